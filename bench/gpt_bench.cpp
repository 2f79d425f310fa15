// gpt-bench: one training step of a GPT (models::GPT) on the CPU, timed as
// bench/torch_gpt.py times PyTorch's eager step on the same model; bench/gpt_compare.sh
// runs both at 1 and 2 threads. One step: zero_grad, forward, cross-entropy, backward,
// AdamW (nanoGPT's groups). Prints one JSON line.
//
//   build/bin/gpt-bench                    # nanoGPT's small CPU config: 4 x 4 x 128, block 64, batch 12
//   OPENBLAS_NUM_THREADS=2 build/bin/gpt-bench --steps 50
//   build/bin/gpt-bench --precision bf16-mixed   # float32 parameters, autocast to bfloat16
//   build/bin/gpt-bench --precision bf16-true    # bfloat16 parameters, float32 masters
//
// --precision takes Lightning's names: 32-true (the default), bf16-mixed (nanoGPT's way:
// float32 parameters and AdamW, the GEMMs in bfloat16 under autocast), bf16-true (llm.c's
// way: bfloat16 parameters, gradients and activations, float32 master weights and AdamW
// state through optim::MasterWeights).
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <minigrad/autograd/autocast.h>
#include <minigrad/autograd/functions.h>
#include <minigrad/core/ops.h>
#include <minigrad/core/tensor.h>
#include <minigrad/models/gpt.h>
#include <minigrad/nn/optim/adam.h>
#include <minigrad/nn/optim/master_weights.h>

#include "bench_common.h"

int main(int argc, char** argv) {
  mg::models::GPTConfig c;
  c.n_layer = 4;
  c.n_head = 4;
  c.n_embd = 128;
  c.block_size = 64;
  c.vocab_size = 65;
  int64_t batch = 12;
  int steps = 30, warmup = 5;
  bool composed = false;
  std::string precision = "32-true";
  CLI::App app{"Times a GPT training step (forward, loss, backward, AdamW) on the CPU."};
  // A flag given twice takes its last value (samples/support/command_line.h).
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  app.add_option("--n-layer", c.n_layer)->capture_default_str();
  app.add_option("--n-head", c.n_head)->capture_default_str();
  app.add_option("--n-embd", c.n_embd)->capture_default_str();
  app.add_option("--block-size", c.block_size)->capture_default_str();
  app.add_option("--vocab-size", c.vocab_size)->capture_default_str();
  app.add_option("--batch", batch)->capture_default_str();
  app.add_option("--steps", steps)->capture_default_str();
  app.add_option("--warmup", warmup)->capture_default_str();
  app.add_flag("--composed", composed, "Attention as its composition, not the fused kernel");
  app.add_option("--precision", precision, "32-true | bf16-mixed | bf16-true")
      ->check(CLI::IsMember({"32-true", "bf16-mixed", "bf16-true"}))
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);

  mg::set_fused_attention_enabled(!composed);
  mg::manual_seed(0);
  mg::models::GPT model(c);
  const auto options = mg::optim::AdamWOptions(1e-3).betas({0.9, 0.99}).weight_decay(0.1);
  std::unique_ptr<mg::optim::Optimizer> optimizer;
  if (precision == "bf16-true") {
    model.to(mg::DType::BFloat16);
    optimizer = std::make_unique<mg::optim::MasterWeights>(
        model.parameters(), [&](std::vector<mg::Tensor> masters) {
          return std::make_unique<mg::optim::AdamW>(mg::optim::weight_decay_groups(masters, options));
        });
  } else {
    optimizer = std::make_unique<mg::optim::AdamW>(mg::optim::weight_decay_groups(model.parameters(), options));
  }
  mg::optim::Optimizer& opt = *optimizer;
  const bool autocast = precision == "bf16-mixed";
  const mg::Tensor x = mg::randint(0, c.vocab_size, mg::Shape{batch, c.block_size});
  const mg::Tensor y = mg::randint(0, c.vocab_size, mg::Shape{batch, c.block_size});
  std::vector<double> ms, cpu_ms;
  float loss_value = 0;
  for (int s = 0; s < warmup + steps; ++s) {
    const auto start = std::chrono::steady_clock::now();
    const double cpu_start = minigrad_bench::process_cpu_ms();
    opt.zero_grad();
    mg::Tensor loss;
    {
      mg::AutocastGuard region(mg::DeviceType::CPU, mg::DType::BFloat16, autocast);
      loss = mg::models::GPT::loss(model(x), y);
    }
    loss.backward();
    opt.step();
    loss_value = mg::ops::to_dtype(loss, mg::DType::Float32).item<float>();
    if (s >= warmup) {
      ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
      cpu_ms.push_back(minigrad_bench::process_cpu_ms() - cpu_start);
    }
  }
  const double median = minigrad_bench::median(ms);
  fmt::print("{{\"framework\":\"minigrad\",\"work\":\"gpt\",\"precision\":\"{}\",\"attention\":\"{}\",\"n_layer\":{},"
             "\"n_head\":{},\"n_embd\":{},\"block_size\":{},\"batch\":{},\"steps\":{},"
             "\"median_ms\":{:.3f},\"p10_ms\":{:.3f},\"p90_ms\":{:.3f},\"median_cpu_ms\":{:.3f},"
             "\"tokens_per_s\":{:.0f},\"loss\":{:.4f}}}\n",
             precision, composed ? "composed" : "fused", c.n_layer, c.n_head, c.n_embd, c.block_size, batch,
             steps, median, minigrad_bench::percentile(ms, 0.1), minigrad_bench::percentile(ms, 0.9),
             minigrad_bench::median(cpu_ms), static_cast<double>(batch * c.block_size) / median * 1e3,
             loss_value);
  return 0;
}
