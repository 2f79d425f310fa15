// Datasets, samplers and the DataLoader: batching, shuffling, drop_last, reproducibility.
#include "catch_compat.h"

#include <algorithm>
#include <memory>
#include <numeric>
#include <set>

#include <minigrad/core/generator.h>
#include <minigrad/data/dataloader.h>
#include <minigrad/data/dataset.h>
#include <minigrad/data/sampler.h>

using namespace mg;
using data::Batch;
using data::DataLoader;
using data::DataLoaderOptions;

namespace {

// n examples of 3 features; example i holds (i, 10i, 100i) and target i % 4.
std::shared_ptr<data::TensorDataset> numbered(int64_t n) {
  std::vector<float> values;
  std::vector<int64_t> targets;
  for (int64_t i = 0; i < n; ++i) {
    values.insert(values.end(), {float(i), float(10 * i), float(100 * i)});
    targets.push_back(i % 4);
  }
  return std::make_shared<data::TensorDataset>(from_vector(values, {n, 3}),
                                               from_vector(targets, {n}));
}

// The example numbers of a batch of `numbered` (its first column).
std::vector<int64_t> ids(const Batch& batch) {
  std::vector<int64_t> out;
  const std::vector<float> v = batch.data.to_vector<float>();
  for (size_t i = 0; i < v.size(); i += 3) out.push_back(static_cast<int64_t>(v[i]));
  return out;
}

std::vector<int64_t> epoch_order(DataLoader& loader) {
  std::vector<int64_t> order;
  for (const Batch& batch : loader) {
    const auto b = ids(batch);
    order.insert(order.end(), b.begin(), b.end());
  }
  return order;
}

DataLoaderOptions batches_of(int64_t batch_size, bool shuffle = false, uint64_t seed = 0,
                             bool drop_last = false) {
  DataLoaderOptions options;
  options.batch_size = batch_size;
  options.shuffle = shuffle;
  options.seed = seed;
  options.drop_last = drop_last;
  return options;
}

// A dataset without a tensor behind it: exercises Dataset's generic get_batch.
class SquaresDataset : public data::Dataset {
 public:
  explicit SquaresDataset(int64_t n, int64_t odd_one = -1) : n_(n), odd_one_(odd_one) {}
  int64_t size() const override { return n_; }
  data::Example get(int64_t index) const override {
    check_index(index, "SquaresDataset");
    const auto x = static_cast<float>(index);
    const int64_t width = index == odd_one_ ? 3 : 2;
    return {full({width}, x * x), scalar_tensor(static_cast<double>(index), DType::Int64)};
  }

 private:
  int64_t n_, odd_one_;
};

// Every other index: what a custom (or distributed) sampler plugs in.
class EvenSampler : public data::Sampler {
 public:
  explicit EvenSampler(int64_t n) : n_(n) {}
  int64_t size() const override { return (n_ + 1) / 2; }
  std::vector<int64_t> indices(int64_t) const override {
    std::vector<int64_t> out;
    for (int64_t i = 0; i < n_; i += 2) out.push_back(i);
    return out;
  }

 private:
  int64_t n_;
};

}  // namespace

TEST_CASE("TensorDataset: get returns rows, get_batch gathers rows in index order") {
  auto ds = numbered(6);
  REQUIRE(ds->size() == 6);
  const data::Example e = ds->get(4);
  REQUIRE(e.data.shape() == Shape{3});
  REQUIRE(e.data.to_vector<float>() == std::vector<float>{4, 40, 400});
  REQUIRE(e.target.item<int64_t>() == 0);

  Batch b = ds->get_batch({5, 1, 2, 3, 0});
  REQUIRE(b.data.shape() == Shape{5, 3});
  REQUIRE(b.target.shape() == Shape{5});
  REQUIRE(ids(b) == std::vector<int64_t>{5, 1, 2, 3, 0});
  REQUIRE(b.target.to_vector<int64_t>() == std::vector<int64_t>{1, 1, 2, 3, 0});
  // A batch is a copy: writing into it leaves the dataset alone.
  b.data.fill_(-1.0);
  REQUIRE(ds->get(5).data.to_vector<float>() == std::vector<float>{5, 50, 500});
}

