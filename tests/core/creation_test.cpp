// Creating tensors (zeros, ones, full, arange, from_vector, rand, randn, randint), reading
// them back (item, to_vector), and printing them with fmt.
#include "catch_compat.h"

#include <cmath>

#include <fmt/format.h>

#include <minigrad/core/generator.h>
#include <minigrad/core/tensor.h>

using namespace mg;

TEST_CASE("zeros, ones, full: shape, dtype, device and values") {
  const Tensor z = zeros({2, 3});
  CHECK(z.shape() == Shape{2, 3});
  CHECK(z.dtype() == DType::Float32);
  CHECK(z.device() == Device::cpu());
  CHECK(z.is_contiguous());
  CHECK(z.strides() == std::vector<int64_t>{3, 1});
  CHECK(z.to_vector<float>() == std::vector<float>(6, 0.0f));
  CHECK(ones({5}).to_vector<float>() == std::vector<float>(5, 1.0f));
  CHECK(full({1, 9}, -2.5).to_vector<float>() == std::vector<float>(9, -2.5f));
  CHECK(zeros({3}, DType::Int64).to_vector<int64_t>() == std::vector<int64_t>{0, 0, 0});
  CHECK(full({2}, 7.0, DType::Int64).to_vector<int64_t>() == std::vector<int64_t>{7, 7});
  CHECK(full(Shape{}, 4.0).item<float>() == 4.0f);
  CHECK(scalar_tensor(3.0).dim() == 0);
  CHECK(scalar_tensor(3.0).numel() == 1);
  CHECK(zeros({0, 4}).numel() == 0);
  CHECK(zeros({0, 4}).to_vector<float>().empty());
  const Tensor like = ones_like(full({3, 1}, 2.0, DType::Int64));
  CHECK(like.shape() == Shape{3, 1});
  CHECK(like.dtype() == DType::Int64);
  CHECK(zeros_like(z).to_vector<float>() == z.to_vector<float>());
}

TEST_CASE("arange: float and int64, fractional and negative steps") {
  CHECK(arange(5.0).to_vector<int64_t>() == std::vector<int64_t>{0, 1, 2, 3, 4});
  CHECK(arange(5.0).dtype() == DType::Int64);
  CHECK(arange(2.0, 7.0, 2.0).to_vector<int64_t>() == std::vector<int64_t>{2, 4, 6});
  CHECK(arange(5.0, 0.0, -2.0).to_vector<int64_t>() == std::vector<int64_t>{5, 3, 1});
  CHECK(arange(3.0, 3.0).numel() == 0);
  CHECK(arange(3.0, 1.0).numel() == 0);  // an empty range, not an error, as in PyTorch

  const std::vector<float> f = arange(0.0, 1.0, 0.25, DType::Float32).to_vector<float>();
  CHECK(f == std::vector<float>{0.0f, 0.25f, 0.5f, 0.75f});
  // 0.3 / 0.1 is 2.9999... in double: three elements, as torch.arange(0, 0.3, 0.1).
  const std::vector<float> tenth = arange(0.0, 0.3, 0.1, DType::Float32).to_vector<float>();
  REQUIRE(tenth.size() == 3);
  CHECK(tenth[2] == Approx(0.2f));
  // 1.0 / 0.1 is exactly 10 in double: ten elements, the last 0.9.
  const std::vector<float> ten = arange(0.0, 1.0, 0.1, DType::Float32).to_vector<float>();
  REQUIRE(ten.size() == 10);
  CHECK(ten.back() == Approx(0.9f));
  CHECK(arange(-1.0, 1.0, 0.5, DType::Float32).to_vector<float>() ==
        std::vector<float>{-1.0f, -0.5f, 0.0f, 0.5f});
  // Fractional steps in int64: the values are computed in double and truncated, as torch.
  CHECK(arange(0.0, 5.0, 1.5).to_vector<int64_t>() == std::vector<int64_t>{0, 1, 3, 4});
}

