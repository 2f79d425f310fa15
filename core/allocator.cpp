#include <minigrad/core/allocator.h>

#include <cstdlib>

#include <minigrad/core/error.h>

namespace mg {
namespace {

class CpuAllocator final : public Allocator {
 public:
  void* allocate(std::size_t nbytes) override {
    if (nbytes == 0) return nullptr;
    constexpr std::size_t kAlignment = 64;
    const std::size_t rounded = (nbytes + kAlignment - 1) / kAlignment * kAlignment;
    void* ptr = std::aligned_alloc(kAlignment, rounded);
    MG_CHECK(ptr != nullptr, "cpu allocator: out of memory allocating {} bytes", nbytes);
    return ptr;
  }
  void deallocate(void* ptr, std::size_t) override { std::free(ptr); }
};

}  // namespace

Allocator& cpu_allocator() {
  static CpuAllocator allocator;
  return allocator;
}

}  // namespace mg
