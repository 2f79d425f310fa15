// Sums over any set of dims, argmax over the last dim of a matrix, and the largest
// magnitude of a tensor.
//
// A sum is out[k] = sum_r in[kept(k) + reduced(r)] (see SumPlan). Three shapes of work:
//  - "rows": the summed elements of one output are read by a warp (few per output) or a
//    whole block (many), e.g. a sum over the last dim;
//  - "columns": neighbouring outputs are neighbours in memory, so a warp reads 32
//    outputs side by side and walks down the summed dim (coalesced), e.g. the bias
//    gradient, a sum over dim 0 of [batch, features];
//  - both split the summed range over several blocks (grid.y) when there are too few
//    outputs to fill the GPU (a full sum has one output); the partial sums then go to
//    scratch memory and a second kernel adds them in a fixed order.
// No atomics, so results are deterministic. float sums accumulate in double, as the
// CPU backend's full reduction does.
#include <algorithm>
#include <cmath>
#include <type_traits>

#include <minigrad/cuda/check.h>
#include <minigrad/cuda/kernels/launch.h>

namespace mg::cuda::kernels {
namespace {

constexpr int kThreads = 256;
constexpr int kColumnsX = 32;                 // outputs per column block
constexpr int kColumnsY = kThreads / kColumnsX;  // threads walking down each column
// Rows a column thread loads before adding any: independent loads in flight, which is
// what a pass over a large [batch, features] gradient needs to reach HBM bandwidth.
constexpr int kColumnRowsPerStep = 8;
constexpr int kColumnBlocksPerSm = 8;        // 8 x 256 threads: all an SM can hold
constexpr int64_t kSms = 132;                // H100/H200
constexpr int64_t kTargetBlocks = 2 * kSms;  // rows kernels: about two blocks per SM
constexpr int kMaxSplits = 1024;

template <typename T>
struct Accumulator {
  using type = T;
};
template <>
struct Accumulator<float> {
  using type = double;
};

template <typename A>
__device__ __forceinline__ A warp_sum(A value) {
  for (int delta = 16; delta > 0; delta >>= 1) value += __shfl_down_sync(0xffffffffu, value, delta);
  return value;
}

__device__ __forceinline__ int64_t kept_offset(const StridedIndexer<1>& kept, int64_t k) {
  int64_t o[1];
  kept.offsets(k, o);
  return o[0];
}

// The range of summed indices that split `split` of `splits` covers.
__device__ __forceinline__ void split_range(int64_t reduced_count, int splits, int split,
                                            int64_t& begin, int64_t& end) {
  const int64_t chunk = (reduced_count + splits - 1) / splits;
  begin = static_cast<int64_t>(split) * chunk;
  end = min(reduced_count, begin + chunk);
}

template <typename T, typename A>
__device__ __forceinline__ void store_result(T* out, A* partials, int64_t kept_count, int splits,
                                             int split, int64_t k, A total) {
  if (splits == 1) {
    out[k] = static_cast<T>(total);
  } else {
    partials[static_cast<int64_t>(split) * kept_count + k] = total;
  }
}

// Groups of ThreadsPerOutput threads (a warp or the whole block) each sum one output.
template <typename T, int ThreadsPerOutput>
__global__ void __launch_bounds__(kThreads)
    sum_rows_kernel(const T* in, T* out, typename Accumulator<T>::type* partials,
                    StridedIndexer<1> kept, StridedIndexer<1> reduced, int64_t kept_count,
                    int64_t reduced_count, int splits) {
  using A = typename Accumulator<T>::type;
  constexpr int kGroups = kThreads / ThreadsPerOutput;
  const int group = static_cast<int>(threadIdx.x) / ThreadsPerOutput;
  const int lane = static_cast<int>(threadIdx.x) % ThreadsPerOutput;
  const int64_t k = static_cast<int64_t>(blockIdx.x) * kGroups + group;
  const int split = static_cast<int>(blockIdx.y);

  A total = A(0);
  if (k < kept_count) {
    const T* base = in + kept_offset(kept, k);
    int64_t begin, end;
    split_range(reduced_count, splits, split, begin, end);
    for (int64_t r = begin + lane; r < end; r += ThreadsPerOutput) {
      int64_t o[1];
      reduced.offsets(r, o);
      total += static_cast<A>(base[o[0]]);
    }
  }
  total = warp_sum(total);
  if constexpr (ThreadsPerOutput == 32) {
    if (lane == 0 && k < kept_count) store_result(out, partials, kept_count, splits, split, k, total);
  } else {
    __shared__ A warp_totals[kThreads / 32];
    if (threadIdx.x % 32 == 0) warp_totals[threadIdx.x / 32] = total;
    __syncthreads();
    if (threadIdx.x == 0 && k < kept_count) {
      A block_total = A(0);
      for (int w = 0; w < kThreads / 32; ++w) block_total += warp_totals[w];
      store_result(out, partials, kept_count, splits, split, k, block_total);
    }
  }
}

// Block (32 x 8): threadIdx.x picks one of 32 neighbouring outputs, threadIdx.y strides
// down the summed elements; the 8 partial sums of each output are added in shared memory.
// When the summed dims collapse to one (FlatRows: a row's offset is row * stride, as for
// any [batch, features] gradient), each thread loads kColumnRowsPerStep rows at once and
// then adds them in row order; the rows left over go one at a time. Either way a thread
// adds its rows in increasing order, the same additions as a one-row-at-a-time loop.
template <typename T, bool FlatRows>
__global__ void __launch_bounds__(kThreads, FlatRows ? kColumnBlocksPerSm : 1)
    sum_columns_kernel(const T* in, T* out, typename Accumulator<T>::type* partials,
                       StridedIndexer<1> kept, StridedIndexer<1> reduced, int64_t kept_count,
                       int64_t reduced_count, int splits) {
  using A = typename Accumulator<T>::type;
  const int64_t k = static_cast<int64_t>(blockIdx.x) * kColumnsX + threadIdx.x;
  const int split = static_cast<int>(blockIdx.y);
  A total = A(0);
  if (k < kept_count) {
    const T* base = in + kept_offset(kept, k);
    int64_t begin, end;
    split_range(reduced_count, splits, split, begin, end);
    int64_t r = begin + threadIdx.y;
    if constexpr (FlatRows) {
      const int64_t step = int64_t{kColumnsY} * reduced.strides[0][0];
      const T* p = base + r * reduced.strides[0][0];
      for (; r + (kColumnRowsPerStep - 1) * kColumnsY < end;
           r += kColumnsY * kColumnRowsPerStep, p += kColumnRowsPerStep * step) {
        T values[kColumnRowsPerStep];
#pragma unroll
        for (int u = 0; u < kColumnRowsPerStep; ++u) values[u] = p[u * step];
#pragma unroll
        for (int u = 0; u < kColumnRowsPerStep; ++u) total += static_cast<A>(values[u]);
      }
      for (; r < end; r += kColumnsY, p += step) total += static_cast<A>(*p);
    } else {
      for (; r < end; r += kColumnsY) {
        int64_t o[1];
        reduced.offsets(r, o);
        total += static_cast<A>(base[o[0]]);
      }
    }
  }
  __shared__ A tile[kColumnsY][kColumnsX + 1];
  tile[threadIdx.y][threadIdx.x] = total;
  __syncthreads();
  if (threadIdx.y == 0 && k < kept_count) {
    A column_total = A(0);
    for (int y = 0; y < kColumnsY; ++y) column_total += tile[y][threadIdx.x];
    store_result(out, partials, kept_count, splits, split, k, column_total);
  }
}

// out[k] = sum over splits of partials[split * kept_count + k], in split order.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    sum_partials_kernel(const typename Accumulator<T>::type* partials, T* out,
                        int64_t kept_count, int splits) {
  using A = typename Accumulator<T>::type;
  for (int64_t k = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; k < kept_count;
       k += static_cast<int64_t>(gridDim.x) * kThreads) {
    A total = A(0);
    for (int s = 0; s < splits; ++s) total += partials[static_cast<int64_t>(s) * kept_count + k];
    out[k] = static_cast<T>(total);
  }
}

enum class SumShape { RowsWarp, RowsBlock, Columns };

struct SumLaunch {
  SumShape shape;
  int64_t blocks;  // along the outputs
  int splits;      // along the summed elements
};

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

int choose_splits(int64_t blocks, int64_t reduced_count, int64_t elements_per_block_pass) {
  // Enough blocks to fill the GPU, but at least ~16 elements per thread per split.
  const int64_t for_occupancy = ceil_div(kTargetBlocks, blocks);
  const int64_t for_work = ceil_div(reduced_count, elements_per_block_pass * 16);
  return static_cast<int>(std::clamp<int64_t>(std::min(for_occupancy, for_work), 1, kMaxSplits));
}

// Flat column sums (see sum_columns_kernel) fill the GPU in one wave: as many splits as
// keep every block resident at once (a few blocks more would run in a second, mostly
// idle wave), but at least ~16 rows per thread in each split. The count depends on the
// shape only, so results are the same bits on every run.
int column_splits(int64_t blocks, int64_t reduced_count) {
  const int64_t for_occupancy = std::max<int64_t>(1, kSms * kColumnBlocksPerSm / blocks);
  const int64_t for_work = ceil_div(reduced_count, int64_t{kColumnsY} * 16);
  return static_cast<int>(std::clamp<int64_t>(std::min(for_occupancy, for_work), 1, kMaxSplits));
}

SumLaunch choose_launch(const SumPlan& plan) {
  const int64_t kept_count = plan.kept_count, reduced_count = plan.reduced_count;
  const bool kept_innermost_contiguous =
      plan.kept.ndim >= 1 && plan.kept.strides[0][plan.kept.ndim - 1] == 1;
  const bool reduced_innermost_contiguous =
      plan.reduced.ndim >= 1 && plan.reduced.strides[0][plan.reduced.ndim - 1] == 1;
  if (kept_count > 1 && kept_innermost_contiguous && !reduced_innermost_contiguous) {
    const int64_t blocks = ceil_div(kept_count, kColumnsX);
    const int splits = plan.reduced.ndim == 1 ? column_splits(blocks, reduced_count)
                                              : choose_splits(blocks, reduced_count, kColumnsY);
    return {SumShape::Columns, blocks, splits};
  }
  if (reduced_count >= 1024) {
    return {SumShape::RowsBlock, kept_count, choose_splits(kept_count, reduced_count, kThreads)};
  }
  const int64_t blocks = ceil_div(kept_count, kThreads / 32);
  return {SumShape::RowsWarp, blocks, choose_splits(blocks, reduced_count, 32)};
}

template <typename T>
void sum_typed(T* out, const T* in, const SumPlan& plan, void* scratch, cudaStream_t stream) {
  using A = typename Accumulator<T>::type;
  const SumLaunch launch = choose_launch(plan);
  auto* partials = static_cast<A*>(scratch);
  const dim3 grid(static_cast<unsigned>(launch.blocks), static_cast<unsigned>(launch.splits));
  switch (launch.shape) {
    case SumShape::Columns:
      if (plan.reduced.ndim == 1) {
        sum_columns_kernel<T, true><<<grid, dim3(kColumnsX, kColumnsY), 0, stream>>>(
            in, out, partials, plan.kept, plan.reduced, plan.kept_count, plan.reduced_count,
            launch.splits);
      } else {
        sum_columns_kernel<T, false><<<grid, dim3(kColumnsX, kColumnsY), 0, stream>>>(
            in, out, partials, plan.kept, plan.reduced, plan.kept_count, plan.reduced_count,
            launch.splits);
      }
      break;
    case SumShape::RowsBlock:
      sum_rows_kernel<T, kThreads><<<grid, kThreads, 0, stream>>>(
          in, out, partials, plan.kept, plan.reduced, plan.kept_count, plan.reduced_count,
          launch.splits);
      break;
    case SumShape::RowsWarp:
      sum_rows_kernel<T, 32><<<grid, kThreads, 0, stream>>>(
          in, out, partials, plan.kept, plan.reduced, plan.kept_count, plan.reduced_count,
          launch.splits);
      break;
  }
  MG_CUDA_CHECK_LAUNCH();
  if (launch.splits > 1) {
    const auto blocks = static_cast<unsigned>(std::min<int64_t>(ceil_div(plan.kept_count, kThreads), 65536));
    sum_partials_kernel<T><<<blocks, kThreads, 0, stream>>>(partials, out, plan.kept_count,
                                                            launch.splits);
    MG_CUDA_CHECK_LAUNCH();
  }
}

// ---- argmax ----

template <typename T>
__device__ __forceinline__ bool is_nan_value(T v) {
  if constexpr (std::is_floating_point_v<T>) {
    return isnan(v);
  } else {
    return false;
  }
}

// Whether (value, index) beats (best, best_index) in PyTorch's order: NaN is larger than
// every number, and among equal values (or NaNs) the smaller index wins.
template <typename T>
__device__ __forceinline__ bool argmax_beats(T value, int64_t index, T best, int64_t best_index) {
  if (is_nan_value(best)) return is_nan_value(value) && index < best_index;
  if (is_nan_value(value)) return true;
  return value > best || (value == best && index < best_index);
}

// One warp per row: each lane keeps the first maximum of the columns it visits, then
// the lanes combine by argmax_beats, as the CPU's first-maximum scan (NaN included).
template <typename T>
__global__ void __launch_bounds__(kThreads)
    argmax_rows_kernel(int64_t* out, const T* in, int64_t rows, int64_t cols,
                       int64_t row_stride, int64_t col_stride) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * (kThreads / 32) + threadIdx.x / 32;
  const int lane = static_cast<int>(threadIdx.x % 32);
  if (row >= rows) return;  // whole warps leave together
  const T* x = in + row * row_stride;
  T best = T(0);
  int64_t best_index = -1;
  for (int64_t j = lane; j < cols; j += 32) {
    const T v = x[j * col_stride];
    if (best_index < 0 || argmax_beats(v, j, best, best_index)) {
      best = v;
      best_index = j;
    }
  }
  for (int delta = 16; delta > 0; delta >>= 1) {
    const T other = __shfl_down_sync(0xffffffffu, best, delta);
    const int64_t other_index = __shfl_down_sync(0xffffffffu, best_index, delta);
    const bool take = other_index >= 0 &&
                      (best_index < 0 || argmax_beats(other, other_index, best, best_index));
    if (take) {
      best = other;
      best_index = other_index;
    }
  }
  if (lane == 0) out[row] = best_index;
}

