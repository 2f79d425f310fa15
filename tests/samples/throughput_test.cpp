// samples/support/throughput.h and memory_report.h: the FLOPs a token against a hand count,
// MFU's arithmetic, the peak from the device table or measured (and said so), the memory
// line beside the planner; and train_gpt printing them, alone and under minigrad-run.
#include "catch_compat.h"

#include <string>

#include <minigrad/models/gpt.h>
#include <minigrad/plan/llama_formulas.h>
#include <minigrad/plan/model_arithmetic.h>
#include <minigrad/plan/planner.h>

#include "samples/memory_range_line.h"
#include "samples/run_program.h"
#include "../../samples/support/language_model.h"
#include "../../samples/support/memory_report.h"
#include "../../samples/support/throughput.h"
#include "../../samples/support/trainer_moments.h"
#include "temp_dir.h"
#include "train_gpt_runs.h"  // make_fortunes

using namespace mg;

TEST_CASE("throughput: the GPT's FLOPs a token are 6 N + 12 L C T, counted by hand on a tiny GPT") {
  models::GPTConfig c;
  c.n_layer = 1;
  c.n_head = 2;
  c.n_embd = 4;
  c.vocab_size = 8;
  c.block_size = 2;
  // The matmul weights: c_attn 4 x 12, attn.c_proj 4 x 4, c_fc 4 x 16, mlp.c_proj 16 x 4
  // (48 + 16 + 64 + 64 = 192) and the tied head 8 x 4 (32): 224, 6 FLOPs each a token.
  // Attention, a token over T = 2 positions: q k^T 2 T C = 16 and att v 16 forward, twice
  // that backward: 96.
  CHECK(plan::gpt_flops_per_token(c, 2) == 6 * 224 + 96);
  CHECK(plan::GPTArithmetic(c).flops_per_token(2) == 1440);
}

TEST_CASE("throughput: MFU is the job's tokens/s times FLOPs a token over devices x peak") {
  samples::PeakFlops peak{1e9, "a test's peak", false};
  const samples::ThroughputMeter meter(1e6, peak, 2);
  // 1000 tokens in 2 s: 500 tokens/s x 1 MFLOP = 0.5 GFLOP/s of 2 x 1 GFLOP/s, a quarter.
  CHECK(meter.mfu(1000, 2) == Approx(0.25));
  CHECK(meter.rate(1000, 2) == "500 tokens/s, MFU 25.0 %");
  CHECK_THAT(meter.describe(), MG_CONTAINS("MFU: 1 MFLOP a token (6 N + 12 L C T) against 2 x a test's peak"));
  REQUIRE_THROWS_WITH(samples::ThroughputMeter(0, peak, 1), MG_CONTAINS("ThroughputMeter: flops_per_token 0"));
  REQUIRE_THROWS_WITH(samples::ThroughputMeter(1, peak, 0), MG_CONTAINS("ThroughputMeter: devices 0"));
  CHECK(samples::devices_in_job({Device::cpu(), Device::cpu()}, 1) == 1);  // DataParallel on one CPU
  CHECK(samples::devices_in_job({Device::cuda(0), Device::cuda(1)}, 1) == 2);
  CHECK(samples::devices_in_job({Device::cpu()}, 4) == 4);
}

TEST_CASE("throughput: a GPU the table knows by its runtime name gives its dense peak for the precision") {
  const auto h100 = plan::device_by_runtime_name("NVIDIA H100 80GB HBM3");
  REQUIRE(h100);
  CHECK(h100->name == "h100-80gb");
  bool measured = false;
  const auto never = [&measured] { measured = true; return 1.0; };
  const samples::PeakFlops bf16 = samples::peak_for(h100, "NVIDIA H100 80GB HBM3", plan::Precision::BF16Mixed, never);
  CHECK(bf16.flops == 989.5e12);
  CHECK_FALSE(bf16.measured);
  CHECK_THAT(bf16.description, MG_CONTAINS("NVIDIA H100 SXM5 80 GB's dense bfloat16 peak of 989.5 TFLOP/s"));
  CHECK(samples::peak_for(h100, "", plan::Precision::True32, never).flops == 67e12);
  CHECK_FALSE(measured);
  // 16-mixed: float16's dense rate is bfloat16's on every row.
  CHECK(samples::plan_precision(samples::Precision::F16Mixed) == plan::Precision::F16Mixed);
  const samples::PeakFlops f16 = samples::peak_for(h100, "", plan::Precision::F16Mixed, never);
  CHECK(f16.flops == 989.5e12);
  CHECK_THAT(f16.description, MG_CONTAINS("dense float16 peak of 989.5 TFLOP/s"));
  CHECK(plan::device_by_runtime_name("NVIDIA A100-SXM4-40GB")->name == "a100-40gb");
}

