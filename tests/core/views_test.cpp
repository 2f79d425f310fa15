// Views and copies as in PyTorch: reshape/view/transpose/narrow/expand/chunk share
// storage; contiguous/cat/to and reshape of a non-viewable layout copy.
#include "catch_compat.h"

#include <minigrad/autograd/functions.h>
#include <minigrad/autograd/grad_mode.h>
#include <minigrad/core/tensor.h>

using namespace mg;

namespace {
Tensor iota(const Shape& shape) {
  return arange(0.0, static_cast<double>(shape.numel()), 1.0, DType::Float32).reshape(shape);
}
std::vector<float> range(float from, float to) {
  std::vector<float> v;
  for (float x = from; x < to; x += 1.0f) v.push_back(x);
  return v;
}
}  // namespace

TEST_CASE("reshape and view of a contiguous tensor share its storage") {
  const Tensor x = iota({2, 6});
  const Tensor r = x.reshape({3, 4});
  const Tensor v = x.view({4, -1});
  CHECK(r.storage().is_alias_of(x.storage()));
  CHECK(v.storage().is_alias_of(x.storage()));
  CHECK(v.shape() == Shape{4, 3});
  CHECK(r.to_vector<float>() == x.to_vector<float>());
  CHECK(x.reshape({-1}).shape() == Shape{12});
  CHECK(x.reshape({1, 12, 1}).strides()[1] == 1);
  CHECK(x.view({2, 2, 3}).strides() == std::vector<int64_t>{6, 3, 1});
  // Writes through the view are visible in the base.
  NoGradGuard no_grad;
  Tensor w = x.view({12});
  w.narrow(0, 5, 1).fill_(-1.0);
  CHECK(x.to_vector<float>()[5] == -1.0f);
}

TEST_CASE("some non-contiguous layouts can still be viewed without a copy") {
  // A narrow along dim 0 keeps rows contiguous: merging the trailing dims is a view.
  const Tensor base = iota({4, 2, 3});
  const Tensor rows = base.narrow(0, 1, 2);  // [2, 2, 3], offset 6
  const Tensor flat = rows.view({2, 6});
  CHECK(flat.storage().is_alias_of(base.storage()));
  CHECK(flat.storage_offset() == 6);
  CHECK(flat.to_vector<float>() == range(6, 18));
  // A transposed tensor can gain or lose size-1 dims as a view.
  const Tensor t = iota({3, 5}).t();
  const Tensor t1 = t.view({5, 1, 3});
  CHECK(t1.storage().is_alias_of(t.storage()));
  CHECK(t1.to_vector<float>() == t.to_vector<float>());
  // Splitting a transposed dim is a view too.
  const Tensor split_dim = iota({4, 3}).t().view({3, 2, 2});
  CHECK(split_dim.to_vector<float>() == iota({4, 3}).t().contiguous().to_vector<float>());
}

TEST_CASE("reshape copies when the layout does not allow a view and view refuses") {
  const Tensor x = iota({3, 5});
  const Tensor t = x.t();
  CHECK_FALSE(t.is_contiguous());
  const Tensor r = t.reshape({15});
  CHECK_FALSE(r.storage().is_alias_of(x.storage()));
  CHECK(r.to_vector<float>() ==
        std::vector<float>{0, 5, 10, 1, 6, 11, 2, 7, 12, 3, 8, 13, 4, 9, 14});
  REQUIRE_THROWS_WITH(t.view({15}), MG_CONTAINS("view") && MG_CONTAINS("reshape()"));
  // An expanded (stride-0) tensor cannot be flattened as a view either.
  const Tensor e = iota({3, 1}).expand({3, 4});
  REQUIRE_THROWS_AS(e.view({12}), Error);
  CHECK(e.reshape({12}).to_vector<float>() ==
        std::vector<float>{0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2});
}

