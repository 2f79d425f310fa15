// Strided copies, fills, ranges and random numbers. Random numbers come from the same
// Philox functions (core/philox.h) as on the CPU, so a seed gives the same tensor on
// both: uniform values match bit for bit; normal values within a few ulps (CUDA's
// logf/sinf/cosf are not glibc's).
#include <cmath>
#include <cstring>

#include <minigrad/core/bfloat16.h>
#include <minigrad/core/float16.h>
#include <minigrad/core/philox.h>
#include <minigrad/cuda/kernels/elementwise_loop.cuh>
#include <minigrad/cuda/kernels/elementwise_map.cuh>
#include <minigrad/cuda/kernels/launch.h>
#include <minigrad/cuda/kernels/reduced_float.cuh>

namespace mg::cuda::kernels {
namespace {

// Copies move bits: one kernel per element width serves every dtype of that width.
template <typename Word>
struct CopyFunctor {
  Word* dst;
  const Word* src;
  template <typename Index>
  __device__ void operator()(const Index (&o)[2]) const {
    dst[o[0]] = src[o[1]];
  }
};

template <typename T>
struct ConstantValue {
  T value;
  __device__ T operator()() const { return value; }
};

template <typename T>
struct ArangeFunctor {
  T* dst;
  double start;
  double step;
  template <typename Index>
  __device__ void operator()(const Index (&o)[1]) const {
    // Multiply and add rounded separately, as the CPU computes start + step * i; a 16-bit
    // value through float, as the CPU converts.
    dst[o[0]] = convert_value<T>(__dadd_rn(start, __dmul_rn(step, static_cast<double>(o[0]))));
  }
};

// core/cpu/data.cpp's round_stochastic_value, on the bits of S: the two 16-bit values
// around |x| are one bit pattern apart, and the upper one is taken with probability
// (|x| - lower) / (upper - lower).
template <typename S>
struct RoundStochasticFunctor {
  S* dst;
  const float* src;
  uint64_t seed;
  uint64_t offset;
  template <typename Index>
  __device__ void operator()(const Index (&o)[1]) const {
    const float x = src[o[0]];
    const S nearest = from_compute<S>(x);
    const float n = to_compute(nearest);
    if (n == x || !isfinite(x) || !isfinite(n)) {
      dst[o[0]] = nearest;
      return;
    }
    const float a = fabsf(x);
    const unsigned short nearest_bits = bits_of(from_compute<S>(a));
    const float na = to_compute(from_bits(nearest_bits));
    const unsigned short lo_bits = na > a ? static_cast<unsigned short>(nearest_bits - 1) : nearest_bits;
    const float lo = to_compute(from_bits(lo_bits));
    const float hi = to_compute(from_bits(static_cast<unsigned short>(lo_bits + 1)));
    float magnitude = lo;
    if (isfinite(hi)) {
      const double p_up = (static_cast<double>(a) - lo) / (static_cast<double>(hi) - lo);
      const float u = philox::uniform(seed, offset, static_cast<uint64_t>(o[0]));
      magnitude = static_cast<double>(u) < p_up ? hi : lo;
    }
    dst[o[0]] = from_compute<S>(copysignf(magnitude, x));
  }
  __device__ static unsigned short bits_of(S v) {
    if constexpr (std::is_same_v<S, __nv_bfloat16>) {
      return __bfloat16_as_ushort(v);
    } else {
      return __half_as_ushort(v);
    }
  }
  __device__ static S from_bits(unsigned short b) {
    if constexpr (std::is_same_v<S, __nv_bfloat16>) {
      return __ushort_as_bfloat16(b);
    } else {
      return __ushort_as_half(b);
    }
  }
};

struct UniformFunctor {
  float* dst;
  float low;
  float span;
  uint64_t seed;
  uint64_t offset;
  template <typename Index>
  __device__ void operator()(const Index (&o)[1]) const {
    const float u = philox::uniform(seed, offset, static_cast<uint64_t>(o[0]));
    dst[o[0]] = __fadd_rn(low, __fmul_rn(span, u));
  }
};

struct NormalFunctor {
  float* dst;
  float mean;
  float stddev;
  uint64_t seed;
  uint64_t offset;
  template <typename Index>
  __device__ void operator()(const Index (&o)[1]) const {
    const float z = philox::normal(seed, offset, static_cast<uint64_t>(o[0]));
    dst[o[0]] = __fadd_rn(mean, __fmul_rn(stddev, z));
  }
};

// A contiguous run of `numel` elements.
StridedIndexer<1> flat(int64_t numel) {
  StridedIndexer<1> layout;
  layout.ndim = 1;
  layout.sizes[0] = numel;
  layout.strides[0][0] = 1;
  return layout;
}

}  // namespace

void strided_copy(std::size_t element_size, void* dst, const void* src,
                  const StridedIndexer<2>& layout, int64_t numel, cudaStream_t stream) {
  if (element_size == 4) {
    launch_elementwise(layout, numel, stream,
                       CopyFunctor<uint32_t>{static_cast<uint32_t*>(dst),
                                             static_cast<const uint32_t*>(src)});
  } else if (element_size == 2) {  // bfloat16, float16
    launch_elementwise(layout, numel, stream,
                       CopyFunctor<uint16_t>{static_cast<uint16_t*>(dst),
                                             static_cast<const uint16_t*>(src)});
  } else {
    launch_elementwise(layout, numel, stream,
                       CopyFunctor<uint64_t>{static_cast<uint64_t*>(dst),
                                             static_cast<const uint64_t*>(src)});
  }
}

void fill(ElementType type, void* dst, double value, int64_t numel, cudaStream_t stream) {
  if (numel <= 0) return;
  if (type == ElementType::Float32) {
    const float v = static_cast<float>(value);
    uint32_t bits = 0;
    std::memcpy(&bits, &v, sizeof bits);
    if (bits == 0) {  // +0.0f: a memset is the fastest fill there is
      MG_CUDA_CHECK(cudaMemsetAsync(dst, 0, static_cast<std::size_t>(numel) * 4, stream));
      return;
    }
    launch_map(MapOperands<float, 0>{static_cast<float*>(dst), {}}, flat(numel), numel, stream,
               ConstantValue<float>{v});
  } else if (type == ElementType::BFloat16 || type == ElementType::Float16) {
    // The value rounded on the host as the CPU rounds it (through float), then its bits.
    const uint16_t bits = type == ElementType::BFloat16 ? bfloat16(static_cast<float>(value)).bits
                                                        : float16(static_cast<float>(value)).bits;
    if (bits == 0) {
      MG_CUDA_CHECK(cudaMemsetAsync(dst, 0, static_cast<std::size_t>(numel) * 2, stream));
      return;
    }
    launch_map(MapOperands<uint16_t, 0>{static_cast<uint16_t*>(dst), {}}, flat(numel), numel,
               stream, ConstantValue<uint16_t>{bits});
  } else if (type == ElementType::Float64) {
    if (value == 0.0 && !std::signbit(value)) {
      MG_CUDA_CHECK(cudaMemsetAsync(dst, 0, static_cast<std::size_t>(numel) * 8, stream));
      return;
    }
    launch_map(MapOperands<double, 0>{static_cast<double*>(dst), {}}, flat(numel), numel, stream,
               ConstantValue<double>{value});
  } else {
    const auto v = static_cast<int64_t>(value);
    if (v == 0) {
      MG_CUDA_CHECK(cudaMemsetAsync(dst, 0, static_cast<std::size_t>(numel) * 8, stream));
      return;
    }
    launch_map(MapOperands<int64_t, 0>{static_cast<int64_t*>(dst), {}}, flat(numel), numel, stream,
               ConstantValue<int64_t>{v});
  }
}

void arange(ElementType type, void* dst, double start, double step, int64_t numel,
            cudaStream_t stream) {
  if (type == ElementType::Float32) {
    launch_elementwise(flat(numel), numel, stream,
                       ArangeFunctor<float>{static_cast<float*>(dst), start, step});
  } else if (type == ElementType::Float64) {
    launch_elementwise(flat(numel), numel, stream,
                       ArangeFunctor<double>{static_cast<double*>(dst), start, step});
  } else if (type == ElementType::BFloat16) {
    launch_elementwise(flat(numel), numel, stream,
                       ArangeFunctor<__nv_bfloat16>{static_cast<__nv_bfloat16*>(dst), start, step});
  } else if (type == ElementType::Float16) {
    launch_elementwise(flat(numel), numel, stream,
                       ArangeFunctor<__half>{static_cast<__half*>(dst), start, step});
  } else {
    launch_elementwise(flat(numel), numel, stream,
                       ArangeFunctor<int64_t>{static_cast<int64_t*>(dst), start, step});
  }
}

void random_uniform(float* dst, int64_t numel, float low, float span, uint64_t seed,
                    uint64_t offset, cudaStream_t stream) {
  launch_elementwise(flat(numel), numel, stream, UniformFunctor{dst, low, span, seed, offset});
}

void random_normal(float* dst, int64_t numel, float mean, float stddev, uint64_t seed,
                   uint64_t offset, cudaStream_t stream) {
  launch_elementwise(flat(numel), numel, stream, NormalFunctor{dst, mean, stddev, seed, offset});
}

void round_stochastic(ElementType type, void* dst, const float* src, int64_t numel, uint64_t seed,
                      uint64_t offset, cudaStream_t stream) {
  if (type == ElementType::BFloat16) {
    launch_elementwise(flat(numel), numel, stream,
                       RoundStochasticFunctor<__nv_bfloat16>{static_cast<__nv_bfloat16*>(dst), src, seed, offset});
  } else {
    launch_elementwise(flat(numel), numel, stream,
                       RoundStochasticFunctor<__half>{static_cast<__half*>(dst), src, seed, offset});
  }
}

}  // namespace mg::cuda::kernels
