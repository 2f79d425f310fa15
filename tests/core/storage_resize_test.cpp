// Storage::resize_ frees and re-allocates a storage block in place (what FSDP does to a
// unit's gathered parameters); Tensor::set_data re-points a tensor at other memory
// keeping its identity; the CPU allocator counts the bytes storages hold.
#include "catch_compat.h"

#include <minigrad/autograd/functions.h>
#include <minigrad/core/allocator.h>
#include <minigrad/core/ops.h>
#include <minigrad/core/tensor.h>

using namespace mg;

TEST_CASE("Storage::resize_: views of a freed block fail clearly and see the re-allocated memory") {
  Tensor flat = arange(0.0, 6.0, 1.0, DType::Float32);
  const Tensor view = ops::view(ops::narrow(flat, 0, 2, 4), Shape{2, 2});
  const Tensor saved = view.detach();  // what autograd keeps: another handle, same block
  Storage storage = flat.storage();
  storage.resize_(0);
  CHECK(saved.storage().nbytes() == 0);
  REQUIRE_THROWS_WITH(saved.to_vector<float>(), MG_CONTAINS("has been freed (Storage::resize_(0))"));
  REQUIRE_THROWS_WITH(view.data_ptr(), MG_CONTAINS("shape [2, 2]"));

  storage.resize_(6 * sizeof(float));
  backend(Device::cpu()).fill(flat, 3.0);
  CHECK(saved.to_vector<float>() == std::vector<float>{3, 3, 3, 3});
  CHECK(saved.storage().is_alias_of(flat.storage()));
}

TEST_CASE("Storage::resize_: only to 0 bytes or from 0 bytes") {
  Tensor t = zeros(Shape{4});
  Storage storage = t.storage();
  REQUIRE_THROWS_WITH(storage.resize_(8),
                      MG_CONTAINS("Storage::resize_: from 16 to 8 bytes on cpu"));
  storage.resize_(16);  // the size it has: nothing to do
  CHECK(t.to_vector<float>() == std::vector<float>{0, 0, 0, 0});
}

TEST_CASE("Tensor::set_data keeps the tensor's identity and autograd state") {
  Tensor p = ones(Shape{2, 3});
  p.set_requires_grad(true);
  Tensor handle = p;  // what a module registry or an optimizer holds
  Tensor flat = zeros(Shape{10});
  p.set_data(ops::view(ops::narrow(flat, 0, 4, 6), Shape{2, 3}));
  CHECK(handle.is_same(p));
  CHECK(handle.requires_grad());
  CHECK(handle.storage().is_alias_of(flat.storage()));
  CHECK(handle.storage_offset() == 4);
  sum(mul(handle, 2.0)).backward();
  CHECK(handle.grad().to_vector<float>() == std::vector<float>(6, 2.0f));
  REQUIRE_THROWS_WITH(p.set_data(zeros(Shape{3, 2})),
                      MG_CONTAINS("set_data: new data of shape [3, 2] (float32, cpu) does not "
                                  "match the tensor's shape [2, 3]"));
}

TEST_CASE("cpu allocator: counts the bytes live storages hold, and their peak") {
  const std::size_t before = cpu_memory_allocated();
  cpu_reset_peak_memory_stats();
  {
    Tensor a = empty(Shape{1000});  // 4000 bytes
    CHECK(cpu_memory_allocated() == before + 4000);
    Tensor b = empty(Shape{250});
    CHECK(cpu_memory_allocated() == before + 5000);
  }
  CHECK(cpu_memory_allocated() == before);
  CHECK(cpu_max_memory_allocated() == before + 5000);
  cpu_reset_peak_memory_stats();
  CHECK(cpu_max_memory_allocated() == before);
  // A freed and re-allocated storage counts only while it holds memory.
  Tensor c = empty(Shape{100});
  Storage storage = c.storage();
  storage.resize_(0);
  CHECK(cpu_memory_allocated() == before);
  storage.resize_(400);
  CHECK(cpu_memory_allocated() == before + 400);
}
