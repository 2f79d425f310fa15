// gpt-pipeline-bench: the bubble of the GPT's pipeline (split_module with the GPT's cut,
// models/gpt_plan.h, run by PipelineStage), read from
// the ranks' timelines, against the arithmetic of docs/gpt-pipeline.md: 1F1B's
// (p - 1) / (m + p - 1) and interleaved 1F1B's (p - 1) / (v m + p - 1). Under minigrad-run,
// one Gloo rank per stage:
//
//   OPENBLAS_NUM_THREADS=1 build/bin/minigrad-run --nproc-per-node 2 build/bin/gpt-pipeline-bench
//
// For each schedule (1F1B, then interleaved with --model-chunks chunks per rank) it runs
// --warmup untimed steps and --steps timed ones, and rank 0 prints per step the measured
// bubble, the median over the steps, the ideal timeline's (equal chunks, free messages:
// parallel::ideal_timeline) and the formula, then the step's time beside one device's
// step on the whole batch.
//
// Two measured bubbles. The mean: 1 - sum_r busy_r / (p * step), busy_r being rank r's
// forward and backward spans and step the longest rank's time from the common barrier to
// its last send (a rank's own window would end when it is done and miss the last stage's
// idle tail). The busiest rank's: 1 - max_r busy_r / step. The formula assumes equal
// stages; the GPT's are not quite (the first holds the embedding, the last the head and
// the loss, and the rank's cores differ a little), and a faster stage idles for that on
// top of the schedule's bubble, which the mean counts and the busiest rank's does not.
// Messages are not free either: each hand-off on the critical path adds its latency
// (about 2 ms over Gloo on this 2-core VM), so the measurement wants a core per rank
// (OPENBLAS_NUM_THREADS=1) and passes long beside a message (16 blocks of C 512, T 128).
// Numbers for reading, not for asserting.
#include <algorithm>
#include <chrono>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <minigrad/minigrad.h>
#include <minigrad/models/gpt_plan.h>
#include <minigrad/parallel/c10d/rendezvous.h>
#include <minigrad/parallel/partial_gradients.h>
#include <minigrad/parallel/pipeline/split_module.h>

#include "samples/support/command_line.h"

namespace {

using namespace mg;

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values.empty() ? 0.0 : values[values.size() / 2];
}

struct Measured {
  std::vector<double> bubbles;   // one per timed step: the mean over ranks
  std::vector<double> critical;  // the busiest rank's idle share of the step
  std::vector<double> seconds;   // the step's time (the longest rank's)
};

