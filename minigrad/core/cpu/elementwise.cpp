// Elementwise ops on the host. Contiguous operands take a flat loop the compiler can
// vectorise, and so do rows with a value broadcast along them (a column [B, 1] against
// [B, N]); anything else (bias rows, transposes, other views) goes through
// for_each_element, whose inner loop the compiler vectorises when its strides are 1.
// An element of type T is computed in compute_t<T> (core/dtype.h): bfloat16 and float16
// load as float, compute in float and round once when they store; for the other types
// the two conversions are no-ops.
#include <cmath>
#include <cstdint>
#include <type_traits>

#include <minigrad/core/cpu/cpu_backend.h>
#include <minigrad/core/cpu/strided_loop.h>
#include <minigrad/core/cpu/wrapping_math.h>
#include <minigrad/core/dispatch.h>
#include <minigrad/core/philox.h>

namespace mg {
namespace {

using cpu::add;
using cpu::mul;
using cpu::sub;

bool all_contiguous(std::initializer_list<const Tensor*> tensors) {
  for (const Tensor* t : tensors)
    if (!t->is_contiguous()) return false;
  return true;
}

// out[i] = f(in[i]), f taking and returning compute_t<T>.
template <typename T, typename F>
void map1(const Tensor& out, const Tensor& in, F f) {
  using C = compute_t<T>;
  T* o = static_cast<T*>(out.data_ptr());
  const T* x = static_cast<const T*>(in.data_ptr());
  if (all_contiguous({&out, &in})) {
    const int64_t n = out.numel();
    for (int64_t i = 0; i < n; ++i) o[i] = T(f(C(x[i])));
    return;
  }
  cpu::for_each_element<2>(out.shape(), {&out.strides(), &in.strides()},
                           [&](const std::array<int64_t, 2>& k) { o[k[0]] = T(f(C(x[k[1]]))); });
}

// out[i] = f(a[i], b[i]), f taking and returning compute_t<T>.
template <typename T, typename F>
void map2(const Tensor& out, const Tensor& a, const Tensor& b, F f) {
  using C = compute_t<T>;
  T* o = static_cast<T*>(out.data_ptr());
  const T* x = static_cast<const T*>(a.data_ptr());
  const T* y = static_cast<const T*>(b.data_ptr());
  if (all_contiguous({&out, &a, &b})) {
    const int64_t n = out.numel();
    for (int64_t i = 0; i < n; ++i) o[i] = T(f(C(x[i]), C(y[i])));
    return;
  }
  // Broadcast rows: along the last dim, out and one operand step by 1 and the other by 0
  // (a value repeated along the row, as a [B, 1] column against [B, N]). Rows where all
  // three step by 1 (a bias row [N] against [B, N]) already vectorise in for_each_element.
  if (out.dim() > 0 && out.strides().back() == 1) {
    const int64_t sa = a.strides().back(), sb = b.strides().back();
    const auto rows = [&](auto row) {
      cpu::for_each_row<3>(out.shape(), {&out.strides(), &a.strides(), &b.strides()},
                           [&](const std::array<int64_t, 3>& k, int64_t n) {
                             row(o + k[0], x + k[1], y + k[2], n);
                           });
    };
    if (sa == 1 && sb == 0) {
      rows([&](T* po, const T* pa, const T* pb, int64_t n) {
        const C vb = C(*pb);
        for (int64_t i = 0; i < n; ++i) po[i] = T(f(C(pa[i]), vb));
      });
      return;
    }
    if (sa == 0 && sb == 1) {
      rows([&](T* po, const T* pa, const T* pb, int64_t n) {
        const C va = C(*pa);
        for (int64_t i = 0; i < n; ++i) po[i] = T(f(va, C(pb[i])));
      });
      return;
    }
  }
  cpu::for_each_element<3>(out.shape(), {&out.strides(), &a.strides(), &b.strides()},
                           [&](const std::array<int64_t, 3>& k) {
                             o[k[0]] = T(f(C(x[k[1]]), C(y[k[2]])));
                           });
}

// torch.maximum: NaN if either operand is NaN.
template <typename T>
T maximum(T x, T y) {
  if constexpr (std::is_floating_point_v<T>) {
    if (std::isnan(x)) return x;
    if (std::isnan(y)) return y;
  }
  return x > y ? x : y;
}

// T is the element type, C = compute_t<T> the type of the arithmetic and of the scalars.
template <typename T, typename C = compute_t<T>>
void binary_typed(BinaryOp op, const Tensor& out, const Tensor& a, const Tensor& b, C alpha) {
  switch (op) {
    case BinaryOp::Add: map2<T>(out, a, b, [alpha](C x, C y) { return add(x, mul(alpha, y)); }); break;
    case BinaryOp::Sub: map2<T>(out, a, b, [alpha](C x, C y) { return sub(x, mul(alpha, y)); }); break;
    case BinaryOp::Mul: map2<T>(out, a, b, [](C x, C y) { return mul(x, y); }); break;
    case BinaryOp::Div: map2<T>(out, a, b, [](C x, C y) { return x / y; }); break;
    case BinaryOp::Maximum: map2<T>(out, a, b, [](C x, C y) { return maximum(x, y); }); break;
  }
}

template <typename T, typename C = compute_t<T>>
void binary_scalar_typed(BinaryOp op, const Tensor& out, const Tensor& in, C s) {
  switch (op) {
    case BinaryOp::Add: map1<T>(out, in, [s](C x) { return add(x, s); }); break;
    case BinaryOp::Sub: map1<T>(out, in, [s](C x) { return sub(x, s); }); break;
    case BinaryOp::Mul: map1<T>(out, in, [s](C x) { return mul(x, s); }); break;
    case BinaryOp::Div: map1<T>(out, in, [s](C x) { return x / s; }); break;
    case BinaryOp::Maximum: map1<T>(out, in, [s](C x) { return maximum(x, s); }); break;
  }
}

}  // namespace

void CpuBackend::unary(UnaryOp op, const Tensor& out, const Tensor& in) {
  // int64: the ops that stay integers (ops::unary computes the others in float32). -x and
  // |x| wrap at INT64_MIN, as torch's (and the CUDA kernels') do.
  if (in.dtype() == DType::Int64) {
    switch (op) {
      case UnaryOp::Neg: map1<int64_t>(out, in, [](int64_t x) { return sub<int64_t>(0, x); }); return;
      case UnaryOp::Relu: map1<int64_t>(out, in, [](int64_t x) { return x < 0 ? int64_t{0} : x; }); return;
      case UnaryOp::Abs: map1<int64_t>(out, in, [](int64_t x) { return x < 0 ? sub<int64_t>(0, x) : x; }); return;
      default: MG_FAIL("{}: expected a floating-point tensor (float32, float64, bfloat16 or float16), got int64", op_name(op));
    }
  }
  MG_DISPATCH_FLOATING_TYPES_AND_REDUCED(in.dtype(), op_name(op), [&] {
    using T = scalar_t;
    using C = compute_t<T>;
    switch (op) {
      case UnaryOp::Neg: map1<T>(out, in, [](C x) { return -x; }); break;
      case UnaryOp::Exp: map1<T>(out, in, [](C x) { return std::exp(x); }); break;
      case UnaryOp::Log: map1<T>(out, in, [](C x) { return std::log(x); }); break;
      // x <= 0 is false for NaN, so relu(NaN) is NaN, as PyTorch's (x > 0 ? x : 0 would
      // turn it into 0 and hide the NaN from everything downstream).
      case UnaryOp::Relu: map1<T>(out, in, [](C x) { return x <= C(0) ? C(0) : x; }); break;
      // IEEE square root: correctly rounded, as the GPU's __fsqrt_rn.
      case UnaryOp::Sqrt: map1<T>(out, in, [](C x) { return std::sqrt(x); }); break;
      case UnaryOp::Abs: map1<T>(out, in, [](C x) { return std::fabs(x); }); break;
      case UnaryOp::Tanh: map1<T>(out, in, [](C x) { return std::tanh(x); }); break;
    }
  });
}

void CpuBackend::binary(BinaryOp op, const Tensor& out, const Tensor& a, const Tensor& b,
                        double alpha) {
  MG_DISPATCH_ALL_TYPES_AND_REDUCED(out.dtype(), op_name(op), [&] {
    binary_typed<scalar_t>(op, out, a, b, static_cast<compute_t<scalar_t>>(alpha));
  });
}

void CpuBackend::binary_scalar(BinaryOp op, const Tensor& out, const Tensor& in, double scalar) {
  MG_DISPATCH_ALL_TYPES_AND_REDUCED(out.dtype(), op_name(op), [&] {
    binary_scalar_typed<scalar_t>(op, out, in, static_cast<compute_t<scalar_t>>(scalar));
  });
}

void CpuBackend::relu_backward(const Tensor& grad_in, const Tensor& grad_out,
                               const Tensor& input) {
  // PyTorch's threshold_backward: the gradient passes where the output is not <= 0,
  // a NaN output included.
  MG_DISPATCH_FLOATING_TYPES_AND_REDUCED(input.dtype(), "relu_backward", [&] {
    using C = compute_t<scalar_t>;
    map2<scalar_t>(grad_in, grad_out, input, [](C g, C x) { return x <= C(0) ? C(0) : g; });
  });
}

// ---- the transformer's elementwise ops ----

namespace {
template <typename T, typename M>
void masked_fill_typed(const Tensor& out, const Tensor& in, const Tensor& mask, double value) {
  T* o = static_cast<T*>(out.data_ptr());
  const T* x = static_cast<const T*>(in.data_ptr());
  const M* m = static_cast<const M*>(mask.data_ptr());
  const auto v = static_cast<T>(value);
  cpu::for_each_element<3>(out.shape(), {&out.strides(), &in.strides(), &mask.strides()},
                           [&](const std::array<int64_t, 3>& k) {
                             o[k[0]] = m[k[2]] != M(0) ? v : x[k[1]];
                           });
}

// The second dispatch, on the mask's dtype, in a scope of its own.
template <typename T>
void masked_fill_mask(const Tensor& out, const Tensor& in, const Tensor& mask, double value) {
  MG_DISPATCH_ALL_TYPES_AND_REDUCED(mask.dtype(), "masked_fill", [&] {
    masked_fill_typed<T, scalar_t>(out, in, mask, value);
  });
}
}  // namespace

void CpuBackend::masked_fill(const Tensor& out, const Tensor& in, const Tensor& mask,
                             double value) {
  MG_DISPATCH_ALL_TYPES_AND_REDUCED(in.dtype(), "masked_fill", [&] {
    masked_fill_mask<scalar_t>(out, in, mask, value);
  });
}

// Element i (row-major over out's shape) is kept when its Philox uniform is >= p, and
// then scaled by 1 / (1 - p); the CUDA kernel draws the same uniform for the same i.
void CpuBackend::dropout(const Tensor& out, const Tensor& in, double p, uint64_t seed,
                         uint64_t offset) {
  MG_DISPATCH_FLOATING_TYPES_AND_REDUCED(in.dtype(), "dropout", [&] {
    using T = scalar_t;
    using C = compute_t<T>;
    T* o = static_cast<T*>(out.data_ptr());
    const T* x = static_cast<const T*>(in.data_ptr());
    const auto scale = static_cast<C>(1.0 / (1.0 - p));
    const auto threshold = static_cast<float>(p);
    uint64_t i = 0;
    cpu::for_each_element<2>(out.shape(), {&out.strides(), &in.strides()},
                             [&](const std::array<int64_t, 2>& k) {
                               const bool keep = philox::uniform(seed, offset, i++) >= threshold;
                               o[k[0]] = T(keep ? C(x[k[1]]) * scale : C(0));
                             });
  });
}

}  // namespace mg
