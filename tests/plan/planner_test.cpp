// The planner (minigrad/plan/planner.h) against figures worked by hand: GPT-2's parameter
// count (nanoGPT's 124M), the bubble, the bytes of a split under each precision and ZeRO
// stage, the ranking's order, and the errors. Its byte formulas against the allocator and
// the process groups: the gpt-parallel-bench and gpt-fsdp-bench ctests (bench/).
#include "catch_compat.h"

#include <cmath>
#include <string>
#include <vector>

#include <minigrad/core/error.h>
#include <minigrad/models/gpt.h>
#include <minigrad/models/llama.h>
#include <minigrad/plan/gpt_formulas.h>
#include <minigrad/plan/llama_formulas.h>
#include <minigrad/plan/planner.h>

using namespace mg;

namespace {

models::GPTConfig gpt2() { return models::GPTConfig{};  }  // 12 x 12 x 768, vocab 50304, block 1024

// train_gpt's default GPT on the test corpus (vocabulary 114), where the terms were read off
// its live blocks, and its batch: 12 rows of 64 tokens over dp 2.
models::GPTConfig train_gpt_default() {
  models::GPTConfig config;
  config.n_layer = 4;
  config.n_head = 4;
  config.n_embd = 128;
  config.block_size = 64;
  config.vocab_size = 114;
  return config;
}

plan::MeshShape twelve_rows_over_dp2() {
  plan::MeshShape mesh;
  mesh.dp = 2;
  mesh.batch = 12;
  mesh.T = 64;
  return mesh;
}

plan::Workload workload(plan::Precision precision, int64_t batch = 8) {
  plan::Workload w;
  w.batch = batch;
  w.seq_len = 1024;
  w.precision = precision;
  return w;
}

}  // namespace

TEST_CASE("planner: GPT-2's parameters and FLOPs a token") {
  // 12 blocks of 12C² + 13C, wte and wpe (50304 + 1024) C, ln_f 2C; nanoGPT prints 123.69M
  // without wpe's 786432.
  CHECK(plan::gpt_parameter_count(gpt2()) == 124475904.0);
  CHECK(plan::gpt_parameter_count(gpt2()) - 1024 * 768 == 123689472.0);
  // 6 (12 L C² + V C) + 12 L C T
  const double C = 768, L = 12, V = 50304, T = 1024;
  CHECK(plan::gpt_flops_per_token(gpt2(), 1024) == 6 * (12 * L * C * C + V * C) + 12 * L * C * T);
}

TEST_CASE("planner: the pipeline bubble is (p-1)/(m+p-1) and (p-1)/(v m+p-1) interleaved") {
  CHECK(plan::pipeline_bubble(1, 1) == 0.0);
  CHECK(plan::pipeline_bubble(4, 8) == Approx(3.0 / 11.0));
  CHECK(plan::pipeline_bubble(4, 8, plan::Schedule::Interleaved, 2) == Approx(3.0 / 19.0));
  REQUIRE_THROWS_WITH(plan::pipeline_bubble(0, 4), MG_CONTAINS("pipeline_bubble: pp 0"));
}

TEST_CASE("planner: a stage's peak is read off its schedule's actions") {
  plan::MeshShape mesh;
  mesh.pp = 4;
  mesh.batch = 8;
  mesh.T = 16;
  mesh.micro_batches = 8;
  // 1F1B: min(pp - stage, m) in flight at the first backward after the last forward; by then
  // every micro-batch was handed on (but from the last stage) and m - in flight sent back
  // (but from the first).
  for (int stage = 0; stage < 4; ++stage) {
    const plan::PipelinePeak p = plan::pipeline_peak(mesh, stage);
    CHECK(p.in_flight == 4 - stage);
    CHECK(p.forwards_sent == (stage == 3 ? 0 : 8));
    CHECK(p.gradients_sent == (stage == 0 ? 0 : 8 - (4 - stage)));
    CHECK(p.gone_back == std::vector<bool>{true});
  }
  mesh.micro_batches = 2;  // all forwards, then all backwards: nothing gone back at the peak
  CHECK(plan::pipeline_peak(mesh, 0).in_flight == 2);
  CHECK(plan::pipeline_peak(mesh, 0).gone_back == std::vector<bool>{false});
  // Interleaved, rank 0 of 2, v = 2, m = 4 (schedule.h's example): F0.0 F1.0 F0.1 F1.1 F2.0
  // then B0.1: 5 chunk forwards alive, 2.5 micro-batches of the stage's blocks -- Megatron's
  // 1 + (p-1)/(pv) = 1.25 times 1F1B's 2. The last rank warms up 2 chunk forwards, not
  // 1.25 micro-batches' worth: 3 alive at its peak, 1.5.
  mesh.pp = 2;
  mesh.micro_batches = 4;
  mesh.model_chunks = 2;
  const plan::PipelinePeak first = plan::pipeline_peak(mesh, 0);
  CHECK(first.in_flight == 2.5);
  CHECK(first.in_flight == Approx(2 * (1 + 1.0 / 4)));
  const plan::PipelinePeak last = plan::pipeline_peak(mesh, 1);
  CHECK(last.in_flight == 1.5);
  // Steady from there on (F then B), so the peak is its last such backward, B3.1: chunk 0
  // has handed on all four micro-batches, and both chunks have gone back before.
  CHECK(last.forwards_sent == 4);
  CHECK(last.gone_back == std::vector<bool>{true, true});
  // With m = 2 the last such backward is B1.1: only chunk 1 (the model's last) went back
  // before it, so only its weights' gradients are in .grad then.
  mesh.micro_batches = 2;
  CHECK(plan::pipeline_peak(mesh, 1).gone_back == std::vector<bool>{false, true});
}

