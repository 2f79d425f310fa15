// Storage: a refcounted block of device memory that one or more tensors view, and the
// version counter those views share.
//
// The version counter (PyTorch: the VariableVersion every view of a base shares) counts
// the in-place writes to the block: autograd remembers it when it saves a tensor for
// backward, and backward refuses a saved tensor whose memory was rewritten since
// (autograd/saved_tensor.h). It lives here, beside the memory, so that every tensor
// that can see the memory (views, detach(), a parameter and its DataParallel replica 0)
// sees one counter, whichever way it was made.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>

#include <minigrad/core/allocator.h>
#include <minigrad/core/device.h>

namespace mg {

class Storage {
 public:
  Storage() = default;
  // Allocates `nbytes` on `device` from that device's allocator.
  Storage(std::size_t nbytes, Device device);

  void* data() const { return block_ ? block_->data : nullptr; }
  std::size_t nbytes() const { return block_ ? block_->nbytes : 0; }
  Device device() const { return block_ ? block_->device : Device::cpu(); }
  bool defined() const { return block_ != nullptr; }
  // True when both share one block (used by tests of views).
  bool is_alias_of(const Storage& other) const { return block_ == other.block_; }
  // How many tensors share this block; autograd steals a gradient buffer only when 1.
  long use_count() const { return block_.use_count(); }

  // How many in-place writes the block has seen (0 for an undefined storage).
  uint64_t version() const { return block_ ? block_->version.load(std::memory_order_relaxed) : 0; }
  // The name of the operation that last wrote the block in place ("mul_", "copy_", ...),
  // or null; quoted by the error of a stale saved tensor.
  const char* last_writer() const {
    return block_ ? block_->last_writer.load(std::memory_order_relaxed) : nullptr;
  }
  // Records one in-place write by `op` (a string literal: it is kept, not copied).
  // Atomic, since DataParallel's replicas write from worker threads.
  void bump_version(const char* op) const {
    if (!block_) return;
    block_->last_writer.store(op, std::memory_order_relaxed);
    block_->version.fetch_add(1, std::memory_order_relaxed);
  }
  // Sets the counter back (autograd::UnsafePreserveVersionCounter only).
  void set_version(uint64_t version) const {
    if (block_) block_->version.store(version, std::memory_order_relaxed);
  }
  // Frees this block's memory (nbytes 0) or gives a freed block `nbytes` of fresh memory,
  // keeping the block itself: every tensor viewing it -- the tensors autograd saved for
  // backward among them -- sees the new memory, as after PyTorch's
  // untyped_storage().resize_(). FSDP (fully_shard) frees a unit's gathered
  // parameters this way between its forward and its backward. Only these two moves are
  // allowed (to 0 bytes, or from 0 bytes), so no contents are ever copied: the new
  // memory holds whatever the allocator hands out until it is written. A tensor whose
  // storage is freed fails with an mg::Error when its data is reached (Tensor::data_ptr).
  void resize_(std::size_t nbytes);
  // True between a resize_(0) and the next re-allocation (not for a storage made empty).
  bool is_freed() const { return block_ && block_->freed; }

 private:
  struct Block {
    void* data;
    std::size_t nbytes;
    Device device;
    Allocator* allocator;
    std::atomic<uint64_t> version{0};
    std::atomic<const char*> last_writer{nullptr};
    bool freed = false;  // by resize_(0)
    Block(void* d, std::size_t n, Device dev, Allocator* a)
        : data(d), nbytes(n), device(dev), allocator(a) {}
    Block(const Block&) = delete;
    Block& operator=(const Block&) = delete;
    ~Block() { allocator->deallocate(data, nbytes); }
  };
  std::shared_ptr<Block> block_;
};

}  // namespace mg
