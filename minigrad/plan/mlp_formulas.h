// train_fashion_mnist's MLP (inputs -> hidden... -> classes, a Linear and a ReLU per hidden
// width) priced as the planner prices the GPT: each rank's bytes of parameters, gradients,
// optimizer state, buffers and activations at its training peak, in float32 and (one
// device, DDP, ZeRO-1, ZeRO-2, ZeRO-3, tp over ranks) in the 16-bit precisions, with the planner's
// RankMemory. Formulas only, read off train_fashion_mnist --memory-blocks
// (docs/planning.md, "The MLP's formulas"); the trainer prints them beside its allocator's
// peak.
//
// The peak of a step after the first (SGD's momentum, as torch's, is made at the first
// step) is the largest of these moments, beside what the rank always holds (parameters,
// optimizer state, the data):
//   forward        the last step's gradients not yet freed (zero_grad sets them to none
//                  after forward): every gradient, DDP's bucket, and the activations at
//                  forward's largest moment (mlp_forward_peak_floats): once the loss is
//                  made, what the ops saved: each hidden layer's ReLU output (the next
//                  Linear's input and ReLU's mask: one tensor, the Linear and the ReLU
//                  fused), the logits (the fused cross-entropy's), the loss and its copy
//                  summed over the ranks; under tp a row layer's moment may be larger
//   ZeRO-1's step  the activations gone; every gradient, DDP's bucket, and each bucket's
//                  shard of the averaged gradient, copied out for the local optimizer
//   DataParallel's the replicas' gradients summed in BroadcastBackward (replicate.cpp):
//   reduce_add     each replica's, each flattened, and the running sum
//   ZeRO-2's       the first layer's weight gradient, the last made, fires the bucket's
//   reduce-scatter reduce-scatter: the flat gradient, its scratch, the gradient shards and
//                  that weight's gradient, still in .grad
//   ZeRO-3's       the first Linear's reduce-scatter launched: its unit gathered, its flat
//   launch         gradient, its weight's gradient, every gradient shard; a range, Gloo's
//                  scratch for it racing the caller (mlp_zero3_memory)
//   tp in one      the ranks' threads on one allocator, meeting at the all-reduces: a range,
//   process        a row layer's bias add or the first Linear's backward (mlp_tp_in_process_memory)
//   the pipeline's  in one process: its stages' threads replayed from the schedule, a
//   stages          range over the states they can be in together (mlp_pipe_memory)
//   16 bits        the forward's first GEMM on widened float32 copies
//                  (mlp_forward_peak_16bit_bytes), bf16-true's widened all-gather and
//                  reduce-scatter, ZeRO-2's first weight-gradient GEMM (mlp_rank_memory),
//                  ZeRO-3's moments before its launch (mlp_zero3_memory)
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <minigrad/plan/planner.h>

