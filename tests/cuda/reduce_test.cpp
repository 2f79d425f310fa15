// Sums over every combination of dims (full, last dim, first dim, middle, several) and
// argmax on CUDA against the CPU backend.
#include <cmath>
#include <utility>
#include <vector>

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

TEST_CASE("large column sums (bias gradients) match the CPU") {
  // Odd row and column counts: the last unrolled step of each split and the last block
  // of 32 columns are partial. [8192, 10] is the classifier's bias gradient (many
  // splits of few columns); [100, 8192] has too few rows to split.
  const std::vector<std::pair<int64_t, int64_t>> shapes = {
      {8193, 4099}, {8192, 10}, {100, 8192}, {65, 33}, {64, 32}};
  for (const auto& [rows, cols] : shapes) {
    CAPTURE(rows, cols);
    const Tensor x = random_cpu({rows, cols}, 37);
    const Tensor xg = x.to(gpu());
    require_sum_close(xg.sum({0}), x.sum({0}), rows);
    // A narrowed view: the same row stride as x, fewer columns.
    require_sum_close(xg.narrow(1, 1, cols - 1).sum({0}),
                      x.narrow(1, 1, cols - 1).sum({0}), rows);
  }
  // int64 column sums are exact.
  const Tensor labels = arange(0, 2049 * 515).reshape({2049, 515});
  require_equal(labels.to(gpu()).sum({0}), labels.sum({0}));
  // Summed dims that do not collapse into one (a transposed batch): the indexer path.
  const Tensor x = random_cpu({4, 300, 70}, 38);
  require_sum_close(x.to(gpu()).transpose(0, 1).sum({0, 1}), x.transpose(0, 1).sum({0, 1}), 1200);
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

TEST_CASE("argmax ties and NaNs across the lanes of a warp match the CPU") {
  for (int64_t cols : {int64_t{33}, int64_t{100}, int64_t{1000}}) {
    CAPTURE(cols);
    // Values in {0, 1, 2}: most rows hold their maximum in several columns, in the same
    // lane and in different lanes; the first one wins on both backends.
    manual_seed(35);
    std::vector<float> small;
    for (int64_t v : randint(0, 3, {64, cols}).to_vector<int64_t>()) small.push_back(float(v));
    const Tensor ties = from_vector(small, {64, cols});
    require_equal(ties.to(gpu()).argmax(-1), ties.argmax(-1));
    // NaN is the maximum, as in PyTorch: the first NaN of a row wins.
    std::vector<float> values = random_cpu({4, cols}, 36).to_vector<float>();
    const auto c = static_cast<size_t>(cols);
    values[0 * c + 0] = NAN;                                            // row 0: NaN first
    values[1 * c + 1] = NAN;                                            // row 1: NaN in lane 1,
    values[1 * c + 33] = 100.0f;                                        //   the max after it
    for (size_t j = 1; j < c; ++j) values[2 * c + j] = NAN;             // row 2: all but col 0
    values[3 * c + c - 1] = NAN;                                        // row 3: NaN last
    const Tensor with_nans = from_vector(values, {4, cols});
    require_equal(with_nans.to(gpu()).argmax(-1), with_nans.argmax(-1));
    CHECK(with_nans.to(gpu()).argmax(-1).to_vector<int64_t>() ==
          std::vector<int64_t>{0, 1, 1, cols - 1});
  }
}

TEST_CASE("abs_max matches the CPU exactly, NaN wins, across many blocks") {
  for (int64_t n : cuda_test::sizes()) {
    CAPTURE(n);
    const Tensor x = random_cpu({n, 3}, 40);
    require_equal(ops::abs_max(x.to(gpu())), ops::abs_max(x));
    require_equal(ops::abs_max(x.to(gpu()).t()), ops::abs_max(x.t()));  // through a copy
  }
  // More elements than the grid's threads: each thread walks several, blocks combine.
  std::vector<float> values(3 * (1 << 20) + 7, 0.25f);
  values[2'000'001] = -9.5f;
  const Tensor big = from_vector(values, {static_cast<int64_t>(values.size())});
  REQUIRE(ops::abs_max(big.to(gpu())).item<float>() == 9.5f);
  values[17] = std::nanf("");
  const Tensor with_nan = from_vector(values, {static_cast<int64_t>(values.size())});
  REQUIRE(std::isnan(ops::abs_max(with_nan.to(gpu())).item<float>()));
  REQUIRE(ops::abs_max(zeros({0}, DType::Float32, gpu())).item<float>() == 0.0f);
}

TEST_CASE("argmax of float64 and int64 matches the CPU, ties and empty rows included") {
  for (int64_t n : cuda_test::sizes()) {
    CAPTURE(n);
    const Tensor x = ops::to_dtype(random_cpu({n, 33}, 37), DType::Float64);
    require_equal(x.to(gpu()).argmax(-1), x.argmax(-1));
    require_equal(x.to(gpu()).argmax(0), x.argmax(0));
    manual_seed(38);
    const Tensor ints = randint(-3, 3, {n, 40});  // many ties, across lanes
    require_equal(ints.to(gpu()).argmax(-1), ints.argmax(-1));
    require_equal(ints.to(gpu()).t().argmax(-1), ints.t().argmax(-1));
  }
  // No rows: an empty result, no kernel.
  CHECK(zeros({0, 5}, DType::Int64, gpu()).argmax(-1).shape() == Shape{0});
}