TEST_CASE("planner: DDP in 32-true holds 4 4 and 8 bytes a parameter and buckets of 4") {
  plan::Split s;
  s.dp = 2;
  const plan::Plan p = plan::plan_gpt(gpt2(), s, workload(plan::Precision::True32), plan::device_by_name("a100-80gb"));
  const double psi = 124475904.0, tensors = 12 * 12 + 4;
  REQUIRE(p.stages.size() == 1);
  CHECK(p.peak.params == 4 * psi);
  CHECK(p.peak.grads == 4 * psi);
  CHECK(p.peak.master == 0);
  CHECK(p.peak.optimizer == 8 * psi + 8 * tensors);
  CHECK(p.peak.buffers == 4 * psi);
  // 4 rows a rank of 1024 tokens, gpt_activation_peak_floats' blocks and the loss's moment
  // (the head's activations and the fused cross-entropy's gradient of the logits, V a
  // token), wpe's int64 positions (1024, two floats' bytes each) and the loss, float32
  const double floats = 4096 * (12 * plan::gpt_block_activation_floats(768, 12) +
                                plan::gpt_head_activation_floats(768, 50304) + 50304) +
                        2 * 1024 + 1;
  CHECK(p.peak.activations == Approx(4 * floats).epsilon(1e-12));
  CHECK(p.comm.at("dp").all_reduce == 4 * psi + 4);
  CHECK(p.comm.at("world").all_reduce == 4);  // clip_grad_norm_'s partial norms, one float32
  CHECK(p.fits);
  s.clip_grad_norm = false;
  CHECK(plan::plan_gpt(gpt2(), s, workload(plan::Precision::True32), plan::device_by_name("a100-80gb")).comm.count("world") == 0);
}

TEST_CASE("planner: one data-parallel rank holds no DDP buckets") {
  plan::Split s;
  s.tp = 2;
  const plan::Plan p = plan::plan_gpt(gpt2(), s, workload(plan::Precision::True32), plan::device_by_name("a100-80gb"));
  CHECK(p.peak.buffers == 0);
  CHECK(p.peak.grads == p.peak.params);
}

TEST_CASE("planner: bf16-true keeps float32 masters and bf16 ZeRO-3 shards") {
  plan::Split s;
  s.dp = 4;
  s.zero = 3;
  const plan::Plan p = plan::plan_gpt(gpt2(), s, workload(plan::Precision::BF16True), plan::device_by_name("h100-80gb"));
  // FSDP's units: a block each and the rest (wte, wpe, ln_f), each sharded ceil(Ψ_g / 4).
  double shards = 0;
  for (const int64_t g : plan::gpt_fsdp_unit_numels(gpt2())) shards += std::ceil(static_cast<double>(g) / 4);
  CHECK(p.peak.params == 2 * shards);
  CHECK(p.peak.grads == 2 * shards);
  CHECK(p.peak.master == 8 * shards);
  CHECK(p.peak.optimizer == 8 * shards + 8 * 13);
  CHECK(p.comm.at("dp").reduce_scatter == 2 * 124475904.0);
}

TEST_CASE("planner: under autocast a GEMM's output travels in 16 bits, the residual stream and the ring in float32") {
  const models::GPTConfig config = train_gpt_default();
  plan::MeshShape mesh;
  mesh.tp = 2;
  mesh.pp = 2;
  mesh.batch = 4;
  mesh.T = 64;
  mesh.micro_batches = 2;
  const double N = 4 * 64, C = 128, Ls = 2;
  // Stage 0: the row layers' outputs (2 a block) at 2 bytes, the column layers' inputs (2 a
  // block) and the embedding's sum at 4; the pp messages the float32 stream.
  const auto mixed = plan::gpt_collective_bytes(config, mesh, 0, 2, 4, 4);
  CHECK(mixed.at("tp").all_reduce == N * C * (2 * Ls * 2 + (2 * Ls + 1) * 4));
  CHECK(mixed.at("pp").send == N * C * 4 + 2 * 12 * 8);
  const auto bf16 = plan::gpt_collective_bytes(config, mesh, 0, 2, 2, 2);
  CHECK(bf16.at("tp").all_reduce == N * C * (4 * Ls + 1) * 2);
  CHECK(bf16.at("pp").send == N * C * 2 + 2 * 12 * 8);
  // The ring runs in float32 whatever the precision: k and v of the rank's heads a hop.
  mesh.pp = 1;
  mesh.tp = 1;
  mesh.cp = 2;
  const double hops = 4 * (3 * 2 - 2), Tl = 32;
  CHECK(plan::gpt_collective_bytes(config, mesh, 0, 2, 2, 2).at("cp").send == hops * 2 * 4 * Tl * C * 4);
}

