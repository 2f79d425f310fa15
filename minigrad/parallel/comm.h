// The collectives of one process over a list of devices, without autograd (as
// torch.cuda.comm): the data movement that scatter, gather and replicate are made of.
// The differentiable wrappers live in scatter.cpp, gather.cpp and replicate.cpp; each
// one's backward is another function of this file.
//
// A device may appear several times in a list (replicas sharing a device): each entry is
// a rank of its own with its own copy.
#pragma once

#include <vector>

#include <minigrad/core/tensor.h>

namespace mg::parallel::comm {

// Sizes of `size` rows cut into at most `chunks` pieces as torch.chunk (and mg::chunk)
// cuts them: ceil(size / chunks) each, the last one what is left; fewer pieces when
// there are not enough rows (30 in 4 -> 8 8 8 6; 9 in 4 -> 3 3 3; 2 in 4 -> 1 1).
std::vector<int64_t> chunk_sizes(int64_t size, int64_t chunks);

// Pieces of `tensor` along `dim`, piece i of chunk_sizes[i] rows on devices[i]. A piece
// already on its device is a view; others are copies ordered as in transfer.h.
std::vector<Tensor> scatter(const Tensor& tensor, const std::vector<Device>& devices,
                            const std::vector<int64_t>& chunk_sizes, int64_t dim = 0);

// The tensors concatenated along `dim` on `destination`: each piece is copied straight
// into its slice of the result (one copy per piece, ordered as in transfer.h).
Tensor gather(const std::vector<Tensor>& tensors, Device destination, int64_t dim = 0);

// `tensors` (on devices[0]) on every device: out[i][k] is tensors[k] on devices[i], and
// out[0] are the tensors themselves. Tensors of one dtype travel as one flat buffer
// (coalesce.h) through the communicator for `devices`; the results are views of it.
std::vector<std::vector<Tensor>> broadcast_coalesced(const std::vector<Tensor>& tensors,
                                                     const std::vector<Device>& devices);

// The sum of `tensors` (one per device of `devices`, same shape and dtype) on
// devices[root]. Summed, not averaged: the replicas' gradients add up to the gradient
// of the whole batch.
Tensor reduce_add(const std::vector<Tensor>& tensors, const std::vector<Device>& devices,
                  size_t root = 0);

// per_device[i][k] lives on devices[i]; returns, for every k, the sum over i on
// devices[root]. Each device's tensors are flattened into one buffer per dtype, reduced
// with one collective, and unflattened: the results are views of the summed buffer.
std::vector<Tensor> reduce_add_coalesced(const std::vector<std::vector<Tensor>>& per_device,
                                         const std::vector<Device>& devices, size_t root = 0);

}  // namespace mg::parallel::comm

namespace mg::parallel {
using comm::broadcast_coalesced;
using comm::reduce_add;
using comm::reduce_add_coalesced;
}  // namespace mg::parallel