TEST_CASE("throughput: the CPU and an unknown GPU fall back to a measured GEMM rate and say so") {
  const auto rate = [] { return 2.5e9; };
  const samples::PeakFlops cpu = samples::peak_for(std::nullopt, "", plan::Precision::BF16Mixed, rate);
  CHECK(cpu.measured);
  CHECK(cpu.flops == 2.5e9);
  CHECK(cpu.description == "this CPU's measured GEMM rate of 2.5 GFLOP/s, not a datasheet peak");
  CHECK_THAT(samples::ThroughputMeter(1e6, cpu, 1).describe(),
             MG_CONTAINS("against this CPU's measured GEMM rate of 2.5 GFLOP/s, not a datasheet peak"));
  // A sibling with other figures is not priced as its cousin.
  const auto nvl = plan::device_by_runtime_name("NVIDIA H100 NVL");
  CHECK_FALSE(nvl);
  CHECK_THAT(samples::peak_for(nvl, "NVIDIA H100 NVL", plan::Precision::True32, rate).description,
             MG_CONTAINS("this GPU's (NVIDIA H100 NVL, not in plan/devices.h's table) measured float32 GEMM rate "
                         "of 2.5 GFLOP/s, not a datasheet peak"));
}

TEST_CASE("memory_report: the allocator's peak beside the planner's bytes, or why it cannot price the split") {
  models::GPTConfig c;
  c.n_layer = 2;
  c.n_head = 2;
  c.n_embd = 16;
  c.vocab_size = 32;
  c.block_size = 16;
  const plan::GPTArithmetic model(c);
  samples::ModelSplit one;
  const plan::Plan p = plan::plan_gpt(c, plan::Split{}, plan::Workload{4, 16, plan::Precision::True32, 0.5},
                                      plan::device_by_name("h100-80gb"));
  const std::string line =
      samples::memory_report(1 << 20, 0, nullptr, model, one, 4, 16, samples::Precision::True32);
  CHECK_THAT(line, MG_CONTAINS("memory: peak 1.00 MiB on rank 0; the planner: " +
                               fmt::format("{:.2f} MiB (params ", p.stages[0].total() / 1048576)));
  CHECK_THAT(line, MG_CONTAINS(fmt::format("measured / planned {:.3f}", 1048576 / p.stages[0].total())));
  // The 16-bit precisions are priced at the trainer's moments over dp with autocast's casts;
  // FSDP's MixedPrecisionPolicy's over Gloo alone (one process here: no Gloo).
  samples::ModelSplit fsdp;
  fsdp.dp = 2;
  fsdp.zero = 3;
  CHECK_THAT(samples::memory_report(1 << 20, 0, nullptr, model, fsdp, 4, 16, samples::Precision::BF16Mixed),
             MG_CONTAINS("at the trainer's moments: "));
  CHECK_THAT(samples::memory_report(1 << 20, 0, nullptr, model, fsdp, 4, 16, samples::Precision::BF16Mixed, true),
             MG_CONTAINS("not priced at the trainer's moments yet"));
  samples::ModelSplit bad;
  bad.tp = 3;
  CHECK_THAT(samples::memory_report(0, 0, nullptr, model, bad, 4, 16, samples::Precision::True32),
             MG_CONTAINS("the planner cannot price this split: plan: tp 3 does not divide n_head 2"));
}

TEST_CASE("train_gpt: the log shows tokens/s, MFU and each rank's memory beside the planner's") {
  mg::testing::TempDir dir;
  const std::string flags = " --devices cpu --n-layer 1 --n-head 2 --n-embd 16 --block-size 16 --batch-size 4 "
                            "--eval-iters 2 --iters 4 --eval-interval 2 --sample-chars 0 --data-dir " +
                            mg::testing::make_fortunes(dir);
  const auto alone = mg::testing::run_program(mg::testing::program_path("train_gpt") + flags);
  INFO(alone.output);
  REQUIRE(alone.exit_code == 0);
  CHECK_THAT(alone.output, MG_CONTAINS("MFU: ") &&
                               MG_CONTAINS("against this CPU's measured GEMM rate of ") &&
                               MG_CONTAINS(" GFLOP/s, not a datasheet peak\n"));
  CHECK_THAT(alone.output, MG_CONTAINS("trained 4 steps in ") && MG_CONTAINS(" tokens/s, MFU "));
  CHECK_THAT(alone.output, MG_CONTAINS("memory: peak ") && MG_CONTAINS(" on rank 0; the planner: "));
  const auto split = mg::testing::run_program(mg::testing::program_path("minigrad-run") + " --nproc-per-node 2 " +
                                              mg::testing::program_path("train_gpt") + flags + " --dp 2 --zero 3 --weight-decay 0");
  INFO(split.output);
  REQUIRE(split.exit_code == 0);
  CHECK_THAT(split.output, MG_CONTAINS("[rank 0] MFU: ") && MG_CONTAINS("against 2 x this CPU's measured"));
  CHECK_THAT(split.output, MG_CONTAINS("[rank 0] memory: peak ") && MG_CONTAINS("on rank 0 (dp 0 pp 0 cp 0 tp 0)"));
  CHECK_THAT(split.output, MG_CONTAINS("[rank 1] memory: peak ") && MG_CONTAINS("on rank 1 (dp 1 pp 0 cp 0 tp 0)"));
}

