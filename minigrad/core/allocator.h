// Allocator: where Storage gets its bytes. Each backend owns one per device; the CPU one
// is aligned malloc that keeps large freed blocks for reuse (core/allocator.cpp), the
// CUDA one is stream-ordered and caches (see cuda/).
#pragma once

#include <cstddef>

#include <minigrad/core/device.h>

namespace mg {

class Allocator {
 public:
  virtual ~Allocator() = default;
  virtual void* allocate(std::size_t nbytes) = 0;
  virtual void deallocate(void* ptr, std::size_t nbytes) = 0;
};

// 64-byte aligned host memory: enough for AVX-512 loads and cache lines.
Allocator& cpu_allocator();

// Bytes the host allocator hands out to live storages now (blocks it keeps cached for
// reuse are not counted), and the most that has been since start-up or the last
// reset: what a pipeline's memory plan and its tests measure on CPU devices, as
// cuda::memory_allocated / max_memory_allocated do on a GPU.
std::size_t cpu_memory_allocated();
std::size_t cpu_max_memory_allocated();
void cpu_reset_peak_memory_stats();

}  // namespace mg
