// Sums over every combination of dims (full, last dim, first dim, middle, several) and
// argmax on CUDA against the CPU backend.
#include "gpu_compare.h"

using namespace mg;
using mg::cuda_test::gpu;
using mg::cuda_test::random_cpu;
using mg::cuda_test::require_close;
using mg::cuda_test::require_equal;

namespace {
// Float sums are added in different orders on the two backends (the CPU's partial sums
// are floats); the rounding differences grow like sqrt(summed).
void require_sum_close(const Tensor& actual, const Tensor& expected, int64_t summed) {
  require_close(actual, expected, 1e-4, 1e-4 * std::sqrt(static_cast<double>(summed)));
}
}  // namespace

TEST_CASE("full sums match the CPU") {
  for (int64_t n : cuda_test::sizes()) {
    CAPTURE(n);
    const Tensor x = random_cpu({n, 3}, 30);
    const Tensor xg = x.to(gpu());
    require_sum_close(xg.sum(), x.sum(), 3 * n);
    require_sum_close(xg.t().sum(), x.sum(), 3 * n);
    require_sum_close(xg.mean(), x.mean(), 1);
  }
  // Large enough to split the sum over many blocks.
  const Tensor big = random_cpu({1 << 22}, 31);
  require_sum_close(big.to(gpu()).sum(), big.sum(), 1 << 22);
}

TEST_CASE("sums over the last dim and over the first dim (bias gradients)") {
  for (int64_t rows : cuda_test::sizes()) {
    for (int64_t cols : {int64_t{1}, int64_t{10}, int64_t{33}, int64_t{1000}}) {
      CAPTURE(rows, cols);
      const Tensor x = random_cpu({rows, cols}, 32);
      const Tensor xg = x.to(gpu());
      require_sum_close(xg.sum({1}), x.sum({1}), cols);
      require_sum_close(xg.sum({0}), x.sum({0}), rows);
      require_sum_close(xg.sum({0}, true), x.sum({0}, true), rows);
      // The same through a transposed view.
      require_sum_close(xg.t().sum({0}), x.t().sum({0}), cols);
      require_sum_close(xg.t().sum({1}), x.t().sum({1}), rows);
    }
  }
}

TEST_CASE("sums over middle and several dims, and int64 sums") {
  for (int64_t n : cuda_test::sizes()) {
    CAPTURE(n);
    const Tensor x = random_cpu({3, n, 5}, 33);
    const Tensor xg = x.to(gpu());
    require_sum_close(xg.sum({1}), x.sum({1}), n);
    require_sum_close(xg.sum({0, 2}), x.sum({0, 2}), 15);
    require_sum_close(xg.sum({0, 2}, true), x.sum({0, 2}, true), 15);
    require_sum_close(xg.sum({2}), x.sum({2}), 5);
    require_sum_close(xg.transpose(0, 2).sum({1}), x.transpose(0, 2).sum({1}), n);
    // A broadcast gradient summed back to a bias shape (ops::sum_to).
    require_sum_close(ops::sum_to(xg, {1, n, 1}), ops::sum_to(x, {1, n, 1}), 15);
    const Tensor labels = arange(0, 3 * n).reshape({3, n});
    require_equal(labels.to(gpu()).sum({1}), labels.sum({1}));
    require_equal(labels.to(gpu()).sum(), labels.sum());
  }
}

TEST_CASE("argmax over rows matches the CPU") {
  for (int64_t n : cuda_test::sizes()) {
    CAPTURE(n);
    const Tensor x = random_cpu({n, 33}, 34);
    const Tensor xg = x.to(gpu());
    require_equal(xg.argmax(-1), x.argmax(-1));
    require_equal(xg.argmax(0), x.argmax(0));
    require_equal(xg.t().argmax(-1), x.t().argmax(-1));
    // Ties go to the first maximum, as on the CPU.
    const Tensor ties = zeros({n, 9}, DType::Float32, gpu());
    require_equal(ties.argmax(-1), zeros({n}, DType::Int64));
  }
}