TEST_CASE("train_gpt --memory-blocks: the blocks live at the peak add up to the peak") {
  mg::testing::TempDir dir;
  const std::string run_flags = " --devices cpu --n-layer 1 --n-head 2 --n-embd 16 --block-size 16 --batch-size 4 "
                                "--eval-iters 2 --iters 2 --eval-interval 2 --sample-chars 0 --memory-blocks --data-dir " +
                                mg::testing::make_fortunes(dir);
  const auto run = mg::testing::run_program(mg::testing::program_path("train_gpt") + run_flags);
  INFO(run.output);
  REQUIRE(run.exit_code == 0);
  const size_t peak = run.output.find("memory: peak ");
  const size_t all = run.output.find(" in all):\n");
  REQUIRE(peak != std::string::npos);
  REQUIRE(all != std::string::npos);
  const std::string peak_mib = run.output.substr(peak + 13, run.output.find(' ', peak + 13) - (peak + 13));
  const size_t open = run.output.rfind('(', all);
  CHECK(run.output.substr(open + 1, all - open - 1) == peak_mib + " MiB");  // every block counted, from the start
  CHECK_THAT(run.output, MG_CONTAINS("memory blocks live at rank 0's peak, largest total first (") &&
                             MG_CONTAINS(" floats each)\n"));
  const auto two = mg::testing::run_program(mg::testing::program_path("train_gpt") + run_flags + " --devices cpu,cpu");
  CHECK(two.exit_code != 0);
  CHECK_THAT(two.output, MG_CONTAINS("--memory-blocks reads the CPU allocator: it needs one CPU device a rank"));
}

namespace {

// Runs `command` (train_gpt alone, or under minigrad-run on 2 or 4 ranks: `alone` and `four`
// are the prefixes that say which) and checks every rank's "measured / that R" line, one a
// rank, within 5 %.
void check_each_rank_within_5_percent(const std::string& command, const std::string& alone, const std::string& four) {
  const auto run = mg::testing::run_program(command);
  INFO(command << "\n" << run.output);
  REQUIRE(run.exit_code == 0);
  int lines = 0;
  for (size_t at = run.output.find("measured / that "); at != std::string::npos;
       at = run.output.find("measured / that ", at + 1)) {
    const double ratio = std::stod(run.output.substr(at + 16, 5));
    CHECK(ratio == Approx(1.0).margin(0.05));
    ++lines;
  }
  CHECK(lines == (command.rfind(alone, 0) == 0 ? 1 : command.rfind(four, 0) == 0 ? 4 : 2));  // a line a rank
}

}  // namespace

