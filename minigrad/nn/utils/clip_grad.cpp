#include <minigrad/nn/utils/clip_grad.h>

#include <cmath>

#include <minigrad/autograd/grad_mode.h>
#include <minigrad/core/ops.h>

namespace mg::nn::utils {
namespace {

void check_norm_type(double norm_type, const char* op) {
  MG_CHECK(norm_type > 0.0 && !std::isnan(norm_type),
           "{}: norm_type must be > 0 or infinity, got {}", op, norm_type);
}

// One tensor's share of the norm, as a 0-dim tensor on its device: sum |t|^p, or max |t|.
// A 16-bit gradient is widened to float32 first: its squares would overflow float16 (and
// lose bits in either) long before the norm does.
Tensor partial_norm(const Tensor& grad, double norm_type) {
  const Tensor t = ops::to_dtype(grad, compute_dtype(grad.dtype()));
  if (std::isinf(norm_type)) return ops::abs_max(t);
  Tensor powered;
  if (norm_type == 2.0) {
    powered = ops::binary(BinaryOp::Mul, t, t);
  } else if (norm_type == 1.0) {
    powered = ops::unary(UnaryOp::Abs, t);
  } else {  // |t|^p as exp(p * log|t|); log 0 = -inf gives 0
    powered = ops::unary(
        UnaryOp::Exp,
        ops::binary_scalar(BinaryOp::Mul, ops::unary(UnaryOp::Log, ops::unary(UnaryOp::Abs, t)),
                           norm_type));
  }
  return ops::sum(powered, {}, false);
}

Tensor total_norm(const std::vector<Tensor>& tensors, double norm_type, bool error_if_nonfinite,
                  const NormReducer& reduce, Device device, const char* op) {
  check_norm_type(norm_type, op);
  NoGradGuard no_grad;
  const bool infinity = std::isinf(norm_type);
  if (!tensors.empty()) device = tensors.front().device();
  // The norm has the gradients' dtype: float32 (also for 16-bit gradients, which may mix
  // with float32 ones), or float64 (gradient checks) throughout.
  const DType dtype = tensors.empty() || !tensors.front().defined()
                          ? DType::Float32
                          : compute_dtype(tensors.front().dtype());
  // The partial starts at 0, the identity of both the sum and the maximum of magnitudes.
  Tensor partial = zeros(Shape{}, dtype, device);
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& t = tensors[i];
    MG_CHECK(t.defined() && compute_dtype(t.dtype()) == dtype &&
                 (dtype == DType::Float32 || dtype == DType::Float64),
             "{}: gradient {} is {}, expected a {} tensor (every gradient float32, bfloat16 "
             "or float16, or every one float64)",
             op, i, t.defined() ? fmt::format("{} (shape {})", t.dtype(), t.shape()) : "undefined",
             dtype == DType::Float64 ? "float64" : "float32");
    Tensor part = partial_norm(t, norm_type);
    if (part.device() != device) part = ops::copy_to(part, device);
    partial = ops::binary(infinity ? BinaryOp::Maximum : BinaryOp::Add, partial, part);
  }
  if (reduce) {
    reduce(partial, infinity ? NormReduction::Max : NormReduction::Sum);
    MG_CHECK(partial.defined() && partial.numel() == 1 && partial.dtype() == dtype,
             "{}: the NormReducer must leave one {} element in the partial norm, got {}", op,
             dtype, partial.defined() ? fmt::format("shape {} ({})", partial.shape(), partial.dtype())
                                   : std::string("an undefined tensor"));
    partial = partial.reshape(Shape{});
  }
  Tensor total;
  if (infinity || norm_type == 1.0) {
    total = partial;
  } else if (norm_type == 2.0) {
    total = ops::unary(UnaryOp::Sqrt, partial);
  } else {
    total = ops::unary(UnaryOp::Exp, ops::binary_scalar(BinaryOp::Mul,
                                                          ops::unary(UnaryOp::Log, partial),
                                                          1.0 / norm_type));
  }
  if (error_if_nonfinite) {
    // Waits for the device: only when asked.
    const double value = dtype == DType::Float64 ? total.item<double>() : total.item<float>();
    MG_CHECK(std::isfinite(value),
             "{}: the total norm of order {} of the gradients is {}, so it cannot be clipped; "
             "pass error_if_nonfinite = false to scale the gradients by it anyway",
             op, norm_type, value);
  }
  return total;
}

}  // namespace

