// build/bin/train_gpt with --pp (the 4-D pipeline), --zero 1|2|3 and --recompute under
// build/bin/minigrad-run (samples/support/split_model.h): tiny runs whose printed losses
// equal the single-device run's on the same windows (the gradient clip included: it is
// active in these runs, as the unclipped run's different losses show) -- ZeRO-1 with every
// split, ZeRO-2 and FSDP with tp and cp -- and the combinations that are refused, with their
// messages.
#include "catch_compat.h"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <minigrad/minigrad.h>

#include "samples/run_program.h"
#include "temp_dir.h"
#include "train_gpt_runs.h"

#if MINIGRAD_WITH_GLOO

using mg::testing::run_program;
using mg::testing::TempDir;
using mg::testing::make_fortunes;
using mg::testing::metrics_losses;

namespace {

const std::string kProgram = mg::testing::program_path("train_gpt");
const std::string kRun = mg::testing::program_path("minigrad-run");
// Two heads, a batch of 5 (uneven over dp 2), two micro-batches of accumulation per step.
const std::string kFlags = " --devices cpu --n-head 2 --n-embd 16 --grad-accum 2 --eval-iters 2 --iters 6 "
                           "--eval-interval 3 --warmup 2 --block-size 16 --batch-size 5";

struct Runs {
  TempDir dir;
  std::string flags;
  int runs = 0;
  explicit Runs(const std::string& model) { flags = kFlags + " " + model + " --data-dir " + make_fortunes(dir); }
  // The run's metrics (after `ranks` processes under minigrad-run when ranks > 0).
  std::vector<double> run(int ranks, const std::string& more, std::string* output = nullptr) {
    const std::string csv = dir / ("run" + std::to_string(runs++) + ".csv");
    const std::string program = ranks > 0 ? kRun + " --nproc-per-node " + std::to_string(ranks) + " " + kProgram : kProgram;
    const auto result = run_program(program + flags + " " + more + " --metrics " + csv);
    INFO(result.output);
    REQUIRE(result.exit_code == 0);
    if (output) *output = result.output;
    return metrics_losses(csv);
  }
};

void require_same(const std::vector<double>& got, const std::vector<double>& want) {
  REQUIRE(want.size() == 6);
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < got.size(); ++i) REQUIRE(got[i] == Approx(want[i]).margin(2e-5));
}

// The clip matters in these runs: without it the last losses differ.
void require_clip_active(Runs& runs, const std::string& more, const std::vector<double>& clipped) {
  const std::vector<double> unclipped = runs.run(0, more + " --grad-clip 0");
  REQUIRE(std::abs(unclipped.back() - clipped.back()) > 1e-4);
}

}  // namespace

TEST_CASE("train_gpt --dp 2 --tp 2 --pp 2 on 8 ranks prints the single-device run's losses, clipped") {
  Runs runs("--n-layer 2 --sample-chars 0");
  const std::vector<double> single = runs.run(0, "");
  require_clip_active(runs, "", single);
  std::string output;
  require_same(runs.run(8, "--dp 2 --tp 2 --pp 2", &output), single);
  REQUIRE_THAT(output, MG_CONTAINS("[rank 0] split: dp 2 x tp 2 x pp 2 x cp 1, 1F1B schedule, 2 micro-batches, "
                                   "1 model chunk over 8 ranks (gloo)"));
}

TEST_CASE("train_gpt --pp 2 --schedule interleaved --model-chunks 2 and --pp 2 --micro-batches 3 "
          "--recompute on 2 ranks print the single-device run's losses") {
  Runs runs("--n-layer 4 --sample-chars 0");
  const std::vector<double> single = runs.run(0, "");
  require_same(runs.run(2, "--pp 2 --schedule interleaved --model-chunks 2"), single);
  require_same(runs.run(2, "--pp 2 --micro-batches 3 --recompute"), single);
}

TEST_CASE("train_gpt --dp 2 --zero 1 and --zero 2 print the single-device run's losses and sample") {
  // A weight decay large enough to show (lr x decay = 1): decaying the biases and
  // LayerNorm gains too, as one AdamW over the flat shards would, zeroes the gains.
  Runs runs("--n-layer 2 --sample-chars 20 --weight-decay 100 --lr 0.01 --min-lr 0.001");
  std::string single_out, out1, out2;
  const std::vector<double> single = runs.run(0, "", &single_out);
  require_same(runs.run(2, "--dp 2 --zero 1", &out1), single);
  require_same(runs.run(2, "--dp 2 --zero 2", &out2), single);
  REQUIRE_THAT(out2, MG_CONTAINS("split: dp 2 x tp 1 x cp 1, ZeRO-2 over 2 ranks"));
  const std::string sample = single_out.substr(single_out.find("---- a sample"));
  REQUIRE_THAT(out2, MG_CONTAINS("[rank 0] " + sample.substr(0, sample.find('\n'))));
}

