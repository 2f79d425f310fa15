#include <minigrad/plan/mlp_formulas.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include <minigrad/core/error.h>
#include <minigrad/plan/gpt_formulas.h>  // shard_elements

namespace mg::plan {

namespace {

constexpr double kFloat = 4;

double sum(const std::vector<int64_t>& v) { return static_cast<double>(std::accumulate(v.begin(), v.end(), int64_t{0})); }

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
  if (optimizer == MLPOptimizer::SGD) return 0;
  return kFloat * elements;  // momentum_buffer
}

std::vector<int64_t> mlp_rank_parameter_numels(const MLPConfig& config, int tp) {
  std::vector<int64_t> numels = mlp_parameter_numels(config);
  if (tp == 1) return numels;
  const size_t linears = numels.size() / 2;
  const size_t paired = linears - linears % 2;
  for (size_t i = 0; i < paired; ++i) {
    if (i % 2 == 0) {  // column: the rows of W and of the bias (the row layer's inputs too)
      MG_CHECK(numels[2 * i + 1] % tp == 0, "mlp_rank_parameter_numels: tp {} does not divide {} outputs", tp,
               numels[2 * i + 1]);
      numels[2 * i + 1] /= tp;
    }
    numels[2 * i] /= tp;  // a row layer: the columns of W; its bias whole
  }
  return numels;
}

MLPForwardPeak mlp_forward_peak_floats(const MLPConfig& config, int tp, int64_t rank_rows) {
  std::vector<int64_t> outs = config.hidden;
  outs.push_back(config.classes);
  const size_t linears = outs.size();
  const size_t paired = tp > 1 ? linears - linears % 2 : 0;
  const double b = static_cast<double>(rank_rows);
  double saved = 0;  // the ReLU outputs so far (the next layer's inputs, ReLU's masks)
  MLPForwardPeak peak;
  for (size_t i = 0; i < linears; ++i) {
    const double out = b * static_cast<double>(outs[i]);
    double moment = 0;
    if (i >= paired) {  // a whole Linear: fused with its ReLU, the output alone
      moment = saved + out;
    } else if (i % 2 == 0) {  // column: its slice of the output and ReLU's of it
      moment = saved + 2 * out / tp;
    } else {  // row: the partial product, the all-reduce's sum and the bias added to it
      moment = saved + 3 * out;
    }
    peak.inside = std::max(peak.inside, moment);
    saved += i % 2 == 0 && i < paired ? out / tp : out;  // ReLU's output, or the logits
  }
  peak.end = saved;
  return peak;
}

std::optional<RankMemory> mlp_rank_memory(const MLPConfig& config, const Split& split, int64_t rank_rows,
                                          MLPOptimizer optimizer, int replicas) {
  MG_CHECK(split.zero >= 0 && split.zero <= 3, "mlp_rank_memory: ZeRO stage {} must be 0 to 3", split.zero);
  MG_CHECK(replicas >= 1, "mlp_rank_memory: {} replicas", replicas);
  if (split.pp > 1 || split.cp > 1 || split.zero == 3 || (split.tp > 1 && split.zero > 0)) return std::nullopt;
  if (replicas > 1 && (split.dp > 1 || split.tp > 1 || split.zero > 0)) return std::nullopt;
  const std::vector<int64_t> numels = mlp_rank_parameter_numels(config, split.tp);
  const double psi = sum(numels);
  const double tensors = static_cast<double>(numels.size());
  const bool distributed = split.dp > 1 || split.tp > 1;
  // The running sum of the epoch's loss; once the loss is made, it and (distributed) its
  // copy summed over the ranks (to stop together on a NaN); in backward, its seed gradient.
  const double running = kFloat;
  const double loss = kFloat * (1 + (distributed ? 1 : 0));
  const double seed = kFloat;
  const MLPForwardPeak forward_peak = mlp_forward_peak_floats(config, split.tp, rank_rows);
  const double forward_act = std::max(kFloat * forward_peak.inside + running, kFloat * forward_peak.end + running + loss);
  // Under tp the whole model the shards were cut from stays (the trainer's `model`).
  const double kept = split.tp > 1 ? kFloat * sum(mlp_parameter_numels(config)) : 0;

  RankMemory r;
  if (replicas > 1) {  // DataParallel in one process: the process's bytes
    const double R = replicas;
    r.params = kFloat * psi;
    r.grads = kFloat * psi;
    r.optimizer = mlp_optimizer_bytes(optimizer, psi, tensors);
    // Forward: the replicas' parameters past the first (which shares the original's) in
    // broadcast's flat copies, beside the last step's gradients and the activations (the
    // replicas' together are one device's). The reduce_add in BroadcastBackward: every
    // replica's gradients (.grad is none: zero_grad) and each flattened, and the host
    // communicator's running sum (at most two sums alive at an add); the activations gone.
    const double forward = kFloat * psi + kFloat * (R - 1) * psi + forward_act;
    const double reduce_add = kFloat * psi * (2 * R + std::min(R - 1, 2.0)) + running + loss + seed;
    r.buffers = reduce_add > forward ? kFloat * psi * (2 * R + std::min(R - 1, 2.0) - 1) : kFloat * (R - 1) * psi;
    r.activations = reduce_add > forward ? running + loss + seed : forward_act;
    return r;
  }
  if (split.zero == 0) {
    r.params = kFloat * psi + kept;
    r.grads = kFloat * psi;
    r.optimizer = mlp_optimizer_bytes(optimizer, psi, tensors);
    r.buffers = split.dp > 1 ? kFloat * psi : 0;  // DDP's buckets: every gradient once
    r.activations = forward_act;
    return r;
  }
  const std::vector<int64_t> buckets = mlp_zero_bucket_numels(config);
  const double shards = shard_elements(buckets, split.dp);
  const double N = split.dp;
  r.params = kFloat * N * shards;  // every rank keeps the padded flat buffers whole
  r.optimizer = mlp_optimizer_bytes(optimizer, shards, static_cast<double>(buckets.size()));
  if (split.zero == 1) {
    r.grads = kFloat * psi;
    const double step = kFloat * shards + running + loss;  // the gradient shards, beside DDP's bucket
    r.buffers = kFloat * psi + (step > forward_act ? kFloat * shards : 0);
    r.activations = step > forward_act ? running + loss : forward_act;
    return r;
  }
  // ZeRO-2: at forward's end the last step's gradient shards alone; the reduce-scatter's
  // moment holds the flat gradients, their scratch and the first weight's gradient.
  r.grads = kFloat * shards;
  const double flat = kFloat * N * shards;
  const double first_weight = kFloat * static_cast<double>(numels.front());
  const double reduce_scatter = 2 * flat + first_weight + running + loss + seed;
  r.buffers = reduce_scatter > forward_act ? 2 * flat + first_weight : 0;
  r.activations = reduce_scatter > forward_act ? running + loss + seed : forward_act;
  return r;
}

std::optional<MLPZero3Memory> mlp_zero3_memory(const MLPConfig& config, const Split& split, int64_t rank_rows,
                                               MLPOptimizer optimizer) {
  if (split.zero != 3 || split.tp > 1 || split.pp > 1 || split.cp > 1 || split.dp < 2) return std::nullopt;
  (void)rank_rows;  // the activations are gone at the moment: the loss's scalars alone
  const std::vector<int64_t> numels = mlp_parameter_numels(config);
  const double N = split.dp;
  double shards = 0;  // a Linear's unit: its weight and bias, ceil(Ψ_u / N) a rank
  for (size_t i = 0; i + 1 < numels.size(); i += 2) shards += std::ceil(static_cast<double>(numels[i] + numels[i + 1]) / N);
  const double first_unit = kFloat * N * std::ceil(static_cast<double>(numels[0] + numels[1]) / N);
  MLPZero3Memory m;
  m.low.params = kFloat * shards;
  m.low.grads = kFloat * shards;
  m.low.optimizer = mlp_optimizer_bytes(optimizer, shards, static_cast<double>(numels.size() / 2));
  m.low.buffers = 2 * first_unit + kFloat * static_cast<double>(numels.front());
  m.low.activations = kFloat * 4;  // the running loss, the loss and its copy summed over the ranks, its seed
  m.scratch = first_unit;
  return m;
}

std::optional<RankMemory> mlp_pipe_memory(const MLPConfig& config, int64_t rows, int64_t chunks, bool one_f_one_b,
                                          MLPOptimizer optimizer) {
  if (config.hidden.size() != 2 || rows < 1 || chunks < 1) return std::nullopt;
  // torch.chunk's cut (comm::chunk_sizes): ceil(rows / chunks) a micro-batch, the last the rest.
  const int64_t piece = (rows + chunks - 1) / chunks;
  std::vector<double> r;
  for (int64_t start = 0; start < rows; start += std::min(piece, rows - start))
    r.push_back(static_cast<double>(std::min(piece, rows - start)));
  const size_t m = r.size();
  if (m < 2) return std::nullopt;
  const std::vector<int64_t> numels = mlp_parameter_numels(config);
  const double psi = sum(numels);
  const double in = static_cast<double>(config.inputs);
  const double h0 = static_cast<double>(config.hidden[0]), h1 = static_cast<double>(config.hidden[1]);
  const double linear0 = kFloat * static_cast<double>(numels[0] + numels[1]);  // W0's and b0's gradients
  const double linear1 = kFloat * static_cast<double>(numels[2] + numels[3]);  // W1's and b1's
  double logits = 0;
  for (const double rj : r) logits += rj * static_cast<double>(config.classes);
  const double losses = kFloat * (static_cast<double>(m) + 1);  // each micro-batch's weighted loss, the running loss
  // One moment: which gradients are in .grad, which pending, and the micro-batches' floats.
  struct Moment {
    double grads, pending, floats;
  };
  std::vector<Moment> moments;
  const double every = kFloat * psi;
  if (!one_f_one_b) {
    const size_t j = m - 2;  // recomputed
    double floats = 0;
    for (size_t i = 0; i <= j; ++i) floats += r[i] * in;  // the checkpointed inputs 0..m-2
    floats += r[j] * (2 * h1 + h0);                        // its root, the root's gradient, ReLU's input gradient
    for (size_t i = 0; i < j; ++i) floats += r[i] * h1;   // stage 1's input gradients queued
    moments.push_back({every, linear0, floats});
    // micro-batch m-1's backward, the first: all its inputs, .grad of the first Linear not yet made
    const size_t k = m - 1;
    double first = 0;
    for (size_t i = 0; i <= k; ++i) first += r[i] * in;
    first += r[k] * (2 * h1 + h0);
    for (size_t i = 0; i < k; ++i) first += r[i] * h1;
    moments.push_back({every - linear0, linear0, first});
  } else {
    const size_t j = m - 2, k = m - 1;
    // micro-batch m-2 recomputed beside m-1's graph: the inputs of both, m-1's ReLU output and
    // root, m-2's root, its gradient and ReLU's input gradient, m-1's input gradient queued.
    const double floats = (r[j] + r[k]) * in + r[k] * (h0 + h1) + r[j] * (2 * h1 + h0) + r[k] * h1;
    moments.push_back({m >= 3 ? every : every - linear0 - linear1, linear0 + linear1, floats});
    // micro-batch m-1's: its input, root, gradient and ReLU's input gradient; nothing queued.
    moments.push_back({every, linear0, r[k] * (in + 2 * h1 + h0)});
  }
  const Moment* peak = &moments.front();
  for (const Moment& x : moments)
    if (x.grads + x.pending + kFloat * x.floats > peak->grads + peak->pending + kFloat * peak->floats) peak = &x;
  RankMemory out;
  out.params = every;
  out.grads = peak->grads;
  out.optimizer = mlp_optimizer_bytes(optimizer, psi, static_cast<double>(numels.size()));
  out.buffers = peak->pending;
  out.activations = kFloat * (peak->floats + logits) + losses;
  return out;
}

double mlp_data_bytes(const MLPConfig& config, int64_t train_images, int64_t test_images, int64_t rank_rows) {
  const double image = kFloat * static_cast<double>(config.inputs);
  const double label = 8;  // int64
  return static_cast<double>(train_images + test_images + rank_rows) * (image + label);
}

}  // namespace mg::plan