template <typename T>
void launch_argmax_rows(int64_t* out, const T* in, int64_t rows, int64_t cols, int64_t row_stride,
                        int64_t col_stride, cudaStream_t stream) {
  const auto blocks = static_cast<unsigned>(ceil_div(rows, kThreads / 32));
  argmax_rows_kernel<T><<<blocks, kThreads, 0, stream>>>(out, in, rows, cols, row_stride, col_stride);
  MG_CUDA_CHECK_LAUNCH();
}

}  // namespace

std::size_t sum_scratch_bytes(ElementType type, const SumPlan& plan) {
  if (plan.kept_count == 0 || plan.reduced_count == 0) return 0;
  const SumLaunch launch = choose_launch(plan);
  if (launch.splits == 1) return 0;
  const std::size_t accumulator_size = type == ElementType::Int64 ? sizeof(int64_t) : sizeof(double);
  return static_cast<std::size_t>(launch.splits) * static_cast<std::size_t>(plan.kept_count) *
         accumulator_size;
}

void sum(ElementType type, void* out, const void* in, const SumPlan& plan, void* scratch,
         cudaStream_t stream) {
  if (plan.kept_count == 0) return;
  if (plan.reduced_count == 0) {
    fill(type, out, 0.0, plan.kept_count, stream);
    return;
  }
  if (type == ElementType::Float32) {
    sum_typed(static_cast<float*>(out), static_cast<const float*>(in), plan, scratch, stream);
  } else if (type == ElementType::Float64) {
    sum_typed(static_cast<double*>(out), static_cast<const double*>(in), plan, scratch, stream);
  } else {
    sum_typed(static_cast<int64_t*>(out), static_cast<const int64_t*>(in), plan, scratch, stream);
  }
}

