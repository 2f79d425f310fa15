// Storage: a refcounted block of device memory that one or more tensors view.
#pragma once

#include <cstddef>
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

  // Frees this block's memory (nbytes 0) or gives a freed block `nbytes` of fresh memory,
  // keeping the block itself: every tensor viewing it -- the tensors autograd saved for
  // backward among them -- sees the new memory, as after PyTorch's
  // untyped_storage().resize_(). FullyShardedDataParallel frees a unit's gathered
  // parameters this way between its forward and its backward. Only these two moves are
  // allowed (to 0 bytes, or from 0 bytes), so no contents are ever copied: the new
  // memory holds whatever the allocator hands out until it is written. A tensor whose
  // storage is freed fails with an mg::Error when its data is reached (Tensor::data_ptr).
  void resize_(std::size_t nbytes);

 private:
  struct Block {
    void* data;
    std::size_t nbytes;
    Device device;
    Allocator* allocator;
    Block(void* d, std::size_t n, Device dev, Allocator* a)
        : data(d), nbytes(n), device(dev), allocator(a) {}
    Block(const Block&) = delete;
    Block& operator=(const Block&) = delete;
    ~Block() { allocator->deallocate(data, nbytes); }
  };
  std::shared_ptr<Block> block_;
};

}  // namespace mg
