// build/bin/train_gpt --model llama (samples/support/language_model.h): the Llama trained by the
// same trainer and split by the same code as the GPT (samples/support/split_model.h), its spec
// alone naming its modules. Tiny runs whose printed losses and sample equal the single-device
// Llama's under dp x tp x pp, tp + SP x cp, ZeRO-3 and the interleaved pipeline; its checkpoint in
// HF's LlamaForCausalLM names, the same under a split, resumed under another split to the
// uninterrupted run's weights, sampled alone; and the flags it refuses, with their messages.
#include "catch_compat.h"

#include <string>
#include <vector>

#include <minigrad/minigrad.h>

#include "samples/run_program.h"
#include "temp_dir.h"
#include "train_gpt_runs.h"

#if MINIGRAD_WITH_GLOO

using mg::testing::make_fortunes;
using mg::testing::metrics_losses;
using mg::testing::require_close;
using mg::testing::run_program;
using mg::testing::sample_of;
using mg::testing::TempDir;

namespace {

const std::string kProgram = mg::testing::program_path("train_gpt");
const std::string kRun = mg::testing::program_path("minigrad-run");
// Four layers (two per stage, one per interleaved chunk), 4 query heads over 2 kv heads (a group
// of 2: tp 2 gives each rank one kv head and its two query heads), a batch of 5 (uneven over dp 2).
const std::string kLlama = " --model llama --devices cpu --n-layer 4 --n-head 4 --n-kv-head 2 --n-embd 16 "
                           "--block-size 16 --batch-size 5 --grad-accum 2 --eval-iters 2 --warmup 2";
const std::string kRunFlags = kLlama + " --iters 6 --eval-interval 3 --sample-chars 30";

std::string launch(int ranks) { return kRun + " --nproc-per-node " + std::to_string(ranks) + " " + kProgram; }

}  // namespace

TEST_CASE("train_gpt --model llama: every split prints the single-device Llama's losses and sample") {
  TempDir dir;
  const std::string flags = kRunFlags + " --data-dir " + make_fortunes(dir);
  const auto single = run_program(kProgram + flags + " --metrics " + (dir / "single.csv"));
  INFO(single.output);
  REQUIRE(single.exit_code == 0);
  REQUIRE_THAT(single.output, MG_CONTAINS("Llama: num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, "
                                          "hidden_size=16, intermediate_size=64, vocab_size=34"));
  const std::vector<double> want = metrics_losses(dir / "single.csv");
  REQUIRE(want.size() == 6);
  REQUIRE(!sample_of(single.output).empty());
  struct Split {
    int ranks;
    std::string flags;
  };
  for (const Split& s : {Split{8, "--dp 2 --tp 2 --pp 2"}, Split{4, "--tp 2 --cp 2 --sequence-parallel"},
                         Split{2, "--dp 2 --zero 3 --weight-decay 0"},
                         Split{2, "--pp 2 --schedule interleaved --model-chunks 2"}}) {
    DYNAMIC_SECTION(s.flags) {
      const std::string csv = dir / "split.csv";
      // ZeRO-3 steps without weight decay: its single-device run is one without it too.
      const bool no_decay = s.flags.find("--weight-decay 0") != std::string::npos;
      std::vector<double> reference = want;
      std::string reference_sample = sample_of(single.output);
      if (no_decay) {
        const auto plain = run_program(kProgram + flags + " --weight-decay 0 --metrics " + (dir / "plain.csv"));
        REQUIRE(plain.exit_code == 0);
        reference = metrics_losses(dir / "plain.csv");
        reference_sample = sample_of(plain.output);
      }
      const auto split = run_program(launch(s.ranks) + flags + " " + s.flags + " --metrics " + csv);
      INFO(split.output);
      REQUIRE(split.exit_code == 0);
      const std::vector<double> got = metrics_losses(csv);
      REQUIRE(got.size() == reference.size());
      for (size_t i = 0; i < got.size(); ++i) REQUIRE(got[i] == Approx(reference[i]).margin(2e-5));
      REQUIRE(sample_of(split.output) == reference_sample);
    }
  }
}

