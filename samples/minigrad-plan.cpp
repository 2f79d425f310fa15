// minigrad-plan: will it fit, and which split is fastest -- before a launch, without
// allocating the model (minigrad/plan/planner.h; docs/planning.md).
//
//   build/bin/minigrad-plan --model gpt2-xl --devices 8 --device h100-80gb     # every split, ranked
//   build/bin/minigrad-plan --model gpt2 --device a100-40gb --dp 2 --tp 2 --zero 1   # one split's table
//
// The ranking prices every dp x tp x pp x cp of --devices (SP on and off, ZeRO 0-3, recompute
// on and off, 1F1B), orders those that fit by predicted step time and lists those that do
// not by per-rank GiB. Naming any of --dp --tp --pp --cp --zero prints one split's table:
// each pipeline stage's bytes, the collectives of the fullest stage, the bubble, the time.
#include <algorithm>
#include <array>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <minigrad/core/error.h>
#include <minigrad/models/gpt.h>
#include <minigrad/plan/llama_formulas.h>
#include <minigrad/plan/planner.h>

#include "samples/support/command_line.h"

namespace {

using namespace mg;

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0, kMiB = 1024.0 * 1024.0;

// GPT-2's sizes (Radford et al. 2019, table 2; nanoGPT's presets), vocabulary padded to
// 50304; and two Llamas by their Hugging Face config.json: TinyLlama-1.1B
// (TinyLlama/TinyLlama-1.1B-intermediate-step-1431k-3T) and Llama-2-7b (meta-llama/Llama-2-7b-hf).
std::unique_ptr<plan::ModelArithmetic> preset(const std::string& name) {
  const std::map<std::string, std::array<int64_t, 3>> gpt2{
      {"gpt2", {12, 12, 768}}, {"gpt2-medium", {24, 16, 1024}}, {"gpt2-large", {36, 20, 1280}},
      {"gpt2-xl", {48, 25, 1600}}};
  if (const auto it = gpt2.find(name); it != gpt2.end()) {
    models::GPTConfig c;
    c.n_layer = it->second[0];
    c.n_head = it->second[1];
    c.n_embd = it->second[2];
    c.vocab_size = 50304;
    c.block_size = 1024;
    return std::make_unique<plan::GPTArithmetic>(c);
  }
  // layers, hidden, heads, kv heads, intermediate, vocabulary, positions
  const std::map<std::string, std::array<int64_t, 7>> llamas{
      {"tinyllama-1.1b", {22, 2048, 32, 4, 5632, 32000, 2048}},
      {"llama2-7b", {32, 4096, 32, 32, 11008, 32000, 4096}}};
  const auto it = llamas.find(name);
  MG_CHECK(it != llamas.end(),
           "--model: unknown model '{}' (gpt2, gpt2-medium, gpt2-large, gpt2-xl, tinyllama-1.1b, llama2-7b)", name);
  models::LlamaConfig c;
  c.num_hidden_layers = it->second[0];
  c.hidden_size = it->second[1];
  c.num_attention_heads = it->second[2];
  c.num_key_value_heads = it->second[3];
  c.intermediate_size = it->second[4];
  c.vocab_size = it->second[5];
  c.max_position_embeddings = it->second[6];
  return std::make_unique<plan::LlamaArithmetic>(c);
}

std::string gib(double bytes) { return fmt::format("{:.2f}", bytes / kGiB); }

void print_split(const plan::Plan& p) {
  const plan::Split& s = p.split;
  fmt::print("split: {} on {} x {}\n", s.str(), s.world(), p.device.description);
  fmt::print("batch: {} rows x {} tokens a step ({} rows a dp rank), {}\n\n", p.workload.batch, p.workload.seq_len,
             p.workload.batch / s.dp, plan::to_string(p.workload.precision));
  fmt::print("| per rank, GiB | {} |\n|---|{}\n", [&] {
    std::string h;
    for (const plan::RankMemory& r : p.stages) h += fmt::format("{}stage {}", h.empty() ? "" : " | ", r.stage);
    return h;
  }(), [&] {
    std::string sep;
    for (size_t i = 0; i < p.stages.size(); ++i) sep += "---|";
    return sep;
  }());
  const auto row = [&](const char* what, double plan::RankMemory::*field) {
    std::string line = fmt::format("| {} |", what);
    for (const plan::RankMemory& r : p.stages) line += fmt::format(" {} |", gib(r.*field));
    fmt::print("{}\n", line);
  };
  row("parameters", &plan::RankMemory::params);
  row("gradients", &plan::RankMemory::grads);
  row("master weights", &plan::RankMemory::master);
  row("optimizer state", &plan::RankMemory::optimizer);
  row("buffers", &plan::RankMemory::buffers);
  row("activations at the peak", &plan::RankMemory::activations);
  std::string total = "| total |";
  for (const plan::RankMemory& r : p.stages) total += fmt::format(" {} |", gib(r.total()));
  fmt::print("{}\n\n", total);
  fmt::print("fits: {} ({} GiB of {} GiB usable on stage {})\n\n", p.fits ? "yes" : "NO", gib(p.peak.total()),
             gib(p.usable_bytes), p.peak.stage);
  fmt::print("communication per step, stage {} (bytes this rank hands in)\n", p.peak.stage);
  fmt::print("| group | all_reduce MiB | all_gather MiB | reduce_scatter MiB | send MiB | recv MiB | ms |\n"
             "|---|---|---|---|---|---|---|\n");
  for (const auto& [group, c] : p.comm)
    if (c.total() + c.recv > 0)
      fmt::print("| {} | {:.2f} | {:.2f} | {:.2f} | {:.2f} | {:.2f} | {:.2f} |\n", group, c.all_reduce / kMiB,
                 c.all_gather / kMiB, c.reduce_scatter / kMiB, (c.send + c.broadcast) / kMiB, c.recv / kMiB,
                 p.comm_s.at(group) * 1e3);
  fmt::print("\npipeline bubble: {:.3f}", p.bubble);
  if (s.pp > 1)
    fmt::print(s.schedule == plan::Schedule::Interleaved ? " = (p-1)/(v m + p - 1), p {} v {} m {}"
                                                         : " = (p-1)/(m + p - 1), p {} m {}",
               s.pp, s.schedule == plan::Schedule::Interleaved ? s.virtual_stages : static_cast<int>(s.micro_batches),
               s.micro_batches);
  fmt::print("\nstep: {:.1f} ms = compute {:.1f} + bubble {:.1f} + exposed communication {:.1f} + "
             "optimizer {:.1f}; {:.0f} tokens/s; {:.2f} PFLOP a step\n",
             p.time.step_s * 1e3, p.time.compute_s * 1e3, p.time.bubble_s * 1e3, p.time.comm_s * 1e3,
             p.time.optimizer_s * 1e3, p.tokens_per_s, p.flops_per_step / 1e15);
}

void print_ranking(const std::vector<plan::Plan>& plans, size_t top, size_t skipped) {
  fmt::print("| # | dp | tp | pp | cp | SP | ZeRO | recompute | m | GiB a rank | fits | bubble | "
             "comm MiB | step ms | tokens/s |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  size_t fit = 0, shown = 0, not_fit = 0;
  for (const plan::Plan& p : plans) (p.fits ? fit : not_fit)++;
  size_t shown_not = 0;
  for (size_t i = 0; i < plans.size(); ++i) {
    const plan::Plan& p = plans[i];
    if (p.fits ? shown >= top : shown_not >= top) continue;
    (p.fits ? shown : shown_not)++;
    double comm = 0;
    for (const auto& [g, c] : p.comm) comm += c.total();
    const plan::Split& s = p.split;
    fmt::print("| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {:.3f} | {:.0f} | {:.1f} | {:.0f} |\n", i + 1,
               s.dp, s.tp, s.pp, s.cp, s.sequence_parallel ? "on" : "off", s.zero, s.recompute ? "on" : "off",
               s.micro_batches, gib(p.peak.total()), p.fits ? "yes" : "NO", p.bubble, comm / kMiB,
               p.time.step_s * 1e3, p.tokens_per_s);
  }
  fmt::print("\n{} splits fit, {} do not (the {} fastest and the {} smallest shown; --top to see more); {} "
             "impossible for this model (--explain lists why)\n",
             fit, not_fit, std::min(fit, top), std::min(not_fit, top), skipped);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Per-rank memory, communication and step time of a GPT's splits, before a launch"};
  std::string model = "gpt2", device_name = "h100-80gb", precision = "bf16-mixed", schedule = "1f1b";
  int devices = 0, dp = 0, tp = 0, pp = 0, cp = 0, zero = -1, virtual_stages = 2;
  size_t top = 10;
  bool sp = false, recompute = false, explain = false;
  plan::Workload w;
  int64_t micro_batches = 0;
  using mg::samples::integer_in;
  app.add_option("--model", model, "gpt2 | gpt2-medium | gpt2-large | gpt2-xl | tinyllama-1.1b | llama2-7b");
  app.add_option("--device", device_name, "h100-80gb h100-pcie h200 a100-40gb a100-80gb l4 rtx-4090 cpu");
  app.add_option("--devices", devices, "devices to split over (ranks every split)")->check(integer_in(1, 4096));
  app.add_option("--precision", precision, "32-true | bf16-mixed | bf16-true | 16-mixed");
  app.add_option("--batch", w.batch, "rows a step, the whole job (default: 8 a device)")->check(integer_in(1, 1 << 20));
  app.add_option("--seq-len", w.seq_len, "tokens a row (default: the model's positions)")->check(integer_in(1, 1 << 20));
  app.add_option("--efficiency", w.efficiency, "share of the dense peak the GEMMs reach")->check(CLI::Range(0.01, 1.0));
  app.add_option("--dp", dp, "data-parallel ranks (one split)")->check(integer_in(1, 4096));
  app.add_option("--tp", tp, "tensor-parallel ranks (one split)")->check(integer_in(1, 4096));
  app.add_option("--pp", pp, "pipeline stages (one split)")->check(integer_in(1, 4096));
  app.add_option("--cp", cp, "context-parallel ranks (one split)")->check(integer_in(1, 4096));
  app.add_option("--zero", zero, "ZeRO stage over dp, 3 = FSDP (one split)")->check(integer_in(0, 3));
  app.add_flag("--sequence-parallel", sp, "Megatron's sequence parallelism (one split)");
  app.add_flag("--recompute", recompute, "recompute each block in backward (one split)");
  app.add_option("--micro-batches", micro_batches, "pipeline micro-batches (0: up to 4 pp)")->check(integer_in(0, 1 << 20));
  app.add_option("--schedule", schedule, "1f1b | interleaved")->check(CLI::IsMember({"1f1b", "interleaved"}));
  app.add_option("--virtual-stages", virtual_stages, "chunks a rank, interleaved")->check(integer_in(2, 64));
  app.add_option("--top", top, "rows of each list in the ranking")->check(integer_in(1, 100000));
  app.add_flag("--explain", explain, "the ranking also lists the impossible splits and why");
  if (const auto exit_code = mg::samples::parse_command_line(app, "minigrad-plan", argc, argv)) return *exit_code;
  try {
    const std::unique_ptr<plan::ModelArithmetic> arithmetic = preset(model);
    if (app.count("--seq-len") == 0) w.seq_len = arithmetic->max_positions();
    w.precision = plan::precision_from_string(precision);
    const plan::DeviceSpec device = plan::device_by_name(device_name);
    fmt::print("{}: {}; {:.2f} GFLOP a token\n", model, arithmetic->describe(),
               arithmetic->flops_per_token(w.seq_len) / 1e9);
    fmt::print("device: {} ({}: {:.1f} TFLOP/s dense {}, {:.0f} GB, {}){}\n\n", device.description, device.name,
               device.peak_flops(w.precision) / 1e12, plan::to_string(w.precision), device.memory_bytes / 1e9,
               device.link, device.measured ? ", measured here" : "");
    const bool one_split = dp + tp + pp + cp > 0 || zero >= 0 || sp || recompute;
    const auto default_batch = [&](int world) {
      if (app.count("--batch") == 0) w.batch = 8 * static_cast<int64_t>(world);
    };
    if (one_split) {
      plan::Split s;
      s.dp = std::max(dp, 1);
      s.tp = std::max(tp, 1);
      s.pp = std::max(pp, 1);
      s.cp = std::max(cp, 1);
      s.zero = std::max(zero, 0);
      s.sequence_parallel = sp;
      s.recompute = recompute;
      s.micro_batches = micro_batches;
      s.schedule = schedule == "interleaved" ? plan::Schedule::Interleaved : plan::Schedule::OneFOneB;
      s.virtual_stages = virtual_stages;
      MG_CHECK(devices == 0 || devices == s.world(), "--devices {} but the split dp {} x tp {} x pp {} "
               "x cp {} has {} ranks", devices, s.dp, s.tp, s.pp, s.cp, s.world());
      default_batch(s.world());
      const plan::Plan p = plan::plan_model(*arithmetic, s, w, device);
      print_split(p);
      fmt::print("\nassumptions:\n");
      for (const std::string& a : p.assumptions) fmt::print("  - {}\n", a);
    } else {
      MG_CHECK(devices > 0, "name --devices N to rank the splits, or a split (--dp --tp --pp --cp --zero)");
      default_batch(devices);
      std::vector<std::string> skipped;
      const std::vector<plan::Plan> plans = plan::rank_splits(*arithmetic, devices, w, device, &skipped);
      fmt::print("every split of {} x {}, batch {} rows x {} tokens, {}\n\n", devices, device.name, w.batch, w.seq_len,
                 plan::to_string(w.precision));
      print_ranking(plans, top, skipped.size());
      if (explain)
        for (const std::string& why : skipped) fmt::print("  impossible: {}\n", why);
      if (!plans.empty()) {
        fmt::print("\nthe fastest{}, in full:\n\n", plans.front().fits ? "" : " (none fits: the smallest)");
        print_split(plans.front());
        fmt::print("\nassumptions:\n");
        for (const std::string& a : plans.front().assumptions) fmt::print("  - {}\n", a);
      }
    }
    return 0;
  } catch (const std::exception& e) {
    return mg::samples::report_error("minigrad-plan", e);
  }
}
