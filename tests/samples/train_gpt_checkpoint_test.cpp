// build/bin/train_gpt's checkpoints and end-of-run sample under --pp (the 4-D pipeline) and
// --zero 1|2|3, alone and with tp, pp and cp (samples/support/split_model.h: the state
// gathered and scattered by placements, parallel::full_state_dict and
// full_optimizer_state): a run saved under one of them
// writes the single-device run's checkpoint (the model in nanoGPT's names, AdamW's state),
// a resume under another split -- or on one device -- continues to the uninterrupted
// single-device run's losses and weights (float32 rounding apart, as the split runs
// themselves), and the sample printed under --pp is the single-device run's.
#include "catch_compat.h"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include <minigrad/minigrad.h>

#include "samples/run_program.h"
#include "temp_dir.h"
#include "train_gpt_runs.h"

#if MINIGRAD_WITH_GLOO

using mg::testing::require_close;
using mg::testing::run_program;
using mg::testing::TempDir;
using mg::testing::make_fortunes;
using mg::testing::read_text;
using mg::testing::sample_of;

namespace {

const std::string kProgram = mg::testing::program_path("train_gpt");
const std::string kRun = mg::testing::program_path("minigrad-run");
// Two heads, a batch of 5 (uneven over dp 2), two micro-batches of accumulation per step;
// one schedule for every run (warmup and decay would otherwise follow --iters).
const std::string kFlags = " --devices cpu --n-head 2 --n-embd 16 --grad-accum 2 --eval-iters 2 --block-size 16 "
                           "--batch-size 5 --eval-interval 4 --warmup 2 --decay-iters 8";

// The evaluations of a run's --metrics CSV (rank 0 writes it), in order: {step, train loss,
// val loss}. A resumed run's CSV starts with the rows its checkpoint carried.
std::vector<std::tuple<int, double, double>> evaluations(const std::string& csv_path) {
  std::vector<std::tuple<int, double, double>> out;
  std::istringstream lines(read_text(csv_path));
  std::string line;
  std::getline(lines, line);  // the header
  while (std::getline(lines, line)) {
    int step = 0;
    double train = 0, val = 0;
    if (std::sscanf(line.c_str(), "%d,%lf,%lf", &step, &train, &val) == 3)
      out.emplace_back(step, train, val);
  }
  return out;
}

struct Runs {
  TempDir dir;
  std::string flags;
  explicit Runs(const std::string& model) { flags = kFlags + " " + model + " --data-dir " + make_fortunes(dir); }
  std::string path(const std::string& name) const { return dir / (name + ".safetensors"); }
  std::string metrics(const std::string& name) const { return dir / (name + ".csv"); }
  // A run of `iters` steps on `ranks` processes (0: the single-device program), saving to
  // `save` (and its evaluations to metrics(save)) and resuming `resume` when given; its output.
  std::string run(int ranks, const std::string& split, int iters, const std::string& save,
                  const std::string& resume = "") {
    const std::string program = ranks > 0 ? kRun + " --nproc-per-node " + std::to_string(ranks) + " " + kProgram : kProgram;
    const auto result = run_program(program + flags + " " + split + " --iters " + std::to_string(iters) +
                                    " --save " + path(save) + " --metrics " + metrics(save) +
                                    (resume.empty() ? "" : " --resume " + path(resume)));
    INFO(result.output);
    REQUIRE(result.exit_code == 0);
    if (!resume.empty()) REQUIRE_THAT(result.output, MG_CONTAINS("resumed at step 4"));
    return result.output;
  }
  // Checkpoint `name` holds what checkpoint `want` holds: the model and AdamW's state.
  void require_same_checkpoint(const std::string& name, const std::string& want) const {
    const auto got = mg::nn::load_tensors(path(name)), expected = mg::nn::load_tensors(path(want));
    REQUIRE(got.tensors.count("model.lm_head.weight") == 1);
    require_close(expected.get("model."), got.get("model."));
    require_close(expected.get("optim."), got.get("optim."));
    REQUIRE(got.metadata.at("step") == expected.metadata.at("step"));
  }
};

// A resumed run's evaluations (those its checkpoint carried, and its own from step 4 on)
// are the uninterrupted run's, read from their --metrics files.
void require_same_losses(const Runs& runs, const std::string& resumed, const std::string& whole) {
  const auto got = evaluations(runs.metrics(resumed)), want = evaluations(runs.metrics(whole));
  std::vector<int> want_steps, got_steps;
  for (const auto& row : want) want_steps.push_back(std::get<0>(row));
  for (const auto& row : got) got_steps.push_back(std::get<0>(row));
  REQUIRE(want_steps == std::vector<int>{0, 4, 8});
  REQUIRE(got_steps == std::vector<int>{0, 4, 4, 8});  // step 4 again, on resuming
  for (const auto& [step, train, val] : got) {
    INFO("step " << step);
    const auto& same = want[static_cast<size_t>(step / 4)];
    // Splits sum in another order: float32 rounding, far below the 4 decimals printed.
    REQUIRE(train == Approx(std::get<1>(same)).margin(1e-4));
    REQUIRE(val == Approx(std::get<2>(same)).margin(1e-4));
  }
}

}  // namespace

