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

}  // namespace mg
