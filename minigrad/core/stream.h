// Device-neutral streams, events and guards. The parallel layer orders work across
// devices with these without knowing CUDA; on the CPU they are synchronous no-ops.
#pragma once

#include <minigrad/core/device.h>

namespace mg {

// A queue of work on one device. `handle` is the backend's own (a cudaStream_t on CUDA,
// nullptr on the CPU, where work runs in order on the calling thread).
struct Stream {
  Device device;
  void* handle = nullptr;
  bool operator==(const Stream& o) const { return device == o.device && handle == o.handle; }
};

Stream current_stream(Device device);   // what ops on `device` run on, for this thread
Stream compute_stream(Device device);   // the device's own compute stream
Stream copy_stream(Device device);      // the device's stream for copies between devices
// One of a few extra streams of `device` (slot k: always the same one), for work that
// must overlap with the compute stream on the same device, as two pipeline stages
// sharing a GPU (torch.cuda's stream pool). The CPU has no streams: the null stream.
Stream stream_from_pool(Device device, int slot);
void synchronize(Device device);        // waits for all work queued on `device`

// A marker recorded on a stream; another stream can wait for it without the host waiting.
class Event {
 public:
  Event() = default;
  ~Event();
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  Event(Event&& other) noexcept;
  Event& operator=(Event&& other) noexcept;

  void record(const Stream& stream);
  void block(const Stream& stream) const;  // `stream` waits for the recorded work
  void synchronize() const;                // the host waits for the recorded work

 private:
  void reset();
  Device device_;
  void* handle_ = nullptr;
};

// Sets the current device for this thread and restores the previous one on exit.
class DeviceGuard {
 public:
  explicit DeviceGuard(Device device);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  Device device_;
  int previous_index_ = 0;
};

// Makes `stream` the current stream of its device (and that device current) for this
// thread, restoring both on exit.
class StreamGuard {
 public:
  explicit StreamGuard(const Stream& stream);
  ~StreamGuard();
  StreamGuard(const StreamGuard&) = delete;
  StreamGuard& operator=(const StreamGuard&) = delete;

 private:
  DeviceGuard device_guard_;
  Stream previous_;
};

}  // namespace mg
