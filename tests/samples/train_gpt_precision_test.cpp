// build/bin/train_gpt --precision (samples/support/precision.h): every precision trains,
// alone and split over ranks, and --resume continues it bit for bit (bf16-true's float32
// masters and 16-mixed's loss scale are in the checkpoint); a bf16-mixed, 16-mixed and
// bf16-true run's losses track the float32 run's within a bound derived from the 16-bit
// dtype's unit roundoff; the refusals, with their messages.
#include "catch_compat.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include <minigrad/core/ops.h>
#include <minigrad/minigrad.h>

#include "samples/run_program.h"
#include "temp_dir.h"
#include "train_gpt_runs.h"

using mg::testing::require_identical;
using mg::testing::run_program;
using mg::testing::TempDir;
using mg::testing::make_fortunes;
using mg::testing::read_text;

namespace {

const std::string kProgram = mg::testing::program_path("train_gpt");
const std::string kRun = mg::testing::program_path("minigrad-run");
// Two blocks, two heads, a batch of 5 (uneven over dp 2), two micro-batches per step.
const std::string kFlags = " --devices cpu --n-layer 2 --n-head 2 --n-embd 16 --grad-accum 2 --eval-iters 2 "
                           "--block-size 16 --batch-size 5 --eval-interval 4 --warmup 2 --decay-iters 8 "
                           "--sample-chars 0";

// {step, train loss, val loss} of each evaluation in a --metrics CSV.
std::vector<std::tuple<int, double, double>> evaluations(const std::string& csv_path) {
  std::vector<std::tuple<int, double, double>> out;
  std::istringstream lines(read_text(csv_path));
  std::string line;
  std::getline(lines, line);
  while (std::getline(lines, line)) {
    int step = 0;
    double train = 0, val = 0;
    if (std::sscanf(line.c_str(), "%d,%lf,%lf", &step, &train, &val) == 3) out.emplace_back(step, train, val);
  }
  return out;
}

struct Runs {
  TempDir dir;
  std::string flags;
  Runs() { flags = kFlags + " --data-dir " + make_fortunes(dir); }
  std::string path(const std::string& name) const { return dir / (name + ".safetensors"); }
  std::string metrics(const std::string& name) const { return dir / (name + ".csv"); }
  // `ranks` processes (0: the program alone), `iters` steps, saved as `save`, resuming `resume`.
  std::string run(int ranks, const std::string& args, int iters, const std::string& save,
                  const std::string& resume = "") {
    const std::string program = ranks > 0 ? kRun + " --nproc-per-node " + std::to_string(ranks) + " " + kProgram : kProgram;
    const auto result = run_program(program + flags + " " + args + " --iters " + std::to_string(iters) + " --save " +
                                    path(save) + " --metrics " + metrics(save) +
                                    (resume.empty() ? "" : " --resume " + path(resume)));
    INFO(result.output);
    REQUIRE(result.exit_code == 0);
    if (!resume.empty()) REQUIRE_THAT(result.output, MG_CONTAINS("resumed at step 4"));
    return result.output;
  }
  // A run saved at step 4 and resumed to 8 ends where the uninterrupted run ends, bit for
  // bit: the evaluations, the model, the optimizer's state (masters included) and the scaler.
  void require_resumes_exactly(int ranks, const std::string& args, const std::string& name) {
    run(ranks, args, 8, name + "-whole");
    run(ranks, args, 4, name + "-half");
    run(ranks, args, 8, name + "-resumed", name + "-half");
    const auto want = evaluations(metrics(name + "-whole")), got = evaluations(metrics(name + "-resumed"));
    REQUIRE(want.size() == 3);
    REQUIRE(got.size() == 4);  // step 4 again, on resuming
    CHECK(got[0] == want[0]);
    CHECK(got[1] == want[1]);
    CHECK(got[2] == want[1]);
    CHECK(got[3] == want[2]);
    const auto a = mg::nn::load_tensors(path(name + "-whole")), b = mg::nn::load_tensors(path(name + "-resumed"));
    REQUIRE(!a.get("model.").empty());
    REQUIRE(!a.get("optim.").empty());
    require_identical(a.get("model."), b.get("model."));
    require_identical(a.get("optim."), b.get("optim."));
    const mg::nn::TensorDict scaler = a.get("scaler.");
    if (!scaler.empty()) require_identical(scaler, b.get("scaler."));
    CHECK(a.metadata.at("precision") == b.metadata.at("precision"));
  }
};

}  // namespace

