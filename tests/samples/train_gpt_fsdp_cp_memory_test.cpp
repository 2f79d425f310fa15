// train_gpt's memory line under FSDP over dp x cp (samples/support/fsdp_moments.h,
// fsdp_ring_moments): the peak is ring attention's backward in some block, with FSDP's units
// and flat gradients of that block's moment; in 16 bits also with recompute.
#include "catch_compat.h"

#include <string>

#include <minigrad/models/gpt.h>
#include <minigrad/plan/model_arithmetic.h>
#include <minigrad/plan/planner.h>

#include "samples/run_program.h"
#include "../../samples/support/memory_report.h"
#include "../../samples/support/throughput.h"
#include "../../samples/support/trainer_moments.h"
#include "temp_dir.h"
#include "train_gpt_runs.h"  // make_fortunes

using namespace mg;

// The GPT at train_gpt's default shape (4 blocks, C 128, 4 heads, 12 rows of 64 tokens) on
// dp 2 x cp 2: the low is the last block's ring backward (block 3's unit gathered, block
// 2's ahead, block 3's flat gradient made: its MLP went back first), the high block 2's with
// block 3's reduce-scatter in flight and Gloo's scratch for it (14.53 and 14.82 MiB a rank
// over runs, 2026-12-07; priced 14.51 to 14.80). The Llama's larger layers keep its last
// layer's moment the peak alone (14.85 against 14.83).
TEST_CASE("train_gpt: FSDP over dp x cp peaks at ring attention's backward, block 2's moment with its race the high") {
  models::GPTConfig c;
  c.n_layer = 4;
  c.n_head = 4;
  c.n_embd = 128;
  c.vocab_size = 34;
  c.block_size = 64;
  const plan::GPTArithmetic model(c);
  samples::ModelSplit split;
  split.dp = 2;
  split.cp = 2;
  split.zero = 3;
  const plan::Plan p = plan::plan_model(model, samples::plan_split(split),
                                        plan::Workload{12, 64, plan::Precision::True32}, plan::device_table().front());
  const auto moments =
      samples::trainer_moments(p.stages[0], model, split, 0, 12, 64, samples::Precision::True32, false, true);
  REQUIRE(moments.has_value());
  REQUIRE(moments->is_range());
  CHECK(moments->low_moment().name == "ring attention's backward in block 3");
  CHECK(moments->high_moment().name == "ring attention's backward in block 2");
  // Block 2's moment against block 3's: block 3's activations freed (17C + 4 + a floats a
  // token of 6 rows x 32), block 3's flat gradient held by its reduce-scatter and its shard
  // made; the high adds that reduce-scatter's scratch, a unit (12C^2 + 13C floats).
  const double unit = 4 * (12.0 * 128 * 128 + 13 * 128), shard = unit / 2;
  const double block_activations = 4 * (17.0 * 128 + 4 + 4) * 6 * 32;
  CHECK(moments->high() - moments->low() == Approx(unit + shard - block_activations + unit).epsilon(1e-12));
  // Over NCCL it is not priced.
  CHECK_FALSE(samples::trainer_moments(p.stages[0], model, split, 0, 12, 64, samples::Precision::True32, false, false));

  mg::testing::TempDir dir;
  const std::string four = mg::testing::program_path("minigrad-run") + " --nproc-per-node 4 " +
                           mg::testing::program_path("train_gpt") +
                           " --devices cpu --iters 4 --eval-iters 2 --eval-interval 4 --sample-chars 0 --data-dir " +
                           mg::testing::make_fortunes(dir) + " --dp 2 --cp 2 --zero 3 --weight-decay 0";
  const auto each_line = [](const std::string& output, const auto& check) {
    int lines = 0;
    for (size_t at = output.find("memory: peak "); at != std::string::npos; at = output.find("memory: peak ", at + 1)) {
      check(output.substr(at, output.find('\n', at) - at));
      ++lines;
    }
    CHECK(lines == 4);
  };
  for (int attempt = 0; attempt < 2; ++attempt) {
    const auto run = mg::testing::run_program(four);
    INFO(four << "\n" << run.output);
    REQUIRE(run.exit_code == 0);
    each_line(run.output, [](const std::string& line) {
      INFO(line);
      const double measured = std::stod(line.substr(13));
      const std::string key = "at the trainer's moments: ";
      const size_t at = line.find(key);
      REQUIRE(at != std::string::npos);
      const double low = std::stod(line.substr(at + key.size()));
      const double high = std::stod(line.substr(line.find(" to ", at) + 4));
      CHECK(measured >= 0.95 * low);
      CHECK(measured <= 1.05 * high);
      CHECK_THAT(line, MG_CONTAINS("the high adds: the reduce-scatter's scratch (block 3's, on Gloo's thread)"));
    });
  }
  const auto llama = mg::testing::run_program(four + " --model llama");
  INFO(llama.output);
  REQUIRE(llama.exit_code == 0);
  each_line(llama.output, [](const std::string& line) {
    INFO(line);
    const size_t at = line.find("measured / that ");
    REQUIRE(at != std::string::npos);
    CHECK(std::stod(line.substr(at + 16)) == Approx(1.0).margin(0.05));
  });
}

