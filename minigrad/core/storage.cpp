#include <minigrad/core/storage.h>

#include <minigrad/core/backend.h>

namespace mg {

Storage::Storage(std::size_t nbytes, Device device) {
  Allocator& allocator = backend(device).allocator(device.index());
  void* data = allocator.allocate(nbytes);
  block_ = std::make_shared<Block>(data, nbytes, device, &allocator);
}

}  // namespace mg
