#include <minigrad/core/storage.h>

#include <minigrad/core/backend.h>

namespace mg {

Storage::Storage(std::size_t nbytes, Device device) {
  Allocator& allocator = backend(device).allocator(device.index());
  void* data = allocator.allocate(nbytes);
  block_ = std::make_shared<Block>(data, nbytes, device, &allocator);
}

void Storage::resize_(std::size_t nbytes) {
  MG_CHECK(block_ != nullptr, "Storage::resize_: the storage is undefined");
  if (nbytes == block_->nbytes) return;
  MG_CHECK(nbytes == 0 || block_->nbytes == 0,
           "Storage::resize_: from {} to {} bytes on {}; a storage is only freed (resized to 0) "
           "or re-allocated once freed, never resized while it holds data",
           block_->nbytes, nbytes, block_->device);
  if (nbytes == 0) {
    block_->allocator->deallocate(block_->data, block_->nbytes);
    block_->data = nullptr;
    block_->nbytes = 0;
    block_->freed = true;
  } else {
    block_->data = block_->allocator->allocate(nbytes);
    block_->nbytes = nbytes;
    block_->freed = false;
  }
}

}  // namespace mg
