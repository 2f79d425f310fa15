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

// A [m, k] @ [k, n] GEMM (+ a bias of n) in 16 bits on the CPU runs the float32 kernel on
// widened copies (core/cpu/matmul.cpp): its operands, bias and result in float32 while it runs.
double widened_gemm_bytes(double m, double k, double n, double bias) { return kFloat * (m * k + k * n + m * n + bias); }

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

MLPForwardPeak mlp_forward_peak_16bit_bytes(const MLPConfig& config, int tp, int64_t rank_rows, bool autocast) {
  constexpr double kHalf = 2;
  std::vector<int64_t> outs = config.hidden;
  outs.push_back(config.classes);
  const size_t linears = outs.size();
  const size_t paired = tp > 1 ? linears - linears % 2 : 0;  // parallelize_mlp's column/row pairs
  const double b = static_cast<double>(rank_rows), t = tp;
  double width = static_cast<double>(config.inputs);
  double kept = kHalf * b * width;  // the batch in 16 bits, the first Linear's saved input
  double last = 0;                  // the last layer's output
  bool float32_input = false;       // a row layer's output under autocast: float32
  MLPForwardPeak peak;
  const auto moment = [&peak](double bytes) { peak.inside = std::max(peak.inside, bytes); };
  for (size_t i = 0; i < linears; ++i) {
    const bool column = i < paired && i % 2 == 0, row = i < paired && i % 2 == 1;
    const double out = static_cast<double>(outs[i]) / (column ? t : 1), in = width / (row ? t : 1);
    const double weight = out * in, bias = row ? 0 : out;  // a row layer adds its bias after the sum
    // Autocast's casts: the weight's and the bias's, and a float32 input's (saved).
    if (autocast) kept += kHalf * (weight + bias) + (float32_input ? kHalf * b * in : 0);
    // The GEMM in 16 bits: its 16-bit output beside the widened copies.
    moment(kept + kHalf * b * out + widened_gemm_bytes(b, in, out, bias));
    double y = kHalf * b * out;
    if (row) {
      // The all-reduce beside the partial product: its sum, and on Gloo's thread the sum
      // widened to float32 for the wire and rounded back; then the bias added to the sum:
      // under autocast a float32 bias promotes it, the sum copied to float32 beside the result.
      moment(kept + 2 * y + kFloat * b * out + kHalf * b * out);
      const double biased = (autocast ? kFloat : kHalf) * b * out;
      moment(kept + 2 * y + (autocast ? kFloat * b * out : 0) + biased);
      y = biased;
    }
    if (i + 1 < linears) {
      if (tp > 1) moment(kept + 2 * y);  // the output and ReLU's of it (unfused under tp)
      kept += y;                         // the ReLU's output (fused on one device), the next input
    }
    float32_input = row && autocast;
    last = y;
    width = static_cast<double>(outs[i]);
  }
  // The logits (a row layer's: its sum, bias added); in 16 bits under autocast the
  // cross-entropy's float32 cast of them, saved.
  const double classes = static_cast<double>(config.classes);
  peak.end = kept + last + (autocast && !float32_input ? kFloat * b * classes : 0);
  return peak;
}

