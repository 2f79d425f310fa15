// What the ZeRO and FSDP tests share: a small MLP whose units shard unevenly, batches,
// the single-process reference run on the whole batch, and the comparisons.
#pragma once

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "catch_compat.h"
#include "multiprocess.h"

#include <minigrad/autograd/functions.h>
#include <minigrad/core/generator.h>
#include <minigrad/nn/layers.h>
#include <minigrad/nn/optim/sgd.h>
#include <minigrad/parallel/distributed/flat_parameter.h>
#include <minigrad/parallel/distributed/process_group_gloo.h>

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

// The single-process run on the whole batch: the loss of every step, the gradients of
// the first, and the parameters after the last.
struct Reference {
  std::vector<float> losses;
  std::vector<float> first_grads;
  std::vector<float> params;
};

inline Reference reference_run(uint64_t seed, int steps, const optim::SGDOptions& options) {
  auto net = make_uneven_mlp(seed);
  optim::SGD sgd(net->parameters(), options);
  Reference ref;
  for (int step = 0; step < steps; ++step) {
    const ShardBatch b = make_shard_batch(static_cast<uint64_t>(50 + step));
    sgd.zero_grad();
    const Tensor loss = cross_entropy(net->forward(b.x), b.y);
    loss.backward();
    ref.losses.push_back(loss.item<float>());
    if (step == 0) ref.first_grads = flat_values(net->parameters(), true);
    sgd.step();
  }
  ref.params = flat_values(net->parameters());
  return ref;
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