TEST_CASE("transpose and t swap strides, not data") {
  const Tensor x = iota({2, 3, 4});
  const Tensor y = x.transpose(0, 2);
  CHECK(y.shape() == Shape{4, 3, 2});
  CHECK(y.strides() == std::vector<int64_t>{1, 4, 12});
  CHECK(y.storage().is_alias_of(x.storage()));
  const std::vector<float> yv = y.to_vector<float>();
  // y[i][j][k] = x[k][j][i] = 12k + 4j + i
  CHECK(yv[static_cast<size_t>(1 * 6 + 2 * 2 + 1)] == 12 + 8 + 1);
  CHECK(x.transpose(-1, 0).shape() == Shape{4, 3, 2});
  CHECK(x.transpose(1, 1).to_vector<float>() == x.to_vector<float>());
  const Tensor v = iota({5});
  CHECK(v.t().shape() == Shape{5});  // 1-D: t() is the tensor itself
  CHECK(iota({2, 3}).t().t().is_contiguous());
}

TEST_CASE("narrow is a view with an offset and a negative start counts from the end") {
  const Tensor x = iota({4, 5});
  const Tensor cols = x.narrow(1, 1, 3);
  CHECK(cols.shape() == Shape{4, 3});
  CHECK(cols.storage().is_alias_of(x.storage()));
  CHECK(cols.storage_offset() == 1);
  CHECK(cols.strides() == std::vector<int64_t>{5, 1});
  CHECK_FALSE(cols.is_contiguous());
  CHECK(cols.to_vector<float>() == std::vector<float>{1, 2, 3, 6, 7, 8, 11, 12, 13, 16, 17, 18});
  const Tensor last_rows = x.narrow(0, -2, 2);
  CHECK(last_rows.to_vector<float>() == range(10, 20));
  CHECK(last_rows.is_contiguous());
  CHECK(x.narrow(0, 4, 0).numel() == 0);  // an empty slice at the end is allowed
  CHECK(x.narrow(1, 2, 2).narrow(0, 1, 2).to_vector<float>() == std::vector<float>{7, 8, 12, 13});
}

TEST_CASE("chunk follows torch.chunk: ceil-sized pieces, the last smaller, maybe fewer") {
  auto sizes = [](const std::vector<Tensor>& pieces, int64_t dim) {
    std::vector<int64_t> s;
    for (const Tensor& p : pieces) s.push_back(p.size(dim));
    return s;
  };
  const Tensor thirty = iota({30, 2});
  const std::vector<Tensor> four = chunk(thirty, 4);
  CHECK(sizes(four, 0) == std::vector<int64_t>{8, 8, 8, 6});
  for (const Tensor& p : four) CHECK(p.storage().is_alias_of(thirty.storage()));
  CHECK(four[3].to_vector<float>() == range(48, 60));
  CHECK(four[1].storage_offset() == 16);

  CHECK(sizes(chunk(iota({2, 3}), 4), 0) == std::vector<int64_t>{1, 1});  // fewer pieces
  CHECK(sizes(chunk(iota({9}), 4), 0) == std::vector<int64_t>{3, 3, 3});  // 3 pieces, not 4
  CHECK(sizes(chunk(iota({8}), 4), 0) == std::vector<int64_t>{2, 2, 2, 2});
  CHECK(sizes(chunk(iota({1, 7}), 3, 1), 1) == std::vector<int64_t>{3, 3, 1});
  CHECK(sizes(chunk(iota({5, 6}), 3, -1), 1) == std::vector<int64_t>{2, 2, 2});
  CHECK(sizes(chunk(iota({4}), 1), 0) == std::vector<int64_t>{4});
  // torch.empty(0, 3).chunk(2) is two tensors of shape (0, 3): ATen's chunk keeps the
  // count of an empty dimension's pieces.
  const std::vector<Tensor> empty_pieces = chunk(zeros({0, 3}), 2);
  REQUIRE(empty_pieces.size() == 2);
  CHECK(empty_pieces[0].shape() == Shape{0, 3});
  CHECK(empty_pieces[1].shape() == Shape{0, 3});
  CHECK(sizes(chunk(zeros({2, 0}), 3, 1), 1) == std::vector<int64_t>{0, 0, 0});
}