TEST_CASE("planner: 16-mixed holds bf16-mixed's bytes and runs at the bfloat16 rate") {
  plan::Split s;
  s.dp = 2;
  s.tp = 2;
  const plan::DeviceSpec h100 = plan::device_by_name("h100-80gb");
  const plan::Plan bf16 = plan::plan_gpt(gpt2(), s, workload(plan::Precision::BF16Mixed), h100);
  const plan::Plan f16 = plan::plan_gpt(gpt2(), s, workload(plan::Precision::F16Mixed), h100);
  CHECK(f16.peak.total() == bf16.peak.total());
  CHECK(f16.peak.activations == bf16.peak.activations);
  CHECK(f16.comm.at("tp").all_reduce == bf16.comm.at("tp").all_reduce);
  // and its GradScaler's inf check: a float32 summed over the world's 4 ranks (the clip's
  // beside it), a ring all-reduce of 2 (k - 1) / k of its bytes over the link
  CHECK(f16.comm.at("world").all_reduce == bf16.comm.at("world").all_reduce + 4);
  CHECK(f16.comm_s.at("world") - bf16.comm_s.at("world") == Approx(4 * 2 * 3.0 / 4 / h100.link_bandwidth));
  CHECK(f16.time.step_s > bf16.time.step_s);
  CHECK(plan::to_string(plan::precision_from_string("16-mixed")) == "16-mixed");
}

TEST_CASE("planner: tensor parallelism shards the stage's matrices and pp deals the blocks") {
  plan::Split s;
  s.tp = 2;
  s.pp = 2;
  const plan::Plan p = plan::plan_gpt(gpt2(), s, workload(plan::Precision::True32), plan::device_by_name("h100-80gb"));
  REQUIRE(p.stages.size() == 2);
  const double C = 768, V = 50304, block = 12 * C * C / 2 + 7 * C / 2 + 6 * C;
  CHECK(p.stages[0].params == 4 * (6 * block + V * C / 2 + 1024 * C));
  CHECK(p.stages[1].params == 4 * (6 * block + 2 * C + V * C / 2));
  CHECK(p.split.micro_batches == 8);  // 8 rows: up to 4 pp that divide them
  CHECK(p.bubble == Approx(1.0 / 9.0));
}

TEST_CASE("planner: the ranking puts what fits first and fastest first") {
  std::vector<std::string> skipped;
  const auto plans = plan::rank_gpt_splits(gpt2(), 4, workload(plan::Precision::BF16Mixed, 16),
                                           plan::device_by_name("l4"), &skipped);
  REQUIRE(!plans.empty());
  bool seen_not_fitting = false;
  for (size_t i = 0; i < plans.size(); ++i) {
    CHECK(plans[i].split.world() == 4);
    CHECK(!(plans[i].split.zero > 1 && plans[i].split.pp > 1));  // what the trainers refuse is not offered
    if (!plans[i].fits) seen_not_fitting = true;
    CHECK(!(seen_not_fitting && plans[i].fits));
    if (i > 0 && plans[i].fits && plans[i - 1].fits) CHECK(plans[i - 1].time.step_s <= plans[i].time.step_s);
  }
  // tp 4 divides 12 heads; cp 4 needs 1024 tokens in 8 chunks: both possible; none skipped
  // but SP on tp 1, which is never tried.
  CHECK(skipped.empty());
}

TEST_CASE("planner: an impossible split or an unknown name is an error naming it") {
  plan::Split s;
  s.tp = 5;
  const plan::DeviceSpec h100 = plan::device_by_name("h100-80gb");
  REQUIRE_THROWS_WITH(plan::plan_gpt(gpt2(), s, workload(plan::Precision::True32), h100),
                      MG_CONTAINS("plan: tp 5 does not divide n_head 12"));
  s.tp = 1;
  s.dp = 3;
  REQUIRE_THROWS_WITH(plan::plan_gpt(gpt2(), s, workload(plan::Precision::True32), h100),
                      MG_CONTAINS("plan: batch 8 does not divide by dp 3"));
  s.dp = 2;
  s.pp = 2;
  s.zero = 3;
  REQUIRE_THROWS_WITH(plan::plan_gpt(gpt2(), s, workload(plan::Precision::True32), h100),
                      MG_CONTAINS("plan: ZeRO-3 with pp 2: minigrad's ZeRO-2 and FSDP reduce in backward hooks"));
  REQUIRE_THROWS_WITH(plan::device_by_name("h100"), MG_CONTAINS("device: unknown device 'h100' (known: cpu, h100-80gb"));
  REQUIRE_THROWS_WITH(plan::precision_from_string("fp8"), MG_CONTAINS("unknown precision 'fp8' (32-true, bf16-mixed, bf16-true or 16-mixed)"));
  REQUIRE_THROWS_WITH(plan::precision_from_string("fp16"), MG_CONTAINS("unknown precision 'fp16'"));
}

