// gpt-precision-memory-bench: the bytes each rank holds for the GPT's training state in
// each precision -- 32-true, bf16-mixed (nanoGPT's), bf16-true (llm.c's: bfloat16
// parameters, float32 masters) -- under DDP (ZeRO-0), ZeRO-1, ZeRO-2 and FSDP by block,
// measured with the CPU allocator's counters (bytes asked for: deterministic) and held
// against the ZeRO paper's formulas (docs/mixed-precision.md). Under minigrad-run:
//
//   build/bin/minigrad-run --nproc-per-node 4 build/bin/gpt-precision-memory-bench
//
// Ψ = the parameters' elements, N = ranks, a flat group g (ZeRO bucket, FSDP unit) gives
// every rank s_g = ceil(Ψ_g / N) elements; e = 2 bytes per parameter for bf16-true, 4
// otherwise; T the tensors AdamW steps (one int64 step count each). Per rank:
//
//   params    held at rest: DDP eΨ; ZeRO-1/2 e Σ N s_g (each rank keeps every padded
//             flat buffer); FSDP e Σ s_g                                         exact
//   masters   bf16-true's float32 copies (MasterWeights): DDP 4Ψ; ZeRO, FSDP 4 Σ s_g  exact
//   grads     after backward: DDP, ZeRO-1 eΨ (the whole averaged gradient); ZeRO-2,
//             FSDP e Σ s_g (this rank's shards)                                  exact
//   AdamW     exp_avg + exp_avg_sq + step: DDP 8Ψ + 8T; ZeRO, FSDP 8 Σ s_g + 8T   exact
//   buckets   DDP's (DDP, ZeRO-1): eΨ, not in the paper's 16 bytes               exact
//
// So params + masters + grads + AdamW per parameter: 16 in every precision under DDP (the
// ZeRO paper's 2 + 2 + 12 for bf16-true, 4 + 4 + 8 for float32), and under ZeRO-2 with
// bf16-true 2 + 14/N against float32's 4 + 12/N. bf16-mixed holds float32's state; what it
// saves is activations (printed, "kept": the bytes forward leaves for backward, measured
// only, no formula: autocast keeps some float32 and caches a bfloat16 copy of each weight).
// --check exits 1 unless every formula column is exact. Times are not measured.
#include <cmath>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <minigrad/autograd/autocast.h>
#include <minigrad/core/allocator.h>
#include <minigrad/minigrad.h>
#include <minigrad/models/gpt_plan.h>
#include <minigrad/nn/optim/adam.h>
#include <minigrad/nn/optim/master_weights.h>
#include <minigrad/parallel/c10d/rendezvous.h>
#include <minigrad/parallel/ddp/distributed_data_parallel.h>
#include <minigrad/parallel/sharded/zero_redundancy_optimizer.h>

#include "samples/support/command_line.h"