TEST_CASE("split cuts pieces of the given sizes") {
  const Tensor x = iota({6, 2});
  const std::vector<Tensor> pieces = split(x, {1, 3, 2});
  REQUIRE(pieces.size() == 3);
  CHECK(pieces[0].to_vector<float>() == std::vector<float>{0, 1});
  CHECK(pieces[1].to_vector<float>() == range(2, 8));
  CHECK(pieces[2].to_vector<float>() == range(8, 12));
  const std::vector<Tensor> cols = split(x, {1, 1}, 1);
  CHECK(cols[1].to_vector<float>() == std::vector<float>{1, 3, 5, 7, 9, 11});
}

TEST_CASE("cat copies its inputs along a dim, in order") {
  const Tensor a = iota({2, 3}), b = full({1, 3}, -1.0), c = full({2, 2}, 9.0);
  const Tensor rows = cat({a, b});
  CHECK(rows.shape() == Shape{3, 3});
  CHECK(rows.to_vector<float>() == std::vector<float>{0, 1, 2, 3, 4, 5, -1, -1, -1});
  CHECK_FALSE(rows.storage().is_alias_of(a.storage()));
  const Tensor cols = cat({a, c}, 1);
  CHECK(cols.shape() == Shape{2, 5});
  CHECK(cols.to_vector<float>() == std::vector<float>{0, 1, 2, 9, 9, 3, 4, 5, 9, 9});
  // Views as inputs, int64, a single input, and cat undoing chunk.
  CHECK(cat({a.t(), a.t()}, -1).to_vector<float>() ==
        std::vector<float>{0, 3, 0, 3, 1, 4, 1, 4, 2, 5, 2, 5});
  const Tensor ints = cat({arange(3.0), arange(2.0)});
  CHECK(ints.dtype() == DType::Int64);
  CHECK(ints.to_vector<int64_t>() == std::vector<int64_t>{0, 1, 2, 0, 1});
  CHECK(cat({a}).to_vector<float>() == a.to_vector<float>());
  const Tensor x = iota({7, 3});
  CHECK(cat(chunk(x, 3)).to_vector<float>() == x.to_vector<float>());
}

TEST_CASE("contiguous returns the tensor itself when contiguous, else a packed copy") {
  const Tensor x = iota({3, 4});
  CHECK(x.contiguous().is_same(x));
  const Tensor t = x.t();
  const Tensor c = t.contiguous();
  CHECK(c.is_contiguous());
  CHECK_FALSE(c.storage().is_alias_of(x.storage()));
  CHECK(c.strides() == std::vector<int64_t>{3, 1});
  CHECK(c.to_vector<float>() == t.to_vector<float>());
  // Size-1 dimensions do not break contiguity, whatever their stride.
  CHECK(iota({3, 1}).t().is_contiguous());
  CHECK(iota({4, 5}).narrow(0, 1, 1).is_contiguous());
}

TEST_CASE("expand broadcasts with stride 0 and new leading dims") {
  const Tensor col = iota({3, 1});
  const Tensor e = col.expand({2, 3, 4});
  CHECK(e.shape() == Shape{2, 3, 4});
  CHECK(e.strides() == std::vector<int64_t>{0, 1, 0});
  CHECK(e.storage().is_alias_of(col.storage()));
  const std::vector<float> v = e.to_vector<float>();
  CHECK(v[0] == 0.0f);
  CHECK(v[5] == 1.0f);
  CHECK(v[23] == 2.0f);
  CHECK(col.expand({-1, 2}).shape() == Shape{3, 2});
}

TEST_CASE("to(device) and clone-like copies never alias") {
  const Tensor x = iota({2, 3});
  const Tensor y = x.to(Device::cpu());
  CHECK_FALSE(y.storage().is_alias_of(x.storage()));
  CHECK(y.to_vector<float>() == x.to_vector<float>());
  CHECK(y.device() == Device::cpu());
  const Tensor tt = x.t().to(Device::cpu());
  CHECK(tt.to_vector<float>() == x.t().to_vector<float>());
  const Tensor d = x.detach();
  CHECK(d.storage().is_alias_of(x.storage()));
}
