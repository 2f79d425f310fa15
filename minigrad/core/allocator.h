// Allocator: where Storage gets its bytes. Each backend owns one per device; the CPU one
// is aligned malloc that keeps large freed blocks for reuse (core/allocator.cpp), the
// CUDA one is stream-ordered and caches (see cuda/).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

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

// What was live at the high-water mark, by block size: how a memory formula's terms are
// read off a run (torch.cuda.memory._record_memory_history and _snapshot, in brief).
// Recording costs a lock and a map update an allocation, so it is off until asked for;
// blocks allocated before it began are not counted, and the snapshot is taken where the
// blocks it counts were most, since recording began or the last cpu_reset_peak_memory_stats.
struct LiveBlocks {
  std::size_t bytes = 0;  // a block's size, as asked for
  int64_t count = 0;      // how many of that size
};
void cpu_record_memory_history(bool enabled);
std::vector<LiveBlocks> cpu_live_blocks_at_peak();  // the largest total first

// A byte count for people: "512 B", "1.50 MiB" (binary units), as the out-of-memory
// errors and the pipeline's memory plan print it.
std::string format_bytes(std::size_t bytes);

}  // namespace mg
