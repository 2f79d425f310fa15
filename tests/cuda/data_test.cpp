// Copies between host and device and within a device (strided on either side), fills,
// ranges and seeded random numbers on CUDA against the CPU backend.
#include "gpu_compare.h"

using namespace mg;
using mg::cuda_test::gpu;
using mg::cuda_test::random_cpu;
using mg::cuda_test::require_close;
using mg::cuda_test::require_equal;

TEST_CASE("to() moves float32 and int64 tensors there and back unchanged") {
  for (int64_t n : cuda_test::sizes()) {
    CAPTURE(n);
    const Tensor x = random_cpu({n, 3}, 20);
    const Tensor on_gpu = x.to(gpu());
    REQUIRE(on_gpu.device() == gpu());
    require_equal(on_gpu.to(Device::cpu()), x);
    const Tensor labels = arange(-n, n);
    require_equal(labels.to(gpu()).to(Device::cpu()), labels);
  }
}

TEST_CASE("strided copies: host to device, device to host, on the device") {
  for (int64_t n : cuda_test::sizes()) {
    CAPTURE(n);
    const Tensor x = random_cpu({n, 6}, 21);
    const Tensor xg = x.to(gpu());
    // Device to host from a transposed and a narrowed view.
    require_equal(xg.t().to(Device::cpu()), x.t().contiguous());
    require_equal(xg.narrow(1, 2, 3).to(Device::cpu()), x.narrow(1, 2, 3).contiguous());
    // On the device: a strided source packed contiguously.
    require_equal(xg.t().contiguous(), x.t().contiguous());
    // Host to device into a strided destination, from a strided source.
    Tensor dst = zeros({6, n}, DType::Float32, gpu());
    NoGradGuard no_grad;
    dst.t().copy_(x);
    require_equal(dst, x.t().contiguous());
    Tensor dst2 = zeros({n, 3}, DType::Float32, gpu());
    dst2.copy_(x.narrow(1, 1, 3));
    require_equal(dst2, x.narrow(1, 1, 3).contiguous());
    // Device to host into a strided host destination.
    Tensor host = zeros({6, n});
    host.t().copy_(xg);
    require_equal(host, x.t().contiguous());
    // A broadcast source (stride 0) on the device.
    Tensor rows = zeros({n, 6}, DType::Float32, gpu());
    rows.copy_(xg.narrow(0, 0, 1));
    require_equal(rows, x.narrow(0, 0, 1).expand({n, 6}).contiguous());
  }
}

TEST_CASE("fill and arange match the CPU") {
  for (int64_t n : cuda_test::sizes()) {
    CAPTURE(n);
    require_equal(full({n, 2}, 3.5, DType::Float32, gpu()), full({n, 2}, 3.5));
    require_equal(zeros({n}, DType::Float32, gpu()), zeros({n}));
    require_equal(ones({n}, DType::Int64, gpu()), ones({n}, DType::Int64));
    require_equal(full({n}, -7, DType::Int64, gpu()), full({n}, -7, DType::Int64));
    require_equal(arange(0.5, 0.5 + 0.25 * n, 0.25, DType::Float32, gpu()),
                  arange(0.5, 0.5 + 0.25 * n, 0.25, DType::Float32));
    require_equal(arange(-3, n - 3, 1, DType::Int64, gpu()), arange(-3, n - 3, 1, DType::Int64));
    // fill_ on a strided view.
    Tensor t = zeros({n, 4}, DType::Float32, gpu());
    Tensor h = zeros({n, 4});
    NoGradGuard no_grad;
    t.narrow(1, 1, 2).fill_(2.0);
    h.narrow(1, 1, 2).fill_(2.0);
    require_equal(t, h);
  }
}

TEST_CASE("a seed gives the same random tensors as on the CPU") {
  for (int64_t n : cuda_test::sizes()) {
    CAPTURE(n);
    manual_seed(1234);
    const Tensor u_gpu = rand({n, 3}, gpu());
    const Tensor z_gpu = randn({n, 3}, gpu());
    manual_seed(1234);
    const Tensor u_cpu = rand({n, 3});
    const Tensor z_cpu = randn({n, 3});
    require_equal(u_gpu, u_cpu);  // same Philox words, same float arithmetic
    // CUDA's logf/sinf/cosf differ from glibc's by an ulp or two.
    require_close(z_gpu, z_cpu, 1e-5, 1e-5);
    // In-place initialisers go through the same kernels.
    Tensor w_gpu = empty({n}, DType::Float32, gpu()), w_cpu = empty({n});
    NoGradGuard no_grad;
    manual_seed(99);
    w_gpu.uniform_(-0.5, 0.25);
    manual_seed(99);
    w_cpu.uniform_(-0.5, 0.25);
    require_equal(w_gpu, w_cpu);
  }
}
