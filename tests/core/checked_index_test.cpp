// Index arithmetic on user-given int64s: sizes, starts, lengths, strides, offsets. Each
// of these once overflowed int64 (undefined behaviour; in practice a wrap) and passed
// its range check: narrow(0, INT64_MAX - 254, 256) then wrote outside the heap block and
// aborted in malloc, narrow(0, INT64_MAX - 998, 1000) read 999 values past a tensor,
// expand({-3}) made a tensor of shape [-3]. Each is now an mg::Error naming the op and
// the values (core/checked_math.h), and as_strided refuses any view past its storage.
#include "catch_compat.h"

#include <cstdint>
#include <limits>
#include <vector>

#include <minigrad/autograd/functions.h>
#include <minigrad/autograd/grad_mode.h>
#include <minigrad/core/checked_math.h>
#include <minigrad/core/generator.h>
#include <minigrad/core/ops.h>
#include <minigrad/core/tensor.h>
#include <minigrad/data/dataloader.h>
#include <minigrad/data/dataset.h>
#include <minigrad/parallel/comm.h>

using namespace mg;

namespace {
constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
constexpr int64_t kMin = std::numeric_limits<int64_t>::min();
}  // namespace

TEST_CASE("checked index: narrow with start + length past INT64_MAX is an error, not a view") {
  Tensor t = zeros({1000});
  REQUIRE_THROWS_WITH(t.narrow(0, kMax - 254, 256),
                      MG_CONTAINS("narrow") && MG_CONTAINS("start 9223372036854775553") &&
                          MG_CONTAINS("length 256") && MG_CONTAINS("size 1000"));
  const Tensor seven = full({1000}, 7.0);
  REQUIRE_THROWS_WITH(seven.narrow(0, kMax - 998, 1000),
                      MG_CONTAINS("narrow") && MG_CONTAINS("start 9223372036854774809"));
  REQUIRE_THROWS_WITH(seven.narrow(0, kMin, 1), MG_CONTAINS("narrow"));
  REQUIRE_THROWS_WITH(seven.narrow(0, 999, kMax), MG_CONTAINS("length 9223372036854775807"));
  // The edges that are valid still are.
  CHECK(seven.narrow(0, 1000, 0).numel() == 0);
  CHECK(seven.narrow(0, -1, 1).item<float>() == 7.0f);
  CHECK(seven.narrow(0, 0, 1000).numel() == 1000);
  // Through autograd too (NarrowBackward narrows the gradient with the same numbers).
  Tensor w = ones({4}).set_requires_grad(true);
  REQUIRE_THROWS_WITH(w.narrow(0, kMax, 2), MG_CONTAINS("narrow"));
}

TEST_CASE("checked index: expand refuses negative sizes and shapes whose element count overflows") {
  const Tensor one = ones({1});
  REQUIRE_THROWS_WITH(one.expand({-3}), MG_CONTAINS("expand") && MG_CONTAINS("-3"));
  REQUIRE_THROWS_WITH(one.expand({2, -3}), MG_CONTAINS("expand") && MG_CONTAINS("-3"));
  REQUIRE_THROWS_WITH(one.expand({-2, 1}), MG_CONTAINS("expand") && MG_CONTAINS("-2"));
  REQUIRE_THROWS_WITH(ones({1, 1}).expand({kMax, 2}),
                      MG_CONTAINS("expand") && MG_CONTAINS("overflows int64"));
  // -1 keeps a size; a huge but countable broadcast view is fine (it reads one value).
  CHECK(ones({2, 1}).expand({-1, 5}).shape() == Shape{2, 5});
  const Tensor huge = one.expand({kMax});
  CHECK(huge.numel() == kMax);
  REQUIRE_THROWS_WITH(huge.nbytes(), MG_CONTAINS("nbytes") && MG_CONTAINS("overflow"));
}

