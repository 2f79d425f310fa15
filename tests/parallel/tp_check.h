// The central check of tensor parallelism, shared by tests/parallel (CPU devices),
// tests/cuda (a repeated GPU) and tests/distributed (Gloo and NCCL ranks): a model split
// by parallelize_mlp gives the same loss, gradients and, after SGD steps, parameters as
// the plain model on the whole batch. Every rank's piece of every parameter and gradient
// is compared with the matching part of the plain model's (the whole, for the pieces
// every rank holds alike): the gathered tensors, compared rank by rank.
//
// The comparison measures instead of asserting, so a test can also show that a wrong
// variant (a missing all-reduce) fails it.
#pragma once

#include <algorithm>
#include <cmath>
#include <functional>
#include <memory>
#include <string>
#include <typeinfo>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "parallel/dp_check.h"

#include <minigrad/minigrad.h>
#include <minigrad/parallel/tensor_parallel/layers.h>
#include <minigrad/parallel/tensor_parallel/tensor_parallel.h>

namespace mg::testing {

// How parallelize_mlp splits a parameter: by rows (a column layer's weight and bias), by
// columns (a row layer's weight), or not at all (a row layer's bias, a layer left whole).
enum class ShardKind { Rows, Columns, Whole };

// The kind of every parameter of `plain` (a Sequential of Linear and ReLU), in the order
// of named_parameters(), by parallelize_mlp's rule: Linear layers in pairs, an odd one
// left over at the end stays whole.
inline std::vector<ShardKind> shard_kinds(const nn::Module& plain) {
  size_t linears = 0;
  for (const auto& [name, child] : plain.named_children())
    if (typeid(*child) == typeid(nn::Linear)) ++linears;
  const size_t paired = linears - linears % 2;
  std::vector<ShardKind> kinds;
  size_t index = 0;
  for (const auto& [name, child] : plain.named_children()) {
    if (typeid(*child) != typeid(nn::Linear)) continue;
    const bool bias = static_cast<const nn::Linear&>(*child).has_bias();
    if (index >= paired) {
      kinds.push_back(ShardKind::Whole);
      if (bias) kinds.push_back(ShardKind::Whole);
    } else if (index % 2 == 0) {
      kinds.push_back(ShardKind::Rows);
      if (bias) kinds.push_back(ShardKind::Rows);
    } else {
      kinds.push_back(ShardKind::Columns);
      if (bias) kinds.push_back(ShardKind::Whole);
    }
    ++index;
  }
  return kinds;
}

// Rank `rank`'s piece of `full` (a contiguous CPU copy).
inline Tensor shard_piece(const Tensor& full, ShardKind kind, int rank, int ranks) {
  const Tensor host = full.to(Device::cpu()).detach();
  if (kind == ShardKind::Whole) return host.contiguous();
  const int64_t dim = kind == ShardKind::Rows ? 0 : 1;
  const int64_t part = host.size(dim) / ranks;
  return host.narrow(dim, rank * part, part).contiguous();
}

// The worst disagreement seen: |got - want| / (atol + rtol * max(|got|, |want|)), so
// anything <= 1 is within tolerance; `where` names the worst element.
struct Mismatch {
  double rtol = 1e-5, atol = 1e-6;
  double worst = 0.0;
  std::string where = "nothing compared";
  int64_t compared = 0;

  bool ok() const { return compared > 0 && worst <= 1.0; }

  void add(const Tensor& got, const Tensor& want, const std::string& what) {
    if (got.shape() != want.shape()) {
      worst = INFINITY;
      where = fmt::format("{}: shape {} against {}", what, got.shape(), want.shape());
      return;
    }
    const std::vector<float> g = got.to(Device::cpu()).contiguous().to_vector<float>();
    const std::vector<float> w = want.to(Device::cpu()).contiguous().to_vector<float>();
    for (size_t i = 0; i < g.size(); ++i) {
      ++compared;
      const double bound = atol + rtol * std::max(std::fabs(double(g[i])), std::fabs(double(w[i])));
      const double ratio = std::fabs(double(g[i]) - double(w[i])) / bound;
      if (!(ratio <= worst)) {  // NaN counts as worst
        worst = std::isnan(ratio) ? INFINITY : ratio;
        where = fmt::format("{}: element {} is {} but should be {}", what, i, g[i], w[i]);
      }
    }
  }

