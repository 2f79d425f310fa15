// Edge shapes and dtypes: 0-dimensional tensors (where a dim index has nothing to point
// at), empty tensors, int64 arithmetic beyond float precision, mixed dtypes in in-place
// updates. These used to crash or return garbage; each now has PyTorch's answer or an
// mg::Error that says what is wrong.
#include "catch_compat.h"

#include <cmath>

#include <minigrad/autograd/functions.h>
#include <minigrad/autograd/grad_mode.h>
#include <minigrad/core/ops.h>
#include <minigrad/core/tensor.h>

using namespace mg;

TEST_CASE("0-dim tensors: size and stride of a dimension it does not have are errors") {
  const Tensor s = scalar_tensor(3.0);
  CHECK(s.dim() == 0);
  CHECK(s.shape() == Shape{});
  CHECK(s.strides().empty());
  REQUIRE_THROWS_AS(s.size(0), Error);
  REQUIRE_THROWS_WITH(s.size(0), MG_CONTAINS("size") && MG_CONTAINS("no dimensions"));
  REQUIRE_THROWS_WITH(s.size(-1), MG_CONTAINS("no dimensions"));
  REQUIRE_THROWS_WITH(s.stride(0), MG_CONTAINS("stride") && MG_CONTAINS("no dimensions"));
}

TEST_CASE("0-dim tensors: sum and mean over dim 0 or -1 return the scalar, as in PyTorch") {
  const Tensor s = scalar_tensor(3.0);
  CHECK(s.sum({0}).item<float>() == 3.0f);
  CHECK(s.sum({0}).dim() == 0);
  CHECK(s.sum({-1}, true).dim() == 0);
  CHECK(s.mean({0}).item<float>() == 3.0f);
  REQUIRE_THROWS_WITH(s.sum({1}), MG_CONTAINS("sum") && MG_CONTAINS("dimension 1"));
  // And their gradients.
  Tensor x = scalar_tensor(2.0).set_requires_grad(true);
  (x.sum({0}) * 3.0 + x.mean({-1}, true)).backward();
  REQUIRE(x.grad().defined());
  CHECK(x.grad().shape() == Shape{});
  CHECK(x.grad().item<float>() == 4.0f);
}

TEST_CASE("0-dim tensors: cat, chunk and split refuse them with a clear message") {
  const Tensor s = scalar_tensor(1.0);
  REQUIRE_THROWS_AS(cat({s, s}), Error);
  REQUIRE_THROWS_WITH(cat({s, s}), MG_CONTAINS("cat") && MG_CONTAINS("zero-dimensional"));
  REQUIRE_THROWS_WITH(cat({ones({2}), s}), MG_CONTAINS("cat"));
  REQUIRE_THROWS_WITH(chunk(s, 2), MG_CONTAINS("chunk") && MG_CONTAINS("zero-dimensional"));
  REQUIRE_THROWS_WITH(split(s, {1}), MG_CONTAINS("split") && MG_CONTAINS("zero-dimensional"));
}

TEST_CASE("0-dim tensors: views, arithmetic, printing") {
  const Tensor s = scalar_tensor(2.0);
  CHECK(s.reshape({1}).shape() == Shape{1});
  CHECK(s.view({1, 1}).item<float>() == 2.0f);
  CHECK(ones({1}).view(Shape{}).dim() == 0);
  CHECK(s.t().dim() == 0);
  CHECK(s.transpose(0, -1).item<float>() == 2.0f);
  CHECK(s.expand({2, 2}).to_vector<float>() == std::vector<float>(4, 2.0f));
  CHECK((s * s + s).item<float>() == 6.0f);
  CHECK(s.log_softmax().item<float>() == 0.0f);
  CHECK(exp(scalar_tensor(0.0)).item<float>() == 1.0f);
}

TEST_CASE("empty tensors flow through ops without touching memory") {
  const Tensor e = zeros({0, 3});
  CHECK((e + ones({3})).shape() == Shape{0, 3});
  CHECK(relu(e).numel() == 0);
  CHECK(e.sum({1}).shape() == Shape{0});
  CHECK(e.sum().item<float>() == 0.0f);
  CHECK(log_softmax(e).shape() == Shape{0, 3});
  CHECK(log_softmax(zeros({2, 0})).shape() == Shape{2, 0});
  CHECK(e.t().contiguous().shape() == Shape{3, 0});
  CHECK(e.reshape({3, 0}).numel() == 0);
  CHECK(cat({e, ones({2, 3})}).to_vector<float>() == std::vector<float>(6, 1.0f));
  CHECK(chunk(zeros({0}), 3).size() == 3);  // torch.chunk: as many empty pieces as asked
  REQUIRE_THROWS_WITH(chunk(zeros({0, 2}), int64_t{1} << 40),
                      MG_CONTAINS("chunk: 1099511627776 empty pieces of dimension 0 (of size 0, "
                                  "shape [0, 2])"));
  // As torch: no rows have no maxima to index (an empty result), but an empty row has none.
  CHECK(e.argmax().shape() == Shape{0});
  REQUIRE_THROWS_WITH(e.argmax(0), MG_CONTAINS("argmax") && MG_CONTAINS("[0, 3]"));
  // The mean loss of no rows is NaN (0 / 0), as torch's (tests/models/empty_batch_test.cpp
  // walks every op over empty batches).
  CHECK(std::isnan(cross_entropy(e, from_vector(std::vector<int64_t>{}, {0})).item<float>()));
}