TEST_CASE("checked index: view and reshape check the product of the sizes, and -1 inference") {
  const Tensor empty_tensor = zeros({0});
  // 2^62 * 4 overflows even though a 0 makes the tensor empty: its strides would.
  REQUIRE_THROWS_WITH(empty_tensor.view({int64_t{1} << 62, 4, 0}),
                      MG_CONTAINS("view") && MG_CONTAINS("overflows int64"));
  REQUIRE_THROWS_WITH(empty_tensor.reshape({int64_t{1} << 62, 4, 0}),
                      MG_CONTAINS("reshape") && MG_CONTAINS("overflows int64"));
  REQUIRE_THROWS_WITH(empty_tensor.reshape({-1, kMax, 2, 0}), MG_CONTAINS("overflows int64"));
  const Tensor six = zeros({6});
  REQUIRE_THROWS_WITH(six.view({-2, -3}), MG_CONTAINS("view") && MG_CONTAINS("invalid size -2"));
  REQUIRE_THROWS_WITH(six.reshape({-1, -1}), MG_CONTAINS("only one dimension can be -1"));
  REQUIRE_THROWS_WITH(six.reshape({kMax, 2}), MG_CONTAINS("reshape"));
  CHECK(six.reshape({-1, 3}).shape() == Shape{2, 3});
  // -1 next to a 0 could be any size (PyTorch refuses it too).
  REQUIRE_THROWS_WITH(empty_tensor.reshape({-1, 0}), MG_CONTAINS("reshape"));
}

TEST_CASE("checked index: chunk and split on huge sizes and counts do not overflow") {
  const Tensor ten = zeros({10});
  // ceil(10 / INT64_MAX) used to compute 10 + INT64_MAX - 1.
  CHECK(chunk(ten, kMax).size() == 10);
  // A broadcast view of INT64_MAX elements: start + piece passed INT64_MAX.
  const std::vector<Tensor> halves = chunk(ones({1}).expand({kMax}), 2);
  REQUIRE(halves.size() == 2);
  CHECK(halves[0].size(0) == (int64_t{1} << 62));
  CHECK(halves[1].size(0) == kMax - (int64_t{1} << 62));
  REQUIRE_THROWS_WITH(split(ten, {-1, 11}),
                      MG_CONTAINS("split") && MG_CONTAINS("-1") && MG_CONTAINS(">= 0"));
  REQUIRE_THROWS_WITH(split(ten, {kMax, kMax, 12}),
                      MG_CONTAINS("split: integer overflow") && MG_CONTAINS("9223372036854775807"));
}

TEST_CASE("checked index: cat of sizes that add past INT64_MAX is an error") {
  const Tensor huge = ones({1}).expand({kMax});
  REQUIRE_THROWS_WITH(cat({huge, huge}), MG_CONTAINS("cat: integer overflow") &&
                                             MG_CONTAINS("9223372036854775807 + 9223372036854775807"));
}

TEST_CASE("checked index: Shape::numel, creation sizes and byte counts") {
  REQUIRE_THROWS_WITH(Shape({kMax, 2}).numel(), MG_CONTAINS("numel") && MG_CONTAINS("int64"));
  REQUIRE_THROWS_WITH(zeros({kMax, 2}), MG_CONTAINS("empty"));
  REQUIRE_THROWS_WITH(zeros({int64_t{1} << 62}), MG_CONTAINS("empty") && MG_CONTAINS("overflows"));
  REQUIRE_THROWS_WITH(ones({-4}), MG_CONTAINS("empty") && MG_CONTAINS("negative"));
  REQUIRE_THROWS_WITH(from_vector(std::vector<float>{1, 2}, {-1, -2}), MG_CONTAINS("negative"));
  REQUIRE_THROWS_WITH(from_vector(std::vector<float>{1}, {kMax, kMax}), MG_CONTAINS("numel"));
}

