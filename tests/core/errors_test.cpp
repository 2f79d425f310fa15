// Every user-facing error of core (and the differentiable API over it) is an mg::Error
// whose message names the op and the shapes, dtypes or devices involved. Each test
// checks the message, not only that something was thrown.
#include "catch_compat.h"
#include "host_backed_cuda.h"

#include <cmath>

#include <minigrad/autograd/functions.h>
#include <minigrad/core/backend.h>
#include <minigrad/core/ops.h>
#include <minigrad/core/tensor.h>

using namespace mg;

namespace {
Tensor iota(const Shape& shape) {
  return arange(0.0, static_cast<double>(shape.numel()), 1.0, DType::Float32).reshape(shape);
}
Tensor labels(const std::vector<int64_t>& values) {
  return from_vector(values, {static_cast<int64_t>(values.size())});
}
}  // namespace

TEST_CASE("error: matmul with mismatched inner dimensions names the op and both shapes") {
  const Tensor a = iota({3, 4}), b = iota({5, 2});
  REQUIRE_THROWS_AS(matmul(a, b), Error);
  REQUIRE_THROWS_WITH(matmul(a, b), MG_CONTAINS("matmul") && MG_CONTAINS("[3, 4]") &&
                                        MG_CONTAINS("[5, 2]") && MG_CONTAINS("inner"));
  REQUIRE_THROWS_WITH(matmul(iota({2, 3, 4}), b), MG_CONTAINS("matmul") &&
                                                      MG_CONTAINS("[2, 3, 4]") &&
                                                      MG_CONTAINS("[5, 2]") && MG_CONTAINS("inner"));
  REQUIRE_THROWS_WITH(matmul(iota({2, 3, 4}), iota({2, 5, 2})),
                      MG_CONTAINS("matmul") && MG_CONTAINS("[2, 5, 2]") && MG_CONTAINS("inner"));
  REQUIRE_THROWS_WITH(matmul(iota({2, 3, 4}), iota({3, 4, 2})),
                      MG_CONTAINS("matmul") && MG_CONTAINS("[2]") && MG_CONTAINS("[3]") &&
                          MG_CONTAINS("broadcast"));
  REQUIRE_THROWS_WITH(matmul(iota({4}), iota({3})), MG_CONTAINS("matmul") && MG_CONTAINS("inner"));
  REQUIRE_THROWS_WITH(matmul(scalar_tensor(1.0), iota({3})),
                      MG_CONTAINS("matmul") && MG_CONTAINS("at least 1 dimension"));
  REQUIRE_THROWS_WITH(matmul(labels({1, 2}).reshape({1, 2}), labels({1, 2}).reshape({2, 1})),
                      MG_CONTAINS("matmul") && MG_CONTAINS("int64"));
  // linear says which operand is wrong.
  REQUIRE_THROWS_WITH(linear(iota({2, 4}), iota({3, 5})),
                      MG_CONTAINS("linear") && MG_CONTAINS("[2, 4]") && MG_CONTAINS("[3, 5]"));
  REQUIRE_THROWS_WITH(linear(iota({2, 4}), iota({3, 4}), iota({4})),
                      MG_CONTAINS("linear") && MG_CONTAINS("bias") && MG_CONTAINS("[4]"));
}

TEST_CASE("error: shapes that do not broadcast name the op and both shapes") {
  const Tensor a = iota({2, 3}), b = iota({4, 3});
  REQUIRE_THROWS_AS(a + b, Error);
  REQUIRE_THROWS_WITH(a + b, MG_CONTAINS("add") && MG_CONTAINS("[2, 3]") && MG_CONTAINS("[4, 3]") &&
                                 MG_CONTAINS("broadcast"));
  REQUIRE_THROWS_WITH(a - b, MG_CONTAINS("sub") && MG_CONTAINS("broadcast"));
  REQUIRE_THROWS_WITH(a * iota({2}), MG_CONTAINS("mul") && MG_CONTAINS("[2]"));
  REQUIRE_THROWS_WITH(a / iota({3, 1, 2}), MG_CONTAINS("div") && MG_CONTAINS("[3, 1, 2]"));
  REQUIRE_THROWS_WITH(iota({3}).expand({2, 4}),
                      MG_CONTAINS("expand") && MG_CONTAINS("[3]") && MG_CONTAINS("[2, 4]"));
  Tensor dst = zeros({2, 3});
  REQUIRE_THROWS_WITH(dst.copy_(iota({3, 2})), MG_CONTAINS("[3, 2]") && MG_CONTAINS("[2, 3]"));
}

