#include <minigrad/cuda/layout.h>

#include <minigrad/cuda/backend.h>

namespace mg::cuda {

DeviceScratch::DeviceScratch(int device, std::size_t nbytes)
    : allocator_(cuda_backend().allocator(device)),
      nbytes_(nbytes),
      data_(allocator_.allocate(nbytes)) {}

DeviceScratch::~DeviceScratch() { allocator_.deallocate(data_, nbytes_); }

}  // namespace mg::cuda