  // Ranks' pieces of every tensor against the plain model's: pieces[i] = (r, tensors),
  // tensors[k] being rank r's piece of plain[k], of `ranks` ranks in all.
  void add_ranks(const std::vector<std::pair<int, std::vector<Tensor>>>& pieces, int ranks,
                 const std::vector<nn::NamedTensor>& plain, const std::vector<Tensor>& plain_values,
                 const std::vector<ShardKind>& kinds, const std::string& what) {
    for (const auto& [r, tensors] : pieces) {
      if (tensors.size() != plain.size()) {
        worst = INFINITY;
        where = fmt::format("rank {} has {} parameters, the plain model {}", r, tensors.size(),
                            plain.size());
        return;
      }
      for (size_t k = 0; k < plain.size(); ++k)
        add(tensors[k], shard_piece(plain_values[k], kinds[k], r, ranks),
            fmt::format("{} of {} on rank {}", what, plain[k].first, r));
    }
  }
};

// parallelize_mlp, or a deliberately wrong variant of it, for rank `group`.
using MakeShard = std::function<nn::ModulePtr(const nn::Sequential&,
                                              const parallel::TensorParallelGroupPtr&)>;

inline nn::ModulePtr default_shard(const nn::Sequential& mlp,
                                   const parallel::TensorParallelGroupPtr& group) {
  return parallel::parallelize_mlp(mlp, group);
}

// The column layer with Megatron's f left out: forward is the same, but the gradient of
// its input is this rank's part only, not the sum over the ranks.
class ColumnWithoutAllReduce : public nn::ColumnParallelLinear {
 public:
  using nn::ColumnParallelLinear::ColumnParallelLinear;
  Tensor forward(const Tensor& input) override {
    return linear(input, weight(), has_bias() ? bias() : Tensor());
  }

