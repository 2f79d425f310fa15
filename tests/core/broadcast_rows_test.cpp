// The CPU elementwise fast path for a value broadcast along rows ([B, 1] against [B, N],
// either side, in place too) must give what element-by-element evaluation gives.
#include "catch_compat.h"

#include <algorithm>

#include <minigrad/core/ops.h>

using namespace mg;

namespace {
// [rows, cols] with a[i][j] = base + 10 i + j
Tensor grid(int64_t rows, int64_t cols, float base) {
  std::vector<float> v;
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) v.push_back(base + 10.0f * i + j);
  return from_vector(v, {rows, cols});
}
}  // namespace

TEST_CASE("broadcast rows: a column against a matrix, on either side, for each op") {
  const Tensor m = grid(3, 5, 1.0f);                                        // [3, 5]
  const Tensor col = from_vector(std::vector<float>{2, -1, 4}, {3, 1});    // [3, 1]
  const auto mv = m.to_vector<float>();
  const std::vector<float> cv{2, -1, 4};
  for (BinaryOp op :
       {BinaryOp::Add, BinaryOp::Sub, BinaryOp::Mul, BinaryOp::Div, BinaryOp::Maximum}) {
    const auto apply = [op](float p, float q) {
      switch (op) {
        case BinaryOp::Add: return p + q;
        case BinaryOp::Sub: return p - q;
        case BinaryOp::Mul: return p * q;
        case BinaryOp::Div: return p / q;
        case BinaryOp::Maximum: return std::max(p, q);
      }
      return 0.0f;
    };
    const auto left = ops::binary(op, m, col).to_vector<float>();   // column on the right
    const auto right = ops::binary(op, col, m).to_vector<float>();  // column on the left
    for (size_t i = 0; i < 3; ++i) {
      for (size_t j = 0; j < 5; ++j) {
        INFO(op_name(op) << " at " << i << "," << j);
        CHECK(left[i * 5 + j] == Approx(apply(mv[i * 5 + j], cv[i])));
        CHECK(right[i * 5 + j] == Approx(apply(cv[i], mv[i * 5 + j])));
      }
    }
  }
}

TEST_CASE("broadcast rows: in place, on a narrowed view, and with int64") {
  Tensor m = grid(4, 6, 0.0f);
  const Tensor col = from_vector(std::vector<float>{1, 2, 3, 4}, {4, 1});
  // Columns 1..3 of m, plus the column: rows of a view whose row stride is 6.
  const Tensor view = ops::narrow(m, 1, 1, 3);
  backend(Device::cpu()).binary(BinaryOp::Add, view, view, ops::expand(col, view.shape()), 1.0);
  const auto v = m.to_vector<float>();
  for (int64_t i = 0; i < 4; ++i)
    for (int64_t j = 0; j < 6; ++j) {
      const float want = 10.0f * i + j + ((j >= 1 && j <= 3) ? static_cast<float>(i + 1) : 0.0f);
      CHECK(v[static_cast<size_t>(i * 6 + j)] == want);
    }

  const Tensor a = from_vector(std::vector<int64_t>{1, 2, 3, 4, 5, 6}, {2, 3});
  const Tensor c = from_vector(std::vector<int64_t>{10, 100}, {2, 1});
  CHECK(ops::binary(BinaryOp::Mul, a, c).to_vector<int64_t>() ==
        std::vector<int64_t>{10, 20, 30, 400, 500, 600});
  CHECK(ops::binary(BinaryOp::Sub, c, a).to_vector<int64_t>() ==
        std::vector<int64_t>{9, 8, 7, 96, 95, 94});
}