// The figure at the trainer's moments (trainer_moments.h: what it always holds + the largest
// of its moments) against each rank's allocator peak, train_gpt's default GPT (4 layers,
// C 128, 12 rows of 64 tokens) in float32. Measured 0.996 to 1.029 on the splits below: cp 2
// 1.000, dp 2 x cp 2 1.000, cp 2 x pp 2 1.001 / 1.001 (with the weight gradients made before
// ring attention's backward: 1.024 and 1.037 / 1.001 without),
// ZeRO-2 1.001, ZeRO-3 1.029, the interleaved
// schedule 0.996 to 1.001 (also on pp 4 x v 2 and dp 2 x pp 2 x v 2; and 1.001 on
// dp 2 x pp 2, tp 2 x pp 2 and pp 4), and in the 16-bit precisions on one device and over dp:
// bf16-mixed and 16-mixed on one device, dp 2, ZeRO-1, ZeRO-2 and ZeRO-3
// (plan::gpt_bf16_mixed_extra_bytes's terms on top; 1.000 to 1.001), bf16-true on one
// device, dp 2, ZeRO-1 and ZeRO-2 (plan::gpt_bf16_true_extra_bytes's; 0.996 to 1.000); over
// tp (± SP) and pp (1F1B and interleaved) 0.994 to 1.015; recomputed, on one device (1.001:
// its first block's moment), over dp (1.000) and pp (the pipeline's whole-stage recompute,
// 0.986 to 1.017 with 1, 2 or 4 micro-batches, tp 2 x pp 2 and pp 4). Not here: bf16-true
// under ZeRO-3 (14.99 to 15.92 MiB a rank over runs: whether the peak holds the unit gathered
// ahead, widened to float32 for Gloo, and its rounding back is a race with the
// communication thread) and FSDP with recompute (a race of the same kind): both priced as
// ranges, the next test. The 16-bit precisions with cp (ring attention runs in float32): cp 2
// 1.000 to 1.013, dp 2 x cp 2 1.000, cp 2 x pp 2 0.989 to 1.029, cp 2 x tp 2 1.005 to 1.017.
TEST_CASE("train_gpt: each rank's peak within 5 % of the planner's bytes at the trainer's moments") {
  mg::testing::TempDir dir;
  const std::string flags = " --devices cpu --iters 4 --eval-iters 2 --eval-interval 4 --sample-chars 0 --data-dir " +
                            mg::testing::make_fortunes(dir);
  const std::string alone = mg::testing::program_path("train_gpt") + flags;
  const std::string two = mg::testing::program_path("minigrad-run") + " --nproc-per-node 2 " + alone;
  const std::string four = mg::testing::program_path("minigrad-run") + " --nproc-per-node 4 " + alone;
  for (const std::string& command : {alone, two + " --dp 2", four + " --cp 2 --pp 2", four + " --dp 2 --cp 2", two + " --dp 2 --zero 1", two + " --tp 2",
                                     two + " --tp 2 --sequence-parallel", two + " --cp 2", two + " --dp 2 --recompute",
                                     two + " --pp 2", two + " --pp 2 --micro-batches 4",
                                     two + " --pp 2 --schedule interleaved --model-chunks 2 --micro-batches 2",
                                     two + " --pp 2 --schedule interleaved --model-chunks 2 --micro-batches 4",
                                     two + " --dp 2 --zero 2",
                                     two + " --dp 2 --zero 3 --weight-decay 0", alone + " --precision bf16-mixed",
                                     two + " --dp 2 --precision bf16-mixed",
                                     two + " --dp 2 --zero 1 --precision bf16-mixed",
                                     two + " --dp 2 --zero 2 --precision bf16-mixed",
                                     two + " --dp 2 --zero 3 --weight-decay 0 --precision bf16-mixed",
                                     alone + " --precision 16-mixed", two + " --dp 2 --precision 16-mixed",
                                     two + " --dp 2 --zero 1 --precision 16-mixed",
                                     two + " --dp 2 --zero 2 --precision 16-mixed",
                                     two + " --dp 2 --zero 3 --weight-decay 0 --precision 16-mixed",
                                     alone + " --precision bf16-true", two + " --dp 2 --precision bf16-true",
                                     two + " --dp 2 --zero 1 --precision bf16-true",
                                     two + " --dp 2 --zero 2 --precision bf16-true",
                                     two + " --tp 2 --precision bf16-mixed",
                                     two + " --tp 2 --sequence-parallel --precision bf16-true",
                                     two + " --pp 2 --precision bf16-mixed",
                                     two + " --pp 2 --micro-batches 4 --precision bf16-true",
                                     two + " --pp 2 --schedule interleaved --model-chunks 2 --micro-batches 4 --precision 16-mixed",
                                     alone + " --recompute", alone + " --recompute --precision bf16-mixed",
                                     two + " --dp 2 --recompute --precision bf16-true", two + " --pp 2 --recompute",
                                     two + " --pp 2 --recompute --micro-batches 1 --precision bf16-true",
                                     four + " --tp 2 --pp 2 --recompute --precision bf16-mixed",
                                     two + " --cp 2 --precision bf16-mixed",
                                     four + " --cp 2 --pp 2 --precision bf16-true"}) {
    check_each_rank_within_5_percent(command, alone, four);
  }
}

