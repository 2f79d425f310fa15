// Allocator: where Storage gets its bytes. Each backend owns one per device; the CPU one
// is aligned malloc that keeps large freed blocks for reuse (core/allocator.cpp), the
// CUDA one is stream-ordered and caches (see cuda/).
#pragma once

#include <cstddef>
#include <string>

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

// What cpu_allocator() hands out, counted in the bytes asked for (as
// cuda::memory_allocated counts a GPU's): held by live storages now, and the most held
// since start-up or the last reset. Per process, so per rank of a distributed job: the
// memory tests and benchmarks of sharded data parallelism read these.
std::size_t cpu_memory_allocated();
std::size_t cpu_max_memory_allocated();
void cpu_reset_peak_memory_stats();

// A byte count for people: "512 B", "1.50 MiB" (binary units), as the out-of-memory
// errors and the pipeline's memory plan print it.
std::string format_bytes(std::size_t bytes);

}  // namespace mg
