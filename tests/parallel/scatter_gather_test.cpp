// scatter and gather: torch.chunk sizes, values, devices, and their gradients (each
// one's backward is the other).
#include "catch_compat.h"

#include "parallel/dp_check.h"

#include <minigrad/minigrad.h>

using mg::Device;
using mg::Shape;
using mg::Tensor;
namespace comm = mg::parallel::comm;

using mg::testing::cpus;

TEST_CASE("chunk sizes follow torch.chunk") {
  REQUIRE(comm::chunk_sizes(30, 4) == std::vector<int64_t>{8, 8, 8, 6});
  REQUIRE(comm::chunk_sizes(2, 4) == std::vector<int64_t>{1, 1});
  REQUIRE(comm::chunk_sizes(9, 4) == std::vector<int64_t>{3, 3, 3});
  REQUIRE(comm::chunk_sizes(10, 4) == std::vector<int64_t>{3, 3, 3, 1});
  REQUIRE(comm::chunk_sizes(5, 1) == std::vector<int64_t>{5});
  REQUIRE(comm::chunk_sizes(0, 3).empty());
  // The same cut as mg::chunk, the differentiable op users know.
  for (int64_t rows = 1; rows <= 13; ++rows) {
    for (int64_t n = 1; n <= 5; ++n) {
      std::vector<int64_t> sizes;
      for (const Tensor& piece : mg::chunk(mg::zeros({rows, 2}), n)) sizes.push_back(piece.size(0));
      REQUIRE(comm::chunk_sizes(rows, n) == sizes);
    }
  }
  REQUIRE_THROWS_WITH(comm::chunk_sizes(4, 0), MG_CONTAINS("chunk_sizes: number of chunks must be positive"));
}

TEST_CASE("scatter cuts the batch into pieces on each device") {
  const Tensor x = mg::arange(0, 60, 1, mg::DType::Float32).reshape({30, 2});
  const auto pieces = mg::parallel::scatter(x, cpus(4));
  REQUIRE(pieces.size() == 4);
  int64_t row = 0;
  for (size_t i = 0; i < pieces.size(); ++i) {
    REQUIRE(pieces[i].size(0) == (i < 3 ? 8 : 6));
    REQUIRE(pieces[i].device() == Device::cpu());
    mg::testing::require_close(pieces[i], x.narrow(0, row, pieces[i].size(0)), "piece", 0, 0);
    row += pieces[i].size(0);
  }
  REQUIRE(mg::parallel::scatter(mg::zeros({2, 3}), cpus(4)).size() == 2);
  REQUIRE(mg::parallel::scatter(mg::zeros({9, 3}), cpus(4)).size() == 3);
  // Along dim 1.
  const auto columns = mg::parallel::scatter(x, cpus(2), 1);
  REQUIRE(columns.size() == 2);
  REQUIRE(columns[1].shape() == Shape{30, 1});
  mg::testing::require_close(columns[1], x.narrow(1, 1, 1), "column", 0, 0);
}

TEST_CASE("scatter is one node whose backward gathers the pieces' gradients") {
  const Tensor x = mg::randn({10, 3}).set_requires_grad(true);
  const auto pieces = mg::parallel::scatter(x, cpus(3));  // 4 4 2
  REQUIRE(pieces.size() == 3);
  for (const Tensor& p : pieces) {
    REQUIRE(p.grad_fn() == pieces[0].grad_fn());
    REQUIRE_FALSE(p.is_leaf());
  }
  REQUIRE(pieces[0].grad_fn()->name() == "ScatterBackward");
  // loss = sum_i (i + 1) * sum(piece_i): row r's gradient is the index of its piece + 1.
  Tensor loss = pieces[0].sum();
  for (size_t i = 1; i < pieces.size(); ++i) loss = loss + pieces[i].sum() * double(i + 1);
  loss.backward();
  std::vector<float> expected;
  for (float g : {1.f, 1.f, 1.f, 1.f, 2.f, 2.f, 2.f, 2.f, 3.f, 3.f})
    for (int c = 0; c < 3; ++c) expected.push_back(g);
  REQUIRE(x.grad().to_vector<float>() == expected);

  // A piece that gets no gradient contributes zeros.
  const Tensor y = mg::randn({4, 2}).set_requires_grad(true);
  mg::parallel::scatter(y, cpus(2))[1].sum().backward();
  REQUIRE(y.grad().to_vector<float>() == std::vector<float>{0, 0, 0, 0, 1, 1, 1, 1});
}

TEST_CASE("scatter without grad mode records nothing") {
  mg::NoGradGuard no_grad;
  const Tensor x = mg::randn({4, 3}).set_requires_grad(true);
  for (const Tensor& p : mg::parallel::scatter(x, cpus(2))) REQUIRE_FALSE(p.requires_grad());
}

TEST_CASE("gather concatenates on the output device and its backward scatters") {
  const Tensor a = mg::randn({3, 2}).set_requires_grad(true);
  const Tensor b = mg::randn({1, 2}).set_requires_grad(true);
  const Tensor c = mg::randn({2, 2});  // no grad: gets none
  const Tensor out = mg::parallel::gather({a, b, c}, Device::cpu());
  REQUIRE(out.shape() == Shape{6, 2});
  mg::testing::require_close(out, mg::cat({a, b, c}), "gathered", 0, 0);
  REQUIRE(out.grad_fn()->name() == "GatherBackward");
  const Tensor weights = mg::arange(0, 12, 1, mg::DType::Float32).reshape({6, 2});
  (out * weights).sum().backward();
  mg::testing::require_close(a.grad(), weights.narrow(0, 0, 3), "grad a", 0, 0);
  mg::testing::require_close(b.grad(), weights.narrow(0, 3, 1), "grad b", 0, 0);
  REQUIRE_FALSE(c.grad().defined());

  // Along dim 1.
  const Tensor d = mg::randn({2, 3}).set_requires_grad(true);
  const Tensor e = mg::randn({2, 1}).set_requires_grad(true);
  const Tensor wide = mg::parallel::gather({d, e}, Device::cpu(), 1);
  REQUIRE(wide.shape() == Shape{2, 4});
  wide.sum().backward();
  REQUIRE(e.grad().to_vector<float>() == std::vector<float>{1, 1});
}

TEST_CASE("scatter and gather errors") {
  REQUIRE_THROWS_WITH(mg::parallel::scatter(mg::zeros({0, 3}), cpus(2)),
                      MG_CONTAINS("scatter: the input (shape [0, 3]) is empty along dimension 0"));
  REQUIRE_THROWS_WITH(mg::parallel::scatter(mg::scalar_tensor(1.0), cpus(2)),
                      MG_CONTAINS("scatter: cannot split a scalar"));
  REQUIRE_THROWS_WITH(mg::parallel::scatter(mg::zeros({2, 3}), {}),
                      MG_CONTAINS("scatter: expected at least one device"));
  REQUIRE_THROWS_WITH(mg::parallel::gather({}, Device::cpu()),
                      MG_CONTAINS("gather: expected at least one output"));
  REQUIRE_THROWS_WITH(mg::parallel::gather({mg::zeros({2, 3}), mg::zeros({2, 4})}, Device::cpu()),
                      MG_CONTAINS("gather: the outputs must have equal sizes except in dimension 0, "
                                  "but output 1 (on cpu) has shape [2, 4] and output 0 (on cpu) "
                                  "has shape [2, 3]"));
  REQUIRE_THROWS_WITH(mg::parallel::gather({mg::zeros({2}), mg::scalar_tensor(1.0)}, Device::cpu()),
                      MG_CONTAINS("gather: output 1 (on cpu) is a scalar (shape [])"));
}
