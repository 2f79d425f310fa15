#include <minigrad/core/stream.h>

#include <minigrad/core/backend.h>

namespace mg {

Stream current_stream(Device device) { return backend(device).current_stream(device.index()); }
Stream compute_stream(Device device) { return backend(device).compute_stream(device.index()); }
Stream copy_stream(Device device) { return backend(device).copy_stream(device.index()); }
Stream stream_from_pool(Device device, int slot) {
  return backend(device).pool_stream(device.index(), slot);
}
void synchronize(Device device) { backend(device).synchronize(device.index()); }

Event::~Event() { reset(); }

Event::Event(Event&& other) noexcept : device_(other.device_), handle_(other.handle_) {
  other.handle_ = nullptr;
}

Event& Event::operator=(Event&& other) noexcept {
  if (this != &other) {
    reset();
    device_ = other.device_;
    handle_ = other.handle_;
    other.handle_ = nullptr;
  }
  return *this;
}

void Event::reset() {
  if (handle_ != nullptr) backend(device_).event_destroy(handle_);
  handle_ = nullptr;
}

void Event::record(const Stream& stream) {
  if (handle_ != nullptr && device_ != stream.device) reset();
  if (handle_ == nullptr) {
    device_ = stream.device;
    handle_ = backend(device_).event_create(device_.index());
  }
  backend(device_).event_record(handle_, stream);
}

void Event::block(const Stream& stream) const {
  // An event never recorded has nothing to wait for, as with CUDA events.
  if (handle_ != nullptr) backend(stream.device).event_block(handle_, stream);
}

void Event::synchronize() const {
  if (handle_ != nullptr) backend(device_).event_synchronize(handle_);
}

DeviceGuard::DeviceGuard(Device device) : device_(device) {
  Backend& b = backend(device);
  previous_index_ = b.current_device();
  if (previous_index_ != device.index()) b.set_device(device.index());
}

DeviceGuard::~DeviceGuard() {
  Backend& b = backend(device_);
  if (b.current_device() != previous_index_) b.set_device(previous_index_);
}

StreamGuard::StreamGuard(const Stream& stream)
    : device_guard_(stream.device), previous_(current_stream(stream.device)) {
  backend(stream.device).set_current_stream(stream);
}

StreamGuard::~StreamGuard() { backend(previous_.device).set_current_stream(previous_); }

}  // namespace mg