TEST_CASE("train_gpt --save under --dp 2 --tp 2 --pp 2 writes the single-device checkpoint and sample, "
          "one device resumes it, and --dp 2 --tp 2 --pp 2 resumes a single-device one, to the "
          "uninterrupted run") {
  Runs runs("--n-layer 2 --sample-chars 30");
  const std::string whole = runs.run(0, "", 8, "whole");
  const std::string single_half = runs.run(0, "", 4, "single-half");
  const std::string split_half = runs.run(8, "--dp 2 --tp 2 --pp 2", 4, "split-half");
  REQUIRE_THAT(split_half, MG_CONTAINS("split: dp 2 x tp 2 x pp 2 x cp 1"));
  // The gathered checkpoint is the single-device run's, and so is the sample (rank 0's).
  runs.require_same_checkpoint("split-half", "single-half");
  REQUIRE(!sample_of(single_half).empty());
  REQUIRE(sample_of(split_half) == sample_of(single_half));
  REQUIRE_THAT(split_half, !MG_CONTAINS("[rank 1] ---- a sample"));
  // Saved under the split, resumed on one device; and the other way round.
  runs.run(0, "", 8, "on-one", "split-half");
  require_same_losses(runs, "on-one", "whole");
  runs.require_same_checkpoint("on-one", "whole");
  const std::string on_split = runs.run(8, "--dp 2 --tp 2 --pp 2", 8, "on-split", "single-half");
  require_same_losses(runs, "on-split", "whole");
  runs.require_same_checkpoint("on-split", "whole");
  REQUIRE(sample_of(on_split) == sample_of(whole));
}

TEST_CASE("train_gpt --save under --pp 2 --schedule interleaved --model-chunks 2 (4 blocks) resumes "
          "under --tp 2 --pp 2 --sequence-parallel to the uninterrupted single-device run") {
  Runs runs("--n-layer 4 --sample-chars 0");
  runs.run(0, "", 8, "whole");
  runs.run(0, "", 4, "single-half");
  runs.run(2, "--pp 2 --schedule interleaved --model-chunks 2", 4, "split-half");
  runs.require_same_checkpoint("split-half", "single-half");
  runs.run(4, "--tp 2 --pp 2 --sequence-parallel", 8, "resumed", "split-half");
  require_same_losses(runs, "resumed", "whole");
  runs.require_same_checkpoint("resumed", "whole");
}

