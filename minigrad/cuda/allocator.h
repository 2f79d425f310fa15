// The CUDA device allocator: stream-ordered allocation from the device's memory pool.
//
// Why cudaMallocAsync with a pool rather than cudaMalloc: cudaMalloc/cudaFree
// synchronise the device and cost tens of microseconds, far too slow for the per-op
// temporaries of a training step. A pool whose release threshold is "never" keeps freed
// memory cached and hands it out again in stream order, which is what a caching
// allocator does, with the driver doing the bookkeeping. It is also what CUDA graph
// capture understands: an allocation made while a stream is being captured becomes a
// memory node of the graph.
//
// Stream order: a block is allocated on the thread's current stream of the device and
// freed, when its storage dies, on that same stream. Work queued on other streams that
// uses the block must be ordered before the free with events (as PyTorch's
// record_stream), which the parallel layer does when it moves tensors between streams.
#pragma once

#include <atomic>
#include <cstddef>
#include <mutex>
#include <unordered_map>
#include <vector>

#include <cuda_runtime_api.h>

#include <minigrad/core/allocator.h>
#include <minigrad/cuda/memory_stats.h>

namespace mg::cuda {

class CudaAllocator final : public Allocator, public DeviceMemoryStats {
 public:
  explicit CudaAllocator(int device) : device_(device) {}

  void* allocate(std::size_t nbytes) override;
  // Never throws (it runs from Storage destructors); failures are reported on stderr.
  void deallocate(void* ptr, std::size_t nbytes) override;

  std::size_t allocated_bytes() const override;
  std::size_t peak_allocated_bytes() const override;
  std::size_t reserved_bytes() const override;
  void reset_peak() override;

  // The device's pool (created with the release threshold set on first use).
  cudaMemPool_t pool();

 private:
  struct Block {
    cudaStream_t stream;       // allocated on, and freed on, this stream
    std::size_t nbytes;
    unsigned long long capture_id;  // non-zero: allocated while `stream` was being captured
  };
  [[noreturn]] void throw_out_of_memory(std::size_t nbytes, cudaStream_t stream);
  void free_block(void* ptr, const Block& block);
  // Frees blocks whose release had to wait for a capture to end (see deallocate).
  void release_deferred_locked();

  int device_;
  std::once_flag pool_once_;
  std::atomic<cudaMemPool_t> pool_{nullptr};
  mutable std::mutex mutex_;
  std::unordered_map<void*, Block> blocks_;
  std::vector<std::pair<void*, Block>> deferred_;
  std::size_t allocated_ = 0;
  std::size_t peak_ = 0;
};

// The allocator of device `index` (created on first use). Never destroyed.
CudaAllocator& device_allocator(int index);

}  // namespace mg::cuda
