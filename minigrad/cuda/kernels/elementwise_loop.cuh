// The loop behind every elementwise kernel: a grid-stride loop over the linear index,
// handing the functor each operand's element offset. Contiguous operands skip the index
// arithmetic; strided ones use 32-bit div/mod when every offset fits. Value maps over
// contiguous, 16-byte-aligned operands use the vector kernel of elementwise_map.cuh
// instead, and fall back to this loop otherwise.
#pragma once

#include <algorithm>
#include <cstdint>

#include <cuda_runtime_api.h>

#include <minigrad/cuda/check.h>
#include <minigrad/cuda/kernels/indexing.h>

namespace mg::cuda::kernels {

constexpr int kElementwiseThreads = 256;

template <int N, bool Contiguous, typename Index, typename Op>
__global__ void __launch_bounds__(kElementwiseThreads)
    elementwise_kernel(StridedIndexer<N> layout, Index numel, Op op) {
  const Index step = static_cast<Index>(gridDim.x) * blockDim.x;
  for (Index i = static_cast<Index>(blockIdx.x) * blockDim.x + threadIdx.x; i < numel;
       i += step) {
    Index offsets[N];
    if constexpr (Contiguous) {
      for (int t = 0; t < N; ++t) offsets[t] = i;
    } else {
      layout.offsets(i, offsets);
    }
    op(offsets);
  }
}

// Enough blocks to fill the GPU several times over; the grid-stride loop covers the rest.
inline unsigned elementwise_blocks(int64_t numel) {
  constexpr int64_t kMaxBlocks = 65536;
  const int64_t blocks = (numel + kElementwiseThreads - 1) / kElementwiseThreads;
  return static_cast<unsigned>(std::max<int64_t>(1, std::min(blocks, kMaxBlocks)));
}

// Runs `op(offsets)` for every element of `layout` on `stream`.
template <int N, typename Op>
void launch_elementwise(const StridedIndexer<N>& layout, int64_t numel, cudaStream_t stream,
                        Op op) {
  if (numel <= 0) return;
  const unsigned blocks = elementwise_blocks(numel);
  // uint32_t indices: i + step stays below 2^32 because numel and step are below 2^31.
  if (layout.all_contiguous() && numel <= INT32_MAX) {
    elementwise_kernel<N, true, uint32_t><<<blocks, kElementwiseThreads, 0, stream>>>(
        layout, static_cast<uint32_t>(numel), op);
  } else if (layout.all_contiguous()) {
    elementwise_kernel<N, true, int64_t><<<blocks, kElementwiseThreads, 0, stream>>>(
        layout, numel, op);
  } else if (layout.fits_int32(numel)) {
    elementwise_kernel<N, false, uint32_t><<<blocks, kElementwiseThreads, 0, stream>>>(
        layout, static_cast<uint32_t>(numel), op);
  } else {
    elementwise_kernel<N, false, int64_t><<<blocks, kElementwiseThreads, 0, stream>>>(
        layout, numel, op);
  }
  MG_CUDA_CHECK_LAUNCH();
}

}  // namespace mg::cuda::kernels
