// build/bin/train_gpt split over ranks under build/bin/minigrad-run (--dp, --tp, --cp,
// --sequence-parallel; samples/support/split_model.h): tiny runs (dp, tp, tp + SP, cp and
// their compositions up to dp2 x tp2 x cp2) whose printed losses, metrics and sample equal
// the single-device run's on the same windows (float32 rounding apart), checkpoints written
// under cp and tp that equal the single-device ones (and resume under another split), a
// merged trace, and the splits that are refused, with their messages.
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

using mg::testing::require_close;
using mg::testing::run_program;
using mg::testing::TempDir;
using mg::testing::make_fortunes;
using mg::testing::metrics_losses;
using mg::testing::read_text;
using mg::testing::sample_of;

namespace {

const std::string kProgram = mg::testing::program_path("train_gpt");
const std::string kRun = mg::testing::program_path("minigrad-run");
// Two blocks, two heads, a batch of 5 (uneven over dp 2), two micro-batches per step.
const std::string kModel = " --devices cpu --n-layer 2 --n-head 2 --n-embd 16 --grad-accum 2 --eval-iters 2";
const std::string kRunFlags = kModel + " --iters 6 --eval-interval 3 --warmup 2 --sample-chars 30";
const std::string kTiny = kRunFlags + " --block-size 16 --batch-size 5";

struct Runs {
  TempDir dir;
  std::string flags;
  mg::testing::ProgramResult single;
  Runs() {
    flags = kTiny + " --data-dir " + make_fortunes(dir);
    single = run_program(kProgram + flags + " --metrics " + (dir / "single.csv"));
  }
  // The split run on `ranks` processes; its metrics next to the single-device ones.
  mg::testing::ProgramResult split(int ranks, const std::string& split_flags, const std::string& csv) {
    return run_program(kRun + " --nproc-per-node " + std::to_string(ranks) + " " + kProgram + flags +
                       " " + split_flags + " --metrics " + (dir / csv));
  }
};

void require_same_run(Runs& runs, const mg::testing::ProgramResult& split, const std::string& csv) {
  INFO(runs.single.output);
  REQUIRE(runs.single.exit_code == 0);
  INFO(split.output);
  REQUIRE(split.exit_code == 0);
  const std::vector<double> got = metrics_losses(runs.dir / csv), want = metrics_losses(runs.dir / "single.csv");
  REQUIRE(want.size() == 6);
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < got.size(); ++i) REQUIRE(got[i] == Approx(want[i]).margin(2e-5));  // seen: 1e-6
  // Rank 0 alone prints the evaluations; the sample is the single-device model's.
  REQUIRE_THAT(split.output, MG_CONTAINS("[rank 0] step 6: train loss "));
  REQUIRE_THAT(split.output, !MG_CONTAINS("[rank 1] step "));
  REQUIRE(!sample_of(runs.single.output).empty());
  REQUIRE(sample_of(split.output) == sample_of(runs.single.output));
}

}  // namespace

TEST_CASE("train_gpt --dp 2 --tp 2 on 4 ranks prints the single-device run's losses and sample") {
  Runs runs;
  const auto split = runs.split(4, "--dp 2 --tp 2 --trace " + (runs.dir / "t.json") +
                                       " --trace-warmup 1 --trace-steps 2", "split.csv");
  REQUIRE_THAT(split.output, MG_CONTAINS("[rank 0] split: dp 2 x tp 2 x cp 1 over 4 ranks (gloo); "
                                         "3936 parameters on each rank (of 7392)"));
  require_same_run(runs, split, "split.csv");
  // Each rank's trace, and rank 0's merge of them.
  for (int r = 0; r < 4; ++r) REQUIRE(std::filesystem::exists(runs.dir / ("t.rank" + std::to_string(r) + ".json")));
  REQUIRE_THAT(read_text(runs.dir / "t.json"), MG_CONTAINS("step 2"));
}

TEST_CASE("train_gpt --tp 2 --sequence-parallel on 2 ranks prints the single-device run's losses") {
  Runs runs;
  require_same_run(runs, runs.split(2, "--tp 2 --sequence-parallel", "sp.csv"), "sp.csv");
}

TEST_CASE("train_gpt --cp 2 on 2 ranks prints the single-device run's losses, its checkpoint is the "
          "single-device one") {
  Runs runs;
  const auto single = run_program(kProgram + runs.flags + " --save " + (runs.dir / "single.safetensors"));
  REQUIRE(single.exit_code == 0);
  const auto split = runs.split(2, "--cp 2 --save " + (runs.dir / "cp.safetensors"), "cp.csv");
  require_same_run(runs, split, "cp.csv");
  const auto a = mg::nn::load_tensors(runs.dir / "single.safetensors").get("model.");
  const auto b = mg::nn::load_tensors(runs.dir / "cp.safetensors").get("model.");
  REQUIRE(a.size() == b.size());
  for (const auto& [name, t] : a) {
    INFO(name);
    const std::vector<float> x = t.to_vector<float>(), y = b.at(name).to_vector<float>();
    REQUIRE(x.size() == y.size());
    for (size_t i = 0; i < x.size(); ++i) REQUIRE(y[i] == Approx(x[i]).margin(1e-5));
  }
}

TEST_CASE("train_gpt --tp 2 --cp 2 --sequence-parallel on 4 ranks and --dp 2 --tp 2 --cp 2 on 8 print "
          "the single-device run's losses and sample") {
  Runs runs;
  require_same_run(runs, runs.split(4, "--tp 2 --cp 2 --sequence-parallel", "tpcp.csv"), "tpcp.csv");
  require_same_run(runs, runs.split(8, "--dp 2 --tp 2 --cp 2", "3d.csv"), "3d.csv");
}