TEST_CASE("int64 sums are exact beyond float and double precision") {
  const int64_t big = int64_t{1} << 53;  // the first integer where double loses odd values
  const Tensor v = from_vector(std::vector<int64_t>{big, 1}, {2});
  CHECK(v.sum().item<int64_t>() == big + 1);
  CHECK(v.reshape({1, 2}).sum({1}).item<int64_t>() == big + 1);
  CHECK(v.reshape({2, 1}).sum({0}).item<int64_t>() == big + 1);
  const Tensor w = from_vector(std::vector<int64_t>{big, 3, big, 5}, {2, 2});
  CHECK(w.sum({0}).to_vector<int64_t>() == std::vector<int64_t>{2 * big, 8});
  CHECK((v + from_vector(std::vector<int64_t>{1, 1}, {2})).to_vector<int64_t>() ==
        std::vector<int64_t>{big + 1, 2});
}

TEST_CASE("in-place updates refuse an operand of another dtype") {
  NoGradGuard no_grad;
  Tensor f = ones({3});
  const Tensor i = from_vector(std::vector<int64_t>{2, 2, 2}, {3});
  REQUIRE_THROWS_WITH(f.mul_(i),
                      MG_CONTAINS("mul_") && MG_CONTAINS("float32") && MG_CONTAINS("int64"));
  REQUIRE_THROWS_WITH(f.add_(i), MG_CONTAINS("add_") && MG_CONTAINS("int64"));
  REQUIRE_THROWS_WITH(f.copy_(i), MG_CONTAINS("copy_") && MG_CONTAINS("int64"));
  CHECK(f.to_vector<float>() == std::vector<float>{1, 1, 1});  // untouched
}

TEST_CASE("int64 tensors with a floating-point scalar promote to float32, as in torch") {
  const Tensor i = from_vector(std::vector<int64_t>{4, 6}, {2});
  // By the scalar's category, not its value (tests/autograd/dtype_semantics_test.cpp has
  // every op in both orders against torch): an integer keeps int64, 2.0 does not.
  CHECK((i * 2).to_vector<int64_t>() == std::vector<int64_t>{8, 12});
  CHECK((i + 1).to_vector<int64_t>() == std::vector<int64_t>{5, 7});
  CHECK((i - 1).to_vector<int64_t>() == std::vector<int64_t>{3, 5});
  CHECK((i * 2.0).to_vector<float>() == std::vector<float>{8.0f, 12.0f});
  CHECK((i + 1.0).to_vector<float>() == std::vector<float>{5.0f, 7.0f});
  CHECK((i - 1.0).to_vector<float>() == std::vector<float>{3.0f, 5.0f});
  // A fraction is neither refused nor truncated: the result is float32.
  CHECK((i * 0.5).dtype() == DType::Float32);
  CHECK((i * 0.5).to_vector<float>() == std::vector<float>{2.0f, 3.0f});
  CHECK((i + 0.25).to_vector<float>() == std::vector<float>{4.25f, 6.25f});
  // `/` is true division, whatever the divisor.
  CHECK((i / 4.0).to_vector<float>() == std::vector<float>{1.0f, 1.5f});
  CHECK((i / 2.0).to_vector<float>() == std::vector<float>{2.0f, 3.0f});
  // The in-place ops keep the tensor's dtype, so there a fraction is still refused.
  Tensor j = from_vector(std::vector<int64_t>{4, 6}, {2});
  REQUIRE_THROWS_WITH(j.mul_(0.5), MG_CONTAINS("mul_") && MG_CONTAINS("int64") && MG_CONTAINS("0.5"));
  REQUIRE_THROWS_WITH(ops::binary_scalar(BinaryOp::Add, j, 0.25),
                      MG_CONTAINS("add") && MG_CONTAINS("0.25"));
}