Tensor get_total_norm(const std::vector<Tensor>& tensors, double norm_type,
                      bool error_if_nonfinite, const NormReducer& reduce, Device device) {
  return total_norm(tensors, norm_type, error_if_nonfinite, reduce, device, "get_total_norm");
}

void clip_grads_with_norm_(const std::vector<Tensor>& parameters, double max_norm,
                           const Tensor& total_norm) {
  MG_CHECK(max_norm >= 0.0, "clip_grad_norm_: max_norm must be >= 0, got {}", max_norm);
  MG_CHECK(total_norm.defined() && total_norm.numel() == 1 &&
               (total_norm.dtype() == DType::Float32 || total_norm.dtype() == DType::Float64),
           "clip_grads_with_norm_: total_norm must be one float32 or float64 element");
  NoGradGuard no_grad;
  // coef = min(max_norm / (total + 1e-6), 1), on the norm's device: multiplying by a coef
  // of 1 costs a pass, but deciding whether to skip would wait for the device.
  const Device device = total_norm.device();
  const Tensor shifted = ops::binary_scalar(BinaryOp::Add, total_norm.reshape(Shape{}), 1e-6);
  const Tensor coef = ops::binary(BinaryOp::Div, full(Shape{}, max_norm, total_norm.dtype(), device),
                                  shifted);
  // min(coef, 1) as -max(-coef, -1): exact, and NaN stays NaN as in torch.clamp.
  const Tensor clamped = ops::unary(
      UnaryOp::Neg,
      ops::binary_scalar(BinaryOp::Maximum, ops::unary(UnaryOp::Neg, coef), -1.0));
  for (const Tensor& p : parameters) {
    Tensor g = p.grad();
    if (!g.defined()) continue;
    Tensor factor = g.device() == device ? clamped : ops::copy_to(clamped, g.device());
    // A 16-bit gradient takes the coefficient rounded to its dtype, as torch's mul_ does.
    if (factor.dtype() != g.dtype()) factor = ops::to_dtype(factor, g.dtype());
    g.mul_(factor);
  }
}

Tensor clip_grad_norm_(const std::vector<Tensor>& parameters, double max_norm, double norm_type,
                       bool error_if_nonfinite, const NormReducer& reduce) {
  MG_CHECK(max_norm >= 0.0, "clip_grad_norm_: max_norm must be >= 0, got {}", max_norm);
  std::vector<Tensor> grads;
  for (const Tensor& p : parameters) {
    MG_CHECK(p.defined(), "clip_grad_norm_: parameter {} is an undefined tensor", grads.size());
    const Tensor g = p.grad();
    if (g.defined()) grads.push_back(g);
  }
  // No gradients and no ranks to agree with: PyTorch's tensor(0.).
  if (grads.empty() && !reduce) return zeros(Shape{}, DType::Float32);
  const Device device = parameters.empty() ? Device::cpu() : parameters.front().device();
  const Tensor total = total_norm(grads, norm_type, error_if_nonfinite, reduce, device,
                                  "clip_grad_norm_");
  clip_grads_with_norm_(parameters, max_norm, total);
  return total;
}

Tensor clip_grad_norm_(const Tensor& parameter, double max_norm, double norm_type,
                       bool error_if_nonfinite) {
  return clip_grad_norm_(std::vector<Tensor>{parameter}, max_norm, norm_type,
                         error_if_nonfinite);
}

}  // namespace mg::nn::utils
