#include <minigrad/cuda/device.h>

#include <cuda_runtime_api.h>

#include <minigrad/core/error.h>
#include <minigrad/cuda/check.h>

namespace mg::cuda {

int visible_device_count() {
  static const int count = [] {
    int n = 0;
    const cudaError_t status = cudaGetDeviceCount(&n);
    if (status != cudaSuccess) {
      // No driver, no device, or a driver too old: CUDA is simply unavailable.
      (void)cudaGetLastError();
      return 0;
    }
    return n;
  }();
  return count;
}

void check_device_index(int index, const char* op) {
  const int count = visible_device_count();
  MG_CHECK(index >= 0 && index < count,
           "{}: cuda:{} is not available: {} CUDA device{} visible{}", op, index, count,
           count == 1 ? " is" : "s are",
           count == 0 ? " (no NVIDIA driver or GPU found; check CUDA_VISIBLE_DEVICES)" : "");
}

int runtime_current_device() {
  int index = 0;
  MG_CUDA_CHECK(cudaGetDevice(&index));
  return index;
}

void ensure_device(int index) {
  if (runtime_current_device() != index) MG_CUDA_CHECK(cudaSetDevice(index));
}

ScopedDevice::ScopedDevice(int index) : previous_(runtime_current_device()), index_(index) {
  if (previous_ != index_) MG_CUDA_CHECK(cudaSetDevice(index_));
}

ScopedDevice::~ScopedDevice() {
  // Restoring cannot reasonably fail, and a destructor must not throw.
  if (previous_ != index_) (void)cudaSetDevice(previous_);
}

}  // namespace mg::cuda
