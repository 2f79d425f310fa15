// Tensor -> kernel layout helpers shared by the backend files. Internal to cuda/.
#pragma once

#include <initializer_list>

#include <minigrad/core/tensor.h>
#include <minigrad/cuda/kernels/launch.h>

namespace mg::cuda {

inline kernels::ElementType element_type(DType dtype) {
  switch (dtype) {
    case DType::Float32: return kernels::ElementType::Float32;
    case DType::Float64: return kernels::ElementType::Float64;
    case DType::Int64: return kernels::ElementType::Int64;
    case DType::BFloat16: return kernels::ElementType::BFloat16;
    case DType::Float16: return kernels::ElementType::Float16;
  }
  MG_FAIL("CUDA: unknown dtype");
}

// An mg::Error unless t is float32: the float-only kernels of launch.h.
inline void require_float32(const char* op, const Tensor& t) {
  MG_CHECK(t.dtype() == DType::Float32,
           "{} on CUDA: this kernel takes float32 only, got {} (float64 on CUDA covers the "
           "transformer's ops so far)",
           op, t.dtype());
}

// A collapsed indexer over `shape` for N tensors of that shape (their own strides).
template <int N>
kernels::StridedIndexer<N> strided_layout(const char* op, const Shape& shape,
                                          const Tensor (&tensors)[N]) {
  const int64_t* strides[N];
  for (int t = 0; t < N; ++t) strides[t] = tensors[t].strides().data();
  kernels::StridedIndexer<N> layout;
  MG_CHECK(kernels::make_indexer<N>(shape.sizes().data(), static_cast<int>(shape.dim()), strides,
                                    layout),
           "{} on CUDA: a view of shape {} needs more than {} strided dimensions; call "
           ".contiguous() on it first",
           op, shape, kernels::kMaxDims);
  return layout;
}

// Device memory for a kernel's temporaries, freed in stream order when the scope ends
// (the free is queued after the kernels that use it, so no wait is needed).
class DeviceScratch {
 public:
  DeviceScratch(int device, std::size_t nbytes);
  ~DeviceScratch();
  DeviceScratch(const DeviceScratch&) = delete;
  DeviceScratch& operator=(const DeviceScratch&) = delete;
  void* data() const { return data_; }

 private:
  Allocator& allocator_;
  std::size_t nbytes_;
  void* data_;
};

}  // namespace mg::cuda
