// What a device allocator reports about itself. Plain C++ (no CUDA): cuda/api.cpp, which
// is built with and without CUDA, reads the stats of the CUDA backend's allocators
// through this interface.
#pragma once

#include <cstddef>

namespace mg::cuda {

class DeviceMemoryStats {
 public:
  virtual ~DeviceMemoryStats() = default;
  // Bytes held by live tensors (storages) on the device now.
  virtual std::size_t allocated_bytes() const = 0;
  // The most allocated_bytes() has been since start-up or the last reset_peak().
  virtual std::size_t peak_allocated_bytes() const = 0;
  // Bytes the allocator holds from the driver, in use or cached for reuse.
  virtual std::size_t reserved_bytes() const = 0;
  virtual void reset_peak() = 0;
};

}  // namespace mg::cuda