TEST_CASE("train_gpt --dp 4 (5 windows: rows 2, 1, 1, 1) and --dp 2 --cp 2 on 4 ranks print the "
          "single-device run's losses") {
  Runs runs;
  require_same_run(runs, runs.split(4, "--dp 4", "dp4.csv"), "dp4.csv");
  require_same_run(runs, runs.split(4, "--dp 2 --cp 2", "dpcp.csv"), "dpcp.csv");
}

TEST_CASE("train_gpt --save under --dp 2 --tp 2 writes the whole model in nanoGPT's names, --tp 2 "
          "--cp 2 --sequence-parallel resumes it to the uninterrupted single-device run's weights") {
  TempDir dir;
  // One schedule for every run (warmup and decay would otherwise follow --iters).
  const std::string flags = kModel + " --block-size 16 --batch-size 5 --sample-chars 0 --eval-interval 4 --warmup 2 --decay-iters 8 --data-dir " +
                            make_fortunes(dir);
  const auto whole = run_program(kProgram + flags + " --iters 8 --save " + (dir / "whole.safetensors"));
  INFO(whole.output);
  REQUIRE(whole.exit_code == 0);
  const auto first = run_program(kRun + " --nproc-per-node 4 " + kProgram + flags + " --dp 2 --tp 2 --iters 4 --save " +
                                 (dir / "half.safetensors"));
  INFO(first.output);
  REQUIRE(first.exit_code == 0);
  const auto single_half = run_program(kProgram + flags + " --iters 4 --save " + (dir / "single-half.safetensors"));
  REQUIRE(single_half.exit_code == 0);
  // The gathered checkpoint is the single-device run's: the model and AdamW's state.
  const auto half = mg::nn::load_tensors(dir / "half.safetensors");
  REQUIRE(half.tensors.count("model.lm_head.weight") == 1);
  require_close(mg::nn::load_tensors(dir / "single-half.safetensors").get("model."), half.get("model."));
  require_close(mg::nn::load_tensors(dir / "single-half.safetensors").get("optim."), half.get("optim."));
  const auto second = run_program(kRun + " --nproc-per-node 4 " + kProgram + flags + " --tp 2 --cp 2 --sequence-parallel "
                                  "--iters 8 --resume " + (dir / "half.safetensors") + " --save " +
                                  (dir / "resumed.safetensors"));
  INFO(second.output);
  REQUIRE(second.exit_code == 0);
  REQUIRE_THAT(second.output, MG_CONTAINS("resumed at step 4"));
  require_close(mg::nn::load_tensors(dir / "whole.safetensors").get("model."),
                mg::nn::load_tensors(dir / "resumed.safetensors").get("model."));
}

TEST_CASE("train_gpt --dp/--tp/--cp: impossible splits are refused, naming the numbers") {
  TempDir dir;
  // The block and the batch are left to each case.
  const std::string flags = kRunFlags + " --data-dir " + make_fortunes(dir);
  const auto two = [&](const std::string& more) {
    return run_program(kRun + " --nproc-per-node 2 " + kProgram + flags + " " + more);
  };
  const auto alone = run_program(kProgram + flags + " --dp 2");  // no launcher
  CHECK(alone.exit_code == 2);
  CHECK_THAT(alone.output, MG_CONTAINS("train_gpt: error: --dp 2 x --tp 1 x --cp 1 = 2 ranks, but "
                                       "the job has 1 (not started by a launcher)"));
  const auto count = two("--dp 2 --tp 2 --block-size 16");
  CHECK(count.exit_code != 0);
  CHECK_THAT(count.output, MG_CONTAINS("--dp 2 x --tp 2 x --cp 1 = 4 ranks, but the job has 2 (minigrad-run)"));
  const auto sp = two("--dp 2 --sequence-parallel --block-size 16");
  CHECK(sp.exit_code != 0);
  CHECK_THAT(sp.output, MG_CONTAINS("--sequence-parallel splits the tensor-parallel layers' "
                                    "activations: it needs --tp 2 or more"));
  const auto rows = two("--dp 2 --batch-size 1");
  CHECK(rows.exit_code != 0);
  CHECK_THAT(rows.output, MG_CONTAINS("--batch-size 1 cannot be cut over --dp 2"));
  const auto chunks = two("--cp 2 --block-size 18");
  CHECK(chunks.exit_code != 0);
  CHECK_THAT(chunks.output, MG_CONTAINS("--cp 2: --block-size 18 must divide into 2 x cp = 4 chunks"));
  const auto sp_block = two("--tp 2 --sequence-parallel --block-size 15");
  CHECK(sp_block.exit_code != 0);
  CHECK_THAT(sp_block.output, MG_CONTAINS("--sequence-parallel: --block-size 15 must divide by --tp 2"));
  const auto dropout = two("--cp 2 --dropout 0.1 --block-size 16");
  CHECK(dropout.exit_code != 0);
  CHECK_THAT(dropout.output, MG_CONTAINS("--cp 2: ring attention has no dropout; train with --dropout 0"));
  const auto heads = run_program(kRun + " --nproc-per-node 4 " + kProgram + flags + " --tp 4 --block-size 16");
  CHECK(heads.exit_code != 0);
  CHECK_THAT(heads.output, MG_CONTAINS("parallelize_gpt: n_head (attention is split by heads) = 2 is "
                                       "not divisible by the tensor-parallel size 4"));
}

#endif