TEST_CASE("train_gpt --model llama --save: HF's names, the same under dp x tp, resumed under pp 2 to the "
          "uninterrupted run, sampled without the data") {
  TempDir dir;
  const std::string flags = kLlama + " --sample-chars 0 --eval-interval 4 --decay-iters 8 --data-dir " + make_fortunes(dir);
  const auto whole = run_program(kProgram + flags + " --iters 8 --save " + (dir / "whole.safetensors"));
  INFO(whole.output);
  REQUIRE(whole.exit_code == 0);
  const auto single_half = run_program(kProgram + flags + " --iters 4 --save " + (dir / "single-half.safetensors"));
  REQUIRE(single_half.exit_code == 0);
  const auto half = run_program(launch(4) + flags + " --dp 2 --tp 2 --iters 4 --save " + (dir / "half.safetensors"));
  INFO(half.output);
  REQUIRE(half.exit_code == 0);
  const auto ck = mg::nn::load_tensors(dir / "half.safetensors");
  // LlamaForCausalLM's keys (under the trainer's "model." prefix), the head untied.
  for (const char* key : {"model.model.embed_tokens.weight", "model.model.layers.3.self_attn.k_proj.weight",
                          "model.model.layers.0.mlp.gate_proj.weight", "model.model.norm.weight", "model.lm_head.weight"})
    REQUIRE(ck.tensors.count(key) == 1);
  REQUIRE(ck.tensors.at("model.model.layers.3.self_attn.k_proj.weight").shape() == mg::Shape{8, 16});  // 2 kv heads of 4
  REQUIRE(ck.metadata.at("model") == "llama");
  REQUIRE_THAT(ck.metadata.at("llama_config"), MG_CONTAINS("\"num_key_value_heads\": 2"));
  const auto single_ck = mg::nn::load_tensors(dir / "single-half.safetensors");
  require_close(single_ck.get("model."), ck.get("model."));
  require_close(single_ck.get("optim."), ck.get("optim."));
  const auto resumed = run_program(launch(2) + flags + " --pp 2 --iters 8 --resume " + (dir / "half.safetensors") +
                                   " --save " + (dir / "resumed.safetensors"));
  INFO(resumed.output);
  REQUIRE(resumed.exit_code == 0);
  REQUIRE_THAT(resumed.output, MG_CONTAINS("resumed at step 4"));
  require_close(mg::nn::load_tensors(dir / "whole.safetensors").get("model."),
                mg::nn::load_tensors(dir / "resumed.safetensors").get("model."));
  // The checkpoint alone makes a sample: the same as a resumed run's at its end.
  const auto sample = run_program(kProgram + kLlama + " --resume " + (dir / "whole.safetensors") +
                                  " --sample-only --sample-chars 20");
  INFO(sample.output);
  REQUIRE(sample.exit_code == 0);
  REQUIRE_THAT(sample.output, MG_CONTAINS("Llama: num_hidden_layers=4"));
  REQUIRE(sample_of(sample.output).size() > 20);
  // A GPT's flags on a Llama's checkpoint are refused, naming the model to pass.
  const auto gpt = run_program(kProgram + " --devices cpu --n-layer 4 --n-head 4 --n-embd 16 --block-size 16 --resume " +
                               (dir / "whole.safetensors") + " --sample-only");
  CHECK(gpt.exit_code != 0);
  CHECK_THAT(gpt.output, MG_CONTAINS("written by --model llama, not gpt; pass --model llama"));
}

TEST_CASE("train_gpt --model llama: flags the Llama cannot take are refused, naming them") {
  TempDir dir;
  const std::string flags = kRunFlags + " --data-dir " + make_fortunes(dir);
  const auto dropout = run_program(kProgram + flags + " --dropout 0.1");
  CHECK(dropout.exit_code == 2);
  CHECK_THAT(dropout.output, MG_CONTAINS("--model llama has no dropout (Llama's blocks have none); got --dropout 0.1"));
  const auto groups = run_program(kProgram + flags + " --n-kv-head 3");
  CHECK(groups.exit_code == 2);
  CHECK_THAT(groups.output, MG_CONTAINS("--n-kv-head 3 does not divide --n-head 4"));
  const auto gpt_only = run_program(kProgram + " --devices cpu --n-kv-head 2 --data-dir " + make_fortunes(dir));
  CHECK(gpt_only.exit_code == 2);
  CHECK_THAT(gpt_only.output, MG_CONTAINS("--n-kv-head and --intermediate-size size the Llama: they need --model llama"));
  const auto unknown = run_program(kProgram + " --model mamba");
  CHECK(unknown.exit_code == 2);
  CHECK_THAT(unknown.output, MG_CONTAINS("--model"));
  // tp must divide the kv heads too: 4 query heads over 2 kv heads cannot take tp 4.
  const auto kv = run_program(launch(4) + flags + " --tp 4");
  CHECK(kv.exit_code != 0);
  CHECK_THAT(kv.output, MG_CONTAINS("parallelize_llama: num_key_value_heads = 2 is not divisible by the "
                                    "tensor-parallel size 4"));
}

#endif