TEST_CASE("train_gpt --precision: each precision says what it holds and its checkpoint keeps it") {
  Runs runs;
  const std::string mixed = runs.run(0, "--precision bf16-mixed", 4, "bf16-mixed");
  CHECK_THAT(mixed, MG_CONTAINS("precision bf16-mixed: float32 parameters, bfloat16 autocast"));
  const std::string half = runs.run(0, "--precision 16-mixed", 4, "16-mixed");
  CHECK_THAT(half, MG_CONTAINS("precision 16-mixed: float32 parameters, float16 autocast, loss scale 65536"));
  CHECK_THAT(half, MG_CONTAINS("16-mixed: 0 steps skipped for an inf or NaN gradient; loss scale 65536"));
  const std::string bf16 = runs.run(0, "--precision bf16-true", 4, "bf16-true");
  CHECK_THAT(bf16, MG_CONTAINS("precision bf16-true: bfloat16 parameters, float32 master weights and optimizer state"));
  CHECK_THAT(runs.run(0, "", 4, "32-true"), MG_CONTAINS("precision 32-true: float32"));

  // bf16-true: the model in bfloat16 (safetensors BF16), the masters and AdamW's moments in
  // float32 under the optimizer; the mixed precisions keep float32 weights.
  const auto ck = mg::nn::load_tensors(runs.path("bf16-true"));
  CHECK(ck.metadata.at("precision") == "bf16-true");
  CHECK(ck.tensors.at("model.transformer.wte.weight").dtype() == mg::DType::BFloat16);
  CHECK(ck.tensors.at("optim.master.0").dtype() == mg::DType::Float32);
  CHECK(ck.tensors.at("optim.exp_avg.0").dtype() == mg::DType::Float32);
  CHECK(ck.get("scaler.").empty());
  // --sample-only reads the bfloat16 weights as they are.
  const auto sample = run_program(kProgram + runs.flags + " --sample-only --sample-chars 20 --resume " + runs.path("bf16-true"));
  INFO(sample.output);
  CHECK(sample.exit_code == 0);
  CHECK_THAT(sample.output, MG_CONTAINS("---- a sample"));
  const auto mixed_ck = mg::nn::load_tensors(runs.path("bf16-mixed"));
  CHECK(mixed_ck.tensors.at("model.transformer.wte.weight").dtype() == mg::DType::Float32);
  CHECK(mixed_ck.tensors.count("optim.master.0") == 0);
  // 16-mixed: GradScaler's state under torch's keys.
  const auto scaled = mg::nn::load_tensors(runs.path("16-mixed"));
  REQUIRE(scaled.tensors.count("scaler.scale") == 1);
  CHECK(scaled.tensors.at("scaler.scale").item<float>() == 65536.0f);
  CHECK(scaled.tensors.at("scaler._growth_tracker").item<int64_t>() == 4);  // four clean steps
}

TEST_CASE("train_gpt --precision bf16-mixed and 16-mixed and bf16-true resume bit for bit on one device") {
  Runs runs;
  for (const char* precision : {"bf16-mixed", "16-mixed", "bf16-true"}) {
    DYNAMIC_SECTION(precision) { runs.require_resumes_exactly(0, std::string("--precision ") + precision, precision); }
  }
}