namespace {

// The backward's first Linear making its weight gradient in 16 bits, in bytes: the arriving
// gradient and the GEMM on widened copies (it and the input in float32, the float32 result
// beside the 16-bit one), the saved input (the 16-bit batch; bf16-true holds it anyway:
// not counted then) and under autocast the saved weight cast.
double first_weight_grad_16bit_bytes(const MLPConfig& config, int64_t rank_rows, bool autocast) {
  const double b = static_cast<double>(rank_rows), in = static_cast<double>(config.inputs);
  const double out = static_cast<double>(config.hidden.empty() ? config.classes : config.hidden.front());
  const double weight = out * in;
  const double saved = autocast ? 2 * b * in + 2 * weight : 0;
  return saved + 2 * b * out + widened_gemm_bytes(out, b, in, 0) + 2 * weight;  // dy^T @ x
}

// mlp_rank_memory in 16 bits: one device, DDP, ZeRO-1 and ZeRO-2 (mlp_formulas.h).
std::optional<RankMemory> mlp_rank_memory_16bit(const MLPConfig& config, const Split& split, int64_t rank_rows,
                                                MLPOptimizer optimizer, int replicas, MLPPrecision precision) {
  if (replicas > 1) return std::nullopt;
  const bool bf16_true = precision == MLPPrecision::BF16True;
  const std::vector<int64_t> numels = mlp_rank_parameter_numels(config, split.tp);
  const double psi = sum(numels);
  const double tensors = static_cast<double>(numels.size());
  const double G = bf16_true ? 2 : kFloat;  // the model's parameters and gradients, a element
  const bool distributed = split.dp > 1 || split.tp > 1;
  // The running loss; once the loss is made, it (bf16-true: bfloat16), read in float32 and
  // (distributed) copied to be summed over the ranks; in backward the loss 16-mixed scaled
  // and the seed gradient of what backward was called on.
  const double running = kFloat;
  const double loss = (bf16_true ? 2 + kFloat : kFloat) + (distributed ? kFloat : 0);
  const double seed = (bf16_true ? 2 : kFloat) + (precision == MLPPrecision::F16Mixed ? kFloat : 0);
  const MLPForwardPeak peak = mlp_forward_peak_16bit_bytes(config, split.tp, rank_rows, !bf16_true);
  const double forward_act = std::max(peak.inside + running, peak.end + running + loss);
  // bf16-true's batch is the bfloat16 images themselves, held through the step (autocast's
  // cast of it goes with the graph).
  const double batch16 = bf16_true ? 2 * static_cast<double>(rank_rows * config.inputs) : 0;
  RankMemory r;
  if (split.zero == 0) {
    // Under tp the whole model the shards were cut from stays (bfloat16 in bf16-true: the
    // trainer converts it before the cut).
    r.params = G * psi + (split.tp > 1 ? G * sum(mlp_parameter_numels(config)) : 0);
    r.master = bf16_true ? kFloat * psi : 0;  // MasterWeights' float32 masters
    r.grads = G * psi + r.master;             // the last step's, and the masters' float32 ones
    r.optimizer = mlp_optimizer_bytes(optimizer, psi, tensors);  // over float32 (the masters)
    r.buffers = split.dp > 1 ? G * psi : 0;   // DDP's bucket, in the gradients' dtype
    r.activations = forward_act;
    return r;
  }
  const std::vector<int64_t> buckets = mlp_zero_bucket_numels(config);
  const double shards = shard_elements(buckets, split.dp);
  const double N = split.dp;
  r.params = G * N * shards;  // the padded flat buffers, whole on every rank
  r.master = bf16_true ? kFloat * shards : 0;
  r.optimizer = mlp_optimizer_bytes(optimizer, shards, static_cast<double>(buckets.size()));
  // The masters' gradients live from the step to zero_grad, after the next forward.
  const double master_grads = r.master;
  if (split.zero == 1) {
    // The step: under autocast each bucket's shard of the averaged gradient copied out (as
    // in 32-true); in bf16-true the all-gather of the stepped bfloat16 shards, on Gloo's
    // thread while the caller waits: float32 on the wire (the output and the shard widened)
    // and the output rounded back to bfloat16, a bucket at a time.
    double step_buffers = kFloat * shards;
    if (bf16_true) {
      step_buffers = 0;
      for (const int64_t bucket : buckets) {
        const double shard = std::ceil(static_cast<double>(bucket) / N);
        step_buffers = std::max(step_buffers, kFloat * N * shard + kFloat * shard + 2 * N * shard);
      }
    }
    const double step = step_buffers + batch16 + running + loss;
    r.grads = G * psi + master_grads;
    r.buffers = G * psi + (step > forward_act ? step_buffers : 0);  // DDP's bucket, and the step's
    r.activations = step > forward_act ? batch16 + running + loss : forward_act;
    return r;
  }
  // ZeRO-2's reduce-scatter: the flat gradient and Gloo's slices of it (as in 32-true), the
  // first weight's gradient; in bf16-true the flat gradient widened to float32 for the wire,
  // the slices float32, their sum float32 and rounded into the bfloat16 shard. The masters'
  // gradients are gone by then (zero_grad), back at the forward.
  const double flat = G * N * shards;
  const double scratch = bf16_true ? 2 * kFloat * N * shards + kFloat * shards + 2 * shards : kFloat * N * shards;
  const double first_weight = G * static_cast<double>(numels.front());
  const double reduce_scatter = flat + scratch + first_weight + G * shards + batch16 + running + loss + seed;
  // Before it, with no gradient shard yet (zero_grad) nor the last step's gradients to hold
  // it down, the first Linear's weight-gradient GEMM beside the flat gradient the other
  // layers' went into.
  const double gemm = flat + first_weight_grad_16bit_bytes(config, rank_rows, !bf16_true) + batch16 + running + loss + seed;
  const double forward = G * shards + master_grads + forward_act;
  if (forward >= reduce_scatter && forward >= gemm) {
    r.grads = G * shards + master_grads;
    r.activations = forward_act;
  } else if (reduce_scatter >= gemm) {
    r.grads = G * shards;
    r.buffers = flat + scratch + first_weight;
    r.activations = batch16 + running + loss + seed;
  } else {
    r.buffers = flat;
    r.activations = gemm - flat;
  }
  return r;
}

}  // namespace

