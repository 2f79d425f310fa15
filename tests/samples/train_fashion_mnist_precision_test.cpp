// build/bin/train_fashion_mnist --precision (samples/support/precision.h) on a small
// synthetic dataset: every precision trains, alone and under --distributed (DDP, ZeRO),
// and --resume continues it bit for bit (bf16-true's float32 masters and 16-mixed's loss
// scale are in the checkpoint); the 16-bit runs' losses track the float32 run's; the
// refusals.
#include "catch_compat.h"

#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <minigrad/core/ops.h>
#include <minigrad/minigrad.h>

#include "checkpoint_compare.h"
#include "data/synthetic_fashion_mnist.h"
#include "samples/run_program.h"
#include "temp_dir.h"

using mg::testing::require_identical;
using mg::testing::run_program;
using mg::testing::TempDir;

namespace {

const std::string kProgram = mg::testing::program_path("train_fashion_mnist");
const std::string kRun = mg::testing::program_path("minigrad-run");

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// {train_loss, test_loss} of each epoch of a metrics CSV.
std::vector<std::pair<double, double>> losses(const std::string& path) {
  std::vector<std::pair<double, double>> out;
  std::istringstream in(read_text(path));
  std::string line;
  std::getline(in, line);
  while (std::getline(in, line)) {
    double train = 0, test = 0;
    if (std::sscanf(line.c_str(), "%*d,%lf,%lf", &train, &test) == 2) out.emplace_back(train, test);
  }
  return out;
}

struct Runs {
  TempDir dir;
  // 300 training and 100 test images, one hidden layer of 32, a constant learning rate (a
  // cosine spans --epochs, so a 1-epoch run extended to 2 would anneal otherwise).
  Runs() { mg::testing::write_synthetic_fashion_mnist(dir.path(), 300, 100, false); }
  std::string flags() const { return " --data-dir " + dir.path() + " --hidden 32 --batch-size 50 --lr-schedule constant"; }
  std::string path(const std::string& name) const { return dir / (name + ".safetensors"); }
  std::string metrics(const std::string& name) const { return dir / (name + ".csv"); }
  std::string run(int ranks, const std::string& args, int epochs, const std::string& save, const std::string& resume = "") {
    const std::string program = ranks > 0 ? kRun + " --nproc-per-node " + std::to_string(ranks) + " " + kProgram : kProgram;
    const auto result = run_program(program + flags() + " " + args + " --epochs " + std::to_string(epochs) + " --save " +
                                    path(save) + " --metrics " + metrics(save) +
                                    (resume.empty() ? "" : " --resume " + path(resume)));
    INFO(result.output);
    REQUIRE(result.exit_code == 0);
    return result.output;
  }
  // Saved after epoch 1 and resumed for epoch 2, a run ends where the straight 2-epoch run
  // ends: the model, the optimizer's state (masters included) and the scaler, bit for bit.
  void require_resumes_exactly(int ranks, const std::string& args, const std::string& name) {
    run(ranks, args, 2, name + "-straight");
    run(ranks, args, 1, name + "-half");
    const std::string resumed = run(ranks, args, 2, name + "-resumed", name + "-half");
    REQUIRE_THAT(resumed, MG_CONTAINS("after epoch 1"));
    const auto a = mg::nn::load_tensors(path(name + "-straight")), b = mg::nn::load_tensors(path(name + "-resumed"));
    require_identical(a.get("model."), b.get("model."));
    require_identical(a.get("optim."), b.get("optim."));
    require_identical(a.get("scaler."), b.get("scaler."));
    CHECK(losses(metrics(name + "-straight")) == losses(metrics(name + "-resumed")));
  }
};

}  // namespace