TEST_CASE("planner: the device table holds dense figures") {
  // Dense BF16 is half the datasheets' "with sparsity" figure; FP32 below it everywhere.
  CHECK(plan::device_by_name("h100-80gb").peak_flops(plan::Precision::BF16Mixed) == 989.5e12);
  CHECK(plan::device_by_name("a100-40gb").peak_flops(plan::Precision::True32) == 19.5e12);
  for (const plan::DeviceSpec& d : plan::device_table()) {
    INFO(d.name);
    CHECK(d.fp32_flops < d.bf16_flops);
    CHECK(d.memory_bytes > 0);
    CHECK(d.link_bandwidth > 0);
    CHECK(!d.source.empty());
  }
}

TEST_CASE("planner: the Llama's parameters and tensors equal a built Llama's") {
  models::LlamaConfig c;  // small: 3 layers, hidden 32, 4 heads, 2 kv heads, SwiGLU 40
  c.num_hidden_layers = 3;
  c.hidden_size = 32;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.intermediate_size = 40;
  c.vocab_size = 24;
  c.max_position_embeddings = 16;
  const plan::LlamaArithmetic arithmetic(c);
  models::Llama llama(c);
  double elements = 0, layer0 = 0, tensors = 0;
  for (const auto& [name, p] : llama.named_parameters()) {
    elements += static_cast<double>(p.numel());
    ++tensors;
    if (name.rfind("model.layers.0.", 0) == 0) layer0 += static_cast<double>(p.numel());
  }
  CHECK(arithmetic.parameter_count() == elements);
  CHECK(arithmetic.block_param_elements(1) == layer0);
  CHECK(arithmetic.stage_tensors(1, 0) == tensors);
  // Two stages: 2 and 1 layers, embed_tokens first, norm and lm_head last.
  CHECK(arithmetic.stage_param_elements(1, 2, 0) + arithmetic.stage_param_elements(1, 2, 1) == elements);
  REQUIRE_THROWS_WITH(arithmetic.check_tp(4), MG_CONTAINS("plan: tp 4 does not divide num_key_value_heads 2"));
  double vectors = 0;  // the 1-D parameters: ZeRO-1/2's second flat list in train_gpt
  for (const Tensor& p : llama.parameters()) vectors += p.dim() == 1 ? static_cast<double>(p.numel()) : 0;
  CHECK(arithmetic.stage_vector_elements(1, 1, 0) == vectors);
  CHECK(arithmetic.stage_vector_elements(2, 2, 0) + arithmetic.stage_vector_elements(2, 2, 1) == vectors);
}

TEST_CASE("planner: the GPT's 1-D elements (ZeRO-1/2's second flat list) equal a built GPT's") {
  models::GPTConfig c;
  c.n_layer = 3;
  c.n_head = 2;
  c.n_embd = 18;
  c.vocab_size = 34;
  c.block_size = 16;
  const plan::GPTArithmetic arithmetic(c);
  models::GPT gpt(c);
  double vectors = 0, column = 0;  // column: c_attn's and c_fc's biases, which tp shards
  for (const auto& [name, p] : gpt.named_parameters()) {
    if (p.dim() != 1) continue;
    vectors += static_cast<double>(p.numel());
    if (name.find("c_attn.bias") != std::string::npos || name.find("c_fc.bias") != std::string::npos)
      column += static_cast<double>(p.numel());
  }
  CHECK(arithmetic.stage_vector_elements(1, 1, 0) == vectors);
  CHECK(arithmetic.stage_vector_elements(2, 1, 0) == vectors - column / 2);
  // Two stages of 2 and 1 blocks; ln_f last.
  CHECK(arithmetic.stage_vector_elements(1, 2, 0) + arithmetic.stage_vector_elements(1, 2, 1) == vectors);
  CHECK(arithmetic.stage_vector_elements(1, 2, 1) == 6 * 18 + 7 * 18 + 2 * 18);
}

