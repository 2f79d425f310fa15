// CudaBackend::copy: host to device, device to host, within a device and between
// devices, for any strides on either side. Strided data crosses the bus only after
// being packed contiguously on the side where it lives.
#include <vector>

#include <minigrad/cuda/backend.h>
#include <minigrad/cuda/check.h>
#include <minigrad/cuda/layout.h>
#include <minigrad/cuda/peer_access.h>
#include <minigrad/cuda/stream.h>
#include <minigrad/cuda/target_check.h>

namespace mg::cuda {
namespace {

// dst = src on one device (the current one, on `stream`).
void copy_on_device(const Tensor& dst, const Tensor& src, cudaStream_t stream) {
  if (dst.is_contiguous() && src.is_contiguous()) {
    if (dst.data_ptr() != src.data_ptr())
      MG_CUDA_CHECK(cudaMemcpyAsync(dst.data_ptr(), src.data_ptr(), dst.nbytes(),
                                    cudaMemcpyDeviceToDevice, stream));
    return;
  }
  const auto layout = strided_layout<2>("copy", dst.shape(), {dst, src});
  kernels::strided_copy(element_size(dst.dtype()), dst.data_ptr(), src.data_ptr(), layout,
                        dst.numel(), stream);
}

// A contiguous tensor holding `t`'s values on `t`'s device (t itself when it already is).
Tensor packed_on_device(const Tensor& t, cudaStream_t stream) {
  if (t.is_contiguous()) return t;
  Tensor packed = empty(t.shape(), t.dtype(), t.device());
  copy_on_device(packed, t, stream);
  return packed;
}

Tensor packed_on_host(const Tensor& t) {
  if (t.is_contiguous()) return t;
  Tensor packed = empty(t.shape(), t.dtype(), Device::cpu());
  backend(DeviceType::CPU).copy(packed, t);
  return packed;
}

void copy_host_to_device(const Tensor& dst, const Tensor& src) {
  OpScope scope(dst);
  const Tensor host = packed_on_host(src);
  // From pageable host memory the call returns once the bytes are staged by the
  // driver, so `host` may be freed right after; the transfer itself stays asynchronous.
  const Tensor target = dst.is_contiguous() ? dst : empty(dst.shape(), dst.dtype(), dst.device());
  MG_CUDA_CHECK(cudaMemcpyAsync(target.data_ptr(), host.data_ptr(), dst.nbytes(),
                                cudaMemcpyHostToDevice, scope.stream()));
  if (!target.is_same(dst)) copy_on_device(dst, target, scope.stream());
}

void copy_device_to_host(const Tensor& dst, const Tensor& src) {
  OpScope scope(src);
  const Tensor packed = packed_on_device(src, scope.stream());
  const Tensor target = dst.is_contiguous() ? dst : empty(dst.shape(), dst.dtype(), Device::cpu());
  MG_CUDA_CHECK(cudaMemcpyAsync(target.data_ptr(), packed.data_ptr(), dst.nbytes(),
                                cudaMemcpyDeviceToHost, scope.stream()));
  // The host reads these bytes as soon as we return.
  MG_CUDA_CHECK(cudaStreamSynchronize(scope.stream()));
  if (!target.is_same(dst)) backend(DeviceType::CPU).copy(dst, target);
  throw_if_invalid_target_reported(scope.device());
}

// One reusable event per device and thread, for ordering a copy between two streams.
// Reusing it is safe: a stream waits for the record made before the wait was queued.
cudaEvent_t ordering_event(int device) {
  thread_local std::vector<cudaEvent_t> events;
  if (events.empty()) events.assign(static_cast<size_t>(cuda_backend().device_count()), nullptr);
  cudaEvent_t& event = events[static_cast<size_t>(device)];
  if (event == nullptr) event = static_cast<cudaEvent_t>(cuda_backend().event_create(device));
  return event;
}

// `waiter` (on its device) waits for the work queued so far on `producer` (on its device).
void stream_wait(int producer_device, cudaStream_t producer, int waiter_device,
                 cudaStream_t waiter) {
  const cudaEvent_t event = ordering_event(producer_device);
  {
    ScopedDevice device(producer_device);
    MG_CUDA_CHECK(cudaEventRecord(event, producer));
  }
  ScopedDevice device(waiter_device);
  MG_CUDA_CHECK(cudaStreamWaitEvent(waiter, event, 0));
}

// The copy runs on the source device's current stream, as in PyTorch: that stream
// first waits for the destination's current stream (which may still be using the
// destination memory), and the destination's stream then waits for the copy.
void copy_between_devices(const Tensor& dst, const Tensor& src) {
  const int src_device = src.device().index(), dst_device = dst.device().index();
  enable_peer_access(src_device, dst_device);
  OpScope dst_scope(dst);
  const cudaStream_t dst_stream = dst_scope.stream();
  const Tensor target = dst.is_contiguous() ? dst : empty(dst.shape(), dst.dtype(), dst.device());

  OpScope src_scope(src);
  const cudaStream_t src_stream = src_scope.stream();
  const Tensor packed = packed_on_device(src, src_stream);
  stream_wait(dst_device, dst_stream, src_device, src_stream);
  MG_CUDA_CHECK(cudaMemcpyPeerAsync(target.data_ptr(), dst_device, packed.data_ptr(), src_device,
                                    dst.nbytes(), src_stream));
  stream_wait(src_device, src_stream, dst_device, dst_stream);
  if (!target.is_same(dst)) {
    ScopedDevice device(dst_device);
    copy_on_device(dst, target, dst_stream);
  }
}

}  // namespace

void CudaBackend::copy(const Tensor& dst, const Tensor& src) {
  MG_CHECK(dst.dtype() == src.dtype() && dst.shape() == src.shape(),
           "copy: destination {} {} and source {} {} differ", dst.shape(), dst.dtype(),
           src.shape(), src.dtype());
  if (dst.numel() == 0) return;
  const Device to = dst.device(), from = src.device();
  if (to.is_cuda() && from.is_cuda()) {
    if (to == from) {
      OpScope scope(dst);
      copy_on_device(dst, src, scope.stream());
    } else {
      copy_between_devices(dst, src);
    }
  } else if (to.is_cuda()) {
    copy_host_to_device(dst, src);
  } else {
    copy_device_to_host(dst, src);
  }
}

}  // namespace mg::cuda
