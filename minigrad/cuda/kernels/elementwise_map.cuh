// Elementwise maps: out[i] = f(in_0[i], ..., in_{k-1}[i]) for a pure value function f
// of 0, 1 or 2 inputs. When every operand is contiguous and 16-byte aligned, a vector
// kernel moves 16 bytes per load and store (several per thread at once), which is what
// keeps enough bytes in flight to reach HBM bandwidth; anything else (views, broadcast
// inputs, misaligned narrows) takes the strided loop of elementwise_loop.cuh. Both
// apply the same f to the same values, so the two paths give the same bits.
//
// `out` may alias an input element for element (in-place updates): each thread reads
// all the elements it writes before writing them, and no other thread touches them.
#pragma once

#include <algorithm>
#include <cstdint>

#include <cuda_runtime_api.h>

#include <minigrad/cuda/check.h>
#include <minigrad/cuda/kernels/elementwise_loop.cuh>

namespace mg::cuda::kernels {

constexpr int kVectorBytes = 16;
// Vectors each thread loads before it stores any: 2 x 16 bytes per operand in flight.
constexpr int kVectorsPerThread = 2;

template <typename T>
struct alignas(kVectorBytes) Vector {
  static_assert(kVectorBytes % sizeof(T) == 0, "a vector holds whole elements");
  static constexpr int kWidth = kVectorBytes / static_cast<int>(sizeof(T));
  T lanes[kWidth];
};

// The operands of a map with `Inputs` inputs (0 for a fill).
template <typename T, int Inputs>
struct MapOperands {
  static_assert(Inputs >= 0 && Inputs <= 2, "maps take 0, 1 or 2 inputs");
  static constexpr int kSlots = Inputs > 0 ? Inputs : 1;
  T* out;
  const T* in[kSlots];
};

// f applied to the first `Inputs` values of x.
template <int Inputs, typename T, typename F>
__device__ __forceinline__ T apply_map(const F& f, const T* x) {
  if constexpr (Inputs == 0) {
    return f();
  } else if constexpr (Inputs == 1) {
    return f(x[0]);
  } else {
    return f(x[0], x[1]);
  }
}

// The strided loop's functor for a map: loads at each operand's own offset.
template <typename T, int Inputs, typename F>
struct StridedMap {
  MapOperands<T, Inputs> operands;
  F f;
  template <typename Index>
  __device__ void operator()(const Index (&o)[Inputs + 1]) const {
    T x[MapOperands<T, Inputs>::kSlots] = {};
#pragma unroll
    for (int t = 0; t < Inputs; ++t) x[t] = operands.in[t][o[t + 1]];
    operands.out[o[0]] = apply_map<Inputs>(f, x);
  }
};

// Contiguous, 16-byte-aligned operands. The grid strides over tiles of
// kVectorsPerThread * blockDim.x vectors; vector u of a thread is u * blockDim.x +
// threadIdx.x inside the tile, so each load instruction of a warp reads 512 contiguous
// bytes. The numel % kWidth elements after the last whole vector are done one per
// thread by block 0.
template <typename T, int Inputs, typename Index, typename F>
__global__ void __launch_bounds__(kElementwiseThreads)
    vectorized_map_kernel(MapOperands<T, Inputs> operands, Index vectors, Index numel, F f) {
  using V = Vector<T>;
  constexpr int kSlots = MapOperands<T, Inputs>::kSlots;
  const Index tile = static_cast<Index>(blockDim.x) * kVectorsPerThread;
  const Index step = static_cast<Index>(gridDim.x) * tile;
  for (Index start = static_cast<Index>(blockIdx.x) * tile; start < vectors; start += step) {
    V loaded[kVectorsPerThread][kSlots] = {};
#pragma unroll
    for (int u = 0; u < kVectorsPerThread; ++u) {
      const Index j = start + static_cast<Index>(u) * blockDim.x + threadIdx.x;
      if (j < vectors) {
#pragma unroll
        for (int t = 0; t < Inputs; ++t) loaded[u][t] = reinterpret_cast<const V*>(operands.in[t])[j];
      }
    }
#pragma unroll
    for (int u = 0; u < kVectorsPerThread; ++u) {
      const Index j = start + static_cast<Index>(u) * blockDim.x + threadIdx.x;
      if (j < vectors) {
        V result;
#pragma unroll
        for (int e = 0; e < V::kWidth; ++e) {
          T x[kSlots] = {};
#pragma unroll
          for (int t = 0; t < Inputs; ++t) x[t] = loaded[u][t].lanes[e];
          result.lanes[e] = apply_map<Inputs>(f, x);
        }
        reinterpret_cast<V*>(operands.out)[j] = result;
      }
    }
  }
  const Index tail_begin = vectors * V::kWidth;
  if (blockIdx.x == 0 && threadIdx.x < numel - tail_begin) {
    const Index i = tail_begin + threadIdx.x;
    T x[kSlots] = {};
#pragma unroll
    for (int t = 0; t < Inputs; ++t) x[t] = operands.in[t][i];
    operands.out[i] = apply_map<Inputs>(f, x);
  }
}

template <typename T, int Inputs>
bool vector_aligned(const MapOperands<T, Inputs>& operands) {
  auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % kVectorBytes == 0; };
  if (!aligned(operands.out)) return false;
  for (int t = 0; t < Inputs; ++t)
    if (!aligned(operands.in[t])) return false;
  return true;
}

// Runs out = f(inputs) over `layout` (operand 0 is out, then the inputs) on `stream`.
template <typename T, int Inputs, typename F>
void launch_map(const MapOperands<T, Inputs>& operands, const StridedIndexer<Inputs + 1>& layout,
                int64_t numel, cudaStream_t stream, F f) {
  if (numel <= 0) return;
  if (!layout.all_contiguous() || !vector_aligned(operands)) {
    launch_elementwise(layout, numel, stream, StridedMap<T, Inputs, F>{operands, f});
    return;
  }
  constexpr int64_t kWidth = Vector<T>::kWidth;
  constexpr int64_t kTile = int64_t{kElementwiseThreads} * kVectorsPerThread;
  constexpr int64_t kMaxBlocks = 65536;
  const int64_t vectors = numel / kWidth;
  const auto blocks = static_cast<unsigned>(
      std::clamp<int64_t>((vectors + kTile - 1) / kTile, 1, kMaxBlocks));
  // uint32_t indices when numel fits: start + step stays below 2^32 since step <= 2^25.
  if (numel <= INT32_MAX) {
    vectorized_map_kernel<T, Inputs, uint32_t><<<blocks, kElementwiseThreads, 0, stream>>>(
        operands, static_cast<uint32_t>(vectors), static_cast<uint32_t>(numel), f);
  } else {
    vectorized_map_kernel<T, Inputs, int64_t><<<blocks, kElementwiseThreads, 0, stream>>>(
        operands, vectors, numel, f);
  }
  MG_CUDA_CHECK_LAUNCH();
}

}  // namespace mg::cuda::kernels