TEST_CASE("planner: bf16-mixed's bytes beyond the activations at 2 bytes, term by term") {
  const models::GPTConfig config = train_gpt_default();
  plan::MeshShape mesh = twelve_rows_over_dp2();
  const double n = 6 * 64, C = 128;
  const plan::PrecisionExtraBytes e = plan::gpt_bf16_mixed_extra_bytes(config, mesh, 3);
  CHECK(e.float32_saved == (4 * C + 8 + 2 * 4) * 4 * n);  // float32 residual, statistics, log-sum-exp
  CHECK(e.weight_casts == 2 * 12 * C * C * 4);             // the linears' bfloat16 weights
  CHECK(e.backward == 4 * C * n + 4 * (C * n + 4 * C * C + 4 * C * n));
  CHECK(e.head_grad == 4 * 114 * C + 4 * (114 * C + 64 * C + 2 * C));  // wte's gradient, the root unit's
  CHECK(plan::gpt_bf16_mixed_extra_bytes(config, mesh, 1).head_grad == 4 * 114 * C);
  // Under tp 2 with SP: the LayerNorms' float32 tokens sharded, the heads, the weights' casts,
  // c_proj's GEMM shard and the vocabulary-parallel head split.
  mesh.tp = 2;
  mesh.sequence_parallel = true;
  const plan::PrecisionExtraBytes tp = plan::gpt_bf16_mixed_extra_bytes(config, mesh, 1);
  CHECK(tp.float32_saved == ((4 * C + 8) / 2 + 2 * 4 / 2) * 4 * n);
  CHECK(tp.weight_casts == 2 * 12 * C * C / 2 * 4);
  CHECK(tp.backward == 4 * C / 2 * n + 4 * (C * n + 4 * C * C / 2 + 4 * C * n / 2));
  CHECK(tp.head_grad == 4 * 114 * C / 2);
  CHECK(tp.messages == 0);
}

TEST_CASE("planner: bf16-mixed's bytes at ring attention's backward, which runs in float32") {
  const models::GPTConfig config = train_gpt_default();
  plan::MeshShape mesh = twelve_rows_over_dp2();
  mesh.dp = 1;
  mesh.cp = 2;
  const double n = 12 * 32, C = 128;
  REQUIRE(plan::gpt_activation_moments(config, mesh, 0).ring > plan::gpt_activation_moments(config, mesh, 0).backward);
  const plan::PrecisionExtraBytes e = plan::gpt_bf16_mixed_extra_bytes(config, mesh, 1);
  // 3 blocks whole, the one going back its ln_1 input and statistics and its log-sum-exp.
  CHECK(e.float32_saved == ((4 * C + 8 + 2 * 4) * 3 + 2 * C + 4 + 2 * 4) * n);
  CHECK(e.weight_casts == 2 * C * C * (12 * 3 + 3));  // c_attn's cast alive in the block going back
  // q k v and the ring's output of 4 blocks, the ring's working set and what flows in (23C),
  // in float32; the residual's gradient float32.
  CHECK(e.backward == (2 * (4 * C * 4 + 23 * C) + 2 * C) * n);
  const plan::PrecisionExtraBytes bf16 = plan::gpt_bf16_true_extra_bytes(config, mesh, 1);
  CHECK(bf16.float32_saved == ((8 + 2 * 4) * 3 + 4 + 2 * 4) * n);
  CHECK(bf16.backward == 2 * (4 * C * 4 + 23 * C) * n);
}

TEST_CASE("planner: bf16-mixed's bytes on a pipeline stage and recomputed") {
  const models::GPTConfig config = train_gpt_default();
  plan::MeshShape mesh;
  mesh.pp = 2;
  mesh.batch = 12;
  mesh.T = 64;
  mesh.micro_batches = 2;
  const double mb = 6 * 64, C = 128;
  // Stage 0 of 1F1B over 2 micro-batches peaks at its first backward: both forwards alive
  // (2 blocks each, each micro-batch's weights cast anew), both handed on, 2 receives posted.
  const plan::PrecisionExtraBytes first = plan::gpt_bf16_mixed_extra_bytes(config, mesh, 1, 0);
  CHECK(first.float32_saved == (4 * C + 8 + 2 * 4) * 2 * 2 * mb);
  CHECK(first.weight_casts == 2 * 12 * C * C * 2 * 2);
  CHECK(first.messages == 2 * (2 + 2) * C * mb);  // the float32 residual stream, 2 bytes over 16 bits
  CHECK(first.head_grad == 0);
  CHECK(plan::gpt_bf16_mixed_extra_bytes(config, mesh, 1, 1).head_grad == 4 * 114 * C);
  // Recomputed, the stage's forward is redone whole per micro-batch: one micro-batch's 2
  // blocks whole; the last stage's other micro-batch in flight keeps its input (none here:
  // one in flight on the last stage), stage 0's its token ids.
  const plan::PrecisionExtraBytes redone = plan::gpt_bf16_mixed_extra_bytes(config, mesh, 1, 0, true);
  CHECK(redone.float32_saved == (4 * C + 8 + 2 * 4) * 2 * mb);
  CHECK(redone.weight_casts == 2 * 12 * C * C * 2);
}

