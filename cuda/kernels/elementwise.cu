// Elementwise math: unary ops, binary ops with broadcasting (stride-0 inputs), scalar
// ops and relu's backward. Float arithmetic uses the round-to-nearest intrinsics where
// the CPU computes a product and a sum separately, so that nvcc's fused multiply-add
// does not make results differ from the CPU backend's in the last bit.
#include <type_traits>

#include <minigrad/cuda/kernels/elementwise_loop.cuh>
#include <minigrad/cuda/kernels/launch.h>

namespace mg::cuda::kernels {
namespace {

// a + alpha * b, rounded as two separate operations (as the CPU does it).
__device__ __forceinline__ float add_scaled(float a, float alpha, float b) {
  return __fadd_rn(a, __fmul_rn(alpha, b));
}
__device__ __forceinline__ int64_t add_scaled(int64_t a, int64_t alpha, int64_t b) {
  return a + alpha * b;
}

template <typename T>
struct UnaryFunctor {
  UnaryKind kind;
  T* out;
  const T* in;
  template <typename Index>
  __device__ void operator()(const Index (&o)[2]) const {
    const T x = in[o[1]];
    T y;
    if constexpr (std::is_same_v<T, float>) {
      switch (kind) {
        case UnaryKind::Neg: y = -x; break;
        case UnaryKind::Exp: y = expf(x); break;
        case UnaryKind::Log: y = logf(x); break;
        default: y = x > 0.0f ? x : 0.0f; break;  // Relu
      }
    } else {
      y = kind == UnaryKind::Neg ? -x : (x > 0 ? x : T(0));
    }
    out[o[0]] = y;
  }
};

template <typename T>
struct BinaryFunctor {
  T* out;
  const T* a;
  const T* b;
  T alpha;
  BinaryKind kind;
  template <typename Index>
  __device__ void operator()(const Index (&o)[3]) const {
    const T x = a[o[1]];
    const T y = b[o[2]];
    T r;
    switch (kind) {
      case BinaryKind::Add: r = add_scaled(x, alpha, y); break;
      case BinaryKind::Sub: r = add_scaled(x, -alpha, y); break;
      case BinaryKind::Mul: r = x * y; break;
      default: r = x / y; break;  // Div
    }
    out[o[0]] = r;
  }
};

// Specialised per op so the common in-place updates (add, mul) carry no switch.
template <typename T, BinaryKind Kind>
struct ScalarFunctor {
  T* out;
  const T* in;
  T scalar;
  template <typename Index>
  __device__ void operator()(const Index (&o)[2]) const {
    const T x = in[o[1]];
    if constexpr (Kind == BinaryKind::Add) out[o[0]] = x + scalar;
    if constexpr (Kind == BinaryKind::Sub) out[o[0]] = x - scalar;
    if constexpr (Kind == BinaryKind::Mul) out[o[0]] = x * scalar;
    if constexpr (Kind == BinaryKind::Div) out[o[0]] = x / scalar;
  }
};

struct ReluBackwardFunctor {
  float* grad_in;
  const float* grad_out;
  const float* input;
  template <typename Index>
  __device__ void operator()(const Index (&o)[3]) const {
    grad_in[o[0]] = input[o[2]] > 0.0f ? grad_out[o[1]] : 0.0f;
  }
};

template <typename T>
void binary_scalar_typed(BinaryKind kind, T* out, const T* in, T scalar,
                         const StridedIndexer<2>& layout, int64_t numel, cudaStream_t stream) {
  switch (kind) {
    case BinaryKind::Add:
      launch_elementwise(layout, numel, stream, ScalarFunctor<T, BinaryKind::Add>{out, in, scalar});
      break;
    case BinaryKind::Sub:
      launch_elementwise(layout, numel, stream, ScalarFunctor<T, BinaryKind::Sub>{out, in, scalar});
      break;
    case BinaryKind::Mul:
      launch_elementwise(layout, numel, stream, ScalarFunctor<T, BinaryKind::Mul>{out, in, scalar});
      break;
    case BinaryKind::Div:
      launch_elementwise(layout, numel, stream, ScalarFunctor<T, BinaryKind::Div>{out, in, scalar});
      break;
  }
}

}  // namespace

void unary(UnaryKind kind, ElementType type, void* out, const void* in,
           const StridedIndexer<2>& layout, int64_t numel, cudaStream_t stream) {
  if (type == ElementType::Float32) {
    launch_elementwise(layout, numel, stream,
                       UnaryFunctor<float>{kind, static_cast<float*>(out),
                                           static_cast<const float*>(in)});
  } else {
    launch_elementwise(layout, numel, stream,
                       UnaryFunctor<int64_t>{kind, static_cast<int64_t*>(out),
                                             static_cast<const int64_t*>(in)});
  }
}

void binary(BinaryKind kind, ElementType type, void* out, const void* a, const void* b,
            double alpha, const StridedIndexer<3>& layout, int64_t numel, cudaStream_t stream) {
  if (type == ElementType::Float32) {
    launch_elementwise(layout, numel, stream,
                       BinaryFunctor<float>{static_cast<float*>(out), static_cast<const float*>(a),
                                            static_cast<const float*>(b),
                                            static_cast<float>(alpha), kind});
  } else {
    launch_elementwise(layout, numel, stream,
                       BinaryFunctor<int64_t>{static_cast<int64_t*>(out),
                                              static_cast<const int64_t*>(a),
                                              static_cast<const int64_t*>(b),
                                              static_cast<int64_t>(alpha), kind});
  }
}

void binary_scalar(BinaryKind kind, ElementType type, void* out, const void* in, double scalar,
                   const StridedIndexer<2>& layout, int64_t numel, cudaStream_t stream) {
  if (type == ElementType::Float32) {
    binary_scalar_typed(kind, static_cast<float*>(out), static_cast<const float*>(in),
                        static_cast<float>(scalar), layout, numel, stream);
  } else {
    binary_scalar_typed(kind, static_cast<int64_t*>(out), static_cast<const int64_t*>(in),
                        static_cast<int64_t>(scalar), layout, numel, stream);
  }
}

void relu_backward(float* grad_in, const float* grad_out, const float* input,
                   const StridedIndexer<3>& layout, int64_t numel, cudaStream_t stream) {
  launch_elementwise(layout, numel, stream, ReluBackwardFunctor{grad_in, grad_out, input});
}

}  // namespace mg::cuda::kernels