TEST_CASE("checked index: as_strided refuses a view outside its storage") {
  const Tensor five = zeros({5});
  REQUIRE_THROWS_WITH(ops::as_strided(five, {10}, {1}, 0),
                      MG_CONTAINS("as_strided") && MG_CONTAINS("out of bounds") &&
                          MG_CONTAINS("storage of 5 elements"));
  REQUIRE_THROWS_WITH(ops::as_strided(five, {2}, {1}, 4), MG_CONTAINS("out of bounds"));
  REQUIRE_THROWS_WITH(ops::as_strided(five, {2}, {-1}, 1), MG_CONTAINS("negative strides"));
  REQUIRE_THROWS_WITH(ops::as_strided(five, {1}, {1}, -1), MG_CONTAINS("negative storage offset"));
  REQUIRE_THROWS_WITH(ops::as_strided(five, {2, 2}, {1}, 0), MG_CONTAINS("strides for 2 dimensions"));
  REQUIRE_THROWS_WITH(ops::as_strided(five, {2, 2}, {kMax, 1}, 0),
                      MG_CONTAINS("as_strided: integer overflow"));
  REQUIRE_THROWS_WITH(ops::as_strided(five, {kMax, 2}, {0, 0}, 0),
                      MG_CONTAINS("as_strided") && MG_CONTAINS("overflows int64"));
  REQUIRE_THROWS_WITH(ops::as_strided(five, {-1}, {1}, 0),
                      MG_CONTAINS("as_strided") && MG_CONTAINS("invalid size -1"));
  CHECK(ops::as_strided(five, {2, 2}, {3, 1}, 0).numel() == 4);  // the last element is 4
  CHECK(ops::as_strided(five, {0, 3}, {1, 1}, 5).numel() == 0);
  // An empty view reads nothing: any offset, as PyTorch's x.as_strided((0,), (1,), 600)
  // (the columns [1, 3) of a [0, 3] tensor start past its empty storage).
  CHECK(ops::as_strided(five, {0}, {1}, 600).numel() == 0);
  // ... even one whose byte offset overflows int64 (the fuzzer's): it points at the
  // storage's start, and reading it reads nothing.
  const Tensor far = ops::as_strided(five, {0}, {1}, kMax);
  CHECK(far.data_ptr() == five.data_ptr());
  CHECK(far.to_vector<float>().empty());
  CHECK(ops::contiguous(far).numel() == 0);
  CHECK(ops::narrow(zeros({0, 3}), 1, 1, 2).shape() == Shape{0, 2});
  CHECK(ops::narrow(zeros({0, 3}), 1, 1, 2).data_ptr() == nullptr);  // no storage to point into
}

TEST_CASE("checked index: arange lengths, int64 fills and scalars that do not fit int64") {
  REQUIRE_THROWS_WITH(arange(0.0, 1e300, 1.0), MG_CONTAINS("arange") && MG_CONTAINS("int64"));
  REQUIRE_THROWS_WITH(arange(0.0, std::numeric_limits<double>::quiet_NaN()),
                      MG_CONTAINS("arange") && MG_CONTAINS("finite"));
  REQUIRE_THROWS_WITH(arange(0.0, std::numeric_limits<double>::infinity()),
                      MG_CONTAINS("finite"));
  REQUIRE_THROWS_WITH(arange(-1e19, 0.0, 1e18, DType::Int64),
                      MG_CONTAINS("arange") && MG_CONTAINS("cannot be converted to type int64"));
  CHECK(arange(-3e18, 0.0, 1e18, DType::Int64).to_vector<int64_t>() ==
        std::vector<int64_t>{-3000000000000000000, -2000000000000000000, -1000000000000000000});
  CHECK(arange(5.0, 0.0).numel() == 0);
  REQUIRE_THROWS_WITH(full({2}, 1e300, DType::Int64),
                      MG_CONTAINS("full") && MG_CONTAINS("cannot be converted to type int64"));
  REQUIRE_THROWS_WITH(full({2}, std::numeric_limits<double>::quiet_NaN(), DType::Int64),
                      MG_CONTAINS("full"));
  Tensor ints = zeros({2}, DType::Int64);
  REQUIRE_THROWS_WITH(ints.fill_(9.3e18), MG_CONTAINS("fill_") && MG_CONTAINS("int64"));
  REQUIRE_THROWS_WITH(ints.mul_(1e19), MG_CONTAINS("mul_"));
  REQUIRE_THROWS_WITH(ints.mul_(0.5), MG_CONTAINS("mul_") && MG_CONTAINS("is a floating-point number"));
  REQUIRE_THROWS_WITH(ints.add_(ints, 1e19), MG_CONTAINS("add_") && MG_CONTAINS("alpha"));
  // A floating-point scalar makes an int64 tensor float32 (torch: x + 1e19 is float32 1e19).
  CHECK((ints + 1e19).to_vector<float>() == std::vector<float>{1e19f, 1e19f});
  CHECK(ints.version() == 0);  // nothing was written by the refused calls
  CHECK(full({1}, -9223372036854775808.0, DType::Int64).item<int64_t>() == kMin);
}

TEST_CASE("checked index: randint takes any range of int64, even wider than INT64_MAX") {
  manual_seed(3);
  const std::vector<int64_t> wide = randint(kMin, kMax, {2000}).to_vector<int64_t>();
  bool negative = false, positive = false;
  for (int64_t v : wide) {
    CHECK(v != kMax);  // high is excluded
    negative = negative || v < -(int64_t{1} << 62);
    positive = positive || v > (int64_t{1} << 62);
  }
  CHECK(negative);
  CHECK(positive);
  for (int64_t v : randint(-5, 5, {500}).to_vector<int64_t>()) CHECK((v >= -5 && v < 5));
  CHECK(randint(kMax - 1, kMax, {3}).to_vector<int64_t>() == std::vector<int64_t>(3, kMax - 1));
}

