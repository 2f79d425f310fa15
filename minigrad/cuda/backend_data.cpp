// CudaBackend: fill, arange and random numbers (kernels in kernels/data.cu).
#include <minigrad/core/ops.h>
#include <minigrad/cuda/backend.h>
#include <minigrad/cuda/layout.h>

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
  require_float32("random_normal", dst);
  MG_CHECK(dst.is_contiguous() && dst.dtype() == DType::Float32,
           "random_normal on CUDA: expected a contiguous float32 destination");
  OpScope scope(dst);
  kernels::random_normal(static_cast<float*>(dst.data_ptr()), dst.numel(),
                         static_cast<float>(mean), static_cast<float>(stddev), seed, offset,
                         scope.stream());
}

}  // namespace mg::cuda
