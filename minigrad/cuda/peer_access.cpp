#include <minigrad/cuda/peer_access.h>

#include <algorithm>
#include <mutex>
#include <set>
#include <utility>

#include <cuda_runtime_api.h>

#include <minigrad/cuda/allocator.h>
#include <minigrad/cuda/check.h>
#include <minigrad/cuda/device.h>

namespace mg::cuda {

void enable_peer_access(int a, int b) {
  if (a == b) return;
  check_device_index(a, "enable_peer_access");
  check_device_index(b, "enable_peer_access");
  static std::mutex mutex;
  static std::set<std::pair<int, int>>* done = new std::set<std::pair<int, int>>();
  std::lock_guard<std::mutex> lock(mutex);
  if (!done->insert({std::min(a, b), std::max(a, b)}).second) return;
  for (const auto& [from, to] : {std::pair<int, int>{a, b}, std::pair<int, int>{b, a}}) {
    int can_access = 0;
    MG_CUDA_CHECK(cudaDeviceCanAccessPeer(&can_access, from, to));
    if (!can_access) continue;
    ScopedDevice device(from);
    const cudaError_t status = cudaDeviceEnablePeerAccess(to, 0);
    if (status == cudaErrorPeerAccessAlreadyEnabled) {
      (void)cudaGetLastError();
    } else {
      MG_CUDA_CHECK(status);
    }
    cudaMemAccessDesc access = {};
    access.location.type = cudaMemLocationTypeDevice;
    access.location.id = from;
    access.flags = cudaMemAccessFlagsProtReadWrite;
    MG_CUDA_CHECK(cudaMemPoolSetAccess(device_allocator(to).pool(), &access, 1));
  }
}

}  // namespace mg::cuda
