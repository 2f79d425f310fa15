// Matmul through cuBLAS against OpenBLAS on the CPU: contiguous operands, transposed
// views (passed to cuBLAS as transposes), narrowed views and views cuBLAS cannot read
// directly; and TF32 when allowed.
#include <array>
#include <vector>

#include "gpu_compare.h"

using namespace mg;
using mg::cuda_test::gpu;
using mg::cuda_test::random_cpu;
using mg::cuda_test::require_close;

namespace {
void require_matmul_close(const Tensor& actual, const Tensor& expected, int64_t k,
                          double rtol = 1e-4) {
  // cuBLAS and OpenBLAS add the k products in different orders.
  require_close(actual, expected, rtol, 1e-4 * std::sqrt(static_cast<double>(k)));
}
}  // namespace

TEST_CASE("matmul matches the CPU for contiguous and transposed operands") {
  const std::vector<std::array<int64_t, 3>> shapes = {
      {1, 1, 1}, {7, 33, 1}, {33, 7, 1000}, {1000, 33, 7}, {4097, 7, 33}, {1, 4097, 7},
      {64, 128, 96}};
  for (const auto& shape : shapes) {
    const int64_t m = shape[0], k = shape[1], n = shape[2];
    CAPTURE(m, k, n);
    const Tensor a = random_cpu({m, k}, 40);
    const Tensor b = random_cpu({k, n}, 41);
    const Tensor at = random_cpu({k, m}, 42);  // used as at.t(): [m, k]
    const Tensor bt = random_cpu({n, k}, 43);  // used as bt.t(): [k, n]
    const Tensor ag = a.to(gpu()), bg = b.to(gpu()), atg = at.to(gpu()), btg = bt.to(gpu());
    require_matmul_close(matmul(ag, bg), matmul(a, b), k);
    require_matmul_close(matmul(atg.t(), bg), matmul(at.t(), b), k);
    require_matmul_close(matmul(ag, btg.t()), matmul(a, bt.t()), k);
    require_matmul_close(matmul(atg.t(), btg.t()), matmul(at.t(), bt.t()), k);
  }
}

TEST_CASE("matmul of narrowed and non-BLAS views matches the CPU") {
  for (int64_t n : cuda_test::sizes()) {
    CAPTURE(n);
    const Tensor wide = random_cpu({n, 40}, 44);
    const Tensor w = random_cpu({12, 9}, 45);
    const Tensor wideg = wide.to(gpu()), wg = w.to(gpu());
    // A column block: row stride 40, column stride 1 (a leading dimension > cols).
    require_matmul_close(matmul(wideg.narrow(1, 3, 12), wg), matmul(wide.narrow(1, 3, 12), w), 12);
    // Every other column: neither row- nor column-major, packed before cuBLAS.
    const Tensor every_other = ops::as_strided(wide, {n, 12}, {40, 2}, 1);
    const Tensor every_other_g = ops::as_strided(wideg, {n, 12}, {40, 2}, 1);
    require_matmul_close(matmul(every_other_g, wg), matmul(every_other, w), 12);
    // A broadcast operand (stride 0).
    const Tensor row = random_cpu({1, 12}, 46);
    require_matmul_close(matmul(row.to(gpu()).expand({n, 12}), wg), matmul(row.expand({n, 12}), w), 12);
  }
}

TEST_CASE("matmul with an empty inner dimension gives zeros") {
  const Tensor a = zeros({5, 0}, DType::Float32, gpu());
  const Tensor b = zeros({0, 3}, DType::Float32, gpu());
  cuda_test::require_equal(matmul(a, b), zeros({5, 3}));
}

TEST_CASE("set_allow_tf32 is off by default and trades precision for speed") {
  REQUIRE_FALSE(cuda::allow_tf32());
  const Tensor a = random_cpu({256, 512}, 47);
  const Tensor b = random_cpu({512, 128}, 48);
  const Tensor expected = matmul(a, b);
  cuda::set_allow_tf32(true);
  REQUIRE(cuda::allow_tf32());
  const Tensor tf32 = matmul(a.to(gpu()), b.to(gpu()));
  cuda::set_allow_tf32(false);
  // TF32 keeps 10 mantissa bits: ~1e-3 relative per product, ~0.02 over 512 of them.
  require_close(tf32, expected, 2e-2, 0.2);
  require_matmul_close(matmul(a.to(gpu()), b.to(gpu())), expected, 512);
}

TEST_CASE("matmuls queued on two streams at once each get a cuBLAS workspace of their own") {
  // A long inner dimension makes cuBLAS split the sum (split-K), which keeps partial
  // sums in its workspace; GEMMs in flight on two streams must not share one.
  const int64_t k = int64_t{1} << 16;
  const Tensor a = random_cpu({48, k}, 49), b = random_cpu({k, 40}, 50);
  const Tensor expected = matmul(a, b);
  const Tensor ag = a.to(gpu()), bg = b.to(gpu());
  const Stream compute = cuda::compute_stream(0), copy = cuda::copy_stream(0);
  Event inputs_ready, copy_done;
  inputs_ready.record(compute);
  inputs_ready.block(copy);
  std::vector<Tensor> results;
  for (int i = 0; i < 8; ++i) {
    StreamGuard guard(i % 2 == 0 ? compute : copy);
    results.push_back(matmul(ag, bg));
  }
  copy_done.record(copy);
  copy_done.block(compute);
  for (const Tensor& r : results) require_matmul_close(r, expected, k);
  // Results made on the copy stream are freed there: let it finish first.
  cuda::synchronize(0);
}
