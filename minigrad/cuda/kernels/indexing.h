// StridedIndexer: turns the linear index of an element into its offset in each of N
// tensors that share one shape but have their own strides (views, transposes,
// broadcast stride-0 inputs). Shapes are collapsed on the host first (size-1 dims
// dropped, dims that are contiguous with respect to each other in every operand
// merged), so most views need one or two dimensions here and a contiguous tensor none.
//
// Plain data, passed to kernels by value; no fmt or minigrad headers, so .cu files
// can include it.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define MG_KERNEL_HD __host__ __device__ __forceinline__
#else
#define MG_KERNEL_HD inline
#endif

namespace mg::cuda::kernels {

// Enough for every collapsed view minigrad makes (tensors here have few dims).
constexpr int kMaxDims = 8;

template <int N>
struct StridedIndexer {
  int ndim = 0;                          // after collapsing; 0 for a single element
  int64_t sizes[kMaxDims] = {};          // outermost first
  int64_t strides[N][kMaxDims] = {};     // in elements, per operand

  // Offsets of element `linear` (row-major over `sizes`) in each operand.
  template <typename Index>
  MG_KERNEL_HD void offsets(Index linear, Index (&out)[N]) const {
    for (int t = 0; t < N; ++t) out[t] = 0;
    // Innermost dims peel off with div/mod; the outermost takes what is left.
    for (int d = ndim - 1; d >= 1; --d) {
      const Index size = static_cast<Index>(sizes[d]);
      const Index coord = linear % size;
      linear /= size;
      for (int t = 0; t < N; ++t) out[t] += coord * static_cast<Index>(strides[t][d]);
    }
    if (ndim >= 1) {
      for (int t = 0; t < N; ++t) out[t] += linear * static_cast<Index>(strides[t][0]);
    }
  }

  // True when every operand is laid out contiguously in row-major order, so the offset
  // of element i is i in each of them.
  MG_KERNEL_HD bool all_contiguous() const {
    if (ndim == 0) return true;
    if (ndim != 1) return false;
    for (int t = 0; t < N; ++t)
      if (strides[t][0] != 1) return false;
    return true;
  }

  // True when every offset of `numel` elements fits a 32-bit index (cheaper div/mod).
  MG_KERNEL_HD bool fits_int32(int64_t numel) const {
    constexpr int64_t kLimit = INT32_MAX;
    if (numel > kLimit) return false;
    for (int t = 0; t < N; ++t) {
      int64_t extent = 0;
      for (int d = 0; d < ndim; ++d) {
        if (strides[t][d] < 0) return false;
        extent += (sizes[d] - 1) * strides[t][d];
      }
      if (extent > kLimit) return false;
    }
    return true;
  }
};

// Builds a collapsed indexer for `ndim` sizes and N stride arrays. Returns false when
// more than kMaxDims dims remain after collapsing.
template <int N>
inline bool make_indexer(const int64_t* sizes, int ndim, const int64_t* const (&strides)[N],
                         StridedIndexer<N>& out) {
  // Walk from the innermost dim outwards, merging each dim into the one inside it when
  // every operand steps over the inner dim exactly once per step of the outer one.
  int64_t merged_sizes[64];
  int64_t merged_strides[N][64];
  int count = 0;
  if (ndim > 64) return false;
  for (int d = ndim - 1; d >= 0; --d) {
    if (sizes[d] == 1) continue;
    if (count > 0) {
      bool mergeable = true;
      for (int t = 0; t < N; ++t) {
        if (strides[t][d] != merged_strides[t][count - 1] * merged_sizes[count - 1]) {
          mergeable = false;
          break;
        }
      }
      if (mergeable) {
        merged_sizes[count - 1] *= sizes[d];
        continue;
      }
    }
    merged_sizes[count] = sizes[d];
    for (int t = 0; t < N; ++t) merged_strides[t][count] = strides[t][d];
    ++count;
  }
  if (count > kMaxDims) return false;
  out = StridedIndexer<N>{};
  out.ndim = count;
  for (int i = 0; i < count; ++i) {  // merged_* are innermost first; the indexer outermost first
    out.sizes[i] = merged_sizes[count - 1 - i];
    for (int t = 0; t < N; ++t) out.strides[t][i] = merged_strides[t][count - 1 - i];
  }
  return true;
}

}  // namespace mg::cuda::kernels