TEST_CASE("train_fashion_mnist --precision: each precision trains and resumes bit for bit on one device") {
  Runs runs;
  for (const char* precision : {"bf16-mixed", "16-mixed", "bf16-true"}) {
    DYNAMIC_SECTION(precision) {
      runs.require_resumes_exactly(0, std::string("--precision ") + precision + " --optimizer adamw", precision);
    }
  }
  // A pipeline of two stages in one process (autocast over its micro-batches, the scale in
  // its loss), and tensor parallelism in one process (no checkpoints: a run alone).
  for (const char* precision : {"16-mixed", "bf16-true"}) {
    DYNAMIC_SECTION("pipeline " << precision) {
      runs.require_resumes_exactly(0, std::string("--precision ") + precision + " --pipeline 2 --devices cpu,cpu --chunks 2",
                                   std::string("pipe-") + precision);
    }
    DYNAMIC_SECTION("tensor parallel " << precision) {
      const auto tp = run_program(kProgram + runs.flags() + " --epochs 1 --tensor-parallel 2 --devices cpu,cpu --precision " +
                                  precision);
      INFO(tp.output);
      CHECK(tp.exit_code == 0);
    }
  }
  const std::string out = runs.run(0, "--precision bf16-true", 1, "sgd-bf16");
  CHECK_THAT(out, MG_CONTAINS("precision bf16-true: bfloat16 parameters, float32 master weights"));
  const auto ck = mg::nn::load_tensors(runs.path("sgd-bf16"));
  CHECK(ck.metadata.at("precision") == "bf16-true");
  CHECK(ck.tensors.at("model.0.weight").dtype() == mg::DType::BFloat16);
  CHECK(ck.tensors.at("optim.master.0").dtype() == mg::DType::Float32);
  CHECK(ck.tensors.at("optim.momentum_buffer.0").dtype() == mg::DType::Float32);
}

TEST_CASE("train_fashion_mnist --precision: the 16-bit runs' losses track the float32 run's") {
  // Two epochs of SGD (12 steps) from the same weights on the same batches. A forward of
  // this MLP rounds three times on a logit's path (two GEMMs' outputs and the ReLU's
  // stored input) and backward as often: a loss moves by about sqrt(6) u relative, 1e-2
  // in bfloat16 (u = 2^-8) and 1.2e-3 in float16 (u = 2^-11); SGD's steps carry the
  // gradients' relative error into the weights, u-sized per step against the step itself.
  // Held to 2e-2 (bfloat16) and 3.5e-3 (float16) relative, as train_gpt's.
  Runs runs;
  runs.run(0, "", 2, "float32");
  const auto reference = losses(runs.metrics("float32"));
  REQUIRE(reference.size() == 2);
  for (const auto& [precision, bound] :
       {std::pair<const char*, double>{"bf16-mixed", 2e-2}, {"16-mixed", 3.5e-3}, {"bf16-true", 2e-2}}) {
    runs.run(0, std::string("--precision ") + precision, 2, precision);
    const auto got = losses(runs.metrics(precision));
    REQUIRE(got.size() == reference.size());
    for (size_t i = 0; i < got.size(); ++i) {
      INFO(precision << " epoch " << i + 1 << ": train " << got[i].first << " against " << reference[i].first
                     << ", test " << got[i].second << " against " << reference[i].second);
      CHECK(std::fabs(got[i].first - reference[i].first) <= bound * reference[i].first);
      CHECK(std::fabs(got[i].second - reference[i].second) <= bound * reference[i].second);
    }
  }
}

#if MINIGRAD_WITH_GLOO

TEST_CASE("train_fashion_mnist --precision under --distributed: DDP and ZeRO train and resume bit for bit") {
  // DDP all-reduces bfloat16 gradients under bf16-true (Gloo carries them as float32);
  // 16-mixed's scaler agrees over the ranks; ZeRO-2 shards float32 parameters under bf16-mixed.
  Runs runs;
  runs.require_resumes_exactly(2, "--distributed --precision bf16-true", "ddp-bf16-true");
  runs.require_resumes_exactly(2, "--distributed --precision 16-mixed --optimizer adamw", "ddp-16-mixed");
  runs.require_resumes_exactly(2, "--distributed --zero 2 --precision bf16-mixed", "zero2-bf16-mixed");
  // bfloat16 parameters sharded with float32 master shards (ZeRO-2), and FSDP over them.
  runs.require_resumes_exactly(2, "--distributed --zero 2 --precision bf16-true", "zero2-bf16-true");
  runs.require_resumes_exactly(2, "--distributed --zero 3 --precision bf16-true --optimizer adamw", "zero3-bf16-true");
}

#endif

TEST_CASE("train_fashion_mnist --precision: an unknown name and another precision's checkpoint are refused") {
  Runs runs;
  const auto unknown = run_program(kProgram + runs.flags() + " --precision fp8");
  CHECK(unknown.exit_code != 0);
  CHECK_THAT(unknown.output, MG_CONTAINS("--precision") && MG_CONTAINS("fp8"));
  runs.run(0, "--precision 16-mixed", 1, "half");
  const auto other = run_program(kProgram + runs.flags() + " --epochs 2 --resume " + runs.path("half"));
  CHECK(other.exit_code != 0);
  CHECK_THAT(other.output, MG_CONTAINS("written with --precision 16-mixed, but --precision is 32-true; pass --precision 16-mixed"));
}