TEST_CASE("planner: the blocks alive at a stage's peak, with and without recompute") {
  plan::MeshShape mesh;
  mesh.batch = 8;
  mesh.T = 16;
  const plan::AliveBlocks plain = plan::alive_blocks(4, mesh, 0, false);
  CHECK((plain.whole == 4 && plain.kept_inputs == 0));
  const plan::AliveBlocks per_block = plan::alive_blocks(4, mesh, 0, true);  // models::GPT's checkpoint
  CHECK((per_block.whole == 1 && per_block.kept_inputs == 4));
  mesh.pp = 2;
  mesh.micro_batches = 4;  // 1F1B: 2 in flight on stage 0, 1 on stage 1
  const plan::AliveBlocks stage0 = plan::alive_blocks(2, mesh, 0, false);
  CHECK((stage0.whole == 4 && stage0.kept_inputs == 0));
  const plan::AliveBlocks redone0 = plan::alive_blocks(2, mesh, 0, true);  // its input is the token ids
  CHECK((redone0.whole == 2 && redone0.kept_inputs == 0));
  mesh.pp = 3;
  const plan::AliveBlocks redone1 = plan::alive_blocks(2, mesh, 1, true);  // 2 in flight: one redone, one kept
  CHECK((redone1.whole == 2 && redone1.kept_inputs == 1));
}

TEST_CASE("planner: bf16-true's bytes beyond the activations at 2 bytes, term by term") {
  const models::GPTConfig config = train_gpt_default();
  plan::MeshShape mesh = twelve_rows_over_dp2();
  const double n = 6 * 64, C = 128;
  const plan::PrecisionExtraBytes e = plan::gpt_bf16_true_extra_bytes(config, mesh, 3);
  CHECK(e.float32_saved == (8 + 2 * 4) * 4 * n);  // float32 statistics and log-sum-exp; a bfloat16 residual
  CHECK(e.weight_casts == 0);                      // the linears save the bfloat16 weights themselves
  CHECK(e.backward == 4 * (C * n + 4 * C * C + 4 * C * n));
  CHECK(e.head_grad == 2 * 114 * C + 2 * (114 * C + 64 * C + 2 * C));  // wte's gradient, the root unit's
  CHECK(plan::gpt_bf16_true_extra_bytes(config, mesh, 2).head_grad == 2 * 114 * C);
}

TEST_CASE("planner: what ZeRO-2's moment with the flat gradients no longer holds, moment by moment") {
  const models::GPTConfig config = train_gpt_default();
  plan::MeshShape mesh = twelve_rows_over_dp2();
  const double n = 6 * 64, C = 128;
  // 32-true: GELU's backward, c_proj's weight and bias gradients laid into the flat buffer.
  CHECK(plan::gpt_zero2_released_bytes(config, mesh, 4, false) == 4 * (4 * C * C + C));
  // bf16-mixed: c_fc's backward (its float32 GEMM scratch is c_proj's size again), less
  // 7C n of activations, c_fc's 4C^2 + 4C gradients for c_proj's 4C^2 + C, and the two casts.
  const double casts = 2 * 4 * C * C + 2 * C * n;
  CHECK(plan::gpt_zero2_released_bytes(config, mesh, 2, true) == 2 * (7 * C * n - 3 * C) + casts);
  // bf16-true: the same moment without autocast's casts.
  CHECK(plan::gpt_zero2_released_bytes(config, mesh, 2, false) == 2 * (7 * C * n - 3 * C));
  // In float32 at few tokens (n < about C/2) c_fc's backward is the later moment: 7C n less
  // activations no longer outweigh c_proj's 4C^2 + C weight gradients.
  mesh.T = 1;
  mesh.batch = 2;
  CHECK(plan::gpt_zero2_released_bytes(config, mesh, 4, false) == 4 * (7 * C - 3 * C));
  CHECK_THROWS_WITH(plan::gpt_zero2_released_bytes(config, mesh, 3, false), MG_CONTAINS("act_bytes 3 must be 2 or 4"));
}