TEST_CASE("train_gpt --zero 1 over the dp dimension of a tp x pp and a cp mesh prints the single-device run's losses") {
  // ZeRO-1 shards only AdamW's state over dp, so it composes with every split: each rank
  // cuts its own parameters (tp shards, pipeline chunks) over its dp group. The weight decay
  // is large enough to show a wrong grouping, as in the --zero 1/2 case above.
  Runs runs("--n-layer 2 --sample-chars 0 --weight-decay 100 --lr 0.01 --min-lr 0.001");
  const std::vector<double> single = runs.run(0, "");
  std::string out;
  require_same(runs.run(8, "--dp 2 --tp 2 --pp 2 --zero 1", &out), single);
  REQUIRE_THAT(out, MG_CONTAINS("split: dp 2 x tp 2 x pp 2 x cp 1, 1F1B schedule, 2 micro-batches, 1 model chunk, "
                                "ZeRO-1 over 8 ranks"));
  require_same(runs.run(4, "--dp 2 --cp 2 --zero 1"), single);
}

TEST_CASE("train_gpt --zero 2 and --zero 3 over the dp dimension of a tp and a cp mesh print the single-device "
          "run's losses") {
  // The plans split the GPT over tp and cp in place; ZeRO-2's and FSDP's flat shards then
  // hold pieces of tp shards, and the partial gradients (sequence parallelism's, cp's) are
  // summed on the shards after the dp reduce-scatter. Weight decay 0: --zero 3's AdamW
  // steps flat shards.
  Runs runs("--n-layer 2 --sample-chars 0 --weight-decay 0");
  const std::vector<double> single = runs.run(0, "");
  require_same(runs.run(4, "--dp 2 --tp 2 --zero 2"), single);
  require_same(runs.run(4, "--dp 2 --tp 2 --sequence-parallel --zero 3"), single);
  require_same(runs.run(4, "--dp 2 --cp 2 --zero 2"), single);
  require_same(runs.run(4, "--dp 2 --cp 2 --zero 3"), single);
}

TEST_CASE("train_gpt --dp 2 --zero 3 --recompute prints the single-device run's losses") {
  Runs runs("--n-layer 2 --sample-chars 20 --weight-decay 0");
  std::string out;
  const std::vector<double> single = runs.run(0, "");
  require_same(runs.run(2, "--dp 2 --zero 3 --recompute", &out), single);
  REQUIRE_THAT(out, MG_CONTAINS("ZeRO-3 (FSDP by block), recompute over 2 ranks"));
  REQUIRE_THAT(out, MG_CONTAINS("[rank 0] ---- a sample"));
}

TEST_CASE("train_gpt --pp/--zero/--recompute: combinations the library does not support are refused") {
  TempDir dir;
  const std::string flags = kFlags + " --n-layer 2 --data-dir " + make_fortunes(dir);
  const auto refused = [&](int ranks, const std::string& more, const std::string& message) {
    const std::string program = ranks > 0 ? kRun + " --nproc-per-node " + std::to_string(ranks) + " " + kProgram : kProgram;
    const auto result = run_program(program + flags + " " + more);
    INFO(result.output);
    CHECK(result.exit_code != 0);
    CHECK_THAT(result.output, MG_CONTAINS(message));
  };
  refused(4, "--dp 2 --pp 2 --zero 2", "--zero 2 with --pp 2: ZeRO-2's and FSDP's reductions run in backward hooks");
  refused(0, "--zero 1", "--zero 1 shards over the data-parallel ranks: it needs --dp 2 or more");
  refused(2, "--dp 2 --zero 3", "--zero 3: AdamW steps FSDP's flat shards");
  refused(0, "--schedule interleaved", "--schedule, --micro-batches and --model-chunks are the pipeline's: they need --pp 2");
  refused(2, "--pp 2 --model-chunks 2", "--model-chunks 2: more than one chunk per rank needs --schedule interleaved");
  refused(2, "--tp 2 --recompute", "--recompute with --tp: block checkpointing wraps the plain model's blocks");
  refused(0, "--pp 2", "--dp 1 x --tp 1 x --pp 2 x --cp 1 = 2 ranks, but the job has 1");
}

#endif