TEST_CASE("train_gpt --dp 2 with dropout resumes each dp rank's own dropout stream to the uninterrupted run") {
  // Each dp rank draws its rows' masks from a generator of its own: a resume that handed
  // every rank rank 0's state would give the second rank the first one's masks, and the
  // steps after step 4 (and the checkpoint at 8) would differ from the uninterrupted run's.
  Runs runs("--n-layer 2 --sample-chars 0 --dropout 0.3");
  runs.run(2, "--dp 2", 8, "whole");
  runs.run(2, "--dp 2", 4, "half");
  runs.run(2, "--dp 2", 8, "resumed", "half");
  require_same_losses(runs, "resumed", "whole");
  runs.require_same_checkpoint("resumed", "whole");
  // The file names both ranks' streams.
  const auto saved = mg::nn::load_tensors(runs.path("half"));
  REQUIRE(std::count(saved.metadata.at("dp_generators").begin(), saved.metadata.at("dp_generators").end(), ':') == 2);
}

TEST_CASE("train_gpt --save under --dp 2 --zero 1 writes the single-device checkpoint, --dp 2 --zero 2 "
          "resumes it to the uninterrupted single-device run") {
  // A weight decay that shows (lr x decay = 1): the two ZeRO optimizers' groups must map
  // onto the single-device AdamW's.
  Runs runs("--n-layer 2 --sample-chars 0 --weight-decay 100 --lr 0.01 --min-lr 0.001");
  runs.run(0, "", 8, "whole");
  runs.run(0, "", 4, "single-half");
  runs.run(2, "--dp 2 --zero 1", 4, "split-half");
  runs.require_same_checkpoint("split-half", "single-half");
  runs.run(2, "--dp 2 --zero 2", 8, "resumed", "split-half");
  require_same_losses(runs, "resumed", "whole");
  runs.require_same_checkpoint("resumed", "whole");
}

TEST_CASE("train_gpt --save under --dp 2 --zero 3 (FSDP) writes the single-device checkpoint, one "
          "device resumes it, and --dp 2 --zero 3 resumes a single-device one") {
  Runs runs("--n-layer 2 --sample-chars 0 --weight-decay 0");
  runs.run(0, "", 8, "whole");
  runs.run(0, "", 4, "single-half");
  runs.run(2, "--dp 2 --zero 3", 4, "split-half");
  runs.require_same_checkpoint("split-half", "single-half");
  runs.run(0, "", 8, "on-one", "split-half");
  require_same_losses(runs, "on-one", "whole");
  runs.require_same_checkpoint("on-one", "whole");
  runs.run(2, "--dp 2 --zero 3", 8, "on-split", "single-half");
  require_same_losses(runs, "on-split", "whole");
  runs.require_same_checkpoint("on-split", "whole");
}

TEST_CASE("train_gpt --save under --zero 1 with tp x pp, and --zero 2 with tp, writes the single-device "
          "checkpoint and --zero 3 with cp, and with tp and sequence parallelism, resumes them to the "
          "uninterrupted run") {
  // Every --zero with a split: the state of ZeRO's and FSDP's flat shards, which hold pieces
  // of the plan's tp shards, gathered into the single-device names and cut into another
  // split's. Weight decay 0: --zero 3's AdamW steps flat shards.
  Runs runs("--n-layer 2 --sample-chars 0 --weight-decay 0");
  runs.run(0, "", 8, "whole");
  runs.run(0, "", 4, "single-half");
  runs.run(8, "--dp 2 --tp 2 --pp 2 --zero 1", 4, "zero1-tp-pp");
  runs.require_same_checkpoint("zero1-tp-pp", "single-half");
  runs.run(4, "--dp 2 --cp 2 --zero 3", 8, "zero3-cp", "zero1-tp-pp");
  require_same_losses(runs, "zero3-cp", "whole");
  runs.require_same_checkpoint("zero3-cp", "whole");
  runs.run(4, "--dp 2 --tp 2 --zero 2", 4, "zero2-tp");
  runs.require_same_checkpoint("zero2-tp", "single-half");
  runs.run(4, "--dp 2 --tp 2 --sequence-parallel --zero 3", 8, "zero3-tp-sp", "zero2-tp");
  require_same_losses(runs, "zero3-tp-sp", "whole");
  runs.require_same_checkpoint("zero3-tp-sp", "whole");
}

#endif