TEST_CASE("error: binary ops on different dtypes name both") {
  // The differentiable ops promote (torch's rule); the backend-level op refuses.
  CHECK((iota({2}) + labels({1, 2})).dtype() == DType::Float32);
  REQUIRE_THROWS_WITH(ops::binary(BinaryOp::Add, iota({2}), labels({1, 2})),
                      MG_CONTAINS("add") && MG_CONTAINS("float32") && MG_CONTAINS("int64"));
  CHECK(exp(labels({1, 2})).dtype() == DType::Float32);  // torch: exp of int64 is float32
  REQUIRE_THROWS_WITH(labels({1, 2}).log_softmax(), MG_CONTAINS("log_softmax"));
  REQUIRE_THROWS_WITH(mean(labels({1, 2})), MG_CONTAINS("mean") && MG_CONTAINS("int64"));
  REQUIRE_THROWS_WITH(iota({2}).to_vector<int64_t>(),
                      MG_CONTAINS("float32") && MG_CONTAINS("int64"));
  REQUIRE_THROWS_WITH(iota({2}).data<int64_t>(), MG_CONTAINS("float32"));
}

TEST_CASE("error: impossible view names the shape, strides and the way out") {
  const Tensor t = iota({3, 5}).t();  // [5, 3], strides [1, 5]
  REQUIRE_THROWS_AS(t.view({15}), Error);
  REQUIRE_THROWS_WITH(t.view({15}), MG_CONTAINS("view") && MG_CONTAINS("[5, 3]") &&
                                        MG_CONTAINS("[1, 5]") && MG_CONTAINS("[15]") &&
                                        MG_CONTAINS("reshape()"));
  REQUIRE_THROWS_WITH(iota({2, 3}).view({7}),
                      MG_CONTAINS("view") && MG_CONTAINS("[7]") && MG_CONTAINS("6 elements"));
  REQUIRE_THROWS_WITH(iota({2, 3}).reshape({4, -1}), MG_CONTAINS("reshape") &&
                                                         MG_CONTAINS("[4, -1]") &&
                                                         MG_CONTAINS("6 elements"));
  REQUIRE_THROWS_WITH(iota({2, 3}).reshape({-1, -1}),
                      MG_CONTAINS("reshape") && MG_CONTAINS("only one dimension can be -1"));
  REQUIRE_THROWS_WITH(iota({2, 3}).t().t().t().view({3, 2, 1}).view({6}), MG_CONTAINS("view"));
  REQUIRE_THROWS_WITH(iota({2, 3, 4}).t(), MG_CONTAINS("t:") && MG_CONTAINS("[2, 3, 4]"));
  REQUIRE_THROWS_WITH(iota({2, 3}).transpose(0, 2),
                      MG_CONTAINS("transpose") && MG_CONTAINS("dimension 2"));
}

TEST_CASE("error: narrow out of range names start, length, dim and shape") {
  const Tensor x = iota({4, 5});
  REQUIRE_THROWS_AS(x.narrow(0, 2, 3), Error);
  REQUIRE_THROWS_WITH(x.narrow(0, 2, 3), MG_CONTAINS("narrow") && MG_CONTAINS("start 2") &&
                                             MG_CONTAINS("length 3") && MG_CONTAINS("size 4") &&
                                             MG_CONTAINS("[4, 5]"));
  REQUIRE_THROWS_WITH(x.narrow(1, -7, 1), MG_CONTAINS("narrow"));
  REQUIRE_THROWS_WITH(x.narrow(1, 0, -1), MG_CONTAINS("length -1"));
  REQUIRE_THROWS_WITH(x.narrow(2, 0, 1), MG_CONTAINS("narrow") && MG_CONTAINS("dimension 2"));
  REQUIRE_THROWS_WITH(scalar_tensor(1.0).narrow(0, 0, 1), MG_CONTAINS("0-dimensional"));
}

