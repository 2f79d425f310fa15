// The CPU allocator: 64-byte aligned blocks, and large freed blocks kept by size and
// handed out again (so a training step does not page-fault its activations back in).
#include "catch_compat.h"

#include <cstdint>
#include <cstring>

#include <minigrad/core/allocator.h>
#include <minigrad/core/tensor.h>

using namespace mg;

TEST_CASE("cpu allocator: blocks are 64-byte aligned, small and large") {
  Allocator& a = cpu_allocator();
  for (std::size_t n : {std::size_t{1}, std::size_t{100}, std::size_t{1} << 20}) {
    void* p = a.allocate(n);
    REQUIRE(p != nullptr);
    CHECK(reinterpret_cast<std::uintptr_t>(p) % 64 == 0);
    std::memset(p, 0xab, n);  // the whole block is writable
    a.deallocate(p, n);
  }
  CHECK(a.allocate(0) == nullptr);
  a.deallocate(nullptr, 0);  // a no-op
}

TEST_CASE("cpu allocator: a freed large block is reused for the same size") {
  Allocator& a = cpu_allocator();
  const std::size_t n = (std::size_t{3} << 20) + 12;  // an odd size, cached by its rounding
  void* first = a.allocate(n);
  a.deallocate(first, n);
  void* second = a.allocate(n);
  CHECK(second == first);
  // A different size does not take it.
  void* other = a.allocate(n + 4096);
  CHECK(other != first);
  a.deallocate(other, n + 4096);
  a.deallocate(second, n);
}

TEST_CASE("cpu allocator: tensors made from reused blocks hold what is written into them") {
  // The same storage size, freed and made again: contents come from the new writes only.
  for (int round = 0; round < 3; ++round) {
    Tensor t = full({512, 512}, static_cast<double>(round));
    const auto v = t.to_vector<float>();
    CHECK(v.front() == static_cast<float>(round));
    CHECK(v.back() == static_cast<float>(round));
  }
}

TEST_CASE("cpu allocator: counts the bytes of live storages and their peak") {
  const std::size_t before = cpu_memory_allocated();
  cpu_reset_peak_memory_stats();
  {
    Tensor a = empty({1000}, DType::Float32);
    CHECK(cpu_memory_allocated() == before + 4000);
    {
      Tensor b = empty({250}, DType::Float32);
      CHECK(cpu_memory_allocated() == before + 5000);
    }
    CHECK(cpu_memory_allocated() == before + 4000);
  }
  CHECK(cpu_memory_allocated() == before);
  CHECK(cpu_max_memory_allocated() == before + 5000);
  cpu_reset_peak_memory_stats();
  CHECK(cpu_max_memory_allocated() == before);
}

TEST_CASE("cpu allocator: the live blocks at the peak, by size, while recording") {
  const Tensor before_recording = empty({300}, DType::Float32);  // not counted: made before
  cpu_record_memory_history(true);
  cpu_reset_peak_memory_stats();
  {
    Tensor a = empty({1000}, DType::Float32), b = empty({1000}, DType::Float32);
    Tensor c = empty({250}, DType::Float32);
    {
      Tensor d = empty({10}, DType::Float64);  // the peak: a, b, c and d
    }
    Tensor e = empty({20}, DType::Float32);  // after it, lower: not in the snapshot
  }
  const std::vector<LiveBlocks> at_peak = cpu_live_blocks_at_peak();
  REQUIRE(at_peak.size() == 3);  // the largest total first
  CHECK(at_peak[0].bytes == 4000);
  CHECK(at_peak[0].count == 2);
  CHECK(at_peak[1].bytes == 1000);
  CHECK(at_peak[1].count == 1);
  CHECK(at_peak[2].bytes == 80);
  CHECK(at_peak[2].count == 1);
  // A reset starts from what is live now (nothing recorded); turned off, it forgets.
  cpu_reset_peak_memory_stats();
  CHECK(cpu_live_blocks_at_peak().empty());
  {
    Tensor f = empty({64}, DType::Float32);
  }
  REQUIRE(cpu_live_blocks_at_peak().size() == 1);
  CHECK(cpu_live_blocks_at_peak()[0].bytes == 256);
  cpu_record_memory_history(false);
  CHECK(cpu_live_blocks_at_peak().size() == 1);  // the last snapshot stays until a reset
}