// The Llama (llama_formulas.h) at train_gpt's default shape, 32-true, through the splits
// train_gpt runs it on: 0.977 to 1.025 on every rank (bench/RESULTS.md); and in the 16-bit
// precisions (LlamaArithmetic::precision_extra_bytes on top) a dozen of the 2026-12-07
// splits, 0.979 to 1.020 on every rank over 31 splits and three precisions there. Left out:
// bf16-true under ZeRO-3 (0.979 to 1.001 a rank over runs: whether the peak holds the unit
// gathered ahead, widened to float32 for Gloo, is a race with the communication thread, as
// the GPT's), and the other measured splits for the run time alone.
TEST_CASE("train_gpt --model llama: each rank's peak within 5 % of the planner's bytes at the trainer's moments") {
  mg::testing::TempDir dir;
  const std::string flags = " --devices cpu --model llama --iters 4 --eval-iters 2 --eval-interval 4 --sample-chars 0 "
                            "--data-dir " + mg::testing::make_fortunes(dir);
  const std::string alone = mg::testing::program_path("train_gpt") + flags;
  const std::string two = mg::testing::program_path("minigrad-run") + " --nproc-per-node 2 " + alone;
  const std::string four = mg::testing::program_path("minigrad-run") + " --nproc-per-node 4 " + alone;
  for (const std::string& command :
       {alone, alone + " --recompute", two + " --dp 2", two + " --dp 2 --zero 1", two + " --dp 2 --zero 2",
        two + " --dp 2 --zero 3 --weight-decay 0", two + " --dp 2 --recompute", two + " --tp 2",
        two + " --tp 2 --sequence-parallel", two + " --cp 2", two + " --pp 2 --micro-batches 1",
        two + " --pp 2", two + " --pp 2 --micro-batches 4", two + " --pp 2 --recompute",
        two + " --pp 2 --schedule interleaved --model-chunks 2 --micro-batches 2",
        two + " --pp 2 --schedule interleaved --model-chunks 2 --micro-batches 4", four + " --dp 2 --pp 2",
        four + " --dp 2 --pp 2 --recompute", four + " --tp 2 --pp 2", four + " --tp 2 --pp 2 --sequence-parallel",
        four + " --cp 2 --pp 2", four + " --dp 2 --cp 2", four + " --tp 2 --cp 2 --sequence-parallel",
        alone + " --precision bf16-mixed", alone + " --precision bf16-true",
        alone + " --recompute --precision bf16-mixed", two + " --dp 2 --zero 1 --precision bf16-true",
        two + " --dp 2 --zero 2 --precision 16-mixed", two + " --dp 2 --zero 3 --weight-decay 0 --precision bf16-mixed",
        two + " --tp 2 --sequence-parallel --precision bf16-true", two + " --pp 2 --micro-batches 4 --precision bf16-mixed",
        two + " --pp 2 --schedule interleaved --model-chunks 2 --micro-batches 4 --precision bf16-true",
        two + " --cp 2 --precision bf16-mixed", four + " --tp 2 --pp 2 --recompute --precision bf16-true",
        four + " --dp 2 --cp 2 --precision 16-mixed"}) {
    check_each_rank_within_5_percent(command, alone, four);
  }
}