void argmax_rows(ElementType type, int64_t* out, const void* in, int64_t rows, int64_t cols,
                 int64_t row_stride, int64_t col_stride, cudaStream_t stream) {
  if (rows == 0) return;
  if (type == ElementType::Float32) {
    launch_argmax_rows(out, static_cast<const float*>(in), rows, cols, row_stride, col_stride, stream);
  } else if (type == ElementType::Float64) {
    launch_argmax_rows(out, static_cast<const double*>(in), rows, cols, row_stride, col_stride, stream);
  } else {
    launch_argmax_rows(out, static_cast<const int64_t*>(in), rows, cols, row_stride, col_stride, stream);
  }
}

// The largest |x|, by its bits: a float's magnitude (sign bit cleared) orders as an
// unsigned integer, and every NaN's bits lie above infinity's, so an integer maximum
// over the bits is the float maximum with NaN winning. Blocks combine with atomicMax on
// the output's bits, which starts at +0.
namespace {
__global__ void __launch_bounds__(kThreads)
    abs_max_kernel(const float* in, int64_t n, unsigned int* out_bits) {
  unsigned int best = 0;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride)
    best = max(best, __float_as_uint(fabsf(in[i])));
  for (int delta = 16; delta > 0; delta >>= 1)
    best = max(best, __shfl_down_sync(0xffffffffu, best, delta));
  __shared__ unsigned int warp_best[kThreads / 32];
  const int lane = static_cast<int>(threadIdx.x % 32), warp = static_cast<int>(threadIdx.x / 32);
  if (lane == 0) warp_best[warp] = best;
  __syncthreads();
  if (warp == 0) {
    best = lane < kThreads / 32 ? warp_best[lane] : 0u;
    for (int delta = 16; delta > 0; delta >>= 1)
      best = max(best, __shfl_down_sync(0xffffffffu, best, delta));
    if (lane == 0) atomicMax(out_bits, best);
  }
}
}  // namespace

void abs_max(float* out, const float* in, int64_t n, cudaStream_t stream) {
  static_assert(sizeof(float) == sizeof(unsigned int), "abs_max compares a float's bits");
  MG_CUDA_CHECK(cudaMemsetAsync(out, 0, sizeof(float), stream));
  const auto blocks = static_cast<unsigned>(std::min<int64_t>(ceil_div(n, kThreads), kTargetBlocks));
  abs_max_kernel<<<blocks, kThreads, 0, stream>>>(in, n, reinterpret_cast<unsigned int*>(out));
  MG_CUDA_CHECK_LAUNCH();
}

}  // namespace mg::cuda::kernels