TEST_CASE("TensorDataset: errors name the sizes") {
  REQUIRE_THROWS_WITH(data::TensorDataset(zeros({4, 2}), zeros({3}, DType::Int64)),
                      MG_CONTAINS("data of shape [4, 2] holds 4 examples but targets of shape "
                                  "[3] hold 3"));
  auto ds = numbered(3);
  REQUIRE_THROWS_WITH(ds->get(3), MG_CONTAINS("index 3 out of range for a dataset of size 3"));
  REQUIRE_THROWS_WITH(ds->get_batch({0, -1}), MG_CONTAINS("index -1 out of range"));
}

TEST_CASE("DataLoader: batches in order, the last one smaller, or dropped") {
  auto ds = numbered(10);
  DataLoader loader(ds, batches_of(4));
  REQUIRE(loader.size() == 3);
  std::vector<std::vector<int64_t>> seen;
  for (const Batch& b : loader) seen.push_back(ids(b));
  REQUIRE(seen == std::vector<std::vector<int64_t>>{{0, 1, 2, 3}, {4, 5, 6, 7}, {8, 9}});

  DataLoader dropping(ds, batches_of(4, false, 0, true));
  REQUIRE(dropping.size() == 2);
  seen.clear();
  for (const Batch& b : dropping) seen.push_back(ids(b));
  REQUIRE(seen == std::vector<std::vector<int64_t>>{{0, 1, 2, 3}, {4, 5, 6, 7}});

  // A batch larger than the dataset: one short batch, or none with drop_last.
  REQUIRE(DataLoader(ds, batches_of(16)).size() == 1);
  REQUIRE(DataLoader(ds, batches_of(16, false, 0, true)).size() == 0);
  DataLoader none(ds, batches_of(16, false, 0, true));
  REQUIRE(none.begin() == none.end());
}

TEST_CASE("DataLoader: shuffle visits every example once per epoch, reproducibly") {
  auto ds = numbered(50);
  DataLoader a(ds, batches_of(8, true, 42));
  a.set_epoch(3);
  const std::vector<int64_t> order = epoch_order(a);
  std::vector<int64_t> sorted = order;
  std::sort(sorted.begin(), sorted.end());
  std::vector<int64_t> all(50);
  std::iota(all.begin(), all.end(), int64_t{0});
  REQUIRE(sorted == all);
  REQUIRE(order != all);

  // Same seed and epoch: the same order, in a different loader.
  DataLoader b(ds, batches_of(8, true, 42));
  b.set_epoch(3);
  REQUIRE(epoch_order(b) == order);
  // Targets travel with their data.
  b.set_epoch(3);
  for (const Batch& batch : b) {
    const auto id = ids(batch);
    const auto t = batch.target.to_vector<int64_t>();
    for (size_t i = 0; i < id.size(); ++i) REQUIRE(t[i] == id[i] % 4);
  }

  // Another epoch, or another seed: another order.
  b.set_epoch(4);
  REQUIRE(epoch_order(b) != order);
  DataLoader c(ds, batches_of(8, true, 43));
  c.set_epoch(3);
  REQUIRE(epoch_order(c) != order);
}

TEST_CASE("DataLoader: each iteration advances the epoch, so loops reshuffle by themselves") {
  auto ds = numbered(30);
  DataLoader loader(ds, batches_of(7, true, 5));
  REQUIRE(loader.epoch() == 0);
  const auto first = epoch_order(loader);
  REQUIRE(loader.epoch() == 1);
  const auto second = epoch_order(loader);
  REQUIRE(first != second);
  loader.set_epoch(1);  // resuming at epoch 1 replays exactly the second epoch
  REQUIRE(epoch_order(loader) == second);
  REQUIRE(data::random_permutation(30, 5, 0) == first);
}