namespace {

using namespace mg;

struct Figures {
  double params = 0, masters = 0, grads = 0, adamw = 0, buckets = 0;
  double total() const { return params + masters + grads + adamw; }
};

std::shared_ptr<parallel::ProcessGroup> process_group() {
  if (parallel::in_launched_job()) return parallel::init_process_group("gloo");
  parallel::TCPStoreOptions store_options;
  store_options.is_server = true;
  store_options.rank = 0;
  auto store = std::make_shared<parallel::TCPStore>("127.0.0.1", 0, store_options);
  return parallel::new_process_group("gloo", store, 0, 1, {});
}

double now() { return static_cast<double>(cpu_memory_allocated()); }

struct Variant {
  int stage;              // 0 DDP, 1 ZeRO-1 (with DDP), 2 ZeRO-2, 3 FSDP by block
  std::string precision;  // 32-true, bf16-mixed, bf16-true
  Figures measured, formula;
  double kept = 0;  // activations forward leaves for backward
  int64_t psi = 0;
};

void measure(Variant& v, const models::GPTConfig& config, int64_t batch,
             const std::shared_ptr<parallel::ProcessGroup>& pg) {
  const bool half = v.precision == "bf16-true", autocast = v.precision == "bf16-mixed";
  const double e = half ? 2 : 4;
  const int n = pg->size();
  manual_seed(100 + static_cast<uint64_t>(pg->rank()));
  const Tensor idx = randint(0, config.vocab_size, Shape{batch, config.block_size});
  const Tensor targets = randint(0, config.vocab_size, Shape{batch, config.block_size});
  const double base = now();
  manual_seed(0);
  auto gpt = std::make_shared<models::GPT>(config);
  if (half) gpt->to(DType::BFloat16);
  std::vector<int64_t> sizes;  // each parameter's elements
  for (const Tensor& p : gpt->parameters()) sizes.push_back(p.numel());
  for (int64_t s : sizes) v.psi += s;
  const auto psi = static_cast<double>(v.psi);

  std::shared_ptr<parallel::FSDPModule> fsdp;
  std::shared_ptr<parallel::DistributedDataParallel> ddp;
  std::unique_ptr<parallel::ZeroRedundancyOptimizer> zero;
  std::unique_ptr<optim::Optimizer> opt;
  const auto adamw = [](std::vector<Tensor> params) -> std::unique_ptr<optim::Optimizer> {
    return std::make_unique<optim::AdamW>(std::move(params), optim::AdamWOptions().lr(1e-3).weight_decay(0.0));
  };
  const auto with_masters = [&](std::vector<Tensor> params) -> std::unique_ptr<optim::Optimizer> {
    return half ? std::make_unique<optim::MasterWeights>(std::move(params), adamw) : adamw(std::move(params));
  };
  if (v.stage == 3) fsdp = models::fully_shard_gpt(gpt, pg);
  const double before_ddp = now();
  if (v.stage <= 1) ddp = std::make_shared<parallel::DistributedDataParallel>(gpt, pg);
  v.measured.buckets = now() - before_ddp;
  // The flat groups (FSDP's units now; ZeRO's buckets once it is built below).
  double shard_elements = 0;   // Σ s_g
  double padded_elements = 0;  // Σ N s_g
  if (v.stage == 3) {
    for (size_t u = 0; u < fsdp->num_units(); ++u) {
      shard_elements += static_cast<double>(fsdp->unit(u).layout().shard_numel);
      padded_elements += static_cast<double>(fsdp->unit(u).layout().padded_numel());
    }
  }
  double stepped_tensors = 0;
  if (v.stage == 0) {
    opt = with_masters(gpt->parameters());
    stepped_tensors = static_cast<double>(sizes.size());
  } else if (v.stage == 3) {
    opt = with_masters(fsdp->parameters());
    stepped_tensors = static_cast<double>(fsdp->parameters().size());
  } else {  // ZeRO moves the parameters into its padded flat buffers as it is built
    parallel::ZeroOptions options;
    options.stage = v.stage;
    zero = std::make_unique<parallel::ZeroRedundancyOptimizer>(gpt->parameters(), pg, with_masters, options);
    for (const parallel::FlatParameter* b : zero->buckets()) {
      shard_elements += static_cast<double>(b->layout().shard_numel);
      padded_elements += static_cast<double>(b->layout().padded_numel());
    }
    stepped_tensors = static_cast<double>(zero->num_buckets());
  }
  optim::Optimizer& step_with = zero ? static_cast<optim::Optimizer&>(*zero) : *opt;
  const double optimizer_built = now();

  const auto forward = [&] {
    const AutocastGuard region(DeviceType::CPU, DType::BFloat16, autocast);
    return models::GPT::loss(fsdp ? (*gpt)(idx) : ddp ? ddp->forward(idx) : gpt->forward(idx), targets);
  };
  // Step 1: AdamW's state comes to exist (and MasterWeights' float32 gradients go with zero_grad).
  step_with.zero_grad();
  forward().backward();
  step_with.step();
  step_with.zero_grad();
  v.measured.adamw = now() - optimizer_built;  // exp_avg, exp_avg_sq, the step counts
  // bf16-true's masters, counted by tensor (MasterWeights' state "master", live); the rest
  // of what the model, its form and the optimizer held before the first step is the
  // parameters.
  for (size_t i = 0; i < step_with.parameters().size(); ++i) {
    const optim::TensorDict state = step_with.state(i);
    if (const auto m = state.find("master"); m != state.end()) v.measured.masters += static_cast<double>(m->second.nbytes());
  }
  v.measured.params = optimizer_built - base - v.measured.buckets - v.measured.masters;
  // Step 2: the gradients held after backward, and the activations forward kept.
  const double before = now();
  Tensor loss = forward();
  v.kept = now() - before;
  loss.backward();
  loss = Tensor();
  std::vector<Tensor> holders = v.stage == 2 ? zero->parameters() : v.stage == 3 ? fsdp->parameters() : gpt->parameters();
  for (const Tensor& t : holders)
    if (t.grad().defined()) v.measured.grads += static_cast<double>(t.grad().nbytes());
  step_with.step();
  step_with.zero_grad();

  // The formulas.
  const bool flat = v.stage >= 1;
  v.formula.params = v.stage == 0 ? e * psi : v.stage == 3 ? e * shard_elements : e * padded_elements;
  v.formula.masters = half ? 4 * (flat ? shard_elements : psi) : 0;
  v.formula.grads = v.stage <= 1 ? e * psi : e * shard_elements;
  v.formula.adamw = 8 * (flat ? shard_elements : psi) + 8 * stepped_tensors;
  v.formula.buckets = v.stage <= 1 ? e * psi : 0;
  (void)n;
}

}  // namespace

