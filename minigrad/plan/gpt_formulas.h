// The GPT's arithmetic: the elements each rank holds, the floats per token it keeps for
// backward and the bytes it hands to each collective, under a dp x pp x cp x tp mesh
// (models/gpt_plan.h's splits) and ZeRO/FSDP over dp. Formulas only: nothing here
// allocates a model. bench/gpt_parallel_bench.cpp and bench/gpt_fsdp_bench.cpp hold every
// exact one against the allocator's bytes and the process groups' counts (their --check
// ctests), so these are the planner's validated terms; the planner (planner.h) adds
// precisions and devices. C = n_embd, V = vocab, a = n_head, t = tp, L = n_layer.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <minigrad/models/gpt.h>

namespace mg::plan {

// ---- parameters ----

// One block's elements on a tp rank: c_attn and c_fc's weights and biases and c_proj's
// weights sharded (12C²/t + 7C/t: attention 3C² + C², MLP 4C² + 4C²; biases 3C + 4C of
// the column layers), and what every tp rank keeps whole: two LayerNorms (4C) and the two
// row layers' biases (2C).
double gpt_block_param_elements(double C, double t = 1);

// Pipeline stage `stage` of `pp` (blocks dealt by parallel::even_balance): its blocks, on
// stage 0 wte (V C/t, vocabulary-parallel) and wpe (block_size C), on the last stage ln_f
// (2C) and, when pp > 1, the head's copy of the tied wte (V C/t).
double gpt_stage_param_elements(const models::GPTConfig& config, int tp, int pp, int stage);
// The blocks stage `stage` of `pp` holds.
int64_t gpt_stage_blocks(const models::GPTConfig& config, int pp, int stage);

// FSDP's units (models::fully_shard_gpt on one rank's model, no tp): the root's (wte,
// wpe, ln_f) first, then one per block, in elements.
std::vector<int64_t> gpt_fsdp_unit_numels(const models::GPTConfig& config);

// ---- activations (floats per token; float32 in minigrad's measurement) ----

// One block: ln_1's and ln_2's inputs and their mean/rstd (4C + 4, replicated; with
// sequence parallelism the LayerNorms' inputs are sharded but the column layers keep their
// all-gathered inputs whole: 2C/t + 2C + 4/t), q, k, v, the attention output and its
// contiguous copy for c_proj, c_fc's output and GELU's (13C/t), the log-sum-exp of every
// local head (a/t). nanoGPT's pre-LN block, exact GELU, dropout 0 (no masks), the fused
// attention never keeping the T x T probabilities.
double gpt_block_activation_floats(double C, double a, double t = 1, bool sp = false);

// The head after forward: ln_f's input and output and its mean/rstd (2C + 2; with SP
// 2C/t + C + 2/t) and the logits the fused cross-entropy keeps (V/t; its backward
// recomputes the softmax from them). Its backward adds two V/t more at once (the logits'
// gradient and the head matmul's working copy).
double gpt_head_activation_floats(double C, double V, double t = 1, bool sp = false);

// What one rank's GPT keeps after the loss on one device or under ZeRO/DDP (no tp, pp,
// cp), in bytes of float32: 4n (L f_block + f_head) + 8T (wpe's int64 positions) + 4 (the
// loss); with recomputed blocks each block keeps only its input, 4n (L C + f_head) + ...
// n = rows T tokens. gpt-fsdp-bench's "kept", exact.
double gpt_kept_activation_bytes(const models::GPTConfig& config, int64_t rows, int64_t T, bool recompute);

// The mesh's shape for the formulas below: the split and the batch.
struct MeshShape {
  int dp = 1, tp = 1, pp = 1, cp = 1;
  bool sequence_parallel = false;
  int64_t batch = 1;          // rows of the whole step (every dp rank batch / dp)
  int64_t T = 1;              // tokens per row (every cp rank T / cp)
  int64_t micro_batches = 1;  // the pipeline's, per step
  int model_chunks = 1;       // a rank's chunks under the interleaved schedule (1: 1F1B)
};

// The micro-batches a dp rank's b rows really make: chunk's (ceil(b / m) rows each, so
// fewer than m when b < m or m does not divide b).
double micro_batches_of(const MeshShape& mesh);

// A pipeline stage's peak moment, read off its schedule's own action list
// (parallel::rank_actions: 1F1B, or interleaved with mesh.model_chunks chunks a rank): the
// backward that starts with the most forwards alive, the latest of them (every send's
// tensor is held to the step's end, so the later holds more). `in_flight`: the micro-batches
// whose activations are alive then -- min(pp - stage, m) under 1F1B; interleaved, the chunk
// forwards alive over v, each being 1/v of the stage's blocks (Megatron's 1 + (p-1)/(pv)
// times 1F1B's is this on stage 0 alone); `forwards_sent` and `gradients_sent`: the
// messages handed on and sent back before it; `gone_back[c]`: whether chunk c ran a backward
// before it (its weights' gradients are in .grad then).
struct PipelinePeak {
  double in_flight = 0;
  int64_t forwards_sent = 0, gradients_sent = 0;
  std::vector<bool> gone_back;
};
PipelinePeak pipeline_peak(const MeshShape& mesh, int stage);

// The pipeline's messages a stage holds at that peak, in floats, for `handed` floats a token
// (C; C/t with SP) and `mb_tokens` a micro-batch (pipeline_stage.cpp): every send's tensor
// stays alive until train_step's waits, so every activation handed on so far (`sent`, each
// behind a 12-int64 header: `headers`, 24 floats' bytes) and every input gradient sent back
// before (in `sent` too); and the receives posted for the current backward's gradient and
// the next one's (`received`). Any model's (the GPT's and the Llama's).
struct HeldMessages {
  double sent = 0, headers = 0, received = 0;
};
HeldMessages held_messages(const PipelinePeak& peak, double handed, double mb_tokens);

// The blocks (of the stage's `stage_blocks`) whose activations are alive at a stage's peak,
// counted once a micro-batch (any model's: the Llama's too):
// `whole` ones keep every saved tensor, `kept_inputs` their input alone. Without recompute:
// blocks x in flight whole. Recomputed on one stage (models::GPT's per-block checkpoint):
// one whole (the block going back) and every block's input. Recomputed under pp (the
// pipeline checkpoints each micro-batch's whole stage forward, Checkpoint::Always): the
// stage's blocks whole once and the others in flight their stage input (none on stage 0,
// whose input is the token ids).
struct AliveBlocks {
  double whole = 0, kept_inputs = 0;
};
AliveBlocks alive_blocks(int64_t stage_blocks, const MeshShape& mesh, int stage, bool recompute);

// The activation peak of one train_step on pipeline stage `stage` (1F1B: min(pp - stage, m)
// micro-batches in flight), in floats; `recompute`: alive_blocks's whole blocks and kept
// inputs (C a token, C/t with SP).
// Without recompute this is gpt-parallel-bench's formula (within 5 % of the allocator on
// tp2 x pp2 with SP, dp2 x cp2, cp2 x tp2 and dp2 x pp2 with 4 micro-batches:
// docs/planning.md, Validated):
//   blocks x in flight x per block x tokens of a micro-batch, on stage 0 + wpe's int64
//     positions of each micro-batch in flight, and
//   the last stage: the gradients it sent back for the m - 1 micro-batches before (held
//     by their sends until the step's end) and each micro-batch's loss (m floats), + the
//     larger of two moments: the loss's (the head's activations and the loss's working
//     set: V a token, the fused cross-entropy's gradient; under tp 2V/t, the vocab-parallel
//     loss's shifted logits and their exp) and the last block's c_proj backward (the
//     gradient from ln_f, C a token, + the working set below)
//   elsewhere: at the first backward after the last forward, every micro-batch's output
//     handed on (C a token; C/t with SP) with its 12-int64 header and, after stage 0, the
//     input gradients sent back before -- all held by their sends until the step's end --,
//     the received gradient and the next one's, posted ahead (one when m = 1), and the
//     working set
//   working set: c_proj's backward, 4C/t a token (its input gradient) + 4C²/t + C (its
//     weight and bias gradients, made before they are added into .grad)
//   cp > 1: the larger of that and ring attention's backward, a moment of its own: one
//     block fewer in full, the first block going back holding what its attention saved
//     (ln_1's input, output and statistics, q k v, the ring's output, the log-sum-exp), the
//     ring's working set 20C/t, 3C/t of gradients flowing in, and on the last stage the
//     loss's logits of one chunk (V/2t); with recompute, + 4C/t a token on top.
double gpt_activation_peak_floats(const models::GPTConfig& config, const MeshShape& mesh, int stage,
                                  bool recompute = false);
// The same as two moments: the backward's (above, without cp's) and, under cp without
// recompute, ring attention's backward (0 otherwise); the peak is the larger.
struct ActivationMoments {
  double backward = 0, ring = 0;
  double peak() const { return backward > ring ? backward : ring; }
};
ActivationMoments gpt_activation_moments(const models::GPTConfig& config, const MeshShape& mesh, int stage,
                                         bool recompute = false);

// The weight gradients made when a block's attention goes back (its MLP's, attention's c_proj
// and ln_2: 9C²/t + 4C/t + 4C elements) and, on the last stage, the head's (the tied wte's
// V C/t and ln_f's 2C): under cp alive at ring attention's backward in a stage's first
// backward of a step whose zero_grad set .grad to none (train_gpt's: AccumulateGrad keeps
// each buffer as .grad). gpt_activation_peak_floats leaves them out: gpt-parallel-bench keeps
// .grad across steps, into which each is added and freed. 0 without cp, or once a backward of
// the stage's has gone before (pipeline_peak).
double gpt_ring_weight_grad_elements(const models::GPTConfig& config, const MeshShape& mesh, int stage);

// The moment after backward when dp and cp sum the stage's gradients
// (parallel::reduce_partial_gradients): a flat copy of the stage's gradients and the
// all-reduce's working copy of it, beside the loss (4 bytes); 0 when neither dp nor cp is
// split. The activations are gone by then, so a step's peak is the larger of this and
// gpt_activation_peak_floats's bytes (it is on the last stage of dp2 x pp2, C 16).
double gpt_gradient_sum_peak_bytes(const models::GPTConfig& config, const MeshShape& mesh, int stage,
                                   double grad_bytes = 4);

// What a 16-bit precision holds at the backward's peak beyond gpt_activation_peak_floats at
// 2 bytes a float, over dp (any ZeRO stage), tp (± SP), pp and cp, ± recompute: the
// backward of the last block's MLP c_proj, or under cp ring attention's backward when
// gpt_activation_moments says that is the peak (ring_attention.cpp runs in float32
// whatever the 16-bit dtype: its saved q k v and output, its working set), read off the
// allocator's live blocks of train_gpt.
// Each term a token is taken over the stage's alive_blocks (whole blocks, kept inputs) and a
// micro-batch's tokens n = (batch / dp) x T / m; under tp the sharded tensors are /t, under
// SP the LayerNorms' tokens too; `messages` is the pipeline's held sends and posted receives
// (pipeline_peak), float32 under autocast.
struct PrecisionExtraBytes {
  double float32_saved = 0, weight_casts = 0, backward = 0, messages = 0, head_grad = 0;
  double total() const { return float32_saved + weight_casts + backward + messages + head_grad; }
};

// bf16-mixed and 16-mixed (CPU autocast to bfloat16 or float16, float32 parameters), read off
// train_gpt --dp 2 --zero 3 --precision bf16-mixed; 16-mixed holds the same blocks (the CPU
// column casts by op, not by 16-bit dtype) but its scaled loss (4 bytes). Each term follows
// from what the ops save under autocast_policy.h's CPU column:
//   float32_saved  LayerNorm has no CPU rule, so the residual stream (ln_1's and ln_2's
//                  inputs) and their mean/rstd stay float32, as does the fused attention's
//                  log-sum-exp: (4C + 8 + 2a) bytes a token a block more than at 2 bytes
//   weight_casts   each linear saves its 16-bit weight for backward (autocast's cast of
//                  a float32 leaf): 2 x 12C^2 bytes a block (the biases are not saved),
//                  once with the cast cache; the pipeline runs without it, each micro-batch
//                  in flight its own
//   backward       the gradient from ln_f is float32 (+2C a token) and c_proj casts it to
//                  16 bits (+2C); the CPU's 16-bit GEMM computes in float32, holding its
//                  operands and result as float32 while its input gradient is made:
//                  4 (C n + 4C^2 + 4C n)
//   head_grad      the tied wte's gradient from the head, float32 (4VC), waiting for the
//                  AccumulateGrad that runs at the end of backward; under FSDP (zero 3)
//                  also the root unit's flat gradient it was laid into (4 x the unit)
PrecisionExtraBytes gpt_bf16_mixed_extra_bytes(const models::GPTConfig& config, const MeshShape& mesh, int zero,
                                               int stage = 0, bool recompute = false);

// bf16-true (bfloat16 parameters and activations, float32 masters in optim::MasterWeights),
// read off train_gpt --precision bf16-true on one device and --dp 2 --zero 3:
//   float32_saved  LayerNorm's mean/rstd and the fused attention's log-sum-exp are float32
//                  whatever the input's dtype: (8 + 2a) bytes a token a block more than at 2
//                  bytes (the residual stream is bfloat16 here)
//   weight_casts   none: the linears save the bfloat16 weights themselves
//   backward       the CPU's bfloat16 GEMM's float32 operands and result, as above:
//                  4 (C n + 4C^2 + 4C n); the gradient from ln_f is bfloat16 already
//   head_grad      the tied wte's bfloat16 gradient (2VC); under FSDP the root unit's
//                  bfloat16 flat gradient (2 x the unit)
PrecisionExtraBytes gpt_bf16_true_extra_bytes(const models::GPTConfig& config, const MeshShape& mesh, int zero,
                                              int stage = 0, bool recompute = false);

// One whole block's share of the 16-bit ring moment's terms above (under autocast, `autocast`,
// or bf16-true): its float32 saved tensors ((4C + 8)/sp + 2a/t bytes a token under autocast,
// 8/sp + 2a/t in bf16-true), its weight casts (autocast: 24C^2/t) and the ring's float32 q k v
// and output it saved (8C/t a token): what it frees once it has gone back.
PrecisionExtraBytes gpt_ring_block_extra_bytes(const models::GPTConfig& config, const MeshShape& mesh, bool autocast);

// ZeRO-2 (minigrad's ShardedGradReducer) makes a bucket's flat gradient at the first
// post-accumulate hook of its parameters, which fires once the last block's c_proj has gone
// back: the flat gradient is not alive at gpt_activation_peak_floats's moment (c_proj's
// backward) but from the next two on. What that peak held and these no longer hold, in
// bytes, the smaller of the two (the later peak is the larger moment), for activations of
// `act_bytes` (4, or 2: the CPU's 16-bit GEMMs then hold float32 scratch) under autocast
// (`autocast`: bf16-mixed, 16-mixed) or not; read off the live blocks of --dp 2 --zero 2 in
// 32-true (the first) and bf16-mixed (the second):
//   GELU's backward  c_proj's weight and bias gradients (4C^2 + C) are in the flat buffer;
//                    GELU's output goes as its input gradient comes (4C n each); in 16 bits
//                    c_proj's float32 GEMM scratch, 4 (C n + 4C^2 + 4C n), is freed, and
//                    under autocast its 16-bit weight cast (2 x 4C^2) and the 16-bit cast of
//                    the gradient from ln_f (2C n)
//   c_fc's backward  c_fc's and GELU's outputs and c_proj's input gradient gone (12C n),
//                    GELU's input gradient and c_fc's made (4C n + C n), c_fc's weight and
//                    bias gradients (4C^2 + 4C) in place of c_proj's (4C^2 + C); c_fc's GEMM
//                    scratch is c_proj's size again; under autocast the two casts above gone
// Priced against the c_proj moment: where the head's moment is the larger (V above about
// 5C), the figure this gives is high.
double gpt_zero2_released_bytes(const models::GPTConfig& config, const MeshShape& mesh, double act_bytes,
                                bool autocast);

// ---- collectives ----

// Bytes one rank hands to each kind of collective in a step (inputs; a recv's buffer).
struct CollectiveBytes {
  double all_reduce = 0, all_gather = 0, reduce_scatter = 0, broadcast = 0, send = 0, recv = 0;
  double total() const { return all_reduce + all_gather + reduce_scatter + broadcast + send; }
};

// By group ("tp", "cp", "dp", "pp", "emb": the tie's group of the first and the last
// stage) on stage `stage`, DDP over dp (ZeRO-0), for activations of `act_bytes` and
// gradients of `grad_bytes` per element (4 and 4: what gpt-parallel-bench counts exactly):
//   tp     without SP: all-reduce (4 L_s + first + last) n C (each block's two in forward
//          and two in backward, the embedding's and the head's input gradient) + 2n (the
//          loss's sums); with SP the same bytes reduce-scattered, a 1/t of them all-gathered,
//          the replicated parameters' gradients all-reduced; + n for the loss's row maxima
//          (all-gathered when tp > 1)
//   cp     send and recv L_s (3cp - 2) 2 b (T/cp) C/t (k and v round the ring: cp - 1 hops
//          forward, 2(cp - 1) in backward with dk dv) and the gradients' all-reduce (+ the
//          last stage's loss per micro-batch)
//   dp     the stage's gradients' all-reduce + the step's loss
//   pp     one activation forward behind a 12-int64 header a micro-batch, one gradient back,
//          the loss broadcast behind its dtype; "emb": the tied wte's gradient all-reduced
// n = the rank's tokens b T / cp, b = batch / dp.
// Bytes an element: `act_bytes` a tensor a GEMM makes (the row layers' outputs, and their
// gradients, in autocast's dtype), `stream_bytes` the residual stream's, the LayerNorms'
// outputs' and the embedding's (float32 under autocast, 2 in bf16-true; 0: act_bytes),
// `grad_bytes` the parameters' gradients. Ring attention runs in float32 whatever the
// precision, so cp's k and v travel at 4 bytes (ring_attention.cpp). Counted exactly by
// gpt-parallel-bench in 32-true and bf16-mixed.
std::map<std::string, CollectiveBytes> gpt_collective_bytes(const models::GPTConfig& config, const MeshShape& mesh,
                                                            int stage, double act_bytes = 4, double grad_bytes = 4,
                                                            double stream_bytes = 0);

// ---- ZeRO and FSDP over dp ----

// Bytes a dp rank holds under ZeRO stage `stage` (0 DDP, 1 optimizer state, 2 + gradients,
// 3 FSDP: + parameters) for parameters of `psi` elements in `tensors` tensors, laid in flat
// groups (ZeRO's buckets, FSDP's units) of `group_numels` elements over `ranks` ranks,
// each rank's shard ceil(Ψ_g / N) (flat_parameter.h pads to equal shards); AdamW, float32:
//   params     DDP 4Ψ; ZeRO-1/2 4 Σ N ceil(Ψ_g/N) (every rank keeps the padded flat
//              buffers whole); FSDP 4 Σ ceil(Ψ_g/N)
//   grads      DDP, ZeRO-1 4Ψ; ZeRO-2, FSDP 4 Σ ceil(Ψ_g/N)
//   optimizer  exp_avg + exp_avg_sq + an int64 step per tensor stepped: DDP 8Ψ + 8 tensors;
//              ZeRO, FSDP 8 Σ ceil(Ψ_g/N) + 8 groups
//   buffers    DDP's buckets (DDP, ZeRO-1): 4Ψ; ZeRO-2 and FSDP keep none
// gpt-fsdp-bench's params, grads, AdamW and buffers, exact.
struct ShardedState {
  double params = 0, grads = 0, optimizer = 0, buffers = 0;
};
ShardedState zero_state_bytes(int stage, double psi, double tensors, const std::vector<int64_t>& group_numels,
                              int ranks);

// Σ_g ceil(Ψ_g / N): a rank's shard of every flat group, padding included (flat_parameter.h).
double shard_elements(const std::vector<int64_t>& group_numels, int ranks);

}  // namespace mg::plan