TEST_CASE("DataLoader: a sampler of one's own decides the indices") {
  auto ds = numbered(9);
  DataLoader loader(ds, std::make_shared<EvenSampler>(9), batches_of(2));
  REQUIRE(loader.size() == 3);
  REQUIRE(epoch_order(loader) == std::vector<int64_t>{0, 2, 4, 6, 8});
  REQUIRE_THROWS_WITH(DataLoader(ds, std::make_shared<EvenSampler>(9), batches_of(2, true)),
                      MG_CONTAINS("shuffle=true cannot be combined with a sampler"));
}

TEST_CASE("DataLoader: bad options are refused") {
  auto ds = numbered(3);
  REQUIRE_THROWS_WITH(DataLoader(ds, batches_of(0)),
                      MG_CONTAINS("batch_size must be positive, got 0"));
  REQUIRE_THROWS_WITH(DataLoader(nullptr, batches_of(1)), MG_CONTAINS("the dataset is null"));
  DataLoader loader(ds);
  REQUIRE_THROWS_WITH(loader.set_epoch(-1), MG_CONTAINS("epoch must be non-negative, got -1"));
}

TEST_CASE("Dataset: the generic get_batch stacks examples, and names one that does not fit") {
  auto ds = std::make_shared<SquaresDataset>(5);
  DataLoader loader(ds, batches_of(3));
  auto it = loader.begin();
  REQUIRE(it->data.shape() == Shape{3, 2});
  REQUIRE(it->data.to_vector<float>() == std::vector<float>{0, 0, 1, 1, 4, 4});
  REQUIRE(it->target.to_vector<int64_t>() == std::vector<int64_t>{0, 1, 2});
  ++it;
  REQUIRE(it->data.to_vector<float>() == std::vector<float>{9, 9, 16, 16});
  ++it;
  REQUIRE(it == loader.end());

  SquaresDataset odd(5, 3);
  REQUIRE_THROWS_WITH(odd.get_batch({0, 3}),
                      MG_CONTAINS("example 3 (position 1 in the batch) has data of shape [3], "
                                  "float32 on cpu, but the first has shape [2]"));
}

TEST_CASE("RandomDataset: randn(length, size) from the default generator, no targets") {
  manual_seed(7);
  auto ds = std::make_shared<data::RandomDataset>(5, 100);
  REQUIRE(ds->size() == 100);
  REQUIRE(ds->data().shape() == Shape{100, 5});
  manual_seed(7);
  REQUIRE(ds->data().to_vector<float>() == randn({100, 5}).to_vector<float>());

  DataLoader loader(ds, batches_of(30));
  std::vector<int64_t> sizes;
  for (const Batch& b : loader) {
    REQUIRE_FALSE(b.target.defined());
    REQUIRE(b.data.size(1) == 5);
    sizes.push_back(b.size());
  }
  REQUIRE(sizes == std::vector<int64_t>{30, 30, 30, 10});
  REQUIRE_THROWS_WITH(data::RandomDataset(0, 10), MG_CONTAINS("size and length must be positive"));
}

TEST_CASE("random_permutation: a permutation, fixed by (seed, epoch)") {
  for (int64_t n : {0, 1, 2, 17, 1000}) {
    auto p = data::random_permutation(n, 123, 0);
    REQUIRE(p.size() == static_cast<size_t>(n));
    REQUIRE(std::set<int64_t>(p.begin(), p.end()).size() == static_cast<size_t>(n));
    if (n > 0) REQUIRE(*std::max_element(p.begin(), p.end()) == n - 1);
    REQUIRE(data::random_permutation(n, 123, 0) == p);
  }
  // Every position takes every value: no element stuck in place across epochs.
  std::vector<std::set<int64_t>> seen(4);
  for (int64_t epoch = 0; epoch < 200; ++epoch) {
    auto p = data::random_permutation(4, 9, epoch);
    for (size_t i = 0; i < 4; ++i) seen[i].insert(p[i]);
  }
  for (const auto& s : seen) REQUIRE(s.size() == 4);
}
