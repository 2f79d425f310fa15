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
