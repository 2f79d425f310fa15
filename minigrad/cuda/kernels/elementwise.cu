// Elementwise math: unary ops, binary ops with broadcasting (stride-0 inputs), scalar
// ops and relu's backward. Each op is a value function (what happens to one element)
// run by launch_map, which picks the vectorized kernel for contiguous aligned operands
// and the strided loop otherwise. Float arithmetic uses the round-to-nearest intrinsics
// where the CPU computes a product and a sum separately, so that nvcc's fused
// multiply-add does not make results differ from the CPU backend's in the last bit.
#include <type_traits>

#include <minigrad/cuda/kernels/elementwise_map.cuh>
#include <minigrad/cuda/kernels/launch.h>
#include <minigrad/cuda/kernels/reduced_float.cuh>

namespace mg::cuda::kernels {
namespace {

// a + alpha * b, rounded as two separate operations (as the CPU does it).
__device__ __forceinline__ float add_scaled(float a, float alpha, float b) {
  return __fadd_rn(a, __fmul_rn(alpha, b));
}
// int64 arithmetic wraps around (two's complement, as on the CPU and in PyTorch), done in
// uint64 where overflow is defined.
__device__ __forceinline__ int64_t wrap_add(int64_t a, int64_t b) {
  return static_cast<int64_t>(static_cast<uint64_t>(a) + static_cast<uint64_t>(b));
}
__device__ __forceinline__ int64_t wrap_sub(int64_t a, int64_t b) {
  return static_cast<int64_t>(static_cast<uint64_t>(a) - static_cast<uint64_t>(b));
}
__device__ __forceinline__ int64_t wrap_mul(int64_t a, int64_t b) {
  return static_cast<int64_t>(static_cast<uint64_t>(a) * static_cast<uint64_t>(b));
}
__device__ __forceinline__ float wrap_add(float a, float b) { return a + b; }
__device__ __forceinline__ float wrap_sub(float a, float b) { return a - b; }
__device__ __forceinline__ float wrap_mul(float a, float b) { return a * b; }
__device__ __forceinline__ double wrap_add(double a, double b) { return a + b; }
__device__ __forceinline__ double wrap_sub(double a, double b) { return a - b; }
__device__ __forceinline__ double wrap_mul(double a, double b) { return a * b; }
__device__ __forceinline__ double add_scaled(double a, double alpha, double b) {
  return __dadd_rn(a, __dmul_rn(alpha, b));
}
__device__ __forceinline__ int64_t add_scaled(int64_t a, int64_t alpha, int64_t b) {
  return wrap_add(a, wrap_mul(alpha, b));
}

// ---- value functions ----

template <typename T>
struct NegValue {
  __device__ T operator()(T x) const {
    if constexpr (std::is_integral_v<T>) {
      return wrap_sub(T(0), x);  // -INT64_MIN wraps to itself
    } else {
      return -x;  // not 0 - x, which would turn -0.0 into +0.0
    }
  }
};
struct ExpValue {
  __device__ float operator()(float x) const { return expf(x); }
  __device__ double operator()(double x) const { return exp(x); }
};
struct LogValue {
  __device__ float operator()(float x) const { return logf(x); }
  __device__ double operator()(double x) const { return log(x); }
};
// Correctly rounded, as std::sqrt on the CPU (sqrtf is too unless -prec-sqrt=false).
struct SqrtValue {
  __device__ float operator()(float x) const { return __fsqrt_rn(x); }
  __device__ double operator()(double x) const { return __dsqrt_rn(x); }
};
struct AbsValue {
  __device__ float operator()(float x) const { return fabsf(x); }
  __device__ double operator()(double x) const { return fabs(x); }
};
// |x| wrapping at INT64_MIN, as the CPU's and torch's.
struct AbsInt64Value {
  __device__ int64_t operator()(int64_t x) const { return x < 0 ? wrap_sub(int64_t{0}, x) : x; }
};
struct TanhValue {
  __device__ float operator()(float x) const { return tanhf(x); }
  __device__ double operator()(double x) const { return tanh(x); }
};
// x <= 0 is false for NaN: relu(NaN) is NaN, as on the CPU and in PyTorch.
template <typename T>
struct ReluValue {
  __device__ T operator()(T x) const { return x <= T(0) ? T(0) : x; }
};

// Add and Sub (a - alpha * b is a + (-alpha) * b, also on the CPU).
template <typename T>
struct AddScaledValue {
  T alpha;
  __device__ T operator()(T a, T b) const { return add_scaled(a, alpha, b); }
};
template <typename T>
struct MulValue {
  __device__ T operator()(T a, T b) const { return wrap_mul(a, b); }
};
template <typename T>
struct DivValue {
  __device__ T operator()(T a, T b) const { return a / b; }
};

// torch.maximum: NaN if either operand is NaN, as on the CPU.
template <typename T>
__device__ __forceinline__ T maximum(T a, T b) {
  if constexpr (std::is_floating_point_v<T>) {
    if (isnan(a)) return a;
    if (isnan(b)) return b;
  }
  return a > b ? a : b;
}
template <typename T>
struct MaximumValue {
  __device__ T operator()(T a, T b) const { return maximum(a, b); }
};

template <typename T, BinaryKind Kind>
struct ScalarValue {
  T scalar;
  __device__ T operator()(T x) const {
    if constexpr (Kind == BinaryKind::Add) {
      return wrap_add(x, scalar);
    } else if constexpr (Kind == BinaryKind::Sub) {
      return wrap_sub(x, scalar);
    } else if constexpr (Kind == BinaryKind::Mul) {
      return wrap_mul(x, scalar);
    } else if constexpr (Kind == BinaryKind::Div) {  // int64 divisors: ops::binary_scalar checked them
      return x / scalar;
    } else {
      return maximum(x, scalar);
    }
  }
};

// grad_in = input <= 0 ? 0 : grad_out, taking (grad_out, input): a NaN input passes the
// gradient, as PyTorch's threshold_backward.
struct ReluBackwardValue {
  __device__ float operator()(float grad_out, float input) const {
    return input <= 0.0f ? 0.0f : grad_out;
  }
  __device__ double operator()(double grad_out, double input) const {
    return input <= 0.0 ? 0.0 : grad_out;
  }
};

// ---- dispatch ----

template <typename T, typename F>
void map_unary(T* out, const T* in, const StridedIndexer<2>& layout, int64_t numel,
               cudaStream_t stream, F f) {
  launch_map(MapOperands<T, 1>{out, {in}}, layout, numel, stream, f);
}

template <typename T, typename F>
void map_binary(T* out, const T* a, const T* b, const StridedIndexer<3>& layout, int64_t numel,
                cudaStream_t stream, F f) {
  launch_map(MapOperands<T, 2>{out, {a, b}}, layout, numel, stream, f);
}

template <typename T>
void binary_typed(BinaryKind kind, T* out, const T* a, const T* b, T alpha,
                  const StridedIndexer<3>& layout, int64_t numel, cudaStream_t stream) {
  switch (kind) {
    case BinaryKind::Add:
      map_binary(out, a, b, layout, numel, stream, AddScaledValue<T>{alpha});
      break;
    case BinaryKind::Sub:
      map_binary(out, a, b, layout, numel, stream, AddScaledValue<T>{-alpha});
      break;
    case BinaryKind::Mul: map_binary(out, a, b, layout, numel, stream, MulValue<T>{}); break;
    case BinaryKind::Div: map_binary(out, a, b, layout, numel, stream, DivValue<T>{}); break;
    case BinaryKind::Maximum:
      map_binary(out, a, b, layout, numel, stream, MaximumValue<T>{});
      break;
  }
}

template <typename T>
void binary_scalar_typed(BinaryKind kind, T* out, const T* in, T scalar,
                         const StridedIndexer<2>& layout, int64_t numel, cudaStream_t stream) {
  switch (kind) {
    case BinaryKind::Add:
      map_unary(out, in, layout, numel, stream, ScalarValue<T, BinaryKind::Add>{scalar});
      break;
    case BinaryKind::Sub:
      map_unary(out, in, layout, numel, stream, ScalarValue<T, BinaryKind::Sub>{scalar});
      break;
    case BinaryKind::Mul:
      map_unary(out, in, layout, numel, stream, ScalarValue<T, BinaryKind::Mul>{scalar});
      break;
    case BinaryKind::Div:
      map_unary(out, in, layout, numel, stream, ScalarValue<T, BinaryKind::Div>{scalar});
      break;
    case BinaryKind::Maximum:
      map_unary(out, in, layout, numel, stream, ScalarValue<T, BinaryKind::Maximum>{scalar});
      break;
  }
}

// bfloat16 and float16 (S): each float value function widened (load as float, compute,
// round once on store), as the CPU's map1/map2 do.
template <typename S>
void unary_reduced(UnaryKind kind, S* o, const S* x, const StridedIndexer<2>& layout, int64_t numel,
                   cudaStream_t stream) {
  switch (kind) {
    case UnaryKind::Neg: map_unary(o, x, layout, numel, stream, widened<S>(NegValue<float>{})); break;
    case UnaryKind::Exp: map_unary(o, x, layout, numel, stream, widened<S>(ExpValue{})); break;
    case UnaryKind::Log: map_unary(o, x, layout, numel, stream, widened<S>(LogValue{})); break;
    case UnaryKind::Relu: map_unary(o, x, layout, numel, stream, widened<S>(ReluValue<float>{})); break;
    case UnaryKind::Sqrt: map_unary(o, x, layout, numel, stream, widened<S>(SqrtValue{})); break;
    case UnaryKind::Abs: map_unary(o, x, layout, numel, stream, widened<S>(AbsValue{})); break;
    case UnaryKind::Tanh: map_unary(o, x, layout, numel, stream, widened<S>(TanhValue{})); break;
  }
}

template <typename S>
void binary_reduced(BinaryKind kind, S* out, const S* a, const S* b, float alpha,
                    const StridedIndexer<3>& layout, int64_t numel, cudaStream_t stream) {
  switch (kind) {
    case BinaryKind::Add:
      map_binary(out, a, b, layout, numel, stream, widened<S>(AddScaledValue<float>{alpha}));
      break;
    case BinaryKind::Sub:
      map_binary(out, a, b, layout, numel, stream, widened<S>(AddScaledValue<float>{-alpha}));
      break;
    case BinaryKind::Mul: map_binary(out, a, b, layout, numel, stream, widened<S>(MulValue<float>{})); break;
    case BinaryKind::Div: map_binary(out, a, b, layout, numel, stream, widened<S>(DivValue<float>{})); break;
    case BinaryKind::Maximum:
      map_binary(out, a, b, layout, numel, stream, widened<S>(MaximumValue<float>{}));
      break;
  }
}

template <typename S>
void binary_scalar_reduced(BinaryKind kind, S* out, const S* in, float scalar,
                           const StridedIndexer<2>& layout, int64_t numel, cudaStream_t stream) {
  switch (kind) {
    case BinaryKind::Add:
      map_unary(out, in, layout, numel, stream, widened<S>(ScalarValue<float, BinaryKind::Add>{scalar}));
      break;
    case BinaryKind::Sub:
      map_unary(out, in, layout, numel, stream, widened<S>(ScalarValue<float, BinaryKind::Sub>{scalar}));
      break;
    case BinaryKind::Mul:
      map_unary(out, in, layout, numel, stream, widened<S>(ScalarValue<float, BinaryKind::Mul>{scalar}));
      break;
    case BinaryKind::Div:
      map_unary(out, in, layout, numel, stream, widened<S>(ScalarValue<float, BinaryKind::Div>{scalar}));
      break;
    case BinaryKind::Maximum:
      map_unary(out, in, layout, numel, stream, widened<S>(ScalarValue<float, BinaryKind::Maximum>{scalar}));
      break;
  }
}

}  // namespace

namespace {
// The float kinds, for float and double alike.
template <typename T>
void unary_float(UnaryKind kind, T* o, const T* x, const StridedIndexer<2>& layout, int64_t numel,
                 cudaStream_t stream) {
  switch (kind) {
    case UnaryKind::Neg: map_unary(o, x, layout, numel, stream, NegValue<T>{}); break;
    case UnaryKind::Exp: map_unary(o, x, layout, numel, stream, ExpValue{}); break;
    case UnaryKind::Log: map_unary(o, x, layout, numel, stream, LogValue{}); break;
    case UnaryKind::Relu: map_unary(o, x, layout, numel, stream, ReluValue<T>{}); break;
    case UnaryKind::Sqrt: map_unary(o, x, layout, numel, stream, SqrtValue{}); break;
    case UnaryKind::Abs: map_unary(o, x, layout, numel, stream, AbsValue{}); break;
    case UnaryKind::Tanh: map_unary(o, x, layout, numel, stream, TanhValue{}); break;
  }
}
}  // namespace

void unary(UnaryKind kind, ElementType type, void* out, const void* in,
           const StridedIndexer<2>& layout, int64_t numel, cudaStream_t stream) {
  if (type == ElementType::Float32) {
    unary_float(kind, static_cast<float*>(out), static_cast<const float*>(in), layout, numel,
                stream);
  } else if (type == ElementType::Float64) {
    unary_float(kind, static_cast<double*>(out), static_cast<const double*>(in), layout, numel,
                stream);
  } else if (type == ElementType::BFloat16) {
    unary_reduced(kind, static_cast<__nv_bfloat16*>(out), static_cast<const __nv_bfloat16*>(in),
                  layout, numel, stream);
  } else if (type == ElementType::Float16) {
    unary_reduced(kind, static_cast<__half*>(out), static_cast<const __half*>(in), layout, numel,
                  stream);
  } else {
    // int64: Neg, Relu and Abs only (the backend refuses the others).
    auto* o = static_cast<int64_t*>(out);
    const auto* x = static_cast<const int64_t*>(in);
    if (kind == UnaryKind::Neg) {
      map_unary(o, x, layout, numel, stream, NegValue<int64_t>{});
    } else if (kind == UnaryKind::Abs) {
      map_unary(o, x, layout, numel, stream, AbsInt64Value{});
    } else {
      map_unary(o, x, layout, numel, stream, ReluValue<int64_t>{});
    }
  }
}

void binary(BinaryKind kind, ElementType type, void* out, const void* a, const void* b,
            double alpha, const StridedIndexer<3>& layout, int64_t numel, cudaStream_t stream) {
  if (type == ElementType::Float32) {
    binary_typed(kind, static_cast<float*>(out), static_cast<const float*>(a),
                 static_cast<const float*>(b), static_cast<float>(alpha), layout, numel, stream);
  } else if (type == ElementType::Float64) {
    binary_typed(kind, static_cast<double*>(out), static_cast<const double*>(a),
                 static_cast<const double*>(b), alpha, layout, numel, stream);
  } else if (type == ElementType::BFloat16) {
    binary_reduced(kind, static_cast<__nv_bfloat16*>(out), static_cast<const __nv_bfloat16*>(a),
                   static_cast<const __nv_bfloat16*>(b), static_cast<float>(alpha), layout, numel,
                   stream);
  } else if (type == ElementType::Float16) {
    binary_reduced(kind, static_cast<__half*>(out), static_cast<const __half*>(a),
                   static_cast<const __half*>(b), static_cast<float>(alpha), layout, numel, stream);
  } else {
    binary_typed(kind, static_cast<int64_t*>(out), static_cast<const int64_t*>(a),
                 static_cast<const int64_t*>(b), static_cast<int64_t>(alpha), layout, numel,
                 stream);
  }
}

void binary_scalar(BinaryKind kind, ElementType type, void* out, const void* in, double scalar,
                   const StridedIndexer<2>& layout, int64_t numel, cudaStream_t stream) {
  if (type == ElementType::Float32) {
    binary_scalar_typed(kind, static_cast<float*>(out), static_cast<const float*>(in),
                        static_cast<float>(scalar), layout, numel, stream);
  } else if (type == ElementType::Float64) {
    binary_scalar_typed(kind, static_cast<double*>(out), static_cast<const double*>(in), scalar,
                        layout, numel, stream);
  } else if (type == ElementType::BFloat16) {
    binary_scalar_reduced(kind, static_cast<__nv_bfloat16*>(out),
                          static_cast<const __nv_bfloat16*>(in), static_cast<float>(scalar), layout,
                          numel, stream);
  } else if (type == ElementType::Float16) {
    binary_scalar_reduced(kind, static_cast<__half*>(out), static_cast<const __half*>(in),
                          static_cast<float>(scalar), layout, numel, stream);
  } else {
    binary_scalar_typed(kind, static_cast<int64_t*>(out), static_cast<const int64_t*>(in),
                        static_cast<int64_t>(scalar), layout, numel, stream);
  }
}

void relu_backward(ElementType type, void* grad_in, const void* grad_out, const void* input,
                   const StridedIndexer<3>& layout, int64_t numel, cudaStream_t stream) {
  if (type == ElementType::Float64) {
    map_binary(static_cast<double*>(grad_in), static_cast<const double*>(grad_out),
               static_cast<const double*>(input), layout, numel, stream, ReluBackwardValue{});
  } else if (type == ElementType::BFloat16) {
    map_binary(static_cast<__nv_bfloat16*>(grad_in), static_cast<const __nv_bfloat16*>(grad_out),
               static_cast<const __nv_bfloat16*>(input), layout, numel, stream,
               widened<__nv_bfloat16>(ReluBackwardValue{}));
  } else if (type == ElementType::Float16) {
    map_binary(static_cast<__half*>(grad_in), static_cast<const __half*>(grad_out),
               static_cast<const __half*>(input), layout, numel, stream,
               widened<__half>(ReluBackwardValue{}));
  } else {
    map_binary(static_cast<float*>(grad_in), static_cast<const float*>(grad_out),
               static_cast<const float*>(input), layout, numel, stream, ReluBackwardValue{});
  }
}

}  // namespace mg::cuda::kernels