TEST_CASE("train_gpt --precision: the 16-bit runs' losses track the float32 run's") {
  // 40 steps on one device, evaluated every 10. The runs start from the same weights and
  // draw the same windows; they differ by rounding alone. Unit roundoff u: 2^-8 (bfloat16),
  // 2^-11 (float16). A forward rounds each GEMM's output and each stored activation once, about
  // k = 12 roundings on a logit's path through 2 blocks; independent and of random sign, they
  // move a loss by about sqrt(k) u relative: 1.4e-2 in bfloat16 and 1.7e-3 in float16. AdamW
  // divides each update by its running RMS, so the gradients' own roundings (of the same
  // size) change each step's direction, not its length, and the runs stay that close rather
  // than drifting apart (tests/models/gpt_precision_test.cpp shows it over 30 steps).
  // bf16-mixed and bf16-true are held to 2e-2 relative (torchtitan's tolerance for bf16
  // against fp32, above sqrt(12) u = 1.4e-2), 16-mixed to 3.5e-3 (2 sqrt(12) u of float16;
  // its loss scale is a power of 2, exact, and changes no rounding).
  Runs runs;
  const std::string schedule = "--eval-interval 10 --decay-iters 40";
  runs.run(0, schedule, 40, "float32");
  const auto reference = evaluations(runs.metrics("float32"));
  REQUIRE(reference.size() == 5);
  REQUIRE(std::get<2>(reference.back()) < std::get<2>(reference.front()) - 0.3);  // it learns
  for (const auto& [precision, bound] : {std::pair<const char*, double>{"bf16-mixed", 2e-2},
                                         {"16-mixed", 3.5e-3},
                                         {"bf16-true", 2e-2}}) {
    runs.run(0, schedule + " --precision " + precision, 40, precision);
    const auto got = evaluations(runs.metrics(precision));
    REQUIRE(got.size() == reference.size());
    for (size_t i = 0; i < got.size(); ++i) {
      const auto& [step, train, val] = got[i];
      INFO(precision << " step " << step << ": train " << train << " against " << std::get<1>(reference[i])
                     << ", val " << val << " against " << std::get<2>(reference[i]));
      CHECK(std::fabs(train - std::get<1>(reference[i])) <= bound * std::get<1>(reference[i]));
      CHECK(std::fabs(val - std::get<2>(reference[i])) <= bound * std::get<2>(reference[i]));
    }
  }
}

#if MINIGRAD_WITH_GLOO

TEST_CASE("train_gpt --precision under splits: each tracks its single-device run and resumes bit for bit") {
  // A split computes the same step in another order: its sums and its 16-bit roundings
  // fall elsewhere (a row-parallel GEMM's partial outputs rounded before they are summed).
  // Each evaluation is held to its single-device run in the same precision by the bound
  // above, 2e-2 relative (bfloat16) and 3.5e-3 (float16): the same roundings, placed
  // differently.
  Runs runs;
  const std::vector<std::tuple<const char*, int, const char*>> cases = {
      {"bf16-mixed", 4, "--dp 2 --tp 2"},  {"16-mixed", 4, "--dp 2 --tp 2 --sequence-parallel"},
      {"bf16-true", 4, "--dp 2 --tp 2"},   {"bf16-mixed", 2, "--pp 2"},
      {"bf16-true", 2, "--pp 2"},          {"16-mixed", 2, "--dp 2 --zero 2"},
      {"bf16-mixed", 2, "--dp 2 --zero 3 --weight-decay 0"}, {"bf16-true", 2, "--cp 2"},
      {"16-mixed", 2, "--dp 2 --zero 1"}, {"bf16-true", 2, "--dp 2 --zero 2"},
      {"bf16-true", 2, "--dp 2 --zero 3 --weight-decay 0"},
      // torchtitan's way: FSDP's MixedPrecisionPolicy in place of autocast (bfloat16 units,
      // float32 reduce-scatter): the same roundings as autocast's GEMMs, and the norms' and
      // GELU's outputs rounded too -- a few more of the k above, within the same bound.
      {"bf16-mixed", 2, "--dp 2 --zero 3 --weight-decay 0 --fsdp-mp-policy"}};
  for (const auto& [precision, ranks, split] : cases) {
    DYNAMIC_SECTION(precision << " " << split) {
      const std::string name = std::string(precision) + "-" + std::to_string(ranks) + "-" + std::to_string(std::string(split).size());
      const std::string extra = std::string(split).find("weight-decay") != std::string::npos ? " --weight-decay 0" : "";
      runs.run(0, std::string("--precision ") + precision + extra, 8, name + "-single");
      const std::string args = std::string("--precision ") + precision + " " + split;
      runs.require_resumes_exactly(ranks, args, name + "-split");
      const double bound = std::string(precision) == "16-mixed" ? 3.5e-3 : 2e-2;
      const auto single = evaluations(runs.metrics(name + "-single")), split_run = evaluations(runs.metrics(name + "-split-whole"));
      REQUIRE(single.size() == split_run.size());
      for (size_t i = 0; i < single.size(); ++i) {
        INFO("step " << std::get<0>(single[i]));
        CHECK(std::fabs(std::get<1>(split_run[i]) - std::get<1>(single[i])) <= bound * std::get<1>(single[i]));
        CHECK(std::fabs(std::get<2>(split_run[i]) - std::get<2>(single[i])) <= bound * std::get<2>(single[i]));
      }
      // The split's checkpoint is in the single-device layout: the same names, shapes and
      // dtypes (bfloat16 weights and float32 masters under bf16-true). Its values are not
      // compared: AdamW divides each update by the gradient's RMS, so where a gradient is
      // near zero (the biases, which start at 0) a rounding flips the update's sign, and
      // such tensors differ by whole updates between any two orders of summation.
      const auto a = mg::nn::load_tensors(runs.path(name + "-split-whole")), b = mg::nn::load_tensors(runs.path(name + "-single"));
      REQUIRE(a.tensors.size() == b.tensors.size());
      for (const auto& [key, t] : b.tensors) {
        INFO(key);
        REQUIRE(a.tensors.count(key) == 1);
        CHECK(a.tensors.at(key).shape() == t.shape());
        CHECK(a.tensors.at(key).dtype() == t.dtype());
      }
    }
  }
}