// FSDP's races with Gloo's communication thread, priced as ranges (trainer_moments.h): the
// low, every collective done before compute reached the moment, and the high, the thread's
// buffers alive at it. With recompute: whether it still holds block k + 1's reduce-scatter
// scratch at block k's backward (13.03, 13.22, 13.60 or 13.79 MiB on rank 0 of the same
// command); in bf16-true: whether the unit gathered ahead is in flight, widened to float32,
// at the last block's c_proj backward (14.99 to 15.92); under FSDP's MixedPrecisionPolicy
// (bf16-mixed and 16-mixed) the same gather with its 16-bit input shard, at the last block's
// c_fc backward (14.62 to 15.47 against 13.75 to 15.46), over dp 2 x tp 2 at c_proj's
// backward (8.28 to 9.04 against 8.17 to 9.02), with SP (8.09 to 8.64 against 7.73 to 8.59),
// over dp 2 x cp 2 at ring attention's backward (12.65 to 13.53 against 11.81 to 13.51) and
// dp 2 x tp 2 x cp 2 (6.78 to 7.12 against 6.30 to 7.15); the
// Llama's on dp 2 at its gate's and up's backward (14.27 to 15.77 against 14.18 to 15.77),
// dp 2 x tp 2 (8.51 to 8.85 against 8.05 to 8.84) and dp 2 x cp 2 (12.39 to 13.22 against
// 11.77 to 13.35). Recomputed in 16 bits (2026-12-07): bf16-mixed 12.27 to 13.03 against
// 12.26 to 13.02, bf16-true 10.74 to 12.62 against 10.52 to 12.60, under the policy 10.65 to
// 12.35 against 10.64 to 12.34. The range is no wider than the named buffers, and each bound
// is a moment's own terms: a wrong formula still fails.
TEST_CASE("train_gpt: FSDP's races with Gloo's thread are priced as ranges and each run falls within them") {
  // The bounds at train_gpt's default shape, exactly: the high is the low's moment with the
  // racing buffers alive, a unit of 12C^2 + 13C elements at C 128.
  models::GPTConfig c;
  c.n_layer = 4;
  c.n_head = 4;
  c.n_embd = 128;
  c.vocab_size = 34;
  c.block_size = 64;
  const plan::GPTArithmetic model(c);
  const double elements = 12 * 128 * 128 + 13 * 128;
  samples::ModelSplit fsdp;
  fsdp.dp = 2;
  fsdp.zero = 3;
  samples::ModelSplit recomputed = fsdp;
  recomputed.recompute = true;
  const double tp_elements = 6 * 128 * 128 + 9.5 * 128;  // a block's tp shard: 12C^2/2, its biases and LayerNorms
  samples::ModelSplit policy_tp = fsdp;
  policy_tp.tp = 2;
  samples::ModelSplit policy_sp = policy_tp;
  policy_sp.sequence_parallel = true;
  samples::ModelSplit policy_cp = fsdp;
  policy_cp.cp = 2;
  samples::ModelSplit policy_tp_cp = policy_tp;
  policy_tp_cp.cp = 2;
  const std::string policy_name = "the unit gathered ahead, widened for Gloo: this rank's shard rounded to 16 bits";
  // train_gpt --model llama's default: C 128, 4 heads, 2 key-value heads (k d 64), SwiGLU 352;
  // a layer is 2C^2 + 2C kd + 3CI + 2C elements.
  models::LlamaConfig lc;
  lc.vocab_size = 34;
  lc.hidden_size = 128;
  lc.intermediate_size = 352;
  lc.num_hidden_layers = 4;
  lc.num_attention_heads = 4;
  lc.num_key_value_heads = 2;
  lc.max_position_embeddings = 64;
  const plan::LlamaArithmetic llama(lc);
  const double llama_elements = 2 * 128 * 128 + 2 * 128 * 64 + 3 * 128 * 352 + 2 * 128;
  const double llama_tp_elements = (2 * 128 * 128 + 2 * 128 * 64 + 3 * 128 * 352) / 2 + 2 * 128;  // norms whole
  struct Case {
    samples::ModelSplit split;
    samples::Precision precision;
    double racing;  // bytes
    std::string name, flags;
    bool fsdp_mp_policy = false;
    int ranks = 2;     // dp 2, times tp and cp
    int attempts = 3;  // runs of it: each may end the race otherwise
    const plan::ModelArithmetic* arithmetic = nullptr;  // the GPT's unless named
  };
  // With recompute: the reduce-scatter's float32 scratch, a unit. In bf16-true: the gathered
  // unit's float32 output (4 bytes an element), this rank's float32 shard (4 / 2) and the
  // unit rounded back to bfloat16 (2).
  // Under FSDP's MixedPrecisionPolicy the same gather, and its input: this rank's float32
  // shard rounded to 16 bits (2 / 2), freed with the rest when the gather ends; 16-mixed
  // holds the same blocks as bf16-mixed.
  // Recomputed in 16 bits (fsdp_moments.h): under autocast the flat gradients are float32,
  // the same scratch; in bf16-true the reduce-scatter travels widened: its float32 copy and
  // scratch (4 + 4 bytes an element), the float32 shard it sums into and that rounded back
  // ((4 + 2) / 2); under the policy the gather ahead is the larger: its input, this rank's
  // float32 shard rounded to 16 bits (2 / 2), the float32 output (4), the float32 input
  // (4 / 2) and the output rounded back (2).
  const std::vector<Case> cases = {
      {recomputed, samples::Precision::True32, 4 * elements, "the reduce-scatter's scratch (block ", " --recompute"},
      {recomputed, samples::Precision::BF16Mixed, 4 * elements, "the reduce-scatter's scratch (block ",
       " --recompute --precision bf16-mixed"},
      {recomputed, samples::Precision::BF16True, (4 + 4 + 3) * elements,
       "the reduce-scatter's widened copy, scratch, float32 shard and it rounded back (block ",
       " --recompute --precision bf16-true"},
      {recomputed, samples::Precision::BF16Mixed, (1 + 4 + 2 + 2) * elements,
       "the gather ahead's input, this rank's shard rounded to 16 bits", " --recompute --precision bf16-mixed --fsdp-mp-policy",
       true},
      {fsdp, samples::Precision::BF16True, (4 + 2 + 2) * elements, "the unit gathered ahead, widened for Gloo",
       " --precision bf16-true"},
      {fsdp, samples::Precision::BF16Mixed, (1 + 4 + 2 + 2) * elements,
       "the unit gathered ahead, widened for Gloo: this rank's shard rounded to 16 bits",
       " --precision bf16-mixed --fsdp-mp-policy", true},
      {fsdp, samples::Precision::F16Mixed, (1 + 4 + 2 + 2) * elements,
       "the unit gathered ahead, widened for Gloo: this rank's shard rounded to 16 bits",
       " --precision 16-mixed --fsdp-mp-policy", true},
      // Over dp x tp (± SP) the units are the rank's tp shards, and over dp x cp the moment is
      // ring attention's backward; the gather ahead is the same buffers.
      {policy_tp, samples::Precision::BF16Mixed, (1 + 4 + 2 + 2) * tp_elements, policy_name,
       " --tp 2 --precision bf16-mixed --fsdp-mp-policy", true, 4, 2},
      {policy_sp, samples::Precision::F16Mixed, (1 + 4 + 2 + 2) * tp_elements, policy_name,
       " --tp 2 --sequence-parallel --precision 16-mixed --fsdp-mp-policy", true, 4, 1},
      {policy_cp, samples::Precision::BF16Mixed, (1 + 4 + 2 + 2) * elements, policy_name,
       " --cp 2 --precision bf16-mixed --fsdp-mp-policy", true, 4, 2},
      {policy_tp_cp, samples::Precision::BF16Mixed, (1 + 4 + 2 + 2) * tp_elements, policy_name,
       " --tp 2 --cp 2 --precision bf16-mixed --fsdp-mp-policy", true, 8, 1},
      // The Llama's layers are its units: the same gather, at its SwiGLU's moments.
      {fsdp, samples::Precision::BF16Mixed, (1 + 4 + 2 + 2) * llama_elements, policy_name,
       " --model llama --precision bf16-mixed --fsdp-mp-policy", true, 2, 2, &llama},
      {policy_tp, samples::Precision::BF16Mixed, (1 + 4 + 2 + 2) * llama_tp_elements, policy_name,
       " --model llama --tp 2 --precision bf16-mixed --fsdp-mp-policy", true, 4, 1, &llama},
      {policy_cp, samples::Precision::BF16Mixed, (1 + 4 + 2 + 2) * llama_elements, policy_name,
       " --model llama --cp 2 --precision bf16-mixed --fsdp-mp-policy", true, 4, 1, &llama}};
  mg::testing::TempDir dir;
  const std::string fortunes = mg::testing::make_fortunes(dir);
  for (const Case& k : cases) {
    const plan::ModelArithmetic& arithmetic = k.arithmetic != nullptr ? *k.arithmetic : model;
    const plan::Plan p =
        plan::plan_model(arithmetic, samples::plan_split(k.split),
                         plan::Workload{12, 64, samples::plan_precision(k.precision)}, plan::device_table().front());
    const auto moments =
        samples::trainer_moments(p.stages[0], arithmetic, k.split, 0, 12, 64, k.precision, k.fsdp_mp_policy, true);
    INFO(k.flags);
    REQUIRE(moments.has_value());
    REQUIRE(moments->is_range());
    CHECK(moments->high() - moments->low() == Approx(k.racing).epsilon(1e-12));
    CHECK(moments->high_moment().name == moments->low_moment().name);
    REQUIRE(moments->high_moment().racing.size() == 1);
    CHECK(moments->high_moment().racing[0].bytes == Approx(k.racing).epsilon(1e-12));
    CHECK_THAT(moments->high_moment().racing[0].name, MG_CONTAINS(k.name));
    // Over NCCL (no such thread's buffers) the range is gone: recompute and the policy are
    // not priced, and bf16-true's gather is not widened.
    const auto nccl =
        samples::trainer_moments(p.stages[0], arithmetic, k.split, 0, 12, 64, k.precision, k.fsdp_mp_policy, false);
    CHECK((!nccl || !nccl->is_range()));

    const std::string command = mg::testing::program_path("minigrad-run") + " --nproc-per-node " +
                                std::to_string(k.ranks) + " " +
                                mg::testing::program_path("train_gpt") +
                                " --devices cpu --iters 4 --eval-iters 2 --eval-interval 4 --sample-chars 0 --data-dir " +
                                fortunes + " --dp 2 --zero 3 --weight-decay 0" + k.flags;
    for (int attempt = 0; attempt < k.attempts; ++attempt) {
      const auto run = mg::testing::run_program(command);
      INFO(command << "\n" << run.output);
      REQUIRE(run.exit_code == 0);
      int lines = 0;
      for (size_t at = run.output.find("memory: peak "); at != std::string::npos;
           at = run.output.find("memory: peak ", at + 1)) {
        const std::string line = run.output.substr(at, run.output.find('\n', at) - at);
        mg::testing::check_range_line(line, "at the trainer's moments: ", k.name, k.racing);
        ++lines;
      }
      CHECK(lines == k.ranks);
    }
  }
}