// FSDP's MixedPrecisionPolicy's float32 flat gradient of the last layer: made after the
// 16-bit peak on dp (the GPT's c_fc moment, the Llama's gate and up), before it over tp for
// the GPT (c_proj's bias, added after the sum, goes back first) and under cp (ring
// attention's backward comes after the MLP's); not priced under pp or for a GPT without biases.
TEST_CASE("planner: when the last layer's flat gradient is made against the 16-bit backward's peak") {
  const models::GPTConfig config = train_gpt_default();
  const plan::GPTArithmetic gpt(config);
  plan::MeshShape mesh = twelve_rows_over_dp2();
  const auto dp = gpt.flat_gradient_moment(mesh);
  REQUIRE(dp);
  CHECK_FALSE(dp->before_peak);
  CHECK(dp->released == plan::gpt_zero2_released_bytes(config, mesh, 2, false));
  plan::MeshShape tp = mesh;
  tp.tp = 2;
  REQUIRE(gpt.flat_gradient_moment(tp));
  CHECK(gpt.flat_gradient_moment(tp)->before_peak);
  CHECK(gpt.flat_gradient_moment(tp)->released == 0);
  models::GPTConfig unbiased = config;
  unbiased.bias = false;
  CHECK_FALSE(plan::GPTArithmetic(unbiased).flat_gradient_moment(tp));
  plan::MeshShape cp = mesh;
  cp.cp = 2;
  REQUIRE(gpt.flat_gradient_moment(cp));
  CHECK(gpt.flat_gradient_moment(cp)->before_peak);
  plan::MeshShape pp = mesh;
  pp.pp = 2;
  CHECK_FALSE(gpt.flat_gradient_moment(pp));

  models::LlamaConfig c;
  c.num_hidden_layers = 4;
  c.hidden_size = 128;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.intermediate_size = 352;
  c.vocab_size = 34;
  c.max_position_embeddings = 64;
  const plan::LlamaArithmetic llama(c);
  const double C = 128, I = 352, n = 6 * 64;
  // Gate's and up's backward: down_proj's input, SiLU's, up's and gate's outputs gone (4I),
  // up's and gate's output gradients and the layer's input gradient made (2I + C), 2 bytes.
  const auto swiglu = llama.flat_gradient_moment(mesh);
  REQUIRE(swiglu);
  CHECK_FALSE(swiglu->before_peak);
  CHECK(swiglu->released == 2 * (4 * I - 2 * I - C) * n);
  CHECK(llama.flat_gradient_moment(tp)->released == 2 * (4 * I / 2 - 2 * I / 2 - C) * n);
  // Under cp the layer's weight gradients made are in the flat gradient, not 16-bit .grad.
  const auto ring = llama.flat_gradient_moment(cp);
  REQUIRE(ring);
  CHECK(ring->before_peak);
  CHECK(ring->released == 2 * (3 * C * I + C * C + C));
  CHECK_FALSE(llama.flat_gradient_moment(pp));
}