// Every rank's `value` in slot `rank`, on every rank.
std::vector<double> gather_to_all(parallel::ProcessGroup& pg, double value) {
  std::vector<double> slots(static_cast<size_t>(pg.size()), 0.0);
  slots[static_cast<size_t>(pg.rank())] = value;
  Tensor t = from_vector(slots, {pg.size()}).to(DType::Float32);
  pg.allreduce(t)->wait();
  return t.to(DType::Float64).to_vector<double>();
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"The GPT's pipeline: the bubble of 1F1B and interleaved 1F1B, measured on the "
               "ranks' timelines against the formula"};
  int64_t n_layer = 16, n_embd = 512, n_head = 8, vocab = 96, seq = 128, batch = 16, chunks = 8;
  int model_chunks = 2, steps = 5, warmup = 1;
  double timeout_s = 300.0;
  using mg::samples::integer_in;
  app.add_option("--layers", n_layer, "GPT blocks")->check(integer_in(1, 1 << 10))->capture_default_str();
  app.add_option("--embd", n_embd, "n_embd")->check(integer_in(1, 1 << 14))->capture_default_str();
  app.add_option("--heads", n_head, "n_head")->check(integer_in(1, 1 << 10))->capture_default_str();
  app.add_option("--vocab", vocab, "vocabulary")->check(integer_in(1, 1 << 20))->capture_default_str();
  app.add_option("--seq", seq, "tokens per row (block_size)")->check(integer_in(1, 1 << 14))->capture_default_str();
  app.add_option("--batch", batch, "rows per step")->check(integer_in(1, 1 << 20))->capture_default_str();
  app.add_option("--chunks", chunks, "micro-batches per step")->check(integer_in(1, 1 << 16))->capture_default_str();
  app.add_option("--model-chunks", model_chunks, "model chunks per rank, interleaved")
      ->check(integer_in(2, 64))->capture_default_str();
  app.add_option("--steps", steps, "timed steps")->check(integer_in(1, 1 << 20))->capture_default_str();
  app.add_option("--warmup", warmup, "untimed steps first")->check(integer_in(0, 1 << 20))->capture_default_str();
  app.add_option("--timeout", timeout_s, "process group timeout, seconds")->check(mg::samples::seconds());
  if (const auto exit_code = mg::samples::parse_command_line(app, "gpt-pipeline-bench", argc, argv))
    return *exit_code;

  try {
    MG_CHECK(parallel::in_launched_job(),
             "gpt-pipeline-bench runs one rank per stage: start it with minigrad-run "
             "--nproc-per-node P");
    parallel::ProcessGroupOptions group_options;
    group_options.timeout = std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000));
    const auto pg = parallel::init_process_group("gloo", group_options);
    const int p = pg->size(), rank = pg->rank();

    models::GPTConfig config;
    config.n_layer = n_layer;
    config.n_embd = n_embd;
    config.n_head = n_head;
    config.vocab_size = vocab;
    config.block_size = seq;
    config.dropout = 0.0;
    config.validate();

    auto run = [&](parallel::Schedule schedule, int v) {
      manual_seed(1);
      models::GPT model(config);
      parallel::PipelineStageOptions options;
      options.chunks = chunks;
      options.schedule = schedule;
      parallel::PipelineStage pipe(parallel::split_module(model, models::gpt_pipeline_cut(config, p, v), pg), pg,
                                   options);
      const std::vector<Tensor> params = parallel::chunk_parameter_tensors(pipe.model_chunks());
      optim::AdamW opt(optim::weight_decay_groups(params, optim::AdamWOptions(1e-3)));
      Measured measured;
      for (int step = 0; step < warmup + steps; ++step) {
        manual_seed(100 + static_cast<uint64_t>(step));
        const Tensor idx = randint(0, vocab, {batch, seq});
        const Tensor targets = randint(0, vocab, {batch, seq});
        for (const nn::ModulePtr& chunk : pipe.model_chunks()) chunk->zero_grad();
        pg->barrier()->wait();  // the ranks start the step together
        const Tensor loss = pipe.train_step(rank == 0 ? idx : Tensor(), rank + 1 == p ? targets : Tensor(),
                                            [](const Tensor& logits, const Tensor& y) {
                                              return models::GPT::loss(logits, y);
                                            });
        parallel::reduce_partial_gradients(params);
        pipe.loss_on_every_rank(loss);  // as a trainer would, for the step's time
        opt.step();
        const parallel::PipeTimeline t = pipe.last_timeline();
        const std::vector<double> busy = gather_to_all(*pg, t.busy_seconds(rank));
        const std::vector<double> window = gather_to_all(*pg, t.running_seconds());
        const double step_seconds = *std::max_element(window.begin(), window.end());
        double busy_total = 0.0;
        for (double b : busy) busy_total += b;
        if (step < warmup) continue;
        measured.bubbles.push_back(1.0 - busy_total / (p * step_seconds));
        measured.critical.push_back(1.0 - *std::max_element(busy.begin(), busy.end()) / step_seconds);
        measured.seconds.push_back(step_seconds);
      }
      return measured;
    };

    // One device's step on the whole batch, the same GPT, timed on rank 0 alone.
    auto single_device_step = [&] {
      manual_seed(1);
      models::GPT model(config);
      optim::AdamW opt(optim::weight_decay_groups(model.parameters(), optim::AdamWOptions(1e-3)));
      std::vector<double> seconds;
      for (int step = 0; step < warmup + steps; ++step) {
        manual_seed(100 + static_cast<uint64_t>(step));
        const Tensor idx = randint(0, vocab, {batch, seq});
        const Tensor targets = randint(0, vocab, {batch, seq});
        const auto t0 = std::chrono::steady_clock::now();
        model.zero_grad();
        models::GPT::loss(model(idx), targets).backward();
        opt.step();
        if (step >= warmup)
          seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      }
      return median(seconds);
    };

    const int64_t m = parallel::MicroBatches(batch, chunks, "gpt-pipeline-bench").count();
    struct Row {
      const char* name;
      parallel::Schedule schedule;
      int v;
    };
    if (rank == 0)
      fmt::print("GPT n_layer={} n_embd={} n_head={} vocab={} T={}, batch {} in {} micro-batches, "
                 "{} ranks\n\n| schedule | v | bubble, mean of the ranks (median of {}) | per step "
                 "| bubble of the busiest rank | ideal timeline | formula | step ms |\n"
                 "|---|---|---|---|---|---|---|---|\n",
                 n_layer, n_embd, n_head, vocab, seq, batch, m, p, steps);
    std::vector<double> pipeline_seconds;
    for (const Row& row : {Row{"1f1b", parallel::Schedule::OneFOneB, 1},
                           Row{"interleaved", parallel::Schedule::Interleaved1F1B, model_chunks}}) {
      const Measured measured = run(row.schedule, row.v);
      pipeline_seconds.push_back(median(measured.seconds));
      if (rank != 0) continue;
      std::string per_step;
      for (double b : measured.bubbles) per_step += fmt::format("{}{:.3f}", per_step.empty() ? "" : " ", b);
      fmt::print("| {} | {} | {:.3f} | {} | {:.3f} | {:.3f} | {:.3f} | {:.1f} |\n", row.name,
                 row.v, median(measured.bubbles), per_step, median(measured.critical),
                 parallel::ideal_timeline(row.schedule, p, m, row.v).bubble_fraction(),
                 parallel::ideal_bubble_fraction(p, m, row.v), 1e3 * pipeline_seconds.back());
    }
    pg->barrier()->wait();
    if (rank == 0) {
      const double single = single_device_step();
      fmt::print("\none device, the whole batch: {:.1f} ms a step; the pipeline's speed-up: 1f1b "
                 "{:.2f}x, interleaved {:.2f}x (at most {} x (1 - bubble) with a core per rank)\n",
                 1e3 * single, single / pipeline_seconds[0], single / pipeline_seconds[1], p);
    }
    pg->barrier()->wait();
  } catch (const std::exception& e) {
    return mg::samples::report_error("gpt-pipeline-bench", e);
  }
  return 0;
}