// FSDP with recompute's ranges on the splits the test above leaves out (2026-12-07, each
// rank over 8 runs within its range): over dp x cp in 32-true (the GPT's and the Llama's),
// the Llama over dp in each precision and under the policy, and 16-mixed, which holds
// bf16-mixed's blocks. The range is the formula's racing term exactly, and each run falls
// within it.
TEST_CASE("train_gpt: FSDP with recompute's ranges hold over dp x cp and for the Llama and 16-mixed") {
  mg::testing::TempDir dir;
  const std::string fortunes = mg::testing::make_fortunes(dir);
  struct Case {
    std::string model;
    int dp, cp;
    samples::Precision precision;
    bool fsdp_mp_policy;
    std::string flags;
  };
  const std::vector<Case> cases = {
      {"gpt", 2, 2, samples::Precision::True32, false, " --dp 2 --cp 2"},
      {"gpt", 2, 1, samples::Precision::F16Mixed, true, " --dp 2 --precision 16-mixed --fsdp-mp-policy"},
      {"llama", 2, 1, samples::Precision::True32, false, " --dp 2"},
      {"llama", 2, 1, samples::Precision::BF16Mixed, false, " --dp 2 --precision bf16-mixed"},
      {"llama", 2, 1, samples::Precision::BF16True, false, " --dp 2 --precision bf16-true"},
      {"llama", 2, 1, samples::Precision::BF16Mixed, true, " --dp 2 --precision bf16-mixed --fsdp-mp-policy"},
      {"llama", 2, 2, samples::Precision::True32, false, " --dp 2 --cp 2"}};
  for (const Case& k : cases) {
    INFO(k.model << k.flags);
    samples::ModelFlags flags;
    flags.model = k.model;
    const auto model = samples::LanguageModel(flags, 34).arithmetic();  // the fortunes' 34 characters
    samples::ModelSplit split;
    split.dp = k.dp;
    split.cp = k.cp;
    split.zero = 3;
    split.recompute = true;
    const plan::Plan p = plan::plan_model(*model, samples::plan_split(split),
                                          plan::Workload{12, 64, samples::plan_precision(k.precision)},
                                          plan::device_table().front());
    const auto moments =
        samples::trainer_moments(p.stages[0], *model, split, 0, 12, 64, k.precision, k.fsdp_mp_policy, true);
    REQUIRE(moments.has_value());
    REQUIRE(moments->is_range());
    CHECK(moments->high_moment().name == moments->low_moment().name);
    REQUIRE(moments->high_moment().racing.size() == 1);
    const samples::MemoryTerm racing = moments->high_moment().racing[0];
    CHECK(moments->high() - moments->low() == Approx(racing.bytes).epsilon(1e-12));

    const int ranks = k.dp * k.cp;
    const std::string command = mg::testing::program_path("minigrad-run") + " --nproc-per-node " +
                                std::to_string(ranks) + " " + mg::testing::program_path("train_gpt") +
                                " --devices cpu --model " + k.model +
                                " --iters 4 --eval-iters 2 --eval-interval 4 --sample-chars 0 --data-dir " + fortunes +
                                " --zero 3 --weight-decay 0 --recompute" + k.flags;
    const auto run = mg::testing::run_program(command);
    INFO(command << "\n" << run.output);
    REQUIRE(run.exit_code == 0);
    int lines = 0;
    for (size_t at = run.output.find("memory: peak "); at != std::string::npos;
         at = run.output.find("memory: peak ", at + 1)) {
      const std::string line = run.output.substr(at, run.output.find('\n', at) - at);
      // The racing term's name up to its block's number, which names the moment's block.
      mg::testing::check_range_line(line, "at the trainer's moments: ", racing.name.substr(0, racing.name.find("(block")),
                                    racing.bytes);
      ++lines;
    }
    CHECK(lines == ranks);
  }
}
