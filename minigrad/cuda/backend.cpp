// CudaBackend: registration, devices, streams and events.
#include <minigrad/cuda/backend.h>

#include <memory>
#include <mutex>
#include <vector>

#include <minigrad/cuda/allocator.h>
#include <minigrad/cuda/check.h>
#include <minigrad/cuda/device.h>
#include <minigrad/cuda/stream.h>
#include <minigrad/cuda/target_check.h>

namespace mg::cuda {

CudaBackend& cuda_backend() {
  // Never destroyed: tensors in static objects may still free memory through it at exit.
  static CudaBackend* instance = new CudaBackend();
  return *instance;
}

namespace {
// Replaces core's "built without CUDA" entry when libminigrad loads. Only a pointer is
// stored: no CUDA call happens before the first use of a CUDA device.
const bool registered = [] {
  register_backend(DeviceType::CUDA, &cuda_backend());
  return true;
}();

int checked_index(int index, const char* op) {
  check_device_index(index, op);
  return index;
}
}  // namespace

void prepare_device(int index) {
  check_device_index(index, "cuda");
  static std::vector<std::once_flag>* prepared =
      new std::vector<std::once_flag>(static_cast<size_t>(visible_device_count()));
  std::call_once((*prepared)[static_cast<size_t>(index)], [index] {
    (void)device_streams(index);
    (void)device_allocator(index).pool();
    (void)target_error_sink(index);
  });
}

OpScope::OpScope(int device)
    : device_(checked_index(device, "cuda op")), scoped_device_(device), stream_(nullptr) {
  prepare_device(device);
  stream_ = current_cuda_stream(device);
}

int CudaBackend::device_count() const { return visible_device_count(); }

Allocator& CudaBackend::allocator(int index) {
  prepare_device(index);
  return device_allocator(index);
}

// ---- devices ----

int CudaBackend::current_device() const {
  // With no device there is nothing to ask the runtime; 0 lets a DeviceGuard reach
  // set_device, which explains that the device does not exist.
  if (visible_device_count() == 0) return 0;
  return runtime_current_device();
}

void CudaBackend::set_device(int index) {
  check_device_index(index, "set_device");
  ensure_device(index);
}

// ---- streams ----

Stream CudaBackend::current_stream(int index) {
  prepare_device(index);
  return Stream{Device::cuda(index), current_cuda_stream(index)};
}

void CudaBackend::set_current_stream(const Stream& stream) {
  MG_CHECK(stream.device.is_cuda(), "set_current_stream: {} is not a CUDA stream",
           stream.device);
  MG_CHECK(stream.handle != nullptr,
           "set_current_stream: a null stream handle would be the legacy default stream, "
           "which minigrad never uses");
  set_current_cuda_stream(stream.device.index(), static_cast<cudaStream_t>(stream.handle));
}

Stream CudaBackend::compute_stream(int index) {
  prepare_device(index);
  return Stream{Device::cuda(index), device_streams(index).compute};
}

Stream CudaBackend::copy_stream(int index) {
  prepare_device(index);
  return Stream{Device::cuda(index), device_streams(index).copy};
}

Stream CudaBackend::pool_stream(int index, int slot) {
  prepare_device(index);
  return Stream{Device::cuda(index), pool_cuda_stream(index, slot)};
}

MemoryInfo CudaBackend::memory_info(int index) {
  check_device_index(index, "memory_info");
  ScopedDevice device(index);
  MemoryInfo info;
  MG_CUDA_CHECK(cudaMemGetInfo(&info.free_bytes, &info.total_bytes));
  info.known = true;
  return info;
}

std::size_t CudaBackend::memory_allocated(int index) {
  check_device_index(index, "memory_allocated");
  return device_allocator(index).allocated_bytes();
}

void CudaBackend::synchronize(int index) {
  check_device_index(index, "synchronize");
  {
    ScopedDevice device(index);
    MG_CUDA_CHECK(cudaDeviceSynchronize());
  }
  throw_if_invalid_target_reported(index);
}

// ---- events ----
// Without timing: cheaper to record and wait on, which is all the ordering needs.

void* CudaBackend::event_create(int index) {
  check_device_index(index, "event_create");
  ScopedDevice device(index);
  cudaEvent_t event = nullptr;
  MG_CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
  return event;
}

void CudaBackend::event_destroy(void* event) {
  // Runs from destructors; at process exit the runtime may already be gone.
  if (event != nullptr && cudaEventDestroy(static_cast<cudaEvent_t>(event)) != cudaSuccess)
    (void)cudaGetLastError();
}

void CudaBackend::event_record(void* event, const Stream& stream) {
  ScopedDevice device(stream.device.index());
  MG_CUDA_CHECK(
      cudaEventRecord(static_cast<cudaEvent_t>(event), static_cast<cudaStream_t>(stream.handle)));
}

void CudaBackend::event_block(void* event, const Stream& stream) {
  ScopedDevice device(stream.device.index());
  MG_CUDA_CHECK(cudaStreamWaitEvent(static_cast<cudaStream_t>(stream.handle),
                                    static_cast<cudaEvent_t>(event), 0));
}

void CudaBackend::event_synchronize(void* event) {
  MG_CUDA_CHECK(cudaEventSynchronize(static_cast<cudaEvent_t>(event)));
}

// ---- the profiler's device spans ----
// With timing, unlike the events above: a span's two ends on the stream it ran on. None
// inside a graph capture, where a recorded event becomes a node of the graph and cannot
// be timed.

void* CudaBackend::timing_event_record(const Stream& stream) {
  ScopedDevice device(stream.device.index());
  const auto cuda_stream = static_cast<cudaStream_t>(stream.handle);
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  MG_CUDA_CHECK(cudaStreamIsCapturing(cuda_stream, &capture));
  if (capture != cudaStreamCaptureStatusNone) return nullptr;
  cudaEvent_t event = nullptr;
  MG_CUDA_CHECK(cudaEventCreate(&event));
  const cudaError_t status = cudaEventRecord(event, cuda_stream);
  if (status != cudaSuccess) {
    (void)cudaEventDestroy(event);
    MG_CUDA_CHECK(status);
  }
  return event;
}

double CudaBackend::event_elapsed_ms(void* start, void* end) {
  MG_CUDA_CHECK(cudaEventSynchronize(static_cast<cudaEvent_t>(end)));
  float ms = 0.0f;
  MG_CUDA_CHECK(
      cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(start), static_cast<cudaEvent_t>(end)));
  return ms;
}

}  // namespace mg::cuda
