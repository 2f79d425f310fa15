// Coalescing: many small tensors as one flat buffer, so a collective moves one large
// block instead of one small block per parameter (torch._utils._flatten_dense_tensors).
// A layer's weight and bias are kilobytes; launching a copy or an NCCL call for each
// costs more than the bytes do.
#pragma once

#include <vector>

#include <minigrad/core/tensor.h>

namespace mg::parallel {

// One contiguous 1-D tensor holding every tensor's elements in order. All tensors
// must share one device and dtype. A single tensor is returned flattened, not copied,
// when it is already contiguous.
Tensor flatten_dense_tensors(const std::vector<Tensor>& tensors);

// Views of `flat` with the shapes of `like` (the inverse of flatten_dense_tensors):
// no copy, so writing the views writes the flat buffer.
std::vector<Tensor> unflatten_dense_tensors(const Tensor& flat, const std::vector<Tensor>& like);

// Indices of `tensors` grouped by dtype (first-seen order), since one flat buffer holds
// one dtype.
std::vector<std::vector<size_t>> group_by_dtype(const std::vector<Tensor>& tensors);

}  // namespace mg::parallel
