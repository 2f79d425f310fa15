// gpt-fsdp-bench: what FSDP with a GPT block per unit (parallel/sharded/gpt_fsdp.h) holds per rank,
// against DDP on the same GPT, with and without recomputing the blocks' activations;
// held against the arithmetic of docs/gpt-fsdp.md. Under minigrad-run (Gloo ranks):
//
//   build/bin/minigrad-run --nproc-per-node 4 build/bin/gpt-fsdp-bench
//
// For each variant (ddp, ddp+recompute, fsdp, fsdp+recompute) every rank builds the same
// GPT, trains one step (so AdamW's state exists), then measures one more step with the
// CPU allocator's counters (core/allocator.h): the peak above what was held before the
// model was built, and the activations kept between forward and backward (bytes held once
// the loss is computed, above those held before the forward). Rank 0 prints a Markdown
// table, the arithmetic beside each peak (an upper bound: every term counted at once,
// though activations are mostly freed by the time all gradients exist):
//   DDP   Ψ(1 + 1 + 2 + 1) x 4 B (parameters, gradients, AdamW's two states, DDP's
//         buckets) + activations
//   FSDP  Ψ(1 + 1 + 2)/N x 4 B (the shards) + 2 gathered units (the one computing, the one
//         prefetched) + 3 flat gradient buffers of a unit (filling, in flight, Gloo's
//         scratch) + activations
// The target: FSDP's peak <= 0.35 x DDP's on 4 ranks. Times are not measured.
#include <algorithm>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <minigrad/core/allocator.h>
#include <minigrad/minigrad.h>
#include <minigrad/models/gpt_checkpointing.h>
#include <minigrad/parallel/sharded/gpt_fsdp.h>
#include <minigrad/nn/checkpoint.h>
#include <minigrad/parallel/c10d/rendezvous.h>
#include <minigrad/parallel/ddp/distributed_data_parallel.h>

#include "samples/support/command_line.h"

namespace {

using namespace mg;

struct Measure {
  double peak = 0, kept = 0, arithmetic = 0, state = 0, units = 0;
};

constexpr double kMiB = 1024.0 * 1024.0;

// The job's group under minigrad-run, else a group of one in this process (a smoke run).
std::shared_ptr<parallel::ProcessGroup> process_group() {
  if (parallel::in_launched_job()) return parallel::init_process_group("gloo");
  parallel::TCPStoreOptions store_options;
  store_options.is_server = true;
  store_options.rank = 0;
  auto store = std::make_shared<parallel::TCPStore>("127.0.0.1", 0, store_options);
  return parallel::new_process_group("gloo", store, 0, 1, {});
}

Measure measure(const models::GPTConfig& config, bool fsdp, bool recompute, int64_t batch,
                const std::shared_ptr<parallel::ProcessGroup>& pg) {
  const size_t base = cpu_memory_allocated();
  manual_seed(0);
  auto gpt = std::make_shared<models::GPT>(config);
  if (recompute) models::set_block_checkpointing(*gpt);
  std::shared_ptr<parallel::FullyShardedDataParallel> sharded;
  std::shared_ptr<parallel::DistributedDataParallel> ddp;
  std::vector<Tensor> params;
  if (fsdp) {
    sharded = parallel::fully_shard_gpt(gpt, pg);
    params = sharded->parameters();
  } else {
    ddp = std::make_shared<parallel::DistributedDataParallel>(gpt, pg);
    params = gpt->parameters();
  }
  optim::AdamW opt(params, optim::AdamWOptions().lr(1e-3));
  manual_seed(100 + static_cast<uint64_t>(pg->rank()));
  const Tensor idx = randint(0, config.vocab_size, Shape{batch, config.block_size});
  const Tensor targets = randint(0, config.vocab_size, Shape{batch, config.block_size});
  Measure m;
  for (int step = 0; step < 2; ++step) {
    if (step == 1) cpu_reset_peak_memory_stats();
    opt.zero_grad();
    const size_t before = cpu_memory_allocated();
    Tensor loss = models::GPT::loss(fsdp ? sharded->forward(idx) : ddp->forward(idx), targets);
    m.kept = static_cast<double>(cpu_memory_allocated() - before);
    loss.backward();
    loss = Tensor();
    opt.step();
  }
  m.peak = static_cast<double>(cpu_max_memory_allocated() - base);
  const double psi = static_cast<double>(gpt->num_parameters(false)) * 4.0;  // bytes
  const double n = pg->size();
  if (fsdp) {
    const double unit = static_cast<double>(sharded->stats().largest_unit_bytes);
    m.state = psi * 4.0 / n;
    m.units = 2.0 * unit + 3.0 * unit;
  } else {
    m.state = psi * 5.0;
  }
  m.arithmetic = m.state + m.units + m.kept;
  return m;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"FSDP on a GPT (a block per unit) against DDP: memory per rank"};
  models::GPTConfig config;
  config.n_layer = 8;
  config.n_head = 4;
  config.n_embd = 256;
  config.vocab_size = 512;
  config.block_size = 32;
  int64_t batch = 2;
  using mg::samples::integer_in;
  app.add_option("--n-layer", config.n_layer, "blocks")->check(integer_in(1, 1024));
  app.add_option("--n-embd", config.n_embd, "width")->check(integer_in(1, 1 << 16));
  app.add_option("--n-head", config.n_head, "heads")->check(integer_in(1, 1024));
  app.add_option("--vocab", config.vocab_size, "vocabulary")->check(integer_in(1, 1 << 20));
  app.add_option("--block-size", config.block_size, "tokens per row")->check(integer_in(1, 1 << 16));
  app.add_option("--batch", batch, "rows per rank")->check(integer_in(1, 1 << 20));
  if (const auto exit_code = mg::samples::parse_command_line(app, "gpt-fsdp-bench", argc, argv))
    return *exit_code;
  try {
    auto pg = process_group();
    struct Row {
      const char* name;
      bool fsdp, recompute;
      Measure m;
    };
    std::vector<Row> rows{{"ddp", false, false, {}},
                          {"ddp+recompute", false, true, {}},
                          {"fsdp", true, false, {}},
                          {"fsdp+recompute", true, true, {}}};
    for (Row& r : rows) r.m = measure(config, r.fsdp, r.recompute, batch, pg);
    if (pg->rank() == 0) {
      fmt::print("GPT {}, {} rows x {} tokens per rank, {} ranks, AdamW; rank 0, MiB\n\n",
                 config.str(), batch, config.block_size, pg->size());
      fmt::print("| variant | peak | arithmetic | states (params, grads, AdamW) | gathered units + "
                 "grad buffers | activations kept | peak / DDP's |\n|---|---|---|---|---|---|---|\n");
      for (const Row& r : rows)
        fmt::print("| {} | {:.2f} | {:.2f} | {:.2f} | {:.2f} | {:.2f} | {:.3f} |\n", r.name,
                   r.m.peak / kMiB, r.m.arithmetic / kMiB, r.m.state / kMiB, r.m.units / kMiB,
                   r.m.kept / kMiB, r.m.peak / rows[0].m.peak);
    }
    return 0;
  } catch (const std::exception& e) {
    fmt::print(stderr, "gpt-fsdp-bench: {}\n", e.what());
    return 1;
  }
}
