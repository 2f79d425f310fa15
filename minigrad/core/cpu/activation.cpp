// GELU and its gradient on the host, exact (x * Phi(x), with erf) or in GPT-2's tanh form,
// as torch.nn.functional.gelu; and SiLU (x * sigmoid(x), the Llama's gate) beside it, on the
// same exp.
//
// A performance trick, signposted: std::erf and std::tanh are library calls that no loop
// vectorises; a [768, 512] GELU took 11.7 ms (erf) and 30 ms (tanh) forward against
// PyTorch's vectorised 0.25 and 1.3. float32 therefore computes both from
// cpu/vector_exp.h's exp: tanh(u) = 1 - 2 / (1 + exp(2u)), and erf by Abramowitz and
// Stegun's 7.1.26 (erf x = 1 - t (a1 + t (a2 + ...)) exp(-x^2), t = 1 / (1 + p x), absolute
// error 1.5e-7, about float's rounding near 1). Plain arithmetic, so the loops vectorise
// (this file is built with -fno-trapping-math, as softmax.cpp). Every element of a tensor
// goes through the same function whatever its layout, so a strided input gives the bits of
// a contiguous one. float64 keeps std::erf and std::tanh (gradient checks, parity tests);
// bfloat16 and float16 take float32's functions and round once.
// The contiguous loops are also compiled for AVX2 (cpu/target_clones.h): GELU's forward and
// backward took 16 % of a GPT step on one core, 8 % with them.
#include <cmath>

#include <minigrad/core/cpu/cpu_backend.h>
#include <minigrad/core/cpu/strided_loop.h>
#include <minigrad/core/cpu/target_clones.h>
#include <minigrad/core/cpu/vector_exp.h>
#include <minigrad/core/dispatch.h>

