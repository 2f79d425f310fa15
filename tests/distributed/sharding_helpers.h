// What the ZeRO and FSDP tests share: a small MLP whose units shard unevenly, batches,
// the single-process reference run on the whole batch, and the comparisons.
#pragma once

#include <cmath>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "catch_compat.h"
#include "multiprocess.h"

#include <minigrad/autograd/functions.h>
#include <minigrad/core/generator.h>
#include <minigrad/nn/layers.h>
#include <minigrad/nn/optim/adam.h>
#include <minigrad/nn/optim/optimizer.h>
#include <minigrad/nn/optim/sgd.h>
#include <minigrad/parallel/c10d/gloo/process_group_gloo.h>
#include <minigrad/parallel/sharded/flat_parameter.h>

namespace mg::test {

constexpr int64_t kShardIn = 5;
constexpr int64_t kShardClasses = 3;
constexpr int64_t kShardBatch = 8;  // divides over 1, 2 and 4 ranks

// Units (one per Linear) of 42, 16, 3 and 6 elements: on 2 ranks every unit's shard
// boundary falls inside a weight or between tensors; on 4 ranks units 2 and 3 leave
// rank 3 a shard of padding alone.
inline std::shared_ptr<nn::Sequential> make_uneven_mlp(uint64_t seed) {
  manual_seed(seed);
  return std::make_shared<nn::Sequential>(std::initializer_list<nn::ModulePtr>{
      std::make_shared<nn::Linear>(kShardIn, 7), std::make_shared<nn::ReLU>(),
      std::make_shared<nn::Linear>(7, 2), std::make_shared<nn::ReLU>(),
      std::make_shared<nn::Linear>(2, 1), std::make_shared<nn::Linear>(1, kShardClasses)});
}

struct ShardBatch {
  Tensor x, y;
};

inline ShardBatch make_shard_batch(uint64_t seed, int64_t rows = kShardBatch) {
  manual_seed(seed);
  return {randn(Shape{rows, kShardIn}), randint(0, kShardClasses, Shape{rows})};
}

// This rank's equal slice of the batch of step `step`.
inline ShardBatch local_slice(int step, int rank, int world) {
  const ShardBatch all = make_shard_batch(static_cast<uint64_t>(50 + step));
  const int64_t per = kShardBatch / world;
  return {all.x.narrow(0, rank * per, per), all.y.narrow(0, rank * per, per)};
}

// A group of one, in this process (single-process checks, and a "no communication" run).
inline std::shared_ptr<parallel::ProcessGroup> single_process_group() {
  parallel::TCPStoreOptions options;
  options.is_server = true;
  options.rank = 0;
  auto store = std::make_shared<parallel::TCPStore>("127.0.0.1", 0, options);
  return std::make_shared<parallel::ProcessGroupGloo>(store, 0, 1);
}

inline std::vector<float> flat_values(const std::vector<Tensor>& tensors, bool grads = false) {
  std::vector<float> out;
  for (const Tensor& t : tensors) {
    const auto v = (grads ? t.grad() : t).contiguous().to_vector<float>();
    out.insert(out.end(), v.begin(), v.end());
  }
  return out;
}

// True when every element agrees within tol (relative to the reference's magnitude).
inline bool all_close(const std::vector<float>& a, const std::vector<float>& b,
                      float tol = 2e-5f) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (!(std::abs(a[i] - b[i]) <= tol * (1.0f + std::abs(b[i])))) return false;
  return true;
}

inline void require_close(const std::vector<float>& a, const std::vector<float>& b,
                          float tol = 2e-5f) {
  REQUIRE(a.size() == b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    INFO("element " << i << ": " << a[i] << " vs " << b[i]);
    REQUIRE(std::abs(a[i] - b[i]) <= tol * (1.0f + std::abs(b[i])));
  }
}

// Builds an optimizer over the given tensors (the whole model's, or a rank's shards).
using MakeOptimizer = std::function<std::unique_ptr<optim::Optimizer>(std::vector<Tensor>)>;

inline MakeOptimizer sgd_momentum() {
  return [](std::vector<Tensor> params) {
    return std::make_unique<optim::SGD>(std::move(params), optim::SGDOptions(0.1).momentum(0.9));
  };
}

// AdamW with its default decoupled weight decay (1e-2): two states per element, and a
// per-parameter step count.
inline MakeOptimizer adamw() {
  return [](std::vector<Tensor> params) {
    return std::make_unique<optim::AdamW>(std::move(params), optim::AdamWOptions().lr(0.02));
  };
}

// Clips the whole gradient to max_norm, computed here on its own (in double) as
// torch.nn.utils.clip_grad_norm_ does: the reference for the sharded versions.
inline void reference_clip(const std::vector<Tensor>& params, double max_norm) {
  double squares = 0.0;
  for (float g : flat_values(params, true)) squares += static_cast<double>(g) * g;
  const double coef = max_norm / (std::sqrt(squares) + 1e-6);
  if (coef >= 1.0) return;
  for (const Tensor& p : params) Tensor(p.grad()).mul_(coef);
}

// The single-process run on the whole batch: the loss of every step, the gradients of
// the first (after clipping, when max_norm > 0), and the parameters after the last.
struct Reference {
  std::vector<float> losses;
  std::vector<float> first_grads;
  std::vector<float> params;
};

inline Reference reference_run(uint64_t seed, int steps, const MakeOptimizer& make,
                               double max_norm = 0.0) {
  auto net = make_uneven_mlp(seed);
  auto opt = make(net->parameters());
  Reference ref;
  for (int step = 0; step < steps; ++step) {
    const ShardBatch b = make_shard_batch(static_cast<uint64_t>(50 + step));
    opt->zero_grad();
    const Tensor loss = cross_entropy(net->forward(b.x), b.y);
    loss.backward();
    if (max_norm > 0.0) reference_clip(net->parameters(), max_norm);
    ref.losses.push_back(loss.item<float>());
    if (step == 0) ref.first_grads = flat_values(net->parameters(), true);
    opt->step();
  }
  ref.params = flat_values(net->parameters());
  return ref;
}

// The mean over the ranks of each step's loss (the whole batch's loss, for equal slices).
inline std::vector<float> mean_losses(const std::vector<RankResult>& results) {
  std::vector<float> mean;
  for (const RankResult& r : results) {
    const auto losses = r.floats("losses");
    mean.resize(losses.size(), 0.0f);
    for (size_t i = 0; i < losses.size(); ++i)
      mean[i] += losses[i] / static_cast<float>(results.size());
  }
  return mean;
}

// Rebuilds a flattened group (parameters in order, padding dropped) from every rank's
// shard of it, reported under `key`.
inline std::vector<float> unshard_reports(const std::vector<RankResult>& results,
                                          const std::string& key, int64_t numel) {
  std::vector<float> flat;
  for (const RankResult& r : results) {
    const auto shard = r.floats(key);
    flat.insert(flat.end(), shard.begin(), shard.end());
  }
  flat.resize(static_cast<size_t>(numel));
  return flat;
}

}  // namespace mg::test