TEST_CASE("from_vector keeps values, shape and dtype and item and to_vector read them") {
  const Tensor f = from_vector(std::vector<float>{1, 2, 3, 4, 5, 6}, {2, 3});
  CHECK(f.shape() == Shape{2, 3});
  CHECK(f.dim() == 2);
  CHECK(f.size(0) == 2);
  CHECK(f.size(-1) == 3);
  CHECK(f.nbytes() == 24);
  CHECK(f.to_vector<float>() == std::vector<float>{1, 2, 3, 4, 5, 6});
  const Tensor i = from_vector(std::vector<int64_t>{-3, 9000000000LL}, {2});
  CHECK(i.dtype() == DType::Int64);
  CHECK(i.to_vector<int64_t>() == std::vector<int64_t>{-3, 9000000000LL});
  CHECK(from_vector(std::vector<float>{2.5f}, Shape{}).item<float>() == 2.5f);
  CHECK(from_vector(std::vector<int64_t>{42}, {1, 1}).item<int64_t>() == 42);
  // to_vector of a view reads it in logical (row-major) order.
  CHECK(f.t().to_vector<float>() == std::vector<float>{1, 4, 2, 5, 3, 6});
}

TEST_CASE("rand and randn are reproducible after manual_seed") {
  manual_seed(1234);
  const std::vector<float> a = rand({3, 7}).to_vector<float>();
  const std::vector<float> an = randn({11}).to_vector<float>();
  manual_seed(1234);
  const std::vector<float> b = rand({3, 7}).to_vector<float>();
  const std::vector<float> bn = randn({11}).to_vector<float>();
  CHECK(a == b);
  CHECK(an == bn);
  // Consecutive draws differ (the generator advances).
  manual_seed(1234);
  const std::vector<float> first = rand({5}).to_vector<float>();
  const std::vector<float> second = rand({5}).to_vector<float>();
  CHECK(first != second);
  // Other seeds give other numbers.
  manual_seed(1235);
  CHECK(rand({3, 7}).to_vector<float>() != a);
  manual_seed(99);
  CHECK(randn({11}).to_vector<float>() != an);
  // The same draw order gives the same numbers whatever the shapes.
  manual_seed(7);
  const std::vector<float> flat = rand({12}).to_vector<float>();
  manual_seed(7);
  CHECK(rand({3, 4}).to_vector<float>() == flat);
}

TEST_CASE(
    "rand is uniform on the unit interval and randn standard normal (large-sample statistics)") {
  manual_seed(2024);
  const int64_t n = 200000;
  const std::vector<float> u = rand({n}).to_vector<float>();
  double sum = 0.0, sum_sq = 0.0;
  int64_t below_tenth = 0, outside = 0;
  for (float v : u) {
    outside += !(v >= 0.0f && v < 1.0f);
    sum += v;
    sum_sq += static_cast<double>(v) * v;
    below_tenth += v < 0.1f;
  }
  // Mean 1/2 (standard error 0.29/sqrt(n) = 0.00065), variance 1/12, P(u < 0.1) = 0.1.
  CHECK(outside == 0);
  const double mean = sum / n, var = sum_sq / n - mean * mean;
  CHECK(std::fabs(mean - 0.5) < 0.005);
  CHECK(std::fabs(var - 1.0 / 12.0) < 0.003);
  CHECK(std::fabs(static_cast<double>(below_tenth) / n - 0.1) < 0.005);

  const std::vector<float> g = randn({n}).to_vector<float>();
  double gs = 0.0, gsq = 0.0;
  int64_t within_one = 0, not_finite = 0;
  for (float v : g) {
    not_finite += !std::isfinite(v);
    gs += v;
    gsq += static_cast<double>(v) * v;
    within_one += std::fabs(v) < 1.0f;
  }
  CHECK(not_finite == 0);
  const double gmean = gs / n, gstd = std::sqrt(gsq / n - gmean * gmean);
  CHECK(std::fabs(gmean) < 0.01);       // standard error 0.0022
  CHECK(std::fabs(gstd - 1.0) < 0.01);  // standard error 0.0016
  CHECK(std::fabs(static_cast<double>(within_one) / n - 0.6827) < 0.01);
}