std::optional<RankMemory> mlp_rank_memory(const MLPConfig& config, const Split& split, int64_t rank_rows,
                                          MLPOptimizer optimizer, int replicas, MLPPrecision precision) {
  MG_CHECK(split.zero >= 0 && split.zero <= 3, "mlp_rank_memory: ZeRO stage {} must be 0 to 3", split.zero);
  MG_CHECK(replicas >= 1, "mlp_rank_memory: {} replicas", replicas);
  if (split.pp > 1 || split.cp > 1 || split.zero == 3 || (split.tp > 1 && split.zero > 0)) return std::nullopt;
  if (replicas > 1 && (split.dp > 1 || split.tp > 1 || split.zero > 0)) return std::nullopt;
  if (precision != MLPPrecision::True32) return mlp_rank_memory_16bit(config, split, rank_rows, optimizer, replicas, precision);
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

namespace {

// Gloo's buffers for a reduce-scatter of `padded` gradient elements into a shard of `shard`
// (process_group_gloo.cpp): its `slices`, the input's size; in 16 bits the input widened to
// float32 for the wire, float32 slices, their float32 sum and its rounding into the shard.
double gloo_reduce_scatter_bytes(double padded, double shard, bool bf16) {
  return bf16 ? 2 * kFloat * padded + kFloat * shard + 2 * shard : kFloat * padded;
}

}  // namespace

std::optional<MLPZero3Memory> mlp_zero3_memory(const MLPConfig& config, const Split& split, int64_t rank_rows,
                                               MLPOptimizer optimizer, MLPPrecision precision) {
  if (split.zero != 3 || split.tp > 1 || split.pp > 1 || split.cp > 1 || split.dp < 2) return std::nullopt;
  const bool bf16_true = precision == MLPPrecision::BF16True;
  const bool autocast = precision == MLPPrecision::BF16Mixed || precision == MLPPrecision::F16Mixed;
  const double G = bf16_true ? 2 : kFloat;  // the parameters' and gradients' dtype, a element
  const std::vector<int64_t> numels = mlp_parameter_numels(config);
  const double N = split.dp;
  // A Linear's unit: its weight and bias, ceil(Ψ_u / N) a rank, N of them gathered.
  std::vector<double> unit_shards;
  for (size_t i = 0; i + 1 < numels.size(); i += 2)
    unit_shards.push_back(std::ceil(static_cast<double>(numels[i] + numels[i + 1]) / N));
  const double shards = std::accumulate(unit_shards.begin(), unit_shards.end(), 0.0);
  const double first_shard = unit_shards.front(), first_unit = G * N * first_shard;
  const double first_weight = G * static_cast<double>(numels.front());
  // The loss's scalars (running, the loss and its copy summed over the ranks, the seed; in
  // bf16-true the bfloat16 loss read in float32, under 16-mixed the scaled loss) and
  // bf16-true's bfloat16 batch, held through the step.
  const double scalars = kFloat * 3 + (bf16_true ? 2 + 2 : kFloat) + (precision == MLPPrecision::F16Mixed ? kFloat : 0);
  const double batch16 = bf16_true ? 2 * static_cast<double>(rank_rows * config.inputs) : 0;
  // The second unit's reduce-scatter, launched before the first's, is in flight until the
  // first's launch: its flat gradient held, its output made, Gloo's buffers racing.
  const bool second = unit_shards.size() > 1;
  const double second_flat = second ? G * N * unit_shards[1] : 0;
  const double second_racing = second ? gloo_reduce_scatter_bytes(N * unit_shards[1], unit_shards[1], bf16_true) : 0;

  MLPZero3Memory m;
  m.low.params = G * shards;
  m.low.master = bf16_true ? kFloat * shards : 0;  // MasterWeights' float32 master shards
  m.low.optimizer = mlp_optimizer_bytes(optimizer, shards, static_cast<double>(unit_shards.size()));
  // The launch: the unit gathered, its flat gradient, its weight's gradient, every shard's.
  const double launch = 2 * first_unit + first_weight + G * shards + scalars + batch16;
  const double launch_racing = gloo_reduce_scatter_bytes(N * first_shard, first_shard, bf16_true);
  // Before it, the second unit in flight and the first's shard not made: in 16 bits the
  // first weight-gradient GEMM on widened copies (the unit gathered), and under autocast the
  // weight's bfloat16 gradient cast back to float32 (beside it the flat gradient the bias
  // went into).
  const double before = first_unit + second_flat + G * (shards - first_shard) + scalars + batch16;
  const double gemm = precision == MLPPrecision::True32 ? 0 : before + first_weight_grad_16bit_bytes(config, rank_rows, autocast);
  const double cast = autocast ? before + first_unit + 2 * static_cast<double>(numels.front()) + first_weight : 0;
  const double low = std::max({launch, gemm, cast});
  if (launch >= gemm && launch >= cast) {
    m.low.grads = G * shards;
    m.low.buffers = 2 * first_unit + first_weight;
    m.low.activations = scalars + batch16;
  } else {
    m.low.grads = G * (shards - first_shard);
    m.low.buffers = first_unit + second_flat + (cast >= gemm ? first_unit : 0);
    m.low.activations = low - m.low.grads - m.low.buffers;
  }
  // The high: the launch with Gloo's buffers for the first unit, or (a small first Linear)
  // the moment before it with those for the second.
  const double before_low = std::max(gemm, cast);
  m.high_at_launch = launch + launch_racing >= before_low + second_racing;
  m.scratch = m.high_at_launch ? launch_racing : second_racing;
  m.high_below_low = low - (m.high_at_launch ? launch : before_low);
  return m;
}

namespace {

// One tensor-parallel rank's pass as the allocator sees it, in floats above what it holds
// throughout: the levels between two barriers (a phase), and at the barriers themselves
// (every rank's input to the all-reduce and the sum made for it).
struct RankPass {
  std::vector<std::vector<double>> phases{{0}};
  std::vector<double> barriers;
  void level(double floats) { phases.back().push_back(floats); }
  // `before` beside the all-reduce's input, which the caller keeps or lets go after it.
  void all_reduce(double before, double tensor, bool input_kept) {
    barriers.push_back(before + 2 * tensor);
    phases.push_back({before + (input_kept ? 2 : 1) * tensor});
  }
};

// parallelize_mlp's layers: Linear i a column layer (i even), a row layer (i odd) or the
// classifier whole, a ReLU after every hidden one (none fused: the shards are not nn::Linear).
enum class Layer { Column, Row, Whole };
Layer layer_kind(size_t i, size_t paired) { return i >= paired ? Layer::Whole : i % 2 == 0 ? Layer::Column : Layer::Row; }

// The forward above the rank's input copy: what the ops saved so far, each layer's output
// beside it; a row layer's partial product goes into the all-reduce, its bias added to the
// sum after (the partial product and the sum freed once the layer returns).
RankPass rank_forward(const std::vector<int64_t>& outs, size_t paired, int tp, double b, double& saved) {
  RankPass f;
  saved = 0;
  for (size_t i = 0; i < outs.size(); ++i) {
    const double out = b * static_cast<double>(outs[i]);
    const bool relu = i + 1 < outs.size();
    switch (layer_kind(i, paired)) {
      case Layer::Whole:  // the classifier: its logits
        f.level(saved + out);
        saved += out;
        break;
      case Layer::Column:  // its slice of the output, then ReLU's of it (which ReLU saves)
        f.level(saved + out / tp);
        f.level(saved + 2 * out / tp);
        saved += out / tp;
        f.level(saved);
        break;
      case Layer::Row:
        f.level(saved + out);
        f.all_reduce(saved, out, /*input_kept=*/true);  // the layer's local until it returns
        f.level(saved + 3 * out);  // the partial product, its sum and the bias added
        f.level(saved + out);
        if (relu) f.level(saved + 2 * out);  // ReLU's output beside its input
        saved += out;
        f.level(saved);
        break;
    }
  }
  return f;
}

// The backward (run_backward with retain_graph: the saved activations stay, constant
// here): each layer's gradients made, the gradient arriving (`flowing`) freed once its node
// returns; a column layer past the first all-reduces its input's gradient. The levels count
// this step's gradients made so far.
RankPass rank_backward(const std::vector<int64_t>& outs, size_t paired, int tp, double b, double inputs) {
  RankPass f;
  double grads = 0, flowing = 0;  // the seed is the caller's
  for (size_t k = outs.size(); k-- > 0;) {
    const double out = b * static_cast<double>(outs[k]);
    const Layer kind = layer_kind(k, paired);
    if (k + 1 < outs.size()) {  // ReLU's backward: the gradient of its input
      const double dy = kind == Layer::Column ? out / tp : out;
      f.level(grads + flowing + dy);
      flowing = dy;
    }
    const double in = k == 0 ? inputs : static_cast<double>(outs[k - 1]);
    const double weight = static_cast<double>(outs[k]) * in / (kind == Layer::Whole ? 1 : tp);
    const double bias = static_cast<double>(outs[k]) / (kind == Layer::Column ? tp : 1);
    const double dx = k == 0 ? 0 : b * in / (kind == Layer::Row ? tp : 1);
    if (kind == Layer::Row) {  // AddBackward: the bias's gradient, the sum's passed on
      f.level(grads + flowing + bias);
      grads += bias;
      f.level(grads + flowing + dx + weight);
      grads += weight;
    } else {
      f.level(grads + flowing + dx + weight + bias);
      grads += weight + bias;
    }
    if (kind == Layer::Column && k > 0) f.all_reduce(grads, dx, /*input_kept=*/false);  // CopyToParallelBackward
    flowing = dx;
    f.level(grads + flowing);
  }
  return f;
}

// The range of a pass's peak over the ranks' interleavings. Between barriers a rank may be
// anywhere in its phase. When the first rank reaches a level, the others are at or before
// it: at least their lowest since the phase began; when the last does, they are at or
// after it: at least their lowest from there to the phase's end. Every interleaving passes
// both moments (the low); the high puts every rank at its largest level at once. At a
// barrier every rank is there.
struct PassRange {
  double low = 0, high = 0;
};
PassRange pass_range(const RankPass& f, int tp) {
  const double N = tp;
  PassRange r;
  for (const double barrier : f.barriers) {
    r.low = std::max(r.low, N * barrier);
    r.high = std::max(r.high, N * barrier);
  }
  for (const std::vector<double>& phase : f.phases) {
    std::vector<double> after(phase.size());  // the lowest from each level to the phase's end
    double lowest = phase.back();
    for (size_t t = phase.size(); t-- > 0;) after[t] = lowest = std::min(lowest, phase[t]);
    double before = phase.front();
    for (size_t t = 0; t < phase.size(); ++t) {
      before = std::min(before, phase[t]);
      r.low = std::max(r.low, phase[t] + (N - 1) * std::max(before, after[t]));
    }
    r.high = std::max(r.high, N * *std::max_element(phase.begin(), phase.end()));
  }
  return r;
}

}  // namespace

std::optional<MLPTensorParallelInProcessMemory> mlp_tp_in_process_memory(const MLPConfig& config, int tp,
                                                                         int64_t rows, MLPOptimizer optimizer) {
  if (tp < 2 || rows < 1) return std::nullopt;
  const std::vector<int64_t> numels = mlp_rank_parameter_numels(config, tp);
  const double psi = sum(numels), N = tp, b = static_cast<double>(rows);
  std::vector<int64_t> outs = config.hidden;
  outs.push_back(config.classes);
  const size_t paired = outs.size() - outs.size() % 2;
  double saved = 0;  // a rank's activations saved at the forward's end, its logits among them
  const PassRange forward = pass_range(rank_forward(outs, paired, tp, b, saved), tp);
  const PassRange backward =
      pass_range(rank_backward(outs, paired, tp, b, static_cast<double>(config.inputs)), tp);
  const double logits = b * static_cast<double>(config.classes);
  const double inputs = N * b * static_cast<double>(config.inputs);  // each rank's copy of the batch
  // In forward: the last step's gradients (zero_grad follows the forward) and the running
  // loss. In backward: what the ranks saved (retained until the region's node is freed;
  // each rank's logits its root), the caller's gradient of the logits and its copy for each
  // rank, the running loss, the loss and its seed; the gradients are in the ranks' levels.
  const double grads = N * psi;
  const double forward_low = grads + inputs + forward.low + 1, forward_high = grads + inputs + forward.high + 1;
  const double held = inputs + N * saved + (N + 1) * logits + 3;
  const double backward_low = held + backward.low, backward_high = held + backward.high;
  MLPTensorParallelInProcessMemory m;
  m.low.params = kFloat * (sum(mlp_parameter_numels(config)) + N * psi);  // the whole model kept, every rank's shards
  m.low.grads = kFloat * grads;  // at either peak every rank's (the last step's, or this one's made)
  m.low.optimizer = N * mlp_optimizer_bytes(optimizer, psi, static_cast<double>(numels.size()));
  const double low = std::max(forward_low, backward_low), high = std::max(forward_high, backward_high);
  m.low.activations = kFloat * (low - grads);
  m.racing = kFloat * (high - low);
  m.backward = backward_low > forward_low;
  return m;
}

double mlp_data_bytes(const MLPConfig& config, int64_t train_images, int64_t test_images, int64_t rank_rows) {
  const double image = kFloat * static_cast<double>(config.inputs);
  const double label = 8;  // int64
  return static_cast<double>(train_images + test_images + rank_rows) * (image + label);
}

}  // namespace mg::plan
