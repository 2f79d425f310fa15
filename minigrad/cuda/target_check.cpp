#include <minigrad/cuda/target_check.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <vector>

#include <minigrad/core/error.h>
#include <minigrad/cuda/check.h>
#include <minigrad/cuda/device.h>
#include <minigrad/cuda/stream.h>

namespace mg::cuda {
namespace {

struct Flag {
  std::once_flag allocated;
  kernels::TargetError* host = nullptr;    // what the host reads
  kernels::TargetError* device = nullptr;  // the same memory as the GPU addresses it
  unsigned long long* claim = nullptr;     // device memory: the last generation reported
  std::atomic<unsigned long long> generation{1};
  // Lets the host skip reading mapped memory until the flag exists.
  std::atomic<bool> exists{false};
};

Flag& flag_of(int device) {
  check_device_index(device, "cross_entropy target check");
  static std::vector<std::unique_ptr<Flag>>* flags = [] {
    auto* list = new std::vector<std::unique_ptr<Flag>>();
    for (int i = 0; i < visible_device_count(); ++i) list->push_back(std::make_unique<Flag>());
    return list;
  }();
  return *(*flags)[static_cast<size_t>(device)];
}

}  // namespace

kernels::TargetErrorSink target_error_sink(int device) {
  Flag& flag = flag_of(device);
  std::call_once(flag.allocated, [&] {
    ScopedDevice scoped(device);
    void* host = nullptr;
    MG_CUDA_CHECK(cudaHostAlloc(&host, sizeof(kernels::TargetError),
                                cudaHostAllocMapped | cudaHostAllocPortable));
    flag.host = static_cast<kernels::TargetError*>(host);
    *flag.host = kernels::TargetError{0, 0, 0, 0, 0};
    void* on_device = nullptr;
    MG_CUDA_CHECK(cudaHostGetDevicePointer(&on_device, host, 0));
    flag.device = static_cast<kernels::TargetError*>(on_device);
    void* claim = nullptr;
    MG_CUDA_CHECK(cudaMalloc(&claim, sizeof(unsigned long long)));
    // Zeroed before any kernel can read it. Not with cudaMemset: that queues on the legacy
    // default stream, which the non-blocking compute and copy streams do not wait for.
    const cudaStream_t stream = device_streams(device).compute;
    MG_CUDA_CHECK(cudaMemsetAsync(claim, 0, sizeof(unsigned long long), stream));
    MG_CUDA_CHECK(cudaStreamSynchronize(stream));
    flag.claim = static_cast<unsigned long long*>(claim);
    flag.exists.store(true, std::memory_order_release);
  });
  return kernels::TargetErrorSink{flag.device, flag.claim, flag.generation.load()};
}

void throw_if_invalid_target_reported(int device) {
  Flag& flag = flag_of(device);
  if (!flag.exists.load(std::memory_order_acquire)) return;
  volatile kernels::TargetError* report = flag.host;
  if (report->raised == 0) return;
  const int64_t row = report->row, value = report->value, classes = report->classes;
  report->raised = 0;
  flag.generation.fetch_add(1);  // kernels launched from now on may report again
  MG_FAIL("cross_entropy on cuda:{}: target {} at row {} is out of range for {} classes "
          "(expected [0, {})); found when the device was next synchronised, the loss and "
          "gradients of that row are NaN",
          device, value, row, classes, classes);
}

}  // namespace mg::cuda
