// Tensor -> kernel layout helpers shared by the backend files. Internal to cuda/.
#pragma once

#include <initializer_list>

#include <minigrad/core/tensor.h>
#include <minigrad/cuda/kernels/launch.h>

namespace mg::cuda {

inline kernels::ElementType element_type(DType dtype) {
  return dtype == DType::Float32 ? kernels::ElementType::Float32 : kernels::ElementType::Int64;
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
