// CudaBackend: fill, arange and random numbers (kernels in kernels/data.cu).
#include <minigrad/core/ops.h>
#include <minigrad/cuda/backend.h>
#include <minigrad/cuda/layout.h>
#include <minigrad/cuda/widen.h>

namespace mg::cuda {

void CudaBackend::fill(const Tensor& dst, double value) {
  OpScope scope(dst);
  if (dst.is_contiguous()) {
    kernels::fill(element_type(dst.dtype()), dst.data_ptr(), value, dst.numel(), scope.stream());
    return;
  }
  // Not needed by the ops layer (it fills fresh tensors), but cheap to get right.
  const Tensor scalar = empty(Shape{}, dst.dtype(), dst.device());
  kernels::fill(element_type(dst.dtype()), scalar.data_ptr(), value, 1, scope.stream());
  copy(dst, ops::expand(scalar, dst.shape()));
}

void CudaBackend::arange(const Tensor& dst, double start, double step) {
  MG_CHECK(dst.is_contiguous(), "arange on CUDA: expected a contiguous destination");
  OpScope scope(dst);
  kernels::arange(element_type(dst.dtype()), dst.data_ptr(), start, step, dst.numel(),
                  scope.stream());
}

void CudaBackend::random_uniform(const Tensor& dst, double low, double high, uint64_t seed,
                                 uint64_t offset) {
  if (is_reduced_float(dst.dtype())) {  // float32's draws, rounded (as on the CPU)
    const Tensor wide = float32_stand_in(dst);
    random_uniform(wide, low, high, seed, offset);
    return round_into(dst, wide);
  }
  require_float32("random_uniform", dst);
  MG_CHECK(dst.is_contiguous() && dst.dtype() == DType::Float32,
           "random_uniform on CUDA: expected a contiguous float32 destination");
  OpScope scope(dst);
  // The same float conversions as the CPU backend, so both draw identical values.
  kernels::random_uniform(static_cast<float*>(dst.data_ptr()), dst.numel(),
                          static_cast<float>(low), static_cast<float>(high - low), seed, offset,
                          scope.stream());
}

void CudaBackend::random_normal(const Tensor& dst, double mean, double stddev, uint64_t seed,
                                uint64_t offset) {
  if (is_reduced_float(dst.dtype())) {
    const Tensor wide = float32_stand_in(dst);
    random_normal(wide, mean, stddev, seed, offset);
    return round_into(dst, wide);
  }
  require_float32("random_normal", dst);
  MG_CHECK(dst.is_contiguous() && dst.dtype() == DType::Float32,
           "random_normal on CUDA: expected a contiguous float32 destination");
  OpScope scope(dst);
  kernels::random_normal(static_cast<float*>(dst.data_ptr()), dst.numel(),
                         static_cast<float>(mean), static_cast<float>(stddev), seed, offset,
                         scope.stream());
}

void CudaBackend::round_stochastic(const Tensor& out, const Tensor& in, uint64_t seed,
                                   uint64_t offset) {
  MG_CHECK(in.dtype() == DType::Float32 && is_reduced_float(out.dtype()) && in.is_contiguous() &&
               out.is_contiguous(),
           "round_stochastic on CUDA: expected a contiguous float32 input and a contiguous "
           "bfloat16 or float16 output, got {} and {}",
           in.dtype(), out.dtype());
  OpScope scope(out);
  kernels::round_stochastic(element_type(out.dtype()), out.data_ptr(),
                            static_cast<const float*>(in.data_ptr()), out.numel(), seed, offset,
                            scope.stream());
}

}  // namespace mg::cuda