TEST_CASE("randint draws every value from low to high-1 and nothing else") {
  manual_seed(5);
  const std::vector<int64_t> v = randint(-2, 3, {1000}).to_vector<int64_t>();
  std::vector<int> counts(5, 0);
  for (int64_t x : v) {
    REQUIRE((x >= -2 && x < 3));
    ++counts[static_cast<size_t>(x + 2)];
  }
  for (int c : counts) CHECK(c > 120);  // about 200 each
  CHECK(randint(0, 10, {2, 3}).dtype() == DType::Int64);
  CHECK(randint(0, 10, {2, 3}).shape() == Shape{2, 3});
}

TEST_CASE("uniform_ and normal_ fill in place from the seeded generator") {
  manual_seed(3);
  Tensor t = empty({4, 5});
  t.uniform_(-2.0, 3.0);
  for (float v : t.to_vector<float>()) {
    CHECK(v >= -2.0f);
    CHECK(v < 3.0f);
  }
  manual_seed(3);
  Tensor again = empty({4, 5});
  again.uniform_(-2.0, 3.0);
  CHECK(again.to_vector<float>() == t.to_vector<float>());
  // In place through a view: only the viewed elements change.
  Tensor base = zeros({3, 4});
  Tensor col = base.narrow(1, 2, 1);
  col.normal_(10.0, 0.1);
  const std::vector<float> b = base.to_vector<float>();
  for (int64_t i = 0; i < 12; ++i) {
    if (i % 4 == 2) {
      CHECK(std::fabs(b[static_cast<size_t>(i)] - 10.0f) < 1.0f);
    } else {
      CHECK(b[static_cast<size_t>(i)] == 0.0f);
    }
  }
}

TEST_CASE("fmt prints values, shape and non-default dtype") {
  const Tensor t = from_vector(std::vector<float>{1, 2.5f, -3, 4, 5, 6}, {2, 3});
  const std::string s = fmt::format("{}", t);
  CHECK_THAT(s, MG_CONTAINS("shape=[2, 3]"));
  CHECK_THAT(s, MG_CONTAINS("[[1, 2.5, -3], [4, 5, 6]]"));
  CHECK(s == t.str());
  CHECK_THAT(s, !MG_CONTAINS("dtype"));

  const std::string i = fmt::format("{}", from_vector(std::vector<int64_t>{7, -8, 9}, {3}));
  CHECK_THAT(i, MG_CONTAINS("[7, -8, 9]"));
  CHECK_THAT(i, MG_CONTAINS("shape=[3]"));
  CHECK_THAT(i, MG_CONTAINS("dtype=int64"));

  CHECK_THAT(fmt::format("{}", scalar_tensor(0.5)), MG_CONTAINS("tensor(0.5, shape=[])"));
  // Long dimensions are elided in the middle, like PyTorch.
  const std::string longer = fmt::format("{}", arange(100.0));
  CHECK_THAT(longer, MG_CONTAINS("[0, 1, 2, ..., 97, 98, 99]"));
  CHECK_THAT(longer, MG_CONTAINS("shape=[100]"));
  // A view prints its logical values.
  CHECK_THAT(fmt::format("{}", t.t()), MG_CONTAINS("[[1, 4], [2.5, 5], [-3, 6]]"));
  CHECK_THAT(fmt::format("{}", ones({2}).set_requires_grad(true)),
             MG_CONTAINS("requires_grad=true"));
  CHECK(fmt::format("{}", Tensor()) == "Tensor(undefined)");
  CHECK_THAT(fmt::format("{}", zeros({0, 2})), MG_CONTAINS("shape=[0, 2]"));
}