// The Llama at train_gpt --model llama's shape (4 layers, C 128, 4 heads of d 32, 2 kv
// heads, I 352, a vocabulary of 34; 12 rows of 64 tokens): what the 16-bit precisions hold
// beyond activation_peak_floats at 2 bytes, term by term (llama_formulas.h).
TEST_CASE("planner: the Llama's 16-bit bytes beyond the activations at 2 bytes term by term") {
  models::LlamaConfig c;
  c.num_hidden_layers = 4;
  c.hidden_size = 128;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.intermediate_size = 352;
  c.vocab_size = 34;
  c.max_position_embeddings = 64;
  const plan::LlamaArithmetic llama(c);
  const double C = 128, I = 352, V = 34, a = 4, kd = 64, n = 12 * 64;
  const double casts = 2 * (2 * C * C + 2 * C * kd + 3 * C * I);  // q o, k v, gate up down in 16 bits
  plan::MeshShape mesh;
  mesh.batch = 12;
  mesh.T = 64;
  CHECK(llama.precision_extra_bytes(mesh, 0, 0, false, plan::Precision::True32)->total() == 0);
  // bf16-mixed on one device: the RMSNorms' float32 inputs (2 x 2C), the five column layers'
  // own casts for the norms' two outputs (5 x 2C - 2 x 2C), the float32 rstd (2 x 2) and
  // log-sum-exps (2a), each of the 4 layers; every weight cast once (the cast cache).
  const auto mixed = llama.precision_extra_bytes(mesh, 0, 0, false, plan::Precision::BF16Mixed);
  REQUIRE(mixed);
  CHECK(mixed->float32_saved == (4 * C + 6 * C + 4 + 2 * a) * 4 * n);
  CHECK(mixed->weight_casts == casts * 4);
  // down_proj's float32 GEMM operands and result less the product's backward's second I, the
  // float32 gradient from the norm and its 16-bit cast.
  CHECK(mixed->backward == 4 * (C * n + C * I + I * n) - 2 * I * n + 4 * C * n);
  CHECK(mixed->messages == 0);
  CHECK(mixed->head_grad == 2 * (V * C + C));  // lm_head's and the norm's float32 .grad
  const auto f16 = llama.precision_extra_bytes(mesh, 0, 0, false, plan::Precision::F16Mixed);
  CHECK(f16->total() == mixed->total());
  // bf16-true: only what is float32 whatever the dtype (rstd, log-sum-exps) and the GEMM's scratch.
  const auto bf16 = llama.precision_extra_bytes(mesh, 0, 0, false, plan::Precision::BF16True);
  REQUIRE(bf16);
  CHECK(bf16->float32_saved == (4 + 2 * a) * 4 * n);
  CHECK(bf16->weight_casts == 0);
  CHECK(bf16->backward == 4 * (C * n + C * I + I * n) - 2 * I * n);
  CHECK(bf16->head_grad == 0);
  // Recomputed on one device: one layer whole, every layer's float32 input kept (2C over 16 bits).
  const auto redone = llama.precision_extra_bytes(mesh, 0, 0, true, plan::Precision::BF16Mixed);
  CHECK(redone->float32_saved == (4 * C + 6 * C + 4 + 2 * a + 4 * 2 * C) * n);
  CHECK(redone->weight_casts == casts);
  // tp 2 with SP: the norms' tokens sharded, the column layers' gathered casts already priced.
  plan::MeshShape tp = mesh;
  tp.tp = 2;
  tp.sequence_parallel = true;
  const auto sp = llama.precision_extra_bytes(tp, 0, 1, false, plan::Precision::BF16Mixed);
  CHECK(sp->float32_saved == (4 * C / 2 + 4 / 2.0 + 2 * a / 2) * 4 * n);
  CHECK(sp->weight_casts == casts / 2 * 4);
  CHECK(sp->backward == 4 * (C * n + C * I / 2 + I * n / 2) - 2 * I * n / 2 + 4 * C / 2 * n);
  CHECK(sp->head_grad == 2 * (V * C / 2 + C));
  // Stage 0 of pp 2 over 2 micro-batches (1F1B): both forwards alive, each casting anew, both
  // handed on and 2 receives posted, the float32 residual stream 2 bytes over 16 bits.
  plan::MeshShape pp = mesh;
  pp.pp = 2;
  pp.micro_batches = 2;
  const auto first = llama.precision_extra_bytes(pp, 0, 1, false, plan::Precision::BF16Mixed);
  CHECK(first->float32_saved == (4 * C + 6 * C + 4 + 2 * a) * 2 * 2 * (n / 2));
  CHECK(first->weight_casts == casts * 2 * 2);
  CHECK(first->messages == 2 * (2 + 2) * C * (n / 2));
  CHECK(first->head_grad == 0);
  // cp 2: ring attention's backward is the peak; the ring is float32 (its saved q k v and
  // output, 4C a layer, and working set 23C, 2 bytes a float more), 3 layers whole and the
  // one going back with its norm's input and rstd, q's k's v's casts and weight casts, the
  // float32 gradient into the stream and the weight gradients made as float32 .grad.
  plan::MeshShape cp = mesh;
  cp.cp = 2;
  const double h = 12 * 32;  // a cp rank's tokens
  const auto ring_true = llama.precision_extra_bytes(cp, 0, 0, false, plan::Precision::BF16True);
  CHECK(ring_true->float32_saved == ((4 + 2 * a) * 3 + 2 + 2 * a) * h);
  CHECK(ring_true->backward == 2 * (4 * C * 4 + 23 * C) * h);
  CHECK(ring_true->weight_casts == 0);
  const auto ring_mixed = llama.precision_extra_bytes(cp, 0, 0, false, plan::Precision::BF16Mixed);
  CHECK(ring_mixed->float32_saved == ((10 * C + 4 + 2 * a) * 3 + 2 * C + 4 * C + 2 + 2 * a) * h);
  CHECK(ring_mixed->weight_casts == casts * 3 + 2 * (C * C + 2 * C * kd));
  CHECK(ring_mixed->backward == 2 * (4 * C * 4 + 23 * C) * h + 2 * C * h + 2 * (3 * C * I + C * C + C));
  CHECK(ring_mixed->head_grad == 2 * (V * C + C));
}

TEST_CASE("planner: the GPT's weight gradients made before ring attention's backward, in a stage's first backward") {
  models::GPTConfig config;
  config.n_layer = 4;
  config.n_head = 4;
  config.n_embd = 128;
  config.vocab_size = 34;
  config.block_size = 64;
  plan::MeshShape mesh = twelve_rows_over_dp2();
  const double C = 128, V = 34;
  CHECK(plan::gpt_ring_weight_grad_elements(config, mesh, 0) == 0);  // no cp: no ring
  mesh.cp = 2;
  // c_fc's weight and bias, the MLP's c_proj, ln_2, attention's c_proj; the head's tied wte and ln_f
  const double block = 4 * C * C + 4 * C + 4 * C * C + C + 2 * C + C * C + C;
  CHECK(plan::gpt_ring_weight_grad_elements(config, mesh, 0) == block + V * C + 2 * C);
  mesh.tp = 2;  // the matrices and the column biases sharded, the row biases and LayerNorms whole
  CHECK(plan::gpt_ring_weight_grad_elements(config, mesh, 0) == 9 * C * C / 2 + 4 * C / 2 + 4 * C + V * C / 2 + 2 * C);
}
