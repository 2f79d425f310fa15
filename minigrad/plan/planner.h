// The planner: before a launch, what a split of a GPT costs each rank -- bytes of
// parameters, gradients, master weights, optimizer state, buffers and activations at the
// peak, bytes per collective by group, the pipeline's bubble -- and a predicted step time
// on a device of devices.h. No model is allocated: every byte term is gpt_formulas.h's,
// which the benches hold exact against the allocator and the process groups
// (docs/planning.md).
//
//   plan::Split split; split.dp = 4; split.tp = 2; split.zero = 1;
//   plan::Plan p = plan::plan_gpt(models::GPTConfig{}, split, plan::Workload{}, plan::device_by_name("h100-80gb"));
//   p.peak.total(), p.fits, p.time.step_s
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <minigrad/models/gpt.h>
#include <minigrad/plan/devices.h>
#include <minigrad/plan/gpt_formulas.h>
#include <minigrad/plan/model_arithmetic.h>

namespace mg::plan {

enum class Schedule { OneFOneB, Interleaved };

// How the job's world is split (models/gpt_plan.h's dimensions) and trained.
struct Split {
  int dp = 1, tp = 1, pp = 1, cp = 1;
  bool sequence_parallel = false;  // needs tp > 1
  int zero = 0;                    // over dp: 0 DDP, 1 optimizer state, 2 + gradients, 3 FSDP
  int64_t micro_batches = 0;       // the pipeline's per step; 0: default_micro_batches
  Schedule schedule = Schedule::OneFOneB;
  int virtual_stages = 2;  // model chunks per rank under Schedule::Interleaved
  bool recompute = false;  // each block recomputed in backward (activation checkpointing)
  // clip_grad_norm_ each step (train_gpt's --grad-clip, nanoGPT's 1.0 by default): the
  // ranks' partial norms summed over the world, one float32 all-reduce.
  bool clip_grad_norm = true;
  int world() const { return dp * tp * pp * cp; }
  std::string str() const;  // "dp 2 x tp 2 x pp 2 x cp 1, ZeRO-1, SP, recompute, 1F1B m 8"
};

// What one step trains on, in what precision, and how near the peak its GEMMs run.
struct Workload {
  int64_t batch = 8;        // rows per step, the whole job (each dp rank batch / dp)
  int64_t seq_len = 1024;   // tokens per row
  Precision precision = Precision::BF16Mixed;
  double efficiency = 0.5;  // the share of the dense peak the step's FLOPs run at
};

// One rank's bytes (a rank of one pipeline stage; the ranks of a stage hold alike).
struct RankMemory {
  int stage = 0;
  double params = 0, grads = 0, master = 0, optimizer = 0, buffers = 0, activations = 0;
  double total() const { return params + grads + master + optimizer + buffers + activations; }
};

struct StepTime {
  double compute_s = 0;  // the rank's FLOPs at efficiency x peak
  double bubble_s = 0;   // the pipeline's idle share: compute x (p - 1) / m (interleaved / v)
  double comm_s = 0;     // communication not hidden (dp's hidden behind backward up to its length)
  double optimizer_s = 0;  // AdamW's step, memory-bound: its bytes over the memory bandwidth
  double step_s = 0;     // their sum on the slowest stage
};

struct Plan {
  std::string model;  // ModelArithmetic::describe()
  Split split;
  Workload workload;
  DeviceSpec device;
  std::vector<RankMemory> stages;  // one rank of each pipeline stage
  RankMemory peak;                 // the stage holding the most
  std::map<std::string, CollectiveBytes> comm;  // that stage's bytes per step, by group
  // Every stage's bytes per step, by group (a rank of stage s: stage_comm[s]); what
  // gpt-parallel-bench counts on each rank.
  std::vector<std::map<std::string, CollectiveBytes>> stage_comm;
  std::map<std::string, double> comm_s;         // that stage's seconds per group
  double bubble = 0;                            // the pipeline's idle fraction
  double flops_per_step = 0;                    // the whole job's, incl. recompute's forward
  StepTime time;
  double tokens_per_s = 0;
  double usable_bytes = 0;  // the device's memory less a reserve for the CUDA context
  bool fits = false;
  std::vector<std::string> assumptions;
};

// The GPT's parameters (tied head counted once) and its training FLOPs per token:
// 6 N_matmul + 12 L C T (PaLM, appendix B: 6 per parameter a token for forward and
// backward, plus attention's q k^T and attn v), N_matmul = L 12 C² + V C (the head).
double gpt_parameter_count(const models::GPTConfig& config);
double gpt_flops_per_token(const models::GPTConfig& config, int64_t T);

// The idle fraction of a pipeline of p stages over m micro-batches: (p - 1)/(m + p - 1);
// interleaved with v chunks per rank: (p - 1)/(v m + p - 1) (Narayanan et al. 2021).
double pipeline_bubble(int pp, int64_t micro_batches, Schedule schedule = Schedule::OneFOneB, int virtual_stages = 1);

// The micro-batches a split gets when it names none: 1 without a pipeline, else the most
// up to 4 pp that divide the dp rank's rows.
int64_t default_micro_batches(const Split& split, const Workload& workload);

// The shape the formulas take (gpt_formulas.h's MeshShape) for a split and a workload:
// its micro-batches (default_micro_batches when it names none) and, interleaved, its chunks.
MeshShape mesh_shape(const Split& split, const Workload& workload);

// mg::Error naming the bad value when the split cannot run this model (tp must divide the
// heads and the vocabulary, T must divide into 2 cp chunks, ...).
void check_split(const ModelArithmetic& model, const Split& split, const Workload& workload);

// Any model the planner has formulas for (GPTArithmetic, LlamaArithmetic), and the GPT's.
Plan plan_model(const ModelArithmetic& model, const Split& split, const Workload& workload, const DeviceSpec& device);
Plan plan_gpt(const models::GPTConfig& config, const Split& split, const Workload& workload, const DeviceSpec& device);

// Every split of `world` devices (dp x tp x pp x cp, SP on and off, ZeRO 0-3 when dp > 1,
// recompute on and off, 1F1B), the impossible ones left out (their reasons in `skipped`
// when given): those that fit by step time, then those that do not by bytes.
std::vector<Plan> rank_splits(const ModelArithmetic& model, int world, const Workload& workload,
                              const DeviceSpec& device, std::vector<std::string>* skipped = nullptr);
std::vector<Plan> rank_gpt_splits(const models::GPTConfig& config, int world, const Workload& workload,
                                  const DeviceSpec& device, std::vector<std::string>* skipped = nullptr);

}  // namespace mg::plan