 protected:
  // TensorParallel runs shallow clones of the shards: the clone must be of this class.
  nn::ModulePtr copy_node() const override { return std::make_shared<ColumnWithoutAllReduce>(*this); }
};

// parallelize_mlp, but the column layer of every block after the first one is
// ColumnWithoutAllReduce (the first block's input is the data, whose gradient nobody
// needs, so f does nothing there and leaving it out would not be wrong).
inline nn::ModulePtr shard_without_backward_all_reduce(const nn::Sequential& mlp,
                                                const parallel::TensorParallelGroupPtr& group) {
  auto good = parallel::parallelize_mlp(mlp, group);
  auto out = std::make_shared<nn::Sequential>();
  int columns = 0;
  for (size_t i = 0; i < good->size(); ++i) {
    nn::ModulePtr layer = (*good)[i];
    if (typeid(*layer) == typeid(nn::ColumnParallelLinear) && columns++ > 0)
      layer = std::make_shared<ColumnWithoutAllReduce>(
          static_cast<const nn::Linear&>(*mlp[i]), group, false);
    out->push_back(layer);
  }
  return out;
}

// For an MLP of Linear, ReLU, Linear: the column layer gathers its output and the row
// layer scatters its input again, so the two all-gather paths (gather_from_parallel,
// scatter_to_parallel) run too. The same shards as parallelize_mlp's, by another road.
inline nn::ModulePtr shard_with_gather_and_scatter(const nn::Sequential& mlp,
                                                   const parallel::TensorParallelGroupPtr& group) {
  MG_CHECK(mlp.size() == 3, "shard_with_gather_and_scatter: expected Linear, ReLU, Linear");
  return std::make_shared<nn::Sequential>(std::initializer_list<nn::ModulePtr>{
      std::make_shared<nn::ColumnParallelLinear>(static_cast<const nn::Linear&>(*mlp[0]), group,
                                                 /*gather_output=*/true),
      std::make_shared<nn::ReLU>(),
      std::make_shared<nn::RowParallelLinear>(static_cast<const nn::Linear&>(*mlp[2]), group,
                                              /*input_is_parallel=*/false)});
}

// A tensor-parallel model under test: `model` runs the forward (TensorParallel in one
// process; this rank's shard, perhaps inside DistributedDataParallel, across processes);
// `shards` are the (rank, module) pairs whose parameters this process compares (every
// rank's in one process, its own across processes), of `ranks` ranks in all. `rows`
// picks the rows of the batch `model` sees (all of them but under data parallelism),
// and `loss` turns its loss into the loss of the whole batch (e.g. a mean over the
// data-parallel ranks); both default to the identity.
struct ShardedModel {
  nn::ModulePtr model;
  std::vector<std::pair<int, nn::ModulePtr>> shards;
  int ranks = 1;
  std::function<Tensor(const Tensor&)> rows = [](const Tensor& t) { return t; };
  std::function<Tensor(const Tensor&)> loss = [](const Tensor& t) { return t; };
};

// The plain MLP of `widths` (seeded) on `device` and its tensor-parallel twin made by
// `build` from it, `steps` SGD steps (lr 0.1, written by hand) on random batches of
// `batch` rows (every process draws the same ones): the loss and every gradient after
// each backward, and every parameter at the end, go into the returned Mismatch.
inline Mismatch sharded_against_plain(const std::vector<int64_t>& widths, int64_t batch,
                                      Device device, int steps,
                                      const std::function<ShardedModel(const nn::Sequential&)>& build,
                                      double rtol = 1e-5, double atol = 1e-6) {
  Mismatch m;
  m.rtol = rtol;
  m.atol = atol;
  manual_seed(20240611);
  auto plain = std::static_pointer_cast<nn::Sequential>(make_mlp(widths));
  plain->to(device);
  const ShardedModel sharded = build(*plain);

  const auto named = plain->named_parameters();
  const auto kinds = shard_kinds(*plain);
  auto pieces = [&](bool grads) {
    std::vector<std::pair<int, std::vector<Tensor>>> out;
    for (const auto& [rank, shard] : sharded.shards) {
      std::vector<Tensor> values;
      for (const Tensor& p : shard->parameters()) values.push_back(grads ? p.grad() : p);
      out.emplace_back(rank, values);
    }
    return out;
  };
  auto plain_values = [&](bool grads) {
    std::vector<Tensor> out;
    for (const auto& [name, p] : named) out.push_back(grads ? p.grad() : p);
    return out;
  };

  const double lr = 0.1;
  for (int step = 0; step < steps; ++step) {
    const Tensor x = randn({batch, widths.front()}, device);
    const Tensor targets = randint(0, widths.back(), {batch}, device);
    const Tensor plain_loss = cross_entropy(plain->forward(x), targets);
    const Tensor tp_loss = cross_entropy(sharded.model->forward(sharded.rows(x)), sharded.rows(targets));
    m.add(sharded.loss(tp_loss.detach()), plain_loss, fmt::format("loss at step {}", step));

    plain->zero_grad();
    sharded.model->zero_grad();
    plain_loss.backward();
    tp_loss.backward();
    m.add_ranks(pieces(true), sharded.ranks, named, plain_values(true), kinds,
                fmt::format("gradient at step {}", step));

    NoGradGuard no_grad;
    for (Tensor p : plain->parameters()) p.add_(p.grad(), -lr);
    for (Tensor p : sharded.model->parameters()) p.add_(p.grad(), -lr);
  }
  m.add_ranks(pieces(false), sharded.ranks, named, plain_values(false), kinds,
              fmt::format("parameter after {} steps", steps));
  return m;
}

// In one process: TensorParallel over `devices` (the plain model on devices[0]), the
// shards made by `make_shard` (parallelize_mlp, or a wrong variant).
inline Mismatch tensor_parallel_against_plain(const std::vector<int64_t>& widths, int64_t batch,
                                              const std::vector<Device>& devices, int steps = 3,
                                              const MakeShard& make_shard = default_shard,
                                              double rtol = 1e-5, double atol = 1e-6) {
  return sharded_against_plain(widths, batch, devices[0], steps, [&](const nn::Sequential& plain) {
    auto group = std::make_shared<parallel::InProcessGroup>(devices);
    ShardedModel sharded;
    std::vector<nn::ModulePtr> shards;
    for (int r = 0; r < group->size(); ++r) {
      shards.push_back(make_shard(plain, group->rank(r)));
      sharded.shards.emplace_back(r, shards.back());
    }
    sharded.model = std::make_shared<parallel::TensorParallel>(shards, group);
    sharded.ranks = group->size();
    return sharded;
  }, rtol, atol);
}

}  // namespace mg::testing
