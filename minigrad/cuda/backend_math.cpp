// CudaBackend: elementwise ops, reductions, log_softmax and cross-entropy. Each method
// turns Tensors into the plain layouts of kernels/launch.h and launches on the current
// stream of the output's device.
#include <minigrad/cuda/backend.h>
#include <minigrad/cuda/layout.h>
#include <minigrad/cuda/target_check.h>
#include <minigrad/cuda/widen.h>

namespace mg::cuda {
namespace {

kernels::UnaryKind unary_kind(UnaryOp op) {
  switch (op) {
    case UnaryOp::Neg: return kernels::UnaryKind::Neg;
    case UnaryOp::Exp: return kernels::UnaryKind::Exp;
    case UnaryOp::Log: return kernels::UnaryKind::Log;
    case UnaryOp::Relu: return kernels::UnaryKind::Relu;
    case UnaryOp::Sqrt: return kernels::UnaryKind::Sqrt;
    case UnaryOp::Abs: return kernels::UnaryKind::Abs;
    case UnaryOp::Tanh: return kernels::UnaryKind::Tanh;
  }
  MG_FAIL("unary on CUDA: unknown op");
}

kernels::BinaryKind binary_kind(BinaryOp op) {
  switch (op) {
    case BinaryOp::Add: return kernels::BinaryKind::Add;
    case BinaryOp::Sub: return kernels::BinaryKind::Sub;
    case BinaryOp::Mul: return kernels::BinaryKind::Mul;
    case BinaryOp::Div: return kernels::BinaryKind::Div;
    case BinaryOp::Maximum: return kernels::BinaryKind::Maximum;
  }
  MG_FAIL("binary on CUDA: unknown op");
}

kernels::MatrixView matrix_view(const Tensor& t) {
  return kernels::MatrixView{static_cast<const float*>(t.data_ptr()), t.stride(0), t.stride(1)};
}

// The dims `out` (keepdim form) sums over: size 1 in out, larger in `in`. Size-1 dims
// of `in` could go either way; they count as kept, and collapsing drops them.
kernels::SumPlan sum_plan(const Tensor& out, const Tensor& in) {
  std::vector<int64_t> kept_sizes, kept_strides, reduced_sizes, reduced_strides;
  for (int64_t d = 0; d < in.dim(); ++d) {
    const bool reduced = out.size(d) == 1 && in.size(d) != 1;
    (reduced ? reduced_sizes : kept_sizes).push_back(in.size(d));
    (reduced ? reduced_strides : kept_strides).push_back(in.stride(d));
  }
  kernels::SumPlan plan;
  const int64_t* kept[1] = {kept_strides.data()};
  const int64_t* summed[1] = {reduced_strides.data()};
  const bool fits =
      kernels::make_indexer<1>(kept_sizes.data(), static_cast<int>(kept_sizes.size()), kept,
                               plan.kept) &&
      kernels::make_indexer<1>(reduced_sizes.data(), static_cast<int>(reduced_sizes.size()),
                               summed, plan.reduced);
  MG_CHECK(fits,
           "sum on CUDA: an input of shape {} needs more than {} strided dimensions; call "
           ".contiguous() on it first",
           in.shape(), kernels::kMaxDims);
  for (int64_t s : kept_sizes) plan.kept_count *= s;
  for (int64_t s : reduced_sizes) plan.reduced_count *= s;
  return plan;
}

}  // namespace

// ---- elementwise ----

void CudaBackend::unary(UnaryOp op, const Tensor& out, const Tensor& in) {
  MG_CHECK(out.dtype() != DType::Int64 || op == UnaryOp::Neg || op == UnaryOp::Relu ||
               op == UnaryOp::Abs,
           "{} on CUDA: expected a floating-point tensor, got {}", op_name(op), out.dtype());
  OpScope scope(out);
  const auto layout = strided_layout<2>(op_name(op), out.shape(), {out, in});
  kernels::unary(unary_kind(op), element_type(out.dtype()), out.data_ptr(), in.data_ptr(), layout,
                 out.numel(), scope.stream());
}

void CudaBackend::binary(BinaryOp op, const Tensor& out, const Tensor& a, const Tensor& b,
                         double alpha) {
  OpScope scope(out);
  const auto layout = strided_layout<3>(op_name(op), out.shape(), {out, a, b});
  kernels::binary(binary_kind(op), element_type(out.dtype()), out.data_ptr(), a.data_ptr(),
                  b.data_ptr(), alpha, layout, out.numel(), scope.stream());
}

void CudaBackend::binary_scalar(BinaryOp op, const Tensor& out, const Tensor& in,
                                double scalar) {
  OpScope scope(out);
  const auto layout = strided_layout<2>(op_name(op), out.shape(), {out, in});
  kernels::binary_scalar(binary_kind(op), element_type(out.dtype()), out.data_ptr(),
                         in.data_ptr(), scalar, layout, out.numel(), scope.stream());
}

void CudaBackend::relu_backward(const Tensor& grad_in, const Tensor& grad_out,
                                const Tensor& input) {
  MG_CHECK(is_floating_point(input.dtype()), "relu_backward on CUDA: expected a floating-point tensor, got {}",
           input.dtype());
  OpScope scope(grad_in);
  const auto layout = strided_layout<3>("relu_backward", grad_in.shape(), {grad_in, grad_out, input});
  kernels::relu_backward(element_type(input.dtype()), grad_in.data_ptr(), grad_out.data_ptr(),
                         input.data_ptr(), layout, grad_in.numel(), scope.stream());
}

// ---- reductions ----

void CudaBackend::sum(const Tensor& out, const Tensor& in) {
  if (is_reduced_float(in.dtype())) {  // accumulated in float32 (cuda/widen.h)
    const Tensor wide = float32_stand_in(out);
    sum(wide, widen(in));
    return round_into(out, wide);
  }
  MG_CHECK(out.is_contiguous() && out.dim() == in.dim(),
           "sum on CUDA: expected a contiguous keepdim output, got shape {} for input {}",
           out.shape(), in.shape());
  OpScope scope(out);
  const kernels::SumPlan plan = sum_plan(out, in);
  const kernels::ElementType type = element_type(in.dtype());
  DeviceScratch scratch(scope.device(), kernels::sum_scratch_bytes(type, plan));
  kernels::sum(type, out.data_ptr(), in.data_ptr(), plan, scratch.data(), scope.stream());
}

void CudaBackend::argmax(const Tensor& out, const Tensor& in) {
  if (is_reduced_float(in.dtype())) return argmax(out, widen(in));  // widening is exact
  OpScope scope(out);
  kernels::argmax_rows(element_type(in.dtype()), static_cast<int64_t*>(out.data_ptr()),
                       in.data_ptr(), in.size(0), in.size(1), in.stride(0), in.stride(1),
                       scope.stream());
}

void CudaBackend::abs_max(const Tensor& out, const Tensor& in) {
  if (is_reduced_float(in.dtype())) {
    const Tensor wide = float32_stand_in(out);
    abs_max(wide, widen(in));
    return round_into(out, wide);  // exact: the largest magnitude is one of the inputs
  }
  require_float32("abs_max", in);
  MG_CHECK(in.is_contiguous() && in.numel() > 0,
           "abs_max on CUDA: expected a contiguous, non-empty input, got shape {}", in.shape());
  OpScope scope(out);
  kernels::abs_max(static_cast<float*>(out.data_ptr()), static_cast<const float*>(in.data_ptr()),
                   in.numel(), scope.stream());
}

// ---- softmax and cross-entropy ----

void CudaBackend::log_softmax(const Tensor& out, const Tensor& in) {
  if (is_reduced_float(in.dtype())) {
    const Tensor wide = float32_stand_in(out);
    log_softmax(wide, widen(in));
    return round_into(out, wide);
  }
  require_float32("log_softmax", in);
  MG_CHECK(out.is_contiguous(), "log_softmax on CUDA: expected a contiguous output");
  OpScope scope(out);
  kernels::log_softmax(static_cast<float*>(out.data_ptr()), matrix_view(in), in.size(0),
                       in.size(1), scope.stream());
}

void CudaBackend::log_softmax_backward(const Tensor& grad_in, const Tensor& grad_out,
                                       const Tensor& output) {
  if (is_reduced_float(output.dtype())) {
    const Tensor wide = float32_stand_in(grad_in);
    log_softmax_backward(wide, widen(grad_out), widen(output));
    return round_into(grad_in, wide);
  }
  require_float32("log_softmax_backward", output);
  MG_CHECK(grad_in.is_contiguous(), "log_softmax_backward on CUDA: expected a contiguous output");
  OpScope scope(grad_in);
  kernels::log_softmax_backward(static_cast<float*>(grad_in.data_ptr()), matrix_view(grad_out),
                                matrix_view(output), output.size(0), output.size(1),
                                scope.stream());
}

namespace {

kernels::CrossEntropyParams cross_entropy_params(const CrossEntropyOptions& options) {
  kernels::LossReduction reduction = kernels::LossReduction::Mean;
  if (options.reduction() == Reduction::None) reduction = kernels::LossReduction::None;
  if (options.reduction() == Reduction::Sum) reduction = kernels::LossReduction::Sum;
  return kernels::CrossEntropyParams{options.ignore_index(),
                                     static_cast<float>(options.label_smoothing()), reduction};
}

}  // namespace

void CudaBackend::cross_entropy(const Tensor& loss, const Tensor& logits, const Tensor& targets,
                                const CrossEntropyOptions& options) {
  if (is_reduced_float(logits.dtype())) {
    const Tensor wide = float32_stand_in(loss);
    cross_entropy(wide, widen(logits), targets, options);
    return round_into(loss, wide);
  }
  require_float32("cross_entropy", logits);
  MG_CHECK(loss.is_contiguous(), "cross_entropy on CUDA: expected a contiguous output");
  OpScope scope(loss);
  const int64_t rows = logits.size(0), cols = logits.size(1);
  const kernels::CrossEntropyParams params = cross_entropy_params(options);
  // Reduction::None writes the row losses straight into the output.
  const bool per_row = params.reduction == kernels::LossReduction::None;
  DeviceScratch row_losses(scope.device(),
                           per_row ? 0 : static_cast<std::size_t>(rows) * sizeof(float));
  kernels::cross_entropy(per_row ? nullptr : static_cast<float*>(loss.data_ptr()),
                         matrix_view(logits), static_cast<const int64_t*>(targets.data_ptr()),
                         targets.stride(0), rows, cols, params,
                         per_row ? static_cast<float*>(loss.data_ptr())
                                 : static_cast<float*>(row_losses.data()),
                         target_error_sink(scope.device()), scope.stream());
}

void CudaBackend::cross_entropy_backward(const Tensor& grad_logits, const Tensor& grad_loss,
                                         const Tensor& logits, const Tensor& targets,
                                         const CrossEntropyOptions& options) {
  if (is_reduced_float(logits.dtype())) {
    const Tensor wide = float32_stand_in(grad_logits);
    cross_entropy_backward(wide, widen(grad_loss), widen(logits), targets, options);
    return round_into(grad_logits, wide);
  }
  require_float32("cross_entropy_backward", logits);
  const kernels::CrossEntropyParams params = cross_entropy_params(options);
  const bool per_row = params.reduction == kernels::LossReduction::None;
  MG_CHECK(grad_loss.device() == logits.device() &&
               grad_loss.numel() == (per_row ? logits.size(0) : 1),
           "cross_entropy_backward on CUDA: expected a gradient of {} element(s) on {}, got "
           "shape {} on {}",
           per_row ? logits.size(0) : 1, logits.device(), grad_loss.shape(), grad_loss.device());
  MG_CHECK(grad_logits.is_contiguous(),
           "cross_entropy_backward on CUDA: expected a contiguous output");
  OpScope scope(grad_logits);
  const bool mean = params.reduction == kernels::LossReduction::Mean;
  DeviceScratch scale(scope.device(), mean ? sizeof(float) : 0);
  kernels::cross_entropy_backward(
      static_cast<float*>(grad_logits.data_ptr()), static_cast<const float*>(grad_loss.data_ptr()),
      per_row ? grad_loss.stride(0) : 0, matrix_view(logits),
      static_cast<const int64_t*>(targets.data_ptr()), targets.stride(0), logits.size(0),
      logits.size(1), params, static_cast<float*>(scale.data()),
      target_error_sink(scope.device()), scope.stream());
}

}  // namespace mg::cuda
