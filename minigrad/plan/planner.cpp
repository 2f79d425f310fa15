// The planner (planner.h): the byte terms are gpt_formulas.h's; what is added here (the
// precisions' bytes per element, ZeRO over dp on a mesh, the time model) says where each
// term comes from, and every Plan carries the assumptions it rests on.
#include <minigrad/plan/planner.h>

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include <minigrad/core/error.h>

namespace mg::plan {

std::string Split::str() const {
  std::string s = fmt::format("dp {} x tp {} x pp {} x cp {}", dp, tp, pp, cp);
  if (zero > 0) s += zero == 3 ? ", ZeRO-3 (FSDP)" : fmt::format(", ZeRO-{}", zero);
  if (sequence_parallel) s += ", SP";
  if (recompute) s += ", recompute";
  if (pp > 1) {
    s += schedule == Schedule::Interleaved ? fmt::format(", interleaved v {}", virtual_stages) : ", 1F1B";
    if (micro_batches > 0) s += fmt::format(" m {}", micro_batches);  // 0: not chosen yet
  }
  return s;
}

double gpt_parameter_count(const models::GPTConfig& config) { return GPTArithmetic(config).parameter_count(); }

double gpt_flops_per_token(const models::GPTConfig& config, int64_t T) {
  return GPTArithmetic(config).flops_per_token(T);
}

double pipeline_bubble(int pp, int64_t micro_batches, Schedule schedule, int virtual_stages) {
  MG_CHECK(pp >= 1 && micro_batches >= 1, "pipeline_bubble: pp {} and micro_batches {} must be >= 1", pp,
           micro_batches);
  const double p = pp, m = static_cast<double>(micro_batches);
  const double v = schedule == Schedule::Interleaved ? virtual_stages : 1;
  return (p - 1) / (v * m + p - 1);
}

MeshShape mesh_shape(const Split& s, const Workload& w) {
  MeshShape mesh;
  mesh.dp = s.dp;
  mesh.tp = s.tp;
  mesh.pp = s.pp;
  mesh.cp = s.cp;
  mesh.sequence_parallel = s.sequence_parallel;
  mesh.batch = w.batch;
  mesh.T = w.seq_len;
  mesh.micro_batches = s.micro_batches > 0 ? s.micro_batches : default_micro_batches(s, w);
  // The interleaved schedule warms up more micro-batches (pipeline_peak reads its actions).
  mesh.model_chunks = s.schedule == Schedule::Interleaved ? s.virtual_stages : 1;
  return mesh;
}

int64_t default_micro_batches(const Split& split, const Workload& workload) {
  if (split.pp == 1) return 1;
  const int64_t rows = workload.batch / std::max(split.dp, 1);
  for (int64_t m = std::min<int64_t>(rows, 4 * split.pp); m > 1; --m)
    if (rows % m == 0) return m;
  return 1;
}

void check_split(const ModelArithmetic& model, const Split& s, const Workload& w) {
  MG_CHECK(s.dp >= 1 && s.tp >= 1 && s.pp >= 1 && s.cp >= 1, "plan: dp {} tp {} pp {} cp {} must each be >= 1",
           s.dp, s.tp, s.pp, s.cp);
  MG_CHECK(s.zero >= 0 && s.zero <= 3, "plan: zero {} must be 0, 1, 2 or 3", s.zero);
  // What the trainers refuse is not priced as if it ran (samples/support/split_model.cpp).
  MG_CHECK(s.zero <= 1 || s.pp == 1,
           "plan: ZeRO-{} with pp {}: minigrad's ZeRO-2 and FSDP reduce in backward hooks, which would fire "
           "once per micro-batch inside the pipeline; ZeRO-1 composes with it",
           s.zero, s.pp);
  model.check_tp(s.tp);
  MG_CHECK(!s.sequence_parallel || s.tp > 1, "plan: sequence parallelism needs tp > 1 (tp {})", s.tp);
  MG_CHECK(s.pp <= model.layers(), "plan: pp {} exceeds the model's {} layers", s.pp, model.layers());
  MG_CHECK(w.seq_len >= 1 && w.seq_len <= model.max_positions(), "plan: seq_len {} outside [1, positions {}]",
           w.seq_len, model.max_positions());
  MG_CHECK(s.cp == 1 || w.seq_len % (2 * s.cp) == 0,
           "plan: cp {} needs the {} tokens in 2 cp equal chunks (each rank holds chunks i and 2cp-1-i)", s.cp,
           w.seq_len);
  MG_CHECK(w.batch % s.dp == 0, "plan: batch {} does not divide by dp {}", w.batch, s.dp);
  const int64_t m = s.micro_batches > 0 ? s.micro_batches : default_micro_batches(s, w);
  MG_CHECK((w.batch / s.dp) % m == 0, "plan: micro_batches {} do not divide the {} rows of a dp rank", m,
           w.batch / s.dp);
  if (s.schedule == Schedule::Interleaved) {
    MG_CHECK(s.virtual_stages >= 2, "plan: the interleaved schedule needs virtual_stages >= 2 (got {})",
             s.virtual_stages);
    MG_CHECK(model.layers() % (s.pp * s.virtual_stages) == 0,
             "plan: interleaved pp {} x v {} does not divide the {} layers", s.pp, s.virtual_stages, model.layers());
    MG_CHECK(m % s.pp == 0, "plan: the interleaved schedule needs micro_batches {} a multiple of pp {}", m, s.pp);
  }
  MG_CHECK(w.efficiency > 0 && w.efficiency <= 1, "plan: efficiency {} outside (0, 1]", w.efficiency);
}

namespace {

// Bytes per element of the parameters (and their gradients, DDP's buckets) and of the
// activations (and the messages carrying them), by precision.
double param_bytes(Precision p) { return p == Precision::BF16True ? 2 : 4; }
double activation_bytes(Precision p) { return p == Precision::True32 ? 4 : 2; }

// The ring's traffic over a link, per byte handed in (NCCL's ring algorithms): all-reduce
// 2(n-1)/n, all-gather (n-1) (each input travels to n-1 ranks), reduce-scatter (n-1)/n.
double seconds(const CollectiveBytes& c, int n, double link) {
  if (n <= 1) return 0;
  const double k = n;
  return (c.all_reduce * 2 * (k - 1) / k + c.all_gather * (k - 1) + c.reduce_scatter * (k - 1) / k + c.broadcast +
          c.send) / link;
}

}  // namespace

Plan plan_gpt(const models::GPTConfig& config, const Split& split, const Workload& workload, const DeviceSpec& device) {
  return plan_model(GPTArithmetic(config), split, workload, device);
}

Plan plan_model(const ModelArithmetic& model, const Split& split_in, const Workload& w, const DeviceSpec& device) {
  check_split(model, split_in, w);
  Plan plan;
  plan.model = model.describe();
  plan.split = split_in;
  Split& s = plan.split;
  if (s.micro_batches == 0) s.micro_batches = default_micro_batches(s, w);
  plan.workload = w;
  plan.device = device;
  const Precision prec = w.precision;
  const double Pb = param_bytes(prec), Ab = activation_bytes(prec);
  const MeshShape mesh = mesh_shape(s, w);
  // ZeRO's flat buckets (25 MiB of float32, zero_redundancy_optimizer.h's bucket_cap_mb).
  const double bucket_cap = 25.0 * 1024 * 1024 / 4;

  plan.bubble = pipeline_bubble(s.pp, s.micro_batches, s.schedule, s.virtual_stages);
  const double tokens = static_cast<double>(w.batch * w.seq_len);
  plan.flops_per_step = model.flops_per_token(w.seq_len) * tokens;
  // Recompute runs each block's forward twice: 8 in place of 6 per parameter a token.
  if (s.recompute) plan.flops_per_step *= 8.0 / 6.0;
  const double peak = device.peak_flops(prec) * w.efficiency;
  const double compute_s = plan.flops_per_step / s.world() / peak;
  plan.usable_bytes = device.measured ? device.memory_bytes : device.memory_bytes - 1024.0 * 1024 * 1024;

  double worst_time = -1;
  for (int stage = 0; stage < s.pp; ++stage) {
    RankMemory r;
    r.stage = stage;
    const double P = model.stage_param_elements(s.tp, s.pp, stage);
    const double blocks = static_cast<double>(model.stage_blocks(s.pp, stage));
    const double tensors = model.stage_tensors(s.pp, stage);
    // The flat groups ZeRO shards: FSDP's units (a block each, the rest one unit), else
    // train_gpt's two ZeroRedundancyOptimizers' 25 MiB buckets, one list for the 2-D weights
    // and one for the 1-D rest (nanoGPT's groups; each pads its own buckets to dp shards);
    // a bucket ends at a parameter's end: up to dp elements apart a bucket.
    std::vector<int64_t> groups;
    const double block = model.block_param_elements(s.tp);
    if (s.zero == 3) {
      groups.assign(static_cast<size_t>(blocks), static_cast<int64_t>(block));
      if (P - blocks * block > 0) groups.push_back(static_cast<int64_t>(P - blocks * block));
    } else if (s.zero > 0) {
      const double vectors = model.stage_vector_elements(s.tp, s.pp, stage);
      for (const double list : {P - vectors, vectors}) {
        if (list <= 0) continue;
        const int64_t n = static_cast<int64_t>(std::ceil(list / bucket_cap));
        for (int64_t g = 0; g < n; ++g) groups.push_back(static_cast<int64_t>(list / static_cast<double>(n)));
      }
    }
    const ShardedState st = zero_state_bytes(s.zero, P, tensors, groups, s.dp);
    const double shards = shard_elements(groups, s.dp);
    r.params = st.params * Pb / 4;
    r.grads = st.grads * Pb / 4;
    r.optimizer = st.optimizer;  // AdamW's state in float32 in every precision
    r.buffers = s.dp > 1 ? st.buffers * Pb / 4 : 0;  // DDP's buckets exist only with dp to reduce over
    // bf16-true: float32 masters and their float32 gradients at the step, sharded as the
    // optimizer (optim::MasterWeights).
    if (prec == Precision::BF16True) r.master = 8 * (s.zero == 0 ? P : shards);
    // ZeRO-2: the largest bucket's flat gradients and Gloo's reduce-scatter scratch of its
    // size at the end of backward (gpt-fsdp-bench's peak); FSDP: two block units gathered
    // (the block and the one prefetched) and the root's rest, gathered through backward.
    if (s.zero == 2) r.buffers += 2 * Pb * std::min(P, bucket_cap);
    if (s.zero == 3) r.buffers += Pb * (2 * block + std::max(0.0, P - blocks * block));
    r.activations = model.activation_peak_floats(mesh, stage, s.recompute) * Ab;
    plan.stages.push_back(r);

    // Communication: gpt-parallel-bench's counts (DDP over dp), then ZeRO's over dp as
    // train_gpt runs it (gpt-parallel-bench --zero counts it on a mesh): below.
    // The residual stream is float32 under autocast (its messages, the LayerNorms' outputs),
    // bfloat16 in bf16-true.
    const double G = prec == Precision::BF16True ? 2 : 4, R = Pb;
    std::map<std::string, CollectiveBytes> comm = model.collective_bytes(mesh, stage, Ab, G, R);
    if (s.dp > 1 && s.zero > 0) {
      CollectiveBytes& d = comm["dp"];
      // A flat group hands the all-gather its shard, ceil(Ψ_g / dp) elements, and the
      // reduce-scatter its whole buffer padded to dp shards.
      const double gathered = shards * Pb;
      if (s.zero == 1) {
        // DDP's all-reduce of the gradients and the loss kept; after the step each
        // bucket's updated shard all-gathered.
        d.all_gather = gathered;
      } else {
        d.all_reduce = 4;                      // the step's loss (float32)
        d.reduce_scatter = s.dp * shards * G;  // each bucket's (unit's) gradients, in backward
        // ZeRO-2: each bucket's updated shard after the step. FSDP: every unit in forward,
        // then in backward every block's but the last's (its backward comes first, so it
        // stays gathered: reshard_after_forward false); the root's unit stays gathered from
        // its forward to the end of backward (FSDP2's rule).
        d.all_gather = s.zero == 2 ? gathered
                                   : gathered + std::max(0.0, blocks - 1) * std::ceil(block / s.dp) * Pb;
      }
      if (s.zero >= 2 && s.sequence_parallel) {
        // The replicated parameters' gradients (SP's Partial over tp: the tp all-reduce's
        // bytes that scale with the gradients' element size) are summed over tp by ZeRO-2's
        // and FSDP's shards, so each dp rank sums the part its shards hold, which depends
        // on where they fall in the flat buffers: priced as the dp ranks' mean.
        const double replicated = comm["tp"].all_reduce - model.collective_bytes(mesh, stage, Ab, 0, R)["tp"].all_reduce;
        comm["tp"].all_reduce -= replicated * (1 - 1.0 / s.dp);
      }
      // ZeRO-2 and FSDP sum over cp what holds the gradients after backward: the shards.
      if (s.cp > 1 && s.zero >= 2) comm["cp"].all_reduce += (shards - P) * G;
    }
    // Without the pipeline train_gpt's loss is loss_share's mean over the cp ranks' tokens:
    // their count (an int64) summed over cp, under DDP as under ZeRO. (The pipeline's is a
    // sum.)
    if (s.cp > 1 && s.pp == 1) comm["cp"].all_reduce += 8;
    if (s.clip_grad_norm && s.world() > 1) comm["world"].all_reduce += 4;
    // 16-mixed's GradScaler: whether any rank found an inf or NaN, a float32 summed over the
    // world per optimizer it unscales (ZeRO-1/2's two, nanoGPT's decayed and not).
    if (prec == Precision::F16Mixed && s.world() > 1) comm["world"].all_reduce += 4 * (s.zero == 1 || s.zero == 2 ? 2 : 1);
    plan.stage_comm.push_back(comm);
    std::map<std::string, double> comm_s;
    const std::map<std::string, int> size{{"tp", s.tp}, {"cp", s.cp}, {"dp", s.dp}, {"pp", 2}, {"emb", 2}, {"world", s.world()}};
    double exposed = 0;
    for (const auto& [group, bytes] : comm) {
      const double t = seconds(bytes, size.at(group), device.link_bandwidth);
      comm_s[group] = t;
      // dp's (and ZeRO's) collectives overlap backward (DDP's buckets from autograd hooks,
      // FSDP's prefetch): only what outlasts backward, 2/3 of the compute, is exposed.
      exposed += group == "dp" ? std::max(0.0, t - compute_s * 2 / 3) : t;
    }
    const double bubble_s = compute_s * plan.bubble / (1 - plan.bubble);
    // AdamW's step streams each element it steps through memory once: reads the parameter,
    // its gradient, exp_avg and exp_avg_sq, writes the three it updates (28 bytes in
    // float32); bf16-true also reads the bfloat16 gradient and writes the bfloat16 copy (+4).
    const double stepped = s.zero == 0 ? P : shards;
    const double optimizer_s = stepped * (prec == Precision::BF16True ? 32 : 28) / device.memory_bandwidth;
    const double step = compute_s + bubble_s + exposed + optimizer_s;
    if (step > worst_time) {
      worst_time = step;
      plan.time = StepTime{compute_s, bubble_s, exposed, optimizer_s, step};
    }
    if (stage == 0 || r.total() > plan.peak.total()) {
      plan.peak = r;
      plan.comm = comm;
      plan.comm_s = comm_s;
    }
  }
  plan.tokens_per_s = tokens / plan.time.step_s;
  plan.fits = plan.peak.total() <= plan.usable_bytes;

  auto& a = plan.assumptions;
  a.push_back(fmt::format("AdamW, state in float32; parameters {}, activations {} bytes an element ({})",
                          Pb == 2 ? "bfloat16" : "float32", Ab, to_string(prec)));
  a.push_back("activation terms are minigrad's measured float32 ones (fused attention, dropout 0) scaled to "
              "the precision's bytes; gradients of bfloat16-true in bfloat16");
  a.push_back(fmt::format("step time: {:.0f} % of the dense peak ({:.1f} TFLOP/s {}), 6 N + 12 L C T FLOPs a "
                          "token (PaLM){}",
                          100 * w.efficiency, device.peak_flops(prec) / 1e12, device.measured ? "measured" : "datasheet",
                          s.recompute ? ", 8 N with recompute" : ""));
  a.push_back(fmt::format("AdamW's step memory-bound at {:.0f} GB/s (28 bytes an element stepped); the "
                          "forward's and backward's elementwise work not priced",
                          device.memory_bandwidth / 1e9));
  a.push_back(fmt::format("collectives as rings over {} at {:.0f} GB/s a direction; tp, cp and pp exposed, "
                          "dp hidden behind backward up to 2/3 of the compute",
                          device.link, device.link_bandwidth / 1e9));
  if (s.clip_grad_norm && s.world() > 1)
    a.push_back("the gradient norm clipped each step (nanoGPT's, train_gpt's --grad-clip): one float32 "
                "all-reduce of the ranks' partial norms over the world");
  if (prec == Precision::F16Mixed && s.world() > 1)
    a.push_back("16-mixed's GradScaler checks for an inf or NaN on every rank: a float32 all-reduce over the "
                "world per optimizer it unscales");
  if (!device.measured)
    a.push_back("usable memory: the datasheet's GB less 1 GiB for the CUDA context and the allocator");
  if (s.zero > 0) {
    a.push_back("ZeRO over dp on a mesh: the dp-only memory formulas (exact on 3 ranks) applied to each stage's "
                "tp shard; its collectives as train_gpt runs them, every group's bytes counted exactly by "
                "gpt-parallel-bench --zero (dp2 x tp2 ZeRO-2, dp2 x cp2 ZeRO-3, dp2 x pp2 ZeRO-1)");
    if (s.zero >= 2 && s.sequence_parallel)
      a.push_back("ZeRO-2/3 with SP: a rank sums over tp the replicated parameters' gradients its shards hold, "
                  "priced as the dp ranks' mean (gpt-parallel-bench checks their sum)");
  }
  return plan;
}

std::vector<Plan> rank_gpt_splits(const models::GPTConfig& config, int world, const Workload& workload,
                                  const DeviceSpec& device, std::vector<std::string>* skipped) {
  return rank_splits(GPTArithmetic(config), world, workload, device, skipped);
}

std::vector<Plan> rank_splits(const ModelArithmetic& model, int world, const Workload& workload,
                              const DeviceSpec& device, std::vector<std::string>* skipped) {
  MG_CHECK(world >= 1, "rank_splits: world {} must be >= 1", world);
  std::vector<Plan> plans;
  for (int tp = 1; tp <= world; ++tp)
    for (int pp = 1; tp * pp <= world; ++pp)
      for (int cp = 1; tp * pp * cp <= world; ++cp) {
        if (world % (tp * pp * cp) != 0) continue;
        const int dp = world / (tp * pp * cp);
        for (int zero = 0; zero <= (dp == 1 ? 0 : pp > 1 ? 1 : 3); ++zero)
          for (const bool sp : {false, true})
            for (const bool recompute : {false, true}) {
              if (sp && tp == 1) continue;
              Split s;
              s.dp = dp;
              s.tp = tp;
              s.pp = pp;
              s.cp = cp;
              s.zero = zero;
              s.sequence_parallel = sp;
              s.recompute = recompute;
              try {
                plans.push_back(plan_model(model, s, workload, device));
              } catch (const Error& e) {
                if (skipped) skipped->push_back(fmt::format("{}: {}", s.str(), e.what()));
              }
            }
      }
  std::stable_sort(plans.begin(), plans.end(), [](const Plan& a, const Plan& b) {
    if (a.fits != b.fits) return a.fits;
    // Equal times (ZeRO's stages hide behind backward alike): the fewer bytes first.
    if (a.fits && a.time.step_s != b.time.step_s) return a.time.step_s < b.time.step_s;
    return a.peak.total() < b.peak.total();
  });
  return plans;
}

}  // namespace mg::plan
