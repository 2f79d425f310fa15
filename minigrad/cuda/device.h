// Devices as the CUDA backend sees them: how many there are, which one this thread is
// on, and setting it cheaply before each op. Internal to cuda/.
#pragma once

namespace mg::cuda {

// The number of visible devices (CUDA_VISIBLE_DEVICES applies, as in the runtime). Zero,
// not an error, when there is no driver or no GPU. Asked once, on first use: nothing
// here touches CUDA during static initialisation.
int visible_device_count();

// Throws an mg::Error naming `op` when `index` is not a visible device.
void check_device_index(int index, const char* op);

// The device the CUDA runtime holds current for this thread.
int runtime_current_device();

// Makes `index` the current device of this thread. The runtime keeps the current device
// per thread, so reading it back is a cheap thread-local read; setting it is skipped
// when it already matches. (Reading it instead of caching it in our own thread-local
// keeps us right when other code, e.g. NCCL or a user, calls cudaSetDevice directly.)
void ensure_device(int index);

// Sets `index` current for a scope and restores the previous device after it.
class ScopedDevice {
 public:
  explicit ScopedDevice(int index);
  ~ScopedDevice();
  ScopedDevice(const ScopedDevice&) = delete;
  ScopedDevice& operator=(const ScopedDevice&) = delete;

 private:
  int previous_;
  int index_;
};

}  // namespace mg::cuda