namespace {

// The GPT at train_gpt's default shape on dp 2 x cp 2 with FSDP, in `precision`.
samples::TrainerMoments default_gpt_moments(samples::Precision precision, bool recompute) {
  models::GPTConfig c;
  c.n_layer = 4;
  c.n_head = 4;
  c.n_embd = 128;
  c.vocab_size = 34;
  c.block_size = 64;
  const plan::GPTArithmetic model(c);
  samples::ModelSplit split;
  split.dp = 2;
  split.cp = 2;
  split.zero = 3;
  split.recompute = recompute;
  const plan::Plan p = plan::plan_model(model, samples::plan_split(split),
                                        plan::Workload{12, 64, samples::plan_precision(precision)},
                                        plan::device_table().front());
  const auto moments = samples::trainer_moments(p.stages[0], model, split, 0, 12, 64, precision, false, true);
  REQUIRE(moments.has_value());
  return *moments;
}

}  // namespace

// In 16 bits each block gone back frees, beside its activations at 2 bytes, its float32 saved
// tensors, its weight casts and the ring's float32 q k v and output (ring_block_extra_bytes);
// with recompute the recomputed block peaks in its ring attention's float32 backward, the
// blocks before it holding their inputs alone. bf16-true's units, flat gradients and shards
// are bfloat16 and Gloo's thread widens its reduce-scatter (2026-12-07: bf16-mixed 14.06 to
// 14.50 MiB a rank against 14.19 to 14.63; bf16-true with recompute 10.45 to 12.05 against
// 10.01 to 12.09).
TEST_CASE("train_gpt: FSDP over dp x cp in 16 bits frees each block's float32 and cast tensors, with and without recompute") {
  const double C = 128, a = 4, n = 6 * 32;           // a rank's tokens: 6 rows of 32
  const double elements = 12 * C * C + 13 * C;        // a block's unit (even over dp 2)
  {  // bf16-mixed: block 3's moment the low, block 2's with block 3's scratch the high
    const samples::TrainerMoments m = default_gpt_moments(samples::Precision::BF16Mixed, false);
    REQUIRE(m.is_range());
    CHECK(m.low_moment().name == "ring attention's backward in block 3");
    CHECK(m.high_moment().name == "ring attention's backward in block 2");
    // Block 3 gone back: its activations at 2 bytes, its float32 residual stream and
    // statistics and log-sum-exps, its four weights' casts and the ring's float32 q k v and
    // output; block 3's flat gradient and shard held, the scratch a float32 unit.
    const double block_freed = 2 * (17 * C + 4 + a) * n + (4 * C + 8 + 2 * a) * n + 2 * 12 * C * C + 8 * C * n;
    CHECK(m.high() - m.low() == Approx(4 * elements + 2 * elements - block_freed + 4 * elements).epsilon(1e-12));
  }
  {  // bf16-true with recompute: block 1's moment, the range its widened reduce-scatter
    const samples::TrainerMoments m = default_gpt_moments(samples::Precision::BF16True, true);
    CHECK(m.low_moment().name == "ring attention's backward in block 1, recomputed");
    CHECK(m.high_moment().name == "ring attention's backward in block 1, recomputed");
    // block 2's reduce-scatter: the float32 copy and scratch (4 + 4 bytes an element), the
    // float32 shard and it rounded back (4 + 2 bytes an element of a half)
    CHECK(m.high() - m.low() == Approx(8 * elements + 6 * elements / 2).epsilon(1e-12));
  }

  mg::testing::TempDir dir;
  const std::string four = mg::testing::program_path("minigrad-run") + " --nproc-per-node 4 " +
                           mg::testing::program_path("train_gpt") +
                           " --devices cpu --iters 4 --eval-iters 2 --eval-interval 4 --sample-chars 0 --data-dir " +
                           mg::testing::make_fortunes(dir) + " --dp 2 --cp 2 --zero 3 --weight-decay 0";
  for (const std::string args : {" --precision bf16-mixed", " --precision bf16-true --recompute",
                                 " --precision 16-mixed --recompute --model llama", " --precision bf16-true --model llama"}) {
    const auto run = mg::testing::run_program(four + args);
    INFO(four + args << "\n" << run.output);
    REQUIRE(run.exit_code == 0);
    int lines = 0;
    for (size_t at = run.output.find("memory: peak "); at != std::string::npos;
         at = run.output.find("memory: peak ", at + 1), ++lines) {
      const std::string line = run.output.substr(at, run.output.find('\n', at) - at);
      INFO(line);
      const std::string key = "at the trainer's moments: ";
      const size_t priced = line.find(key);
      REQUIRE(priced != std::string::npos);
      const double measured = std::stod(line.substr(13));
      const double low = std::stod(line.substr(priced + key.size()));
      const double high = std::stod(line.substr(line.find(" to ", priced) + 4));
      CHECK(measured >= 0.95 * low);
      CHECK(measured <= 1.05 * high);
      CHECK_THAT(line, MG_CONTAINS("(a race with Gloo's communication thread)"));
    }
    CHECK(lines == 4);
  }
}
