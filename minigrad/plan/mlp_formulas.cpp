#include <minigrad/plan/mlp_formulas.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include <minigrad/core/error.h>

namespace mg::plan {

namespace {

constexpr double kFloat = 4;

double sum(const std::vector<int64_t>& v) { return static_cast<double>(std::accumulate(v.begin(), v.end(), int64_t{0})); }

// Σ_g ceil(Ψ_g / N): a rank's shard of every bucket, padding included (flat_parameter.h).
double shard_elements(const std::vector<int64_t>& buckets, int ranks) {
  double shards = 0;
  for (const int64_t g : buckets) shards += std::ceil(static_cast<double>(g) / ranks);
  return shards;
}

}  // namespace

std::vector<int64_t> mlp_parameter_numels(const MLPConfig& config) {
  std::vector<int64_t> numels;
  int64_t width = config.inputs;
  std::vector<int64_t> outs = config.hidden;
  outs.push_back(config.classes);
  for (const int64_t out : outs) {
    numels.push_back(out * width);
    numels.push_back(out);
    width = out;
  }
  return numels;
}

std::vector<int64_t> mlp_zero_bucket_numels(const MLPConfig& config, double cap_bytes) {
  const std::vector<int64_t> numels = mlp_parameter_numels(config);
  std::vector<int64_t> buckets;
  int64_t open = 0;
  for (auto it = numels.rbegin(); it != numels.rend(); ++it) {
    open += *it;
    if (kFloat * static_cast<double>(open) >= cap_bytes) {
      buckets.push_back(open);
      open = 0;
    }
  }
  if (open > 0) buckets.push_back(open);
  return buckets;
}

double mlp_optimizer_bytes(MLPOptimizer optimizer, double elements, double tensors) {
  if (optimizer == MLPOptimizer::AdamW) return 2 * kFloat * elements + 8 * tensors;  // exp_avg, exp_avg_sq, step
  return kFloat * elements;                                                       // momentum_buffer
}

std::optional<RankMemory> mlp_rank_memory(const MLPConfig& config, const Split& split, int64_t rank_rows,
                                          MLPOptimizer optimizer) {
  MG_CHECK(split.zero >= 0 && split.zero <= 3, "mlp_rank_memory: ZeRO stage {} must be 0 to 3", split.zero);
  if (split.tp > 1 || split.pp > 1 || split.cp > 1 || split.zero == 3) return std::nullopt;
  const std::vector<int64_t> numels = mlp_parameter_numels(config);
  const double psi = sum(numels);
  const double tensors = static_cast<double>(numels.size());
  const bool distributed = split.dp > 1;
  // The loss and the epoch's running sum; a distributed rank's copy of the loss summed over
  // the ranks (to stop together on a NaN); in backward, its seed gradient.
  const double scalars = kFloat * (2 + (distributed ? 1 : 0));
  const double seed = kFloat;
  const double rows = static_cast<double>(rank_rows);
  const double saved = kFloat * rows * (sum(config.hidden) + static_cast<double>(config.classes));

  RankMemory r;
  if (split.zero == 0) {
    r.params = kFloat * psi;
    r.grads = kFloat * psi;
    r.optimizer = mlp_optimizer_bytes(optimizer, psi, tensors);
    r.buffers = distributed ? kFloat * psi : 0;  // DDP's buckets: every gradient once
    r.activations = saved + scalars;
    return r;
  }
  const std::vector<int64_t> buckets = mlp_zero_bucket_numels(config);
  const double shards = shard_elements(buckets, split.dp);
  const double N = split.dp;
  r.params = kFloat * N * shards;  // every rank keeps the padded flat buffers whole
  r.optimizer = mlp_optimizer_bytes(optimizer, shards, static_cast<double>(buckets.size()));
  if (split.zero == 1) {
    r.grads = kFloat * psi;
    const double forward_end = kFloat * psi + saved + scalars;       // DDP's bucket + activations
    const double step = kFloat * psi + kFloat * shards + scalars;    // DDP's bucket + gradient shards
    r.buffers = kFloat * psi + (step > forward_end ? kFloat * shards : 0);
    r.activations = step > forward_end ? scalars : saved + scalars;
    return r;
  }
  // ZeRO-2: at forward's end the last step's gradient shards alone; the reduce-scatter's
  // moment holds the flat gradients, their scratch and the first weight's gradient.
  r.grads = kFloat * shards;
  const double flat = kFloat * N * shards;
  const double first_weight = kFloat * static_cast<double>(numels.front());
  const double reduce_scatter = 2 * flat + first_weight + scalars + seed;
  const double forward_end = saved + scalars;
  r.buffers = reduce_scatter > forward_end ? 2 * flat + first_weight : 0;
  r.activations = reduce_scatter > forward_end ? scalars + seed : saved + scalars;
  return r;
}

double mlp_data_bytes(const MLPConfig& config, int64_t train_images, int64_t test_images, int64_t rank_rows) {
  const double image = kFloat * static_cast<double>(config.inputs);
  const double label = 8;  // int64
  return static_cast<double>(train_images + test_images + rank_rows) * (image + label);
}

}  // namespace mg::plan