#endif

TEST_CASE("train_gpt --precision: an unknown name and a resume in another precision are refused") {
  Runs runs;
  const auto unknown = run_program(kProgram + runs.flags + " --precision fp8");
  CHECK(unknown.exit_code == 2);
  CHECK_THAT(unknown.output, MG_CONTAINS("--precision") && MG_CONTAINS("fp8"));
  runs.run(0, "--precision bf16-true", 4, "bf16");
  const auto other = run_program(kProgram + runs.flags + " --iters 8 --precision bf16-mixed --resume " + runs.path("bf16"));
  CHECK(other.exit_code != 0);
  CHECK_THAT(other.output, MG_CONTAINS("written with --precision bf16-true, not bf16-mixed; pass --precision bf16-true"));
  const auto policy = run_program(kProgram + runs.flags + " --precision bf16-mixed --fsdp-mp-policy");
  CHECK(policy.exit_code == 2);
  CHECK_THAT(policy.output, MG_CONTAINS("--fsdp-mp-policy is FSDP's way of a mixed precision: it needs --zero 3 and "
                                        "--precision bf16-mixed or 16-mixed (got --zero 0, --precision bf16-mixed)"));
}

TEST_CASE("train_gpt --scale-log: 16-mixed's loss scale at every step, by GradScaler's rules, and refused in another precision") {
  Runs runs;
  const std::string log = runs.dir / "scale.csv";
  runs.run(0, "--precision 16-mixed --growth-interval 2 --scale-log " + log, 8, "16-mixed");
  std::istringstream lines(read_text(log));
  std::string line;
  std::getline(lines, line);
  CHECK(line == "step,scale,stepped");
  std::vector<std::tuple<int, double, int>> steps;
  while (std::getline(lines, line)) {
    int step = 0, stepped = 0;
    double scale = 0;
    REQUIRE(std::sscanf(line.c_str(), "%d,%lf,%d", &step, &scale, &stepped) == 3);
    steps.emplace_back(step, scale, stepped);
  }
  REQUIRE(steps.size() == 8);
  CHECK(std::get<1>(steps[0]) == 65536.0);  // torch's initial scale
  // Each step's scale from the one before: halved after a skip, doubled after 2 clean
  // steps in a row (--growth-interval 2), else kept.
  int clean = 0, grown = 0;
  for (size_t i = 0; i < steps.size(); ++i) {
    INFO("step " << std::get<0>(steps[i]));
    CHECK(std::get<0>(steps[i]) == static_cast<int>(i) + 1);
    if (i == 0) {
      clean = std::get<2>(steps[0]);
      continue;
    }
    const double before = std::get<1>(steps[i - 1]);
    double want = before;
    if (std::get<2>(steps[i - 1]) == 0) want = before / 2;
    else if (clean == 2) want = before * 2;
    if (want == before * 2) ++grown;
    CHECK(std::get<1>(steps[i]) == want);
    if (want != before) clean = 0;
    clean = std::get<2>(steps[i]) ? clean + 1 : 0;
  }
  CHECK(grown >= 1);  // the run showed growth, not only a constant
  const auto refused = run_program(kProgram + runs.flags + " --iters 2 --precision bf16-mixed --scale-log " + log);
  CHECK(refused.exit_code == 2);
  CHECK_THAT(refused.output, MG_CONTAINS("--scale-log records 16-mixed's loss scale: it needs --precision 16-mixed"));
}
