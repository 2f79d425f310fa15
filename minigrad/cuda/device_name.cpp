// get_device_name (device_name.h): cudaDeviceProp::name with CUDA; without it, an error
// that says so (this file is built either way, as cuda/api.cpp is).
#include <minigrad/cuda/device_name.h>

#include <minigrad/core/backend.h>
#include <minigrad/core/error.h>

#ifdef MINIGRAD_WITH_CUDA
#include <cuda_runtime_api.h>

#include <minigrad/cuda/check.h>
#include <minigrad/cuda/device.h>
#endif

namespace mg::cuda {

std::string get_device_name(int device) {
#ifdef MINIGRAD_WITH_CUDA
  const int index = device < 0 ? backend(DeviceType::CUDA).current_device() : device;
  check_device_index(index, "cuda::get_device_name");
  cudaDeviceProp properties{};
  MG_CUDA_CHECK(cudaGetDeviceProperties(&properties, index));
  return properties.name;
#else
  MG_FAIL("cuda::get_device_name(cuda:{}): minigrad was built without CUDA", device);
#endif
}

}  // namespace mg::cuda
