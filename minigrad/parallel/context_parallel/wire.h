// How context parallelism's tensors travel through a ProcessGroup whatever their float
// dtype. The ring's blocks and the tests' checks are also float64, whose 8 bytes travel
// as the bits of an int64 of the same size (a message only moves bytes; written when the
// groups carried float32 and int64 alone, and still exact). Sums are the one place that
// needs arithmetic: sum_over_group all-reduces float32, and for float64 gathers every
// rank's values and adds them here, in rank order, so every rank gets the same float64
// sum, in the order the float64 checks were derived for, whatever the backend's reduction
// order.
#pragma once

#include <memory>
#include <vector>

#include <minigrad/core/tensor.h>
#include <minigrad/parallel/c10d/process_group.h>

namespace mg::parallel::context_parallel {

// What goes into a message for `t` (contiguous): t itself for float32 and int64, an int64
// view of the same memory for float64 (writing into it writes t).
Tensor wire_view(const Tensor& t);

// send/recv of tensors of any of minigrad's dtypes (each made contiguous first; recv's
// tensors must be contiguous, as they are written in place).
std::shared_ptr<Work> send_any(ProcessGroup& group, const std::vector<Tensor>& tensors, int dst,
                               int tag);
std::shared_ptr<Work> recv_any(ProcessGroup& group, const std::vector<Tensor>& tensors, int src,
                               int tag);

// A new tensor: the sum of `t` over the group's ranks (float32: one all-reduce; float64:
// an all-gather of the bits, added in rank order; int64: all-reduce).
Tensor sum_over_group(const Tensor& t, ProcessGroup& group);

// A new tensor [size() * t.numel()]: rank r's t at [r * n, (r + 1) * n), n = t.numel().
Tensor all_gather_any(const Tensor& t, ProcessGroup& group);

}  // namespace mg::parallel::context_parallel