namespace mg {
namespace {

constexpr double kSqrt2OverPi = 0.7978845608028654;
constexpr double kInvSqrt2 = 0.7071067811865476;
constexpr double kInvSqrt2Pi = 0.3989422804014327;
constexpr double kCubic = 0.044715;

// always_inline: without it GCC stops inlining inside the backward's larger loop body,
// and a loop with a call in it does not vectorise.
// tanh and erf: vectorisable for float, the library's for double.
[[gnu::always_inline]] inline float fast_tanh(float u) {
  // exp(2u) overflows to inf for large u, giving 1; underflows to 0 for very negative u,
  // giving -1: both the right limits.
  return 1.0f - 2.0f / (1.0f + cpu::vector_exp(2.0f * u));
}
inline double fast_tanh(double u) { return std::tanh(u); }

[[gnu::always_inline]] inline float fast_erf(float x) {
  const float a = std::fabs(x);
  const float t = 1.0f / (1.0f + 0.3275911f * a);
  const float poly =
      t * (0.254829592f +
           t * (-0.284496736f + t * (1.421413741f + t * (-1.453152027f + t * 1.061405429f))));
  const float y = 1.0f - poly * cpu::vector_exp(-a * a);
  return x < 0.0f ? -y : y;
}
inline double fast_erf(double x) { return std::erf(x); }

inline float fast_exp(float x) { return cpu::vector_exp(x); }
inline double fast_exp(double x) { return std::exp(x); }

template <typename T>
[[gnu::always_inline]] inline T gelu_value(T x, bool tanh_form) {
  if (tanh_form) {
    const T inner = T(kSqrt2OverPi) * (x + T(kCubic) * x * x * x);
    return T(0.5) * x * (T(1) + fast_tanh(inner));
  }
  return T(0.5) * x * (T(1) + fast_erf(x * T(kInvSqrt2)));
}

template <typename T>
[[gnu::always_inline]] inline T gelu_grad(T g, T x, bool tanh_form) {
  if (tanh_form) {
    const T inner = T(kSqrt2OverPi) * (x + T(kCubic) * x * x * x);
    const T t = fast_tanh(inner);
    const T d_inner = T(kSqrt2OverPi) * (T(1) + T(3 * kCubic) * x * x);
    return g * (T(0.5) * (T(1) + t) + T(0.5) * x * (T(1) - t * t) * d_inner);
  }
  const T cdf = T(0.5) * (T(1) + fast_erf(x * T(kInvSqrt2)));
  const T pdf = T(kInvSqrt2Pi) * fast_exp(T(-0.5) * x * x);
  return g * (cdf + x * pdf);
}

// The contiguous loops, in functions of their own: pointers that a lambda captures by
// reference (the strided path below) are reloaded on every iteration, and such a loop does
// not vectorise. One loop per form, so the form's branch is outside the loop.
// T is the element type; the arithmetic is compute_t<T>'s (bfloat16 and float16 load as
// float and round once when they store).
template <typename T, bool TanhForm>
MG_AVX2_CLONES void gelu_rows(T* o, const T* x, int64_t n) {
  using C = compute_t<T>;
  for (int64_t i = 0; i < n; ++i) o[i] = T(gelu_value(C(x[i]), TanhForm));
}

template <typename T, bool TanhForm>
MG_AVX2_CLONES void gelu_grad_rows(T* gi, const T* go, const T* x, int64_t n) {
  using C = compute_t<T>;
  for (int64_t i = 0; i < n; ++i) gi[i] = T(gelu_grad(C(go[i]), C(x[i]), TanhForm));
}

template <typename T, bool TanhForm>
void gelu_typed(const Tensor& out, const Tensor& in) {
  using C = compute_t<T>;
  T* o = static_cast<T*>(out.data_ptr());
  const T* x = static_cast<const T*>(in.data_ptr());
  if (out.is_contiguous() && in.is_contiguous()) return gelu_rows<T, TanhForm>(o, x, out.numel());
  cpu::for_each_element<2>(out.shape(), {&out.strides(), &in.strides()},
                           [&](const std::array<int64_t, 2>& k) {
                             o[k[0]] = T(gelu_value(C(x[k[1]]), TanhForm));
                           });
}

template <typename T, bool TanhForm>
void gelu_backward_typed(const Tensor& grad_in, const Tensor& grad_out, const Tensor& input) {
  using C = compute_t<T>;
  T* gi = static_cast<T*>(grad_in.data_ptr());
  const T* go = static_cast<const T*>(grad_out.data_ptr());
  const T* x = static_cast<const T*>(input.data_ptr());
  if (grad_in.is_contiguous() && grad_out.is_contiguous() && input.is_contiguous())
    return gelu_grad_rows<T, TanhForm>(gi, go, x, grad_in.numel());
  cpu::for_each_element<3>(grad_in.shape(), {&grad_in.strides(), &grad_out.strides(), &input.strides()},
                           [&](const std::array<int64_t, 3>& k) {
                             gi[k[0]] = T(gelu_grad(C(go[k[1]]), C(x[k[2]]), TanhForm));
                           });
}

// ---- silu: x * sigmoid(x); d/dx = s (1 + x (1 - s)), s = sigmoid(x) ----
// sigmoid(x) = 1 / (1 + exp(-x)): exp(-x) overflows to inf for x << 0, giving 0, its limit.
template <typename T>
[[gnu::always_inline]] inline T sigmoid_value(T x) {
  return T(1) / (T(1) + fast_exp(-x));
}

template <typename T>
MG_AVX2_CLONES void silu_rows(T* o, const T* x, int64_t n) {
  using C = compute_t<T>;
  for (int64_t i = 0; i < n; ++i) {
    const C v = C(x[i]);
    o[i] = T(v * sigmoid_value(v));
  }
}

template <typename T>
MG_AVX2_CLONES void silu_grad_rows(T* gi, const T* go, const T* x, int64_t n) {
  using C = compute_t<T>;
  for (int64_t i = 0; i < n; ++i) {
    const C v = C(x[i]), s = sigmoid_value(v);
    gi[i] = T(C(go[i]) * s * (C(1) + v * (C(1) - s)));
  }
}

template <typename T>
void silu_typed(const Tensor& out, const Tensor& in) {
  using C = compute_t<T>;
  T* o = static_cast<T*>(out.data_ptr());
  const T* x = static_cast<const T*>(in.data_ptr());
  if (out.is_contiguous() && in.is_contiguous()) return silu_rows<T>(o, x, out.numel());
  cpu::for_each_element<2>(out.shape(), {&out.strides(), &in.strides()},
                           [&](const std::array<int64_t, 2>& k) {
                             const C v = C(x[k[1]]);
                             o[k[0]] = T(v * sigmoid_value(v));
                           });
}

template <typename T>
void silu_backward_typed(const Tensor& grad_in, const Tensor& grad_out, const Tensor& input) {
  using C = compute_t<T>;
  T* gi = static_cast<T*>(grad_in.data_ptr());
  const T* go = static_cast<const T*>(grad_out.data_ptr());
  const T* x = static_cast<const T*>(input.data_ptr());
  if (grad_in.is_contiguous() && grad_out.is_contiguous() && input.is_contiguous())
    return silu_grad_rows<T>(gi, go, x, grad_in.numel());
  cpu::for_each_element<3>(grad_in.shape(), {&grad_in.strides(), &grad_out.strides(), &input.strides()},
                           [&](const std::array<int64_t, 3>& k) {
                             const C v = C(x[k[2]]), s = sigmoid_value(v);
                             gi[k[0]] = T(C(go[k[1]]) * s * (C(1) + v * (C(1) - s)));
                           });
}

}  // namespace

void CpuBackend::gelu(const Tensor& out, const Tensor& in, bool tanh_form) {
  MG_DISPATCH_FLOATING_TYPES_AND_REDUCED(in.dtype(), "gelu", [&] {
    if (tanh_form) {
      gelu_typed<scalar_t, true>(out, in);
    } else {
      gelu_typed<scalar_t, false>(out, in);
    }
  });
}

void CpuBackend::gelu_backward(const Tensor& grad_in, const Tensor& grad_out, const Tensor& input,
                               bool tanh_form) {
  MG_DISPATCH_FLOATING_TYPES_AND_REDUCED(input.dtype(), "gelu_backward", [&] {
    if (tanh_form) {
      gelu_backward_typed<scalar_t, true>(grad_in, grad_out, input);
    } else {
      gelu_backward_typed<scalar_t, false>(grad_in, grad_out, input);
    }
  });
}

void CpuBackend::silu(const Tensor& out, const Tensor& in) {
  MG_DISPATCH_FLOATING_TYPES_AND_REDUCED(in.dtype(), "silu", [&] { silu_typed<scalar_t>(out, in); });
}

void CpuBackend::silu_backward(const Tensor& grad_in, const Tensor& grad_out, const Tensor& input) {
  MG_DISPATCH_FLOATING_TYPES_AND_REDUCED(input.dtype(), "silu_backward", [&] {
    silu_backward_typed<scalar_t>(grad_in, grad_out, input);
  });
}

}  // namespace mg