TEST_CASE("error: cross-entropy targets out of range or not int64") {
  const Tensor logits = iota({3, 4});
  REQUIRE_THROWS_AS(cross_entropy(logits, labels({0, 4, 1})), Error);
  REQUIRE_THROWS_WITH(cross_entropy(logits, labels({0, 4, 1})),
                      MG_CONTAINS("cross_entropy") && MG_CONTAINS("target 4") &&
                          MG_CONTAINS("row 1") && MG_CONTAINS("4 classes") &&
                          MG_CONTAINS("[0, 4)"));
  REQUIRE_THROWS_WITH(cross_entropy(logits, labels({0, 1, -1})),
                      MG_CONTAINS("target -1") && MG_CONTAINS("row 2"));
  const Tensor float_targets = from_vector(std::vector<float>{0, 1, 2}, {3});
  REQUIRE_THROWS_AS(cross_entropy(logits, float_targets), Error);
  REQUIRE_THROWS_WITH(cross_entropy(logits, float_targets), MG_CONTAINS("cross_entropy") &&
                                                                MG_CONTAINS("int64") &&
                                                                MG_CONTAINS("float32"));
  REQUIRE_THROWS_WITH(cross_entropy(logits, labels({0, 1})),
                      MG_CONTAINS("cross_entropy") && MG_CONTAINS("[2]") && MG_CONTAINS("[3, 4]"));
  REQUIRE_THROWS_WITH(cross_entropy(iota({12}), labels({0})),
                      MG_CONTAINS("cross_entropy") && MG_CONTAINS("[12]"));
}

TEST_CASE("error: ops mixing devices name both devices and shapes") {
  // Without a GPU the CUDA entry is a host-backed stand-in: the check under test is the
  // ops layer's, which looks only at each tensor's Device.
  std::unique_ptr<mg::testing::ScopedHostBackedCuda> stand_in;
  if (backend(DeviceType::CUDA).device_count() == 0)
    stand_in = std::make_unique<mg::testing::ScopedHostBackedCuda>();
  const Tensor host = iota({2, 3});
  const Tensor gpu = iota({2, 3}).to(Device::cuda(0));
  REQUIRE(gpu.device() == Device::cuda(0));

  REQUIRE_THROWS_AS(host + gpu, Error);
  REQUIRE_THROWS_WITH(host + gpu, MG_CONTAINS("add") && MG_CONTAINS("cpu") &&
                                      MG_CONTAINS("cuda:0") && MG_CONTAINS("[2, 3]") &&
                                      MG_CONTAINS(".to()"));
  REQUIRE_THROWS_WITH(gpu * host, MG_CONTAINS("mul") && MG_CONTAINS("cuda:0"));
  REQUIRE_THROWS_WITH(matmul(host, gpu.t()), MG_CONTAINS("matmul") && MG_CONTAINS("cuda:0"));
  REQUIRE_THROWS_WITH(cat({host, gpu}), MG_CONTAINS("cat") && MG_CONTAINS("cuda:0"));
  REQUIRE_THROWS_WITH(cross_entropy(gpu, labels({0, 1})),
                      MG_CONTAINS("cross_entropy") && MG_CONTAINS("cuda:0") && MG_CONTAINS("cpu"));
  Tensor acc = zeros({2, 3});
  REQUIRE_THROWS_WITH(acc.add_(gpu), MG_CONTAINS("add_") && MG_CONTAINS("cuda:0"));
  if (backend(DeviceType::CUDA).device_count() >= 2) {
    const Tensor other = iota({2, 3}).to(Device::cuda(1));
    REQUIRE_THROWS_WITH(gpu - other,
                        MG_CONTAINS("sub") && MG_CONTAINS("cuda:0") && MG_CONTAINS("cuda:1"));
  }
  // Moving one side fixes it, and to() round-trips the values.
  CHECK((host + gpu.to(Device::cpu())).to_vector<float>() == std::vector<float>{0, 2, 4, 6, 8, 10});
}