TEST_CASE("checked index: int64 sums and products wrap around as in PyTorch, without UB") {
  const Tensor top = from_vector(std::vector<int64_t>{kMax, kMin}, {2});
  CHECK((top + from_vector(std::vector<int64_t>{1, -1}, {2})).to_vector<int64_t>() ==
        std::vector<int64_t>{kMin, kMax});
  CHECK((top * from_vector(std::vector<int64_t>{2, 2}, {2})).to_vector<int64_t>() ==
        std::vector<int64_t>{-2, 0});
  CHECK((top - from_vector(std::vector<int64_t>{-1, 1}, {2})).to_vector<int64_t>() ==
        std::vector<int64_t>{kMin, kMax});
  CHECK(top.sum().item<int64_t>() == -1);
  CHECK(from_vector(std::vector<int64_t>{kMax, kMax}, {2}).sum().item<int64_t>() == -2);
  CHECK((top * 3).to_vector<int64_t>() == std::vector<int64_t>{kMax - 2, kMin});
}

TEST_CASE("checked_math: the helpers name the op and the values") {
  CHECK(checked_add(2, 3, "op") == 5);
  CHECK(checked_mul(-4, 3, "op") == -12);
  CHECK(checked_sub(kMin + 1, 1, "op") == kMin);
  REQUIRE_THROWS_WITH(checked_add(kMax, 1, "narrow"),
                      MG_CONTAINS("narrow: integer overflow: 9223372036854775807 + 1"));
  REQUIRE_THROWS_WITH(checked_mul(kMin, -1, "strides"), MG_CONTAINS("strides: integer overflow"));
  REQUIRE_THROWS_WITH(checked_sub(kMin, 1, "x"), MG_CONTAINS("x: integer overflow"));
  REQUIRE_THROWS_WITH(checked_int64(9223372036854775808.0, "fill_"),
                      MG_CONTAINS("fill_: value") && MG_CONTAINS("int64 without overflow"));
  CHECK(checked_int64(-9223372036854775808.0, "fill_") == kMin);
  CHECK(checked_int64(-2.9, "x") == -2);
}

TEST_CASE("checked index: dims and duplicate dims of reductions and transposes") {
  const Tensor t = zeros({2, 3});
  REQUIRE_THROWS_WITH(t.transpose(kMin, 0), MG_CONTAINS("transpose") && MG_CONTAINS("out of range"));
  REQUIRE_THROWS_WITH(t.transpose(0, kMax), MG_CONTAINS("transpose"));
  REQUIRE_THROWS_WITH(t.sum({kMin}), MG_CONTAINS("sum") && MG_CONTAINS("out of range"));
  REQUIRE_THROWS_WITH(t.mean({0, 0}), MG_CONTAINS("appears more than once"));
  REQUIRE_THROWS_WITH(t.mean({1, -1}), MG_CONTAINS("appears more than once"));
  REQUIRE_THROWS_WITH(t.argmax(kMin), MG_CONTAINS("argmax"));
}

TEST_CASE("checked index: batch counts and scatter sizes do not overflow either") {
  // (n + batch_size - 1) / batch_size wrapped for a batch size near INT64_MAX.
  auto dataset = std::make_shared<data::TensorDataset>(zeros({10, 2}));
  data::DataLoaderOptions options;
  options.batch_size = kMax;
  CHECK(data::DataLoader(dataset, options).size() == 1);
  CHECK(ceil_div(10, kMax) == 1);
  CHECK(parallel::comm::chunk_sizes(10, kMax) == std::vector<int64_t>(10, 1));
  CHECK(parallel::comm::chunk_sizes(kMax, 2) ==
        std::vector<int64_t>{int64_t{1} << 62, kMax - (int64_t{1} << 62)});
  const Tensor x = zeros({4, 2});
  REQUIRE_THROWS_WITH(parallel::comm::scatter(x, {Device::cpu(), Device::cpu(), Device::cpu()},
                                              {kMax, kMax, 6}),
                      MG_CONTAINS("scatter: integer overflow"));
  REQUIRE_THROWS_WITH(parallel::comm::scatter(x, {Device::cpu(), Device::cpu()}, {-1, 5}),
                      MG_CONTAINS("scatter") && MG_CONTAINS(">= 0"));
}
