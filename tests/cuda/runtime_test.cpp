// The CUDA runtime layer: devices, streams and events, the allocator's statistics and
// its out-of-memory error, and errors for devices that do not exist.
#include <thread>

#include "gpu_compare.h"

using namespace mg;
using mg::cuda_test::gpu;
using mg::cuda_test::random_cpu;
using mg::cuda_test::require_close;
using mg::cuda_test::require_equal;

TEST_CASE("devices are visible and named in errors when missing") {
  REQUIRE(cuda::is_available());
  REQUIRE(cuda::device_count() >= 1);
  const int missing = cuda::device_count() + 3;
  REQUIRE_THROWS_WITH(zeros({2}, DType::Float32, Device::cuda(missing)),
                      MG_CONTAINS(fmt::format("cuda:{} is not available", missing)));
  REQUIRE_THROWS_WITH(cuda::set_device(missing), MG_CONTAINS("is not available"));
}

TEST_CASE("each device has its own compute and copy streams") {
  const Stream compute = cuda::compute_stream(0);
  const Stream copy = cuda::copy_stream(0);
  REQUIRE(compute.handle != nullptr);  // never the legacy default stream
  REQUIRE(copy.handle != nullptr);
  REQUIRE_FALSE(compute == copy);
  REQUIRE(cuda::current_stream(0) == compute);
  {
    StreamGuard guard(copy);
    REQUIRE(cuda::current_stream(0) == copy);
    REQUIRE(cuda::current_device() == 0);
  }
  REQUIRE(cuda::current_stream(0) == compute);
}

TEST_CASE("the current stream is per thread") {
  const Stream copy = cuda::copy_stream(0);
  StreamGuard guard(copy);
  Stream seen_by_worker;
  std::thread worker([&] { seen_by_worker = cuda::current_stream(0); });
  worker.join();
  REQUIRE(seen_by_worker == cuda::compute_stream(0));
  REQUIRE(cuda::current_stream(0) == copy);
}

TEST_CASE("an event orders work across streams") {
  const Tensor x = random_cpu({1 << 20}, 90);
  const Tensor xg = x.to(gpu());
  cuda::synchronize(0);
  Tensor produced;
  Event done;
  {
    // Produced on the copy stream...
    StreamGuard guard(cuda::copy_stream(0));
    produced = exp(xg) * 2.0;
    done.record(cuda::current_stream(0));
  }
  // ...consumed on the compute stream once it has waited for the event.
  done.block(cuda::current_stream(0));
  const Tensor consumed = produced + 1.0;
  done.synchronize();
  require_close(consumed, exp(x) * 2.0 + 1.0, 1e-6, 1e-6);
  // The producer's tensor was allocated on the copy stream; wait before it is freed.
  cuda::synchronize(0);
}

TEST_CASE("work on two devices and copies between them") {
  if (cuda::device_count() < 2) {
    SUCCEED("one GPU: nothing to copy between");
    return;
  }
  const Tensor x = random_cpu({1000, 33}, 91);
  const Tensor on0 = x.to(Device::cuda(0));
  const Tensor on1 = on0.to(Device::cuda(1));
  REQUIRE(on1.device() == Device::cuda(1));
  require_equal(on1, x);
  require_equal(on0.t().to(Device::cuda(1)), x.t().contiguous());  // strided source
  require_close(matmul(on1, on1.t()), matmul(x, x.t()), 1e-4, 1e-3);
  REQUIRE(cuda::current_device() == 0);  // ops restore the caller's device
}

TEST_CASE("memory statistics follow allocations, with a high-water mark") {
  cuda::synchronize(0);
  const std::size_t before = cuda::memory_allocated(0);
  cuda::reset_peak_memory_stats(0);
  REQUIRE(cuda::max_memory_allocated(0) == before);
  {
    const Tensor a = empty({1 << 20}, DType::Float32, gpu());  // 4 MiB
    REQUIRE(cuda::memory_allocated(0) == before + (4u << 20));
    {
      const Tensor b = empty({1 << 18}, DType::Int64, gpu());  // 2 MiB
      REQUIRE(cuda::memory_allocated(0) == before + (6u << 20));
    }
    REQUIRE(cuda::memory_allocated(0) == before + (4u << 20));
  }
  REQUIRE(cuda::memory_allocated(0) == before);
  REQUIRE(cuda::max_memory_allocated(0) == before + (6u << 20));
  REQUIRE(cuda::memory_reserved(0) >= (6u << 20));  // cached by the pool, not returned
  cuda::reset_peak_memory_stats(0);
  REQUIRE(cuda::max_memory_allocated(0) == before);
  REQUIRE(cuda::memory_allocated() == cuda::memory_allocated(cuda::current_device()));
}

TEST_CASE("freed memory is reused rather than requested again") {
  cuda::synchronize(0);
  { const Tensor warm = empty({1 << 22}, DType::Float32, gpu()); }
  cuda::synchronize(0);
  const std::size_t reserved = cuda::memory_reserved(0);
  for (int i = 0; i < 20; ++i) {
    const Tensor t = empty({1 << 22}, DType::Float32, gpu());
  }
  cuda::synchronize(0);
  REQUIRE(cuda::memory_reserved(0) == reserved);
}

TEST_CASE("running out of memory names the device, the size and the free memory") {
  // 4 TiB: more than any GPU has.
  REQUIRE_THROWS_WITH(empty({int64_t{1} << 40}, DType::Float32, gpu()),
                      MG_CONTAINS("CUDA out of memory on cuda:0: tried to allocate 4.00 TiB"));
  REQUIRE_THROWS_WITH(empty({int64_t{1} << 40}, DType::Float32, gpu()), MG_CONTAINS("free of"));
  // The failure leaves the device usable.
  require_equal(ones({7}, DType::Float32, gpu()), ones({7}));
}

TEST_CASE("ops leave the caller's current device and stream alone") {
  const int device = cuda::current_device();
  const Tensor y = relu(random_cpu({33}, 92).to(gpu()));
  REQUIRE(cuda::current_device() == device);
  REQUIRE(cuda::current_stream(0) == cuda::compute_stream(0));
  cuda::synchronize();
  REQUIRE(y.device() == gpu());
}