namespace mg::plan {

struct MLPConfig {
  int64_t inputs = 784;
  std::vector<int64_t> hidden{256, 256};
  int64_t classes = 10;
};

enum class MLPOptimizer { SGD, SGDMomentum, AdamW };  // SGD: without momentum, no state

// The trainer's --precision (samples/support/precision.h): 32-true; bf16-mixed and 16-mixed
// (float32 parameters, gradients and state, the forward under CPU autocast); bf16-true
// (bfloat16 parameters and gradients, optim::MasterWeights' float32 masters, their
// gradients and the optimizer's state over them).
enum class MLPPrecision { True32, BF16Mixed, F16Mixed, BF16True };

// Each parameter's elements in the model's order: W0 [hidden0, inputs], b0, W1, b1, ...
std::vector<int64_t> mlp_parameter_numels(const MLPConfig& config);

// ZeroRedundancyOptimizer's buckets (parallel::compute_bucket_assignment_by_size): from the
// last parameter to the first, a bucket closed once it holds at least `cap_bytes`.
std::vector<int64_t> mlp_zero_bucket_numels(const MLPConfig& config, double cap_bytes = 25.0 * 1024 * 1024);

// A tensor-parallel rank's parameters (parallel::parallelize_mlp): the Linear layers in
// pairs, the first of each a column layer (W's rows and the bias split over tp), the second
// a row layer (W's columns split, the bias whole); a Linear left over at the end whole.
std::vector<int64_t> mlp_rank_parameter_numels(const MLPConfig& config, int tp);

// The forward's activations on a rank of `tp` for `rank_rows` rows, in floats: `inside`, its
// largest moment before the loss (a whole Linear: its output, fused with its ReLU; a column
// layer: its output slice and ReLU's of it; a row layer: its partial product, the
// all-reduce's sum and the bias added to it), and `end`, what is saved once the loss is
// made: each ReLU's output (a column layer's slice of it) and the logits.
struct MLPForwardPeak {
  double inside = 0, end = 0;
};
MLPForwardPeak mlp_forward_peak_floats(const MLPConfig& config, int tp, int64_t rank_rows);

// The same in 16 bits (bf16-mixed and 16-mixed under autocast, `autocast`, or bf16-true), in
// bytes. Each Linear runs in 16 bits (autocast's Lower), and the CPU's 16-bit GEMM runs the
// float32 kernel on widened copies (core/cpu/matmul.cpp): while it runs, its input, weight
// and bias widened to float32 and its float32 result beside the 16-bit output, so `inside`
// is the first Linear's GEMM wherever its weight is the largest. What stays: the batch in 16
// bits (autocast's cast, or bf16-true's images), each ReLU's output, under autocast each
// Linear's weight and bias cast to 16 bits (saved for backward, in the cast cache while the
// region lasts); at `end` the logits and under autocast their float32 cast, which the
// cross-entropy (autocast's Float32) saves. Under tp (a rank of parallelize_mlp's, the ReLU
// unfused) a row layer's GEMM has no bias; its all-reduce holds the partial product, the sum,
// and on Gloo's thread the sum widened to float32 and rounded back; its bias is added after
// the sum and, float32 under autocast, promotes it to float32 (a float32 copy of the sum
// beside the result), so the ReLU after it is float32 and the next Linear casts it (saved).
MLPForwardPeak mlp_forward_peak_16bit_bytes(const MLPConfig& config, int tp, int64_t rank_rows, bool autocast);

// The optimizer's state for `elements` float32 elements in `tensors` tensors: none for SGD
// without momentum; SGD's momentum buffer (4 a element); AdamW's two moments and an int64
// step a tensor.
double mlp_optimizer_bytes(MLPOptimizer optimizer, double elements, double tensors);

// One data-parallel rank's bytes at its training peak for `rank_rows` rows a step (the
// global batch over split.dp), under DDP (zero 0), ZeRO-1 or ZeRO-2 over split.dp ranks;
// params, grads and optimizer are the tensors themselves (exact), buffers and activations
// those of the peak's moment; under tp (--distributed: a rank of a tp group, DDP over dp)
// params also hold the whole model the shards were cut from, which the trainer keeps.
// `replicas` > 1: DataParallel's in one process (the process's bytes: the original's
// parameters, gradients and state, the replicas' copies and the reduce_add's buffers).
// Empty for the splits priced elsewhere or not yet: pp (in one process: mlp_pipe_memory), ZeRO-3
// (a range: mlp_zero3_memory), tp in one process (`replicas` > 1 with tp, a range:
// mlp_tp_in_process_memory), and ZeRO with tp (the trainer refuses it).
// In 16 bits (`precision`) one device and DDP peak at the forward's first GEMM
// (mlp_forward_peak_16bit_bytes) beside the last step's gradients (float32 under autocast;
// bf16-true's bfloat16 and the masters' float32 ones, in grads; the masters themselves, of
// the shards under ZeRO, in master) and DDP's bucket, in the gradients' dtype. ZeRO-1's step
// in bf16-true is the all-gather of the stepped bfloat16 shards, float32 on Gloo's wire (its
// output and the shard widened) and rounded back, a bucket at a time, while the caller waits.
// ZeRO-2 in 16 bits adds a moment: the backward's first weight-gradient GEMM on widened
// copies beside the flat gradient (no gradient shard, no last step's gradients then); and its
// reduce-scatter in bf16-true the flat gradient widened for the wire, its float32 slices,
// their float32 sum and its rounding into the shard. 16-mixed's GradScaler holds no tensor at
// these moments (its scale is a float member) but the scaled loss in backward, so it prices as
// bf16-mixed. Under tp (DDP over dp) the whole model kept is in the parameters' dtype. Empty
// in 16 bits for DataParallel so far.
std::optional<RankMemory> mlp_rank_memory(const MLPConfig& config, const Split& split, int64_t rank_rows,
                                          MLPOptimizer optimizer, int replicas = 1,
                                          MLPPrecision precision = MLPPrecision::True32);

// ZeRO-3 (FullyShardedDataParallel: a unit a Linear, reduced last first) over Gloo: its peak
// is a race with the communication thread, so it is a range. The moment is the first
// Linear's weight gradient's post-accumulate hook (the unit's last, in a step after the
// first, beside the optimizer's state), which launches that unit's reduce-scatter: the unit
// gathered (freed only after the launch), its flat gradient (the reduce-scatter's input),
// the weight's gradient (the engine holds it while its hook runs), every unit's gradient
// shard (the first's the reduce-scatter's output, made at the launch; the others' done:
// one reduce-scatter in flight), the loss's scalars. `low`: the largest moment without
// Gloo's thread; `scratch`: what the high adds, the largest moment with Gloo's buffers
// for the reduce-scatter in flight (`slices`, the flat gradient's size; in bf16-true the
// flat gradient widened to float32 for the wire, float32 slices, their float32 sum and its
// rounding into the shard), which Gloo's thread allocates as soon as the work is queued
// and may do before the caller frees the gathered unit and returns from the hook. In 16
// bits (`precision`: the parameters, shards and gradients bfloat16 in bf16-true, with
// float32 master shards; float32 under autocast) two moments come before the launch, the
// second unit's reduce-scatter still in flight (its flat gradient held, Gloo's buffers for
// it racing) and the first's shard not made: the first weight-gradient GEMM on widened
// copies (bf16-true's low at --hidden 64,32), and under autocast the weight's bfloat16
// gradient cast back to float32 beside the flat gradient the bias went into (the low).
// The high is the launch with its buffers, or, where the first Linear is small (--hidden
// 16 under autocast), the moment before it with the second unit's: the range is those
// buffers less how far the high's moment is below the low (`high_below_low`). Empty under
// tp, pp or cp, and with `replicas` > 1.
struct MLPZero3Memory {
  RankMemory low;  // params and grads: the shards; buffers: the unit(s) and flat gradients held
  double scratch = 0;          // Gloo's buffers for the reduce-scatter at the high's moment
  double high_below_low = 0;   // 0 where the high's moment is the low's (32-true)
  bool high_at_launch = true;  // the first unit's reduce-scatter (else the second's, before the launch)
  double high() const { return low.total() - high_below_low + scratch; }
};
std::optional<MLPZero3Memory> mlp_zero3_memory(const MLPConfig& config, const Split& split, int64_t rank_rows,
                                               MLPOptimizer optimizer,
                                               MLPPrecision precision = MLPPrecision::True32);

// TensorParallel in one process (--tensor-parallel N --devices cpu,cpu: no --distributed):
// the ranks are threads on one allocator, so the process's peak is what their moments add
// to as they meet. They meet at barriers: the forward and the backward each run on the
// ranks' threads from the region's start to its join (tensor_parallel.cpp), and every
// all-reduce is one (in_process_group.cpp: the last rank to arrive sums the inputs and
// copies the sum for every other rank): a row layer's in forward, a column layer's input
// gradient (past the first) in backward. Between two barriers a rank may be anywhere in its
// own phase while the others are anywhere in theirs, never in another. So the peak is a
// range over the interleavings:
//   low   when the first rank reaches a level the others are at or before it, at least at
//         their lowest since the phase began; when the last does, at or after it, at least
//         at their lowest from there to the phase's end: every interleaving passes both.
//         In forward after a row layer's all-reduce: one rank adding its bias (its partial
//         product, its sum and the output) beside the others' partial products and sums.
//         In backward (run with retain_graph: every saved activation stays; the caller's
//         gradient of the logits, copied for each rank): the last rank making its first
//         Linear's weight gradient, its output's gradient alive, beside the others done;
//   high  every rank at its phase's largest level at once: the racing terms are the others'
//         share above that low, a bias-added output each, or a first Linear's output gradient.
// Beside it the process holds the whole model the shards were cut from, each rank's shards
// and optimizer state, the gradients (in forward the last step's: zero_grad follows the
// forward; in backward this step's, made by then), each rank's copy of the batch, the
// running loss (in backward the loss and its seed too). Empty unless tp > 1.
struct MLPTensorParallelInProcessMemory {
  RankMemory low;      // activations: the ranks' input copies, the running loss, the low moment
  double racing = 0;   // what the high adds: the other ranks at their own largest moment
  bool backward = false;  // the low's moment is the backward's (else the forward's)
  double high() const { return low.total() + racing; }
};
std::optional<MLPTensorParallelInProcessMemory> mlp_tp_in_process_memory(const MLPConfig& config, int tp,
                                                                         int64_t rows, MLPOptimizer optimizer);

// The pipeline in one process (parallel::Pipe, --pipeline P --devices cpu,...): a thread a
// stage on one allocator, the trainer's Sequential cut by even_balance, torchgpipe's
// checkpoint=except_last, `rows` a step cut into `chunks` micro-batches as torch.chunk cuts
// them, GPipe or 1F1B. Each stage's thread is replayed from its schedule
// (parallel::stage_actions) as the levels its allocations pass through: a forward's input
// (the batch's slice copied in, or the previous stage's output received), each op's output
// (a Linear fused with the ReLU after it in the same stage; kept with grad, freed once the
// next op made its own without), the last stage's logits (the caller's output) and weighted
// loss; a backward's received gradient, the forward again (checkpointed), each node's
// gradients made (an input's gradient, a weight's and a bias's) and the arriving gradient
// and saved output let go after it, the weight gradients added into .grad at once, or, when
// micro-batch m-1's graph is alive (1F1B, after its forward) and holds the accumulators,
// after the chain (the engine runs the latest made first); the first backward's kept as
// .grad. Hand-offs between stages are the channels' alone where the sender let go (a
// checkpointed output, an input's gradient). The stages meet only where one receives what
// a neighbour pushed, so the peak is a range over the states the threads can be in together
// (a point of each, no stage past a receipt its neighbour has not pushed; neighbours only,
// so a sweep along the chain finds them):
//   low   the largest, over every stage's every point, of the least the stages can hold
//         together with it: every run passes each point;
//   high  the most they can hold together.
// Beside it: every parameter and the optimizer's state, the running loss. After the
// threads the outputs are gathered into one tensor (a moment of its own). Empty for fewer
// than 2 stages or more than the layers.
struct MLPPipeMemory {
  RankMemory low;     // activations: the stages' threads (their gradients made among them) and channels
  double racing = 0;  // what the high adds: the stages at the most they can hold together
  double high() const { return low.total() + racing; }
  // Each stage's place at the low's and the high's moments, by its schedule's names of the
  // actions ("in F3", "after B2", "done"), or "gathering the outputs" after the threads.
  std::vector<std::string> low_at, high_at;
};
std::optional<MLPPipeMemory> mlp_pipe_memory(const MLPConfig& config, int stages, int64_t rows, int64_t chunks,
                                             bool one_f_one_b, MLPOptimizer optimizer);

// What the trainer holds beside the step: the training and test sets (float32 images,
// int64 labels) and the rank's batch of `rank_rows`.
double mlp_data_bytes(const MLPConfig& config, int64_t train_images, int64_t test_images, int64_t rank_rows);

}  // namespace mg::plan
