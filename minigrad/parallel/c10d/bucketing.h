// How gradients are grouped for their collectives, shared by DDP's Reducer, ZeRO and the
// sharded gradient reducer: PyTorch keeps compute_bucket_assignment_by_size in c10d too.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include <minigrad/core/tensor.h>

namespace mg::parallel {

// PyTorch's compute_bucket_assignment_by_size: the parameters from last to first (about
// the order backward produces their gradients), one open bucket per dtype, a bucket
// closed once it holds at least its limit; the first bucket closed gets
// first_bucket_bytes, the others bucket_bytes. Parameter indices per bucket, in that
// order. DDP's Reducer and ZeroRedundancyOptimizer both bucket this way.
std::vector<std::vector<size_t>> compute_bucket_assignment_by_size(
    const std::vector<Tensor>& params, size_t first_bucket_bytes, size_t bucket_bytes);

// For messages that name parameters: the first ten names quoted, then "and N more".
std::string quoted_names(const std::vector<std::string>& names);

// A bucket size option in MiB as bytes (at least 1); an mg::Error naming `who` and
// `option` unless it is finite and positive.
size_t bucket_bytes_from_mib(double mib, const char* who, const char* option);

}  // namespace mg::parallel