int main(int argc, char** argv) {
  models::GPTConfig config;
  config.n_layer = 4;
  config.n_embd = 64;
  config.n_head = 4;
  config.block_size = 32;
  config.vocab_size = 64;
  int64_t batch = 4;
  bool check = false;
  CLI::App app{"Per-rank bytes of the GPT's training state in 32-true, bf16-mixed and bf16-true under DDP, ZeRO-1, "
               "ZeRO-2 and FSDP, against the ZeRO paper's formulas"};
  app.add_option("--n-layer", config.n_layer)->capture_default_str();
  app.add_option("--n-embd", config.n_embd)->capture_default_str();
  app.add_option("--n-head", config.n_head)->capture_default_str();
  app.add_option("--block-size", config.block_size)->capture_default_str();
  app.add_option("--vocab", config.vocab_size)->capture_default_str();
  app.add_option("--batch", batch, "Windows per rank")->capture_default_str();
  app.add_flag("--check", check, "Exit 1 unless every formula column is exact");
  if (const auto code = mg::samples::parse_command_line(app, "gpt-precision-memory-bench", argc, argv)) return *code;
  try {
    const auto pg = process_group();
    std::vector<Variant> variants;
    for (const char* precision : {"32-true", "bf16-mixed", "bf16-true"})
      for (int stage : {0, 1, 2, 3}) variants.push_back(Variant{stage, precision, {}, {}, 0, 0});
    for (Variant& v : variants) {
      measure(v, config, batch, pg);
      pg->barrier()->wait();
    }
    bool exact = true;
    if (pg->rank() == 0) {
      fmt::print("GPT {} ({} parameters), {} rank{}, rank 0's bytes: measured / formula\n\n", config.str(),
                 variants.front().psi, pg->size(), pg->size() == 1 ? "" : "s");
      fmt::print("| form | precision | params | masters | grads | AdamW | bytes per parameter | DDP buckets | kept activations |\n");
      fmt::print("|---|---|---|---|---|---|---|---|---|\n");
    }
    static const char* const kForm[] = {"DDP", "ZeRO-1", "ZeRO-2", "FSDP"};
    for (const Variant& v : variants) {
      const auto cell = [&](double got, double want) {
        exact = exact && got == want;
        return got == want ? fmt::format("{:.0f}", got) : fmt::format("**{:.0f} / {:.0f}**", got, want);
      };
      const std::string row = fmt::format(
          "| {} | {} | {} | {} | {} | {} | {:.2f} | {} | {:.0f} |", kForm[v.stage], v.precision,
          cell(v.measured.params, v.formula.params), cell(v.measured.masters, v.formula.masters),
          cell(v.measured.grads, v.formula.grads), cell(v.measured.adamw, v.formula.adamw),
          v.measured.total() / static_cast<double>(v.psi), cell(v.measured.buckets, v.formula.buckets), v.kept);
      if (pg->rank() == 0) fmt::print("{}\n", row);
    }
    if (pg->rank() == 0)
      fmt::print("\n(a bold cell differs from its formula; bytes per parameter: (params + masters + grads + "
                 "AdamW) / Ψ)\n");
    return check && !exact ? 1 : 0;
  } catch (const std::exception& e) {
    fmt::print(stderr, "gpt-precision-memory-bench: error: {}\n", e.what());
    return 1;
  }
}
