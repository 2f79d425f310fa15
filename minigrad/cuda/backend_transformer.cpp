// CudaBackend: the transformer's ops (core/backend.h), float32 and float64, and bfloat16
// and float16 (natively where kernels/transformer.h says, else through float32 copies:
// cuda/widen.h). Tensors become the plain layouts of kernels/transformer.h; the batched
// matmul is one cuBLAS strided batched GEMM.
#include <climits>
#include <vector>

#include <minigrad/core/ops.h>
#include <minigrad/cuda/backend.h>
#include <minigrad/cuda/blas.h>
#include <minigrad/cuda/check.h>
#include <minigrad/cuda/kernels/transformer.h>
#include <minigrad/cuda/layout.h>
#include <minigrad/cuda/widen.h>

namespace mg::cuda {
namespace {

kernels::FloatType float_type(DType dtype, const char* op) {
  switch (dtype) {
    case DType::Float32: return kernels::FloatType::Float32;
    case DType::Float64: return kernels::FloatType::Float64;
    case DType::BFloat16: return kernels::FloatType::BFloat16;
    case DType::Float16: return kernels::FloatType::Float16;
    default: break;
  }
  MG_FAIL("{} on CUDA: expected a floating-point tensor, got {}", op, dtype);
}

kernels::AnyType any_type(DType dtype) {
  switch (dtype) {
    case DType::Float32: return kernels::AnyType::Float32;
    case DType::Float64: return kernels::AnyType::Float64;
    case DType::Int64: return kernels::AnyType::Int64;
    case DType::BFloat16: return kernels::AnyType::BFloat16;
    case DType::Float16: return kernels::AnyType::Float16;
  }
  MG_FAIL("CUDA: unknown dtype");
}

const void* data_or_null(const Tensor& t) { return t.defined() ? t.data_ptr() : nullptr; }
void* mutable_data_or_null(const Tensor& t) { return t.defined() ? t.data_ptr() : nullptr; }

int checked_int(int64_t value, const char* what) {
  MG_CHECK(value <= INT_MAX, "matmul on CUDA: {} {} exceeds cuBLAS's 32-bit limit", what, value);
  return static_cast<int>(value);
}

// t ([..., r, c], batch dims as in `batch`) as [B, r, c] with one batch stride: a view
// where the batch dims collapse (contiguous, or all broadcast), else a contiguous copy.
Tensor as_batch(const Tensor& t, int64_t batch) {
  const Shape shape{batch, t.size(-2), t.size(-1)};
  return ops::can_view(t, shape) ? ops::view(t, shape) : ops::view(ops::clone(t), shape);
}

}  // namespace

void CudaBackend::convert(const Tensor& dst, const Tensor& src) {
  OpScope scope(dst);
  const auto layout = strided_layout<2>("to", dst.shape(), {dst, src});
  kernels::convert(any_type(dst.dtype()), any_type(src.dtype()), dst.data_ptr(), src.data_ptr(),
                   layout, dst.numel(), scope.stream());
}

void CudaBackend::gelu(const Tensor& out, const Tensor& in, bool tanh_form) {
  OpScope scope(out);
  const auto layout = strided_layout<2>("gelu", out.shape(), {out, in});
  kernels::gelu(float_type(out.dtype(), "gelu"), out.data_ptr(), in.data_ptr(), tanh_form, layout,
                out.numel(), scope.stream());
}

void CudaBackend::gelu_backward(const Tensor& grad_in, const Tensor& grad_out, const Tensor& input,
                                bool tanh_form) {
  OpScope scope(grad_in);
  const auto layout =
      strided_layout<3>("gelu_backward", grad_in.shape(), {grad_in, grad_out, input});
  kernels::gelu_backward(float_type(input.dtype(), "gelu_backward"), grad_in.data_ptr(),
                         grad_out.data_ptr(), input.data_ptr(), tanh_form, layout,
                         grad_in.numel(), scope.stream());
}

void CudaBackend::silu(const Tensor& out, const Tensor& in) {
  OpScope scope(out);
  const auto layout = strided_layout<2>("silu", out.shape(), {out, in});
  kernels::silu(float_type(out.dtype(), "silu"), out.data_ptr(), in.data_ptr(), layout, out.numel(), scope.stream());
}

void CudaBackend::silu_backward(const Tensor& grad_in, const Tensor& grad_out, const Tensor& input) {
  OpScope scope(grad_in);
  const auto layout = strided_layout<3>("silu_backward", grad_in.shape(), {grad_in, grad_out, input});
  kernels::silu_backward(float_type(input.dtype(), "silu_backward"), grad_in.data_ptr(), grad_out.data_ptr(),
                         input.data_ptr(), layout, grad_in.numel(), scope.stream());
}

void CudaBackend::masked_fill(const Tensor& out, const Tensor& in, const Tensor& mask,
                              double value) {
  OpScope scope(out);
  const auto layout = strided_layout<3>("masked_fill", out.shape(), {out, in, mask});
  kernels::masked_fill(any_type(out.dtype()), any_type(mask.dtype()), out.data_ptr(), in.data_ptr(),
                       mask.data_ptr(), value, layout, out.numel(), scope.stream());
}

void CudaBackend::dropout(const Tensor& out, const Tensor& in, double p, uint64_t seed,
                          uint64_t offset) {
  OpScope scope(out);
  const auto layout = strided_layout<2>("dropout", out.shape(), {out, in});
  kernels::dropout(float_type(out.dtype(), "dropout"), out.data_ptr(), in.data_ptr(), p, seed,
                   offset, layout, out.numel(), scope.stream());
}

// One cublasGemmStridedBatchedEx over the flattened batch. Row-major out = a @ b is, in
// cuBLAS's column-major terms, out^T = b^T a^T: b's memory is cuBLAS's A (as in matmul).
void CudaBackend::bmm(const Tensor& out, const Tensor& a, const Tensor& b) {
  const int64_t m = a.size(-2), k = a.size(-1), n = b.size(-1);
  const int64_t batch = out.numel() / (m * n);
  OpScope scope(out);
  Tensor a3 = as_batch(a, batch), b3 = as_batch(b, batch);
  GemmPlan plan = gemm_plan(m, k, n, a3.stride(1), a3.stride(2), b3.stride(1), b3.stride(2));
  if (plan.rhs.pack || plan.lhs.pack) {
    if (plan.rhs.pack) a3 = ops::clone(a3);
    if (plan.lhs.pack) b3 = ops::clone(b3);
    plan = gemm_plan(m, k, n, a3.stride(1), a3.stride(2), b3.stride(1), b3.stride(2));
  }
  const bool is_double = out.dtype() == DType::Float64;
  const cudaDataType_t type = cublas_data_type(out.dtype());
  const cublasComputeType_t compute = gemm_compute_type(out.dtype());
  const double alpha64 = 1.0, beta64 = 0.0;
  const float alpha32 = 1.0f, beta32 = 0.0f;
  const void* alpha = is_double ? static_cast<const void*>(&alpha64) : &alpha32;
  const void* beta = is_double ? static_cast<const void*>(&beta64) : &beta32;
  MG_CUBLAS_CHECK(cublasGemmStridedBatchedEx(
      blas_context(scope.device(), scope.stream()).handle,
      plan.lhs.transpose ? CUBLAS_OP_T : CUBLAS_OP_N, plan.rhs.transpose ? CUBLAS_OP_T : CUBLAS_OP_N,
      checked_int(plan.gemm_m, "n"), checked_int(plan.gemm_n, "m"), checked_int(plan.gemm_k, "k"),
      alpha, b3.data_ptr(), type, checked_int(plan.lhs.ld, "leading dimension"), b3.stride(0),
      a3.data_ptr(), type, checked_int(plan.rhs.ld, "leading dimension"), a3.stride(0), beta,
      out.data_ptr(), type, checked_int(plan.ldc, "n"), m * n, checked_int(batch, "batch"),
      compute, CUBLAS_GEMM_DEFAULT));
}

void CudaBackend::softmax(const Tensor& out, const Tensor& in) {
  if (is_reduced_float(in.dtype())) {
    const Tensor wide = float32_stand_in(out);
    softmax(wide, widen(in));
    return round_into(out, wide);
  }
  OpScope scope(out);
  const Tensor x = ops::contiguous(in);
  kernels::softmax(float_type(in.dtype(), "softmax"), out.data_ptr(), x.data_ptr(), in.size(0),
                   in.size(1), scope.stream());
}

void CudaBackend::softmax_backward(const Tensor& grad_in, const Tensor& grad_out,
                                   const Tensor& output) {
  if (is_reduced_float(output.dtype())) {
    const Tensor wide = float32_stand_in(grad_in);
    softmax_backward(wide, widen(grad_out), widen(output));
    return round_into(grad_in, wide);
  }
  OpScope scope(grad_in);
  const Tensor g = ops::contiguous(grad_out), y = ops::contiguous(output);
  kernels::softmax_backward(float_type(output.dtype(), "softmax_backward"), grad_in.data_ptr(),
                            g.data_ptr(), y.data_ptr(), output.size(0), output.size(1),
                            scope.stream());
}

void CudaBackend::layer_norm(const Tensor& out, const Tensor& mean, const Tensor& rstd,
                             const Tensor& in, const Tensor& weight, const Tensor& bias,
                             double eps) {
  if (is_reduced_float(in.dtype())) {  // mean and rstd are float32 already (compute_dtype)
    const Tensor wide = float32_stand_in(out);
    layer_norm(wide, mean, rstd, widen(in), widen(weight), widen(bias), eps);
    return round_into(out, wide);
  }
  OpScope scope(out);
  kernels::layer_norm(float_type(in.dtype(), "layer_norm"), out.data_ptr(), mean.data_ptr(),
                      rstd.data_ptr(), in.data_ptr(), data_or_null(weight), data_or_null(bias),
                      in.size(0), in.size(1), eps, scope.stream());
}

void CudaBackend::layer_norm_backward(const Tensor& grad_in, const Tensor& grad_weight,
                                      const Tensor& grad_bias, const Tensor& grad_out,
                                      const Tensor& in, const Tensor& mean, const Tensor& rstd,
                                      const Tensor& weight) {
  if (is_reduced_float(in.dtype())) {
    const Tensor gi = float32_stand_in(grad_in), gw = float32_stand_in(grad_weight),
                 gb = float32_stand_in(grad_bias);
    layer_norm_backward(gi, gw, gb, widen(grad_out), widen(in), mean, rstd, widen(weight));
    round_into(grad_in, gi);
    round_into(grad_weight, gw);
    return round_into(grad_bias, gb);
  }
  OpScope scope(grad_in);
  kernels::layer_norm_backward(float_type(in.dtype(), "layer_norm_backward"), grad_in.data_ptr(),
                               mutable_data_or_null(grad_weight), mutable_data_or_null(grad_bias),
                               grad_out.data_ptr(), in.data_ptr(), mean.data_ptr(),
                               rstd.data_ptr(), data_or_null(weight), in.size(0), in.size(1),
                               scope.stream());
}

void CudaBackend::rms_norm(const Tensor& out, const Tensor& rstd, const Tensor& in, const Tensor& weight,
                           double eps) {
  if (is_reduced_float(in.dtype())) {  // rstd is float32 already (compute_dtype)
    const Tensor wide = float32_stand_in(out);
    rms_norm(wide, rstd, widen(in), widen(weight), eps);
    return round_into(out, wide);
  }
  OpScope scope(out);
  kernels::rms_norm(float_type(in.dtype(), "rms_norm"), out.data_ptr(), rstd.data_ptr(), in.data_ptr(),
                    data_or_null(weight), in.size(0), in.size(1), eps, scope.stream());
}

void CudaBackend::rms_norm_backward(const Tensor& grad_in, const Tensor& grad_weight, const Tensor& grad_out,
                                    const Tensor& in, const Tensor& rstd, const Tensor& weight) {
  if (is_reduced_float(in.dtype())) {
    const Tensor gi = float32_stand_in(grad_in), gw = float32_stand_in(grad_weight);
    rms_norm_backward(gi, gw, widen(grad_out), widen(in), rstd, widen(weight));
    round_into(grad_in, gi);
    return round_into(grad_weight, gw);
  }
  OpScope scope(grad_in);
  kernels::rms_norm_backward(float_type(in.dtype(), "rms_norm_backward"), grad_in.data_ptr(),
                             mutable_data_or_null(grad_weight), grad_out.data_ptr(), in.data_ptr(), rstd.data_ptr(),
                             data_or_null(weight), in.size(0), in.size(1), scope.stream());
}

// in, out [B, T, H, D] and the tables contiguous (ops::rotary_embedding makes them so).
void CudaBackend::rotary_embedding(const Tensor& out, const Tensor& in, const Tensor& cos, const Tensor& sin,
                                   bool inverse) {
  OpScope scope(out);
  kernels::rotary_embedding(float_type(in.dtype(), "rotary_embedding"), out.data_ptr(), in.data_ptr(), cos.data_ptr(),
                            sin.data_ptr(), in.size(0), in.size(1), in.size(2), in.size(3), inverse, scope.stream());
}

// The indices are checked on the host before the lookup (a copy and a wait): an index out
// of range must be an mg::Error naming it, as on the CPU, not a read past the table.
void CudaBackend::embedding(const Tensor& out, const Tensor& weight, const Tensor& indices) {
  const std::vector<int64_t> host = indices.to_vector<int64_t>();
  const int64_t vocab = weight.size(0);
  for (size_t i = 0; i < host.size(); ++i)
    MG_CHECK(host[i] >= 0 && host[i] < vocab,
             "embedding: index {} (at position {} of the indices) is out of range for an "
             "embedding of {} rows (weight shape {})",
             host[i], i, vocab, weight.shape());
  OpScope scope(out);
  kernels::embedding(float_type(weight.dtype(), "embedding"), out.data_ptr(), weight.data_ptr(),
                     weight.stride(0), weight.stride(1),
                     static_cast<const int64_t*>(indices.data_ptr()), indices.numel(),
                     weight.size(1), scope.stream());
}

void CudaBackend::embedding_backward(const Tensor& grad_weight, const Tensor& grad_out,
                                     const Tensor& indices) {
  if (is_reduced_float(grad_weight.dtype())) {  // summed in float32, rounded once
    const Tensor wide = float32_stand_in(grad_weight, /*keep_values=*/true);
    embedding_backward(wide, widen(grad_out), indices);
    return round_into(grad_weight, wide);
  }
  OpScope scope(grad_weight);
  kernels::embedding_backward(float_type(grad_weight.dtype(), "embedding_backward"),
                              grad_weight.data_ptr(), grad_out.data_ptr(),
                              static_cast<const int64_t*>(indices.data_ptr()), indices.numel(),
                              grad_weight.size(1), scope.stream());
}

namespace {
kernels::AttentionShape attention_shape(const Tensor& q, const Tensor& k, const Tensor& v,
                                        double scale, bool causal, double dropout_p,
                                        uint64_t seed, uint64_t offset) {
  MG_CHECK(q.size(2) <= kernels::kAttentionMaxDim && v.size(2) <= kernels::kAttentionMaxDim,
           "scaled_dot_product_attention on CUDA: head dimensions up to {} are supported, got "
           "query {} and value {}",
           kernels::kAttentionMaxDim, q.shape(), v.shape());
  return kernels::AttentionShape{q.size(0), q.size(1), k.size(1), q.size(2), v.size(2),
                                 scale,     causal,    dropout_p, seed,      offset};
}
}  // namespace

void CudaBackend::attention(const Tensor& out, const Tensor& lse, const Tensor& q, const Tensor& k,
                            const Tensor& v, double scale, bool causal, double dropout_p,
                            uint64_t seed, uint64_t offset) {
  if (is_reduced_float(q.dtype())) {  // lse is float32 already (compute_dtype)
    const Tensor wide = float32_stand_in(out);
    attention(wide, lse, widen(q), widen(k), widen(v), scale, causal, dropout_p, seed, offset);
    return round_into(out, wide);
  }
  OpScope scope(out);
  kernels::attention(float_type(q.dtype(), "scaled_dot_product_attention"), out.data_ptr(),
                     lse.data_ptr(), q.data_ptr(), k.data_ptr(), v.data_ptr(),
                     attention_shape(q, k, v, scale, causal, dropout_p, seed, offset),
                     scope.stream());
}

void CudaBackend::attention_backward(const Tensor& grad_q, const Tensor& grad_k,
                                     const Tensor& grad_v, const Tensor& grad_out,
                                     const Tensor& q, const Tensor& k, const Tensor& v,
                                     const Tensor& out, const Tensor& lse, double scale,
                                     bool causal, double dropout_p, uint64_t seed,
                                     uint64_t offset) {
  if (is_reduced_float(q.dtype())) {
    const Tensor gq = float32_stand_in(grad_q), gk = float32_stand_in(grad_k),
                 gv = float32_stand_in(grad_v);
    attention_backward(gq, gk, gv, widen(grad_out), widen(q), widen(k), widen(v), widen(out), lse,
                       scale, causal, dropout_p, seed, offset);
    round_into(grad_q, gq);
    round_into(grad_k, gk);
    return round_into(grad_v, gv);
  }
  OpScope scope(grad_q);
  DeviceScratch delta(scope.device(), static_cast<std::size_t>(lse.numel()) * element_size(q.dtype()));
  kernels::attention_backward(float_type(q.dtype(), "scaled_dot_product_attention backward"),
                              grad_q.data_ptr(), grad_k.data_ptr(), grad_v.data_ptr(),
                              grad_out.data_ptr(), q.data_ptr(), k.data_ptr(), v.data_ptr(),
                              out.data_ptr(), lse.data_ptr(), delta.data(),
                              attention_shape(q, k, v, scale, causal, dropout_p, seed, offset),
                              scope.stream());
}

}  // namespace mg::cuda