TEST_CASE("error: creation and element access") {
  REQUIRE_THROWS_AS(from_vector(std::vector<float>{1, 2, 3}, {2, 2}), Error);
  REQUIRE_THROWS_WITH(from_vector(std::vector<float>{1, 2, 3}, {2, 2}),
                      MG_CONTAINS("from_vector") && MG_CONTAINS("3 values") &&
                          MG_CONTAINS("[2, 2]") && MG_CONTAINS("4 elements"));
  REQUIRE_THROWS_WITH(from_vector(std::vector<int64_t>{1}, {3}), MG_CONTAINS("from_vector"));
  REQUIRE_THROWS_WITH(zeros({2, -1}), MG_CONTAINS("negative") && MG_CONTAINS("[2, -1]"));
  REQUIRE_THROWS_WITH(empty({0, int64_t{1} << 62, int64_t{1} << 62}),
                      MG_CONTAINS("empty") && MG_CONTAINS("impossibly large"));
  REQUIRE_THROWS_WITH(arange(0.0, 5.0, 0.0), MG_CONTAINS("arange") && MG_CONTAINS("step"));
  REQUIRE_THROWS_WITH(randint(3, 3, {2}), MG_CONTAINS("randint") && MG_CONTAINS("[3, 3)"));
  REQUIRE_THROWS_WITH(iota({2, 3}).item<float>(),
                      MG_CONTAINS("item") && MG_CONTAINS("one element") && MG_CONTAINS("[2, 3]"));
  REQUIRE_THROWS_WITH(Tensor().shape(), MG_CONTAINS("undefined"));
  REQUIRE_THROWS_WITH(iota({2}).size(1), MG_CONTAINS("size") && MG_CONTAINS("dimension 1"));
  REQUIRE_THROWS_WITH(iota({2}).set_grad(zeros({3})),
                      MG_CONTAINS("set_grad") && MG_CONTAINS("[3]") && MG_CONTAINS("[2]"));
}

TEST_CASE("error: reductions, cat, chunk and split with bad arguments") {
  const Tensor x = iota({2, 3});
  REQUIRE_THROWS_WITH(x.sum({2}), MG_CONTAINS("sum") && MG_CONTAINS("dimension 2"));
  REQUIRE_THROWS_WITH(x.sum({1, -1}), MG_CONTAINS("sum") && MG_CONTAINS("more than once"));
  CHECK(std::isnan(zeros({0, 3}).mean().item<float>()));  // torch: the mean of nothing is NaN
  REQUIRE_THROWS_WITH(x.argmax(2), MG_CONTAINS("argmax"));
  REQUIRE_THROWS_WITH(cat({}), MG_CONTAINS("cat") && MG_CONTAINS("non-empty"));
  REQUIRE_THROWS_WITH(cat({x, iota({2, 4})}, 0),
                      MG_CONTAINS("cat") && MG_CONTAINS("[2, 4]") && MG_CONTAINS("[2, 3]"));
  REQUIRE_THROWS_WITH(cat({x, iota({6})}), MG_CONTAINS("cat") && MG_CONTAINS("[6]"));
  REQUIRE_THROWS_WITH(cat({x, labels({1, 2, 3, 4, 5, 6}).reshape({2, 3})}),
                      MG_CONTAINS("cat") && MG_CONTAINS("int64"));
  REQUIRE_THROWS_WITH(chunk(x, 0), MG_CONTAINS("chunk") && MG_CONTAINS("positive"));
  REQUIRE_THROWS_WITH(split(x, {1, 1}, 1),
                      MG_CONTAINS("split") && MG_CONTAINS("size 3") && MG_CONTAINS("[2, 3]"));
}
