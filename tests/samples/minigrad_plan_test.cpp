// build/bin/minigrad-plan run as a user runs it: one split's table, a ranking, and the
// errors a mistyped name gets.
#include "catch_compat.h"

#include <string>

#include "samples/run_program.h"

using mg::testing::run_program;

namespace {
const std::string kProgram = mg::testing::program_path("minigrad-plan");
}  // namespace

TEST_CASE("minigrad-plan: prints one split's per-rank table") {
  const auto r = run_program(kProgram + " --model gpt2 --device a100-80gb --dp 2 --precision 32-true");
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  CHECK(r.output.find("gpt2: 124 M parameters") != std::string::npos);
  CHECK(r.output.find("split: dp 2 x tp 1 x pp 1 x cp 1 on 2 x NVIDIA A100 SXM4 80 GB") != std::string::npos);
  // 124475904 x 4 bytes = 0.46 GiB; AdamW twice that and 8 bytes a tensor
  CHECK(r.output.find("| parameters | 0.46 |") != std::string::npos);
  CHECK(r.output.find("| optimizer state | 0.93 |") != std::string::npos);
  CHECK(r.output.find("fits: yes") != std::string::npos);
  CHECK(r.output.find("assumptions:") != std::string::npos);
}

TEST_CASE("minigrad-plan: ranks the splits and says which do not fit") {
  const auto r = run_program(kProgram + " --model gpt2-xl --devices 2 --device l4 --precision 32-true --top 3");
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  CHECK(r.output.find("every split of 2 x l4") != std::string::npos);
  CHECK(r.output.find("| 1 | ") != std::string::npos);
  CHECK(r.output.find("| NO |") != std::string::npos);  // DDP of 1.5 B in float32 on 24 GB
  CHECK(r.output.find("do not") != std::string::npos);
}

TEST_CASE("minigrad-plan: names the known devices for an unknown one") {
  const auto r = run_program(kProgram + " --model gpt2 --devices 2 --device h100");
  CHECK(r.exit_code == 1);
  CHECK(r.output.find("minigrad-plan: error: device: unknown device 'h100' (known: cpu, h100-80gb, h100-pcie, h200, "
                      "a100-40gb, a100-80gb, l4, rtx-4090)") != std::string::npos);
  const auto m = run_program(kProgram + " --model gpt3 --devices 2");
  CHECK(m.exit_code == 1);
  CHECK(m.output.find("--model: unknown model 'gpt3' (gpt2, gpt2-medium, gpt2-large, gpt2-xl, tinyllama-1.1b, "
                      "llama2-7b)") != std::string::npos);
}

TEST_CASE("minigrad-plan: ranks a Llama's splits from its config") {
  const auto r = run_program(kProgram + " --model llama2-7b --devices 8 --device h100-80gb --top 2");
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  // Llama-2-7b's 6,738,415,616 parameters; DDP of it in bf16-mixed (16 bytes an element
  // before activations) does not fit 80 GB.
  CHECK(r.output.find("llama2-7b: 6738 M parameters (layers 32, heads 32, kv heads 32") != std::string::npos);
  CHECK(r.output.find("| NO |") != std::string::npos);
  CHECK(r.output.find("| yes |") != std::string::npos);
}
