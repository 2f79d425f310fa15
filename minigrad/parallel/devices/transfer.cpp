#include <minigrad/parallel/devices/transfer.h>

#include <vector>

#include <minigrad/core/ops.h>
#include <minigrad/core/stream.h>

namespace mg::parallel {

void ordered_copy_(const Tensor& dst, const Tensor& src) {
  if (src.device().is_cpu() && dst.device().is_cpu()) {  // the host runs in order
    ops::copy_(dst, src);
    return;
  }
  ordered_copy_(dst, src, current_stream(src.device()), current_stream(dst.device()));
}

void ordered_copy_(const Tensor& dst, const Tensor& src, const Stream& src_stream,
                   const Stream& dst_stream) {
  const Device from = src.device();
  const Device to = dst.device();
  MG_CHECK(src_stream.device == from && dst_stream.device == to,
           "ordered_copy_: the streams are on {} and {}, the tensors on {} and {}",
           src_stream.device, dst_stream.device, from, to);
  if (from.is_cpu() && to.is_cpu()) {  // the host runs in order: nothing to arrange
    ops::copy_(dst, src);
    return;
  }

  // The GPUs taking part; their copy streams carry the copy.
  std::vector<Device> lanes;
  if (!to.is_cpu()) lanes.push_back(to);
  if (!from.is_cpu() && from != to) lanes.push_back(from);

  Event src_ready, dst_ready;
  src_ready.record(src_stream);
  dst_ready.record(dst_stream);

  std::vector<Event> done(lanes.size());
  {
    // Nested guards: each lane's copy stream is current on its device while copying.
    // The destination's guard is the innermost, so its device is the current one.
    const Stream first = copy_stream(lanes.back());
    src_ready.block(first);
    dst_ready.block(first);
    StreamGuard outer(first);
    if (lanes.size() == 2) {
      const Stream second = copy_stream(lanes.front());
      src_ready.block(second);
      dst_ready.block(second);
      StreamGuard inner(second);
      ops::copy_(dst, src);
      done[0].record(second);
      done[1].record(first);
    } else {
      ops::copy_(dst, src);
      done[0].record(first);
    }
  }
  for (const Event& e : done) {
    if (to.is_cpu()) {
      e.synchronize();  // host memory: the host itself must wait before reading it
    } else {
      e.block(dst_stream);
    }
    if (!from.is_cpu()) e.block(src_stream);
  }
}

Tensor copy_to_device(const Tensor& src, Device device) {
  Tensor dst;
  {
    // Allocated with `device` current, hence on its current stream.
    DeviceGuard guard(device);
    dst = empty(src.shape(), src.dtype(), device);
  }
  ordered_copy_(dst, src);
  return dst;
}

}  // namespace mg::parallel
