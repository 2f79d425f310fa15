// train_gpt: a character-level GPT (models::GPT, nanoGPT's model; or with --model llama a
// Llama of the same sizes, models::Llama) trained on the fortune cookies of Debian's
// `fortunes` package, then asked to write one.
//
//   build/bin/train_gpt                                  # the default: a few minutes on 2 cores
//   build/bin/train_gpt --iters 200 --n-layer 2 --n-embd 64          # a quick look
//   build/bin/train_gpt --grad-accum 4 --batch-size 3                # the same step in 4 pieces
//   build/bin/train_gpt --save gpt.safetensors; build/bin/train_gpt --resume gpt.safetensors
//   build/bin/train_gpt --resume gpt.safetensors --sample-only --sample-chars 1000   # no data needed
//   build/bin/train_gpt --metrics run.csv --plot run.svg --trace t.json
//   build/bin/train_gpt --precision bf16-mixed                       # nanoGPT's autocast
//   build/bin/train_gpt --precision bf16-true                        # llm.c's: bfloat16 weights, float32 masters
//   build/bin/train_gpt --devices cpu,cpu                            # DataParallel, 2 replicas
//   build/bin/train_gpt --model llama                                # RoPE, RMSNorm, SwiGLU, 2 kv heads
//   build/bin/minigrad-run --nproc-per-node 8 build/bin/train_gpt --model llama --devices cpu --dp 2 --tp 2 --pp 2
//   build/bin/minigrad-run --nproc-per-node 4 build/bin/train_gpt --devices cpu --dp 2 --tp 2
//   build/bin/minigrad-run --nproc-per-node 2 build/bin/train_gpt --devices cpu --cp 2
//   build/bin/minigrad-run --nproc-per-node 8 build/bin/train_gpt --devices cpu --dp 2 --tp 2 --cp 2
//   build/bin/minigrad-run --nproc-per-node 8 build/bin/train_gpt --devices cpu --dp 2 --tp 2 --pp 2
//   build/bin/minigrad-run --nproc-per-node 2 build/bin/train_gpt --devices cpu --pp 2 --schedule interleaved --model-chunks 2
//   build/bin/minigrad-run --nproc-per-node 2 build/bin/train_gpt --devices cpu --dp 2 --zero 2
//   build/bin/minigrad-run --nproc-per-node 2 build/bin/train_gpt --devices cpu --pp 2 --save gpt.safetensors
//
// The loop is nanoGPT's train.py: every --eval-interval steps the mean loss of
// --eval-iters batches of the training and the validation text (eval mode, no gradient);
// each step sets the learning rate (linear warmup, then cosine decay to --min-lr), runs
// --grad-accum micro-batches of --batch-size random windows of --block-size + 1 characters
// (forward, loss / grad_accum, backward: the gradients add up), clips the gradient norm to
// 1 and takes an AdamW step, with weight decay on the 2-D weights only. At the end a text
// sample. The text is encoded once at the character level (minigrad/data/text_dataset.h);
// --tokens FILE keeps the encoding in a token file for the next runs.
//
// Checkpoints (--save, written at every evaluation, at the end and at Ctrl-C) hold the
// model under nanoGPT's names (model.transformer.wte.weight, ..., model.lm_head.weight),
// so tests/models/reference/gpt_reference.py --load loads one into PyTorch's nanoGPT
// with strict=True; --resume continues bit for bit (the windows of step s are drawn from
// (--seed, s), the dropout generator's state is saved). The vocabulary is in the
// checkpoint's metadata too (support/vocabulary_metadata.h: "vocab", each character's byte
// in hex), so --sample-only samples from a checkpoint without the text it was trained on,
// and --resume on a corpus of other characters is refused rather than misread.
//
// --model gpt|llama (support/language_model.h): the model the flags build; everything else
// here is the same for both (a checkpoint names its model and config, and --resume refuses
// the other one).
//
// --dp/--tp/--cp (under minigrad-run, one process per rank): the model split over a mesh of
// data, tensor and context parallelism; support/split_model.h holds the split (which rows,
// shards and positions a rank takes, how the gradients are reduced), generic over the
// model's models::SplitSpec (its plans, FSDP units, pipeline cut), and this loop calls it
// in three places: the loss, the gradients' reduction, the clip. Rank 0 prints the numbers
// the single-device run prints, writes the files and the sample. --pp P > 1 runs the 4-D
// pipeline (--schedule 1f1b|interleaved, --micro-batches, --model-chunks), which does
// forward and backward itself (the loop's fourth place: pipeline_step; evaluation through
// it too). --zero 1|2|3 shards AdamW's state, the gradients, the parameters over --dp
// (ZeRO-1/2, FSDP by block; 1 with any split, 2 and 3 with any but --pp); --recompute
// checkpoints the blocks. Checkpoints and the sample keep the single-device layout under
// any split: the parameters and AdamW's state are gathered by their placements
// (parallel/full_state_dict.h, full_optimizer_state.h) and scattered back the same way,
// so a run saved under one split resumes under another, or on one device, and the other
// way round.
//
// --precision 32-true | bf16-mixed | 16-mixed | bf16-true (Lightning's names;
// support/precision.h): the forward and the loss under autocast (bf16-mixed, 16-mixed), the
// loss scaled by a GradScaler whose skip is agreed by every rank (16-mixed), or bfloat16
// parameters stepped through float32 master weights (bf16-true; under --zero float32
// master shards, the ZeRO paper's 2 + 2 + 12 bytes), with or without a split; under --zero 3,
// --fsdp-mp-policy makes it FSDP's MixedPrecisionPolicy instead of autocast. Checkpoints
// keep the masters (MasterWeights' optimizer state) and the scaler's state, and name their
// precision: --resume continues bit for bit, and refuses a checkpoint of another precision.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>

#include <minigrad/autograd/functions.h>
#include <minigrad/autograd/grad_mode.h>
#include <minigrad/core/files.h>
#include <minigrad/core/generator.h>
#include <minigrad/core/ops.h>
#include <minigrad/core/tensor.h>
#include <minigrad/data/char_tokenizer.h>
#include <minigrad/data/text_dataset.h>
#include <minigrad/data/token_file.h>
#include <minigrad/models/gpt.h>
#include <minigrad/models/gpt_checkpointing.h>
#include <minigrad/nn/optim/adam.h>
#include <minigrad/nn/optim/lr_schedule.h>
#include <minigrad/nn/serialize.h>
#include <minigrad/nn/utils/clip_grad.h>
#include <minigrad/parallel/c10d/launch_environment.h>
#include <minigrad/parallel/data_parallel.h>
#include <minigrad/plan/model_arithmetic.h>
#include "support/command_line.h"
#include "support/devices.h"
#include "support/distributed_run.h"
#include "support/language_model.h"
#include "support/vocabulary_metadata.h"
#include "support/memory_report.h"
#include "support/precision.h"
#include "support/progress.h"
#include "support/run_files.h"
#include "support/split_model.h"
#include "support/stop_signal.h"
#include "support/svg_plot.h"
#include "support/throughput.h"
#include "support/trace.h"

namespace {

using namespace mg;
using Clock = std::chrono::steady_clock;
constexpr const char* kProgram = "train_gpt";

struct Options {
  // The model (--model gpt|llama): nanoGPT's small CPU configuration (its README's "baby GPT"
  // for a laptop), or a Llama of the same sizes (support/language_model.h).
  samples::ModelFlags model;
  // The run.
  // 3000 steps at a peak of 3e-3: about 2.3 M characters, nine-tenths of one pass over the
  // corpus, to a validation loss near 1.80, where the sample is mostly English words (1000
  // steps at 1e-3, nanoGPT's figures for Shakespeare, stop at 2.24: word-shaped letters).
  int64_t iters = 3000, batch_size = 12, grad_accum = 1;
  double lr = 3e-3, min_lr = 1e-4, weight_decay = 0.1, grad_clip = 1.0;
  int64_t warmup = 100, decay_iters = 0;  // 0: --iters
  int64_t eval_interval = 500, eval_iters = 20;
  uint64_t seed = 1337;
  std::string devices = "cpu";
  std::vector<Device> device_list;
  std::string data_dir = data::kFortunesDir, tokens;
  std::string save, resume, metrics, plot, scale_log;  // --scale-log: 16-mixed's loss scale per step
  int64_t growth_interval = 2000;                      // 16-mixed: GradScaler's, torch's default
  int64_t sample_chars = 400;
  double temperature = 0.8;
  int64_t top_k = 0;
  bool sample_only = false;  // --resume's weights and vocabulary, a sample, nothing else
  samples::Precision precision = samples::Precision::True32;
  // --fsdp-mp-policy: under --zero 3, the mixed precision as FSDP2's MixedPrecisionPolicy
  // (torchtitan's) in place of autocast.
  bool fsdp_mp_policy = false;
  bool memory_blocks = false;  // the allocator's live blocks at each rank's peak, listed
  samples::TraceOptions trace;
  // The split over ranks (--dp, --tp, --cp, --sequence-parallel); distributed when given.
  samples::ModelSplit split;
  bool distributed = false;
  double dist_timeout = 300;
};

std::optional<int> parse_options(int argc, char** argv, Options& o) {
  CLI::App app{"Trains a character-level GPT (nanoGPT's model) on Debian's fortune cookies and "
               "writes a sample."};
  const auto positive = samples::positive_integer();
  samples::ModelFlags& m = o.model;
  app.add_option("--model", m.model, "gpt (nanoGPT's) or llama (RoPE, RMSNorm, SwiGLU, grouped-query attention)")
      ->check(CLI::IsMember(samples::model_names()))->capture_default_str();
  app.add_option("--n-layer", m.n_layer, "Transformer blocks")->check(positive)->capture_default_str();
  app.add_option("--n-head", m.n_head, "Attention heads per block")->check(positive)->capture_default_str();
  app.add_option("--n-kv-head", m.n_kv_head, "--model llama: key-value heads (default: half of --n-head)")->check(positive);
  app.add_option("--n-embd", m.n_embd, "Width of the residual stream")->check(positive)->capture_default_str();
  app.add_option("--intermediate-size", m.intermediate_size, "--model llama: SwiGLU's width (default: 8/3 --n-embd, rounded up to 32)")->check(positive);
  app.add_option("--block-size", m.block_size, "Context length in characters")->check(positive)->capture_default_str();
  app.add_option("--dropout", m.dropout, "Dropout probability (--model gpt)")->check(CLI::Range(0.0, 0.99))->capture_default_str();
  app.add_option("--iters", o.iters, "Optimizer steps in all (counting resumed ones)")->check(positive)->capture_default_str();
  app.add_option("--batch-size", o.batch_size, "Windows per micro-batch")->check(positive)->capture_default_str();
  app.add_option("--grad-accum", o.grad_accum, "Micro-batches per step (gradient accumulation)")->check(positive)->capture_default_str();
  app.add_option("--lr", o.lr, "Peak learning rate (AdamW)")->check(samples::non_negative_number())->capture_default_str();
  app.add_option("--min-lr", o.min_lr, "Learning rate at the end of the cosine decay")->check(samples::non_negative_number())->capture_default_str();
  CLI::Option* warmup = app.add_option("--warmup", o.warmup, "Steps of linear warmup (default: 100, or --decay-iters when that is fewer)")->check(samples::non_negative_integer());
  app.add_option("--decay-iters", o.decay_iters, "Step where the cosine reaches --min-lr (default: --iters)")->check(samples::non_negative_integer());
  app.add_option("--weight-decay", o.weight_decay, "AdamW's weight decay of the 2-D weights")->check(samples::non_negative_number())->capture_default_str();
  app.add_option("--grad-clip", o.grad_clip, "Clip the gradient norm to this (0: no clipping)")->check(samples::non_negative_number())->capture_default_str();
  app.add_option("--eval-interval", o.eval_interval, "Evaluate every this many steps")->check(positive)->capture_default_str();
  app.add_option("--eval-iters", o.eval_iters, "Batches per evaluation of each split")->check(positive)->capture_default_str();
  app.add_option("--seed", o.seed, "Seed of the weights, the windows and dropout")->check(samples::non_negative_integer())->capture_default_str();
  app.add_option("--devices", o.devices, "cpu, GPU ids such as 0 or 0,1, or cpu,cpu; several devices train with DataParallel")->capture_default_str();
  app.add_option("--data-dir", o.data_dir, "Directory of fortune files (Debian's fortunes package)")->capture_default_str();
  app.add_option("--tokens", o.tokens, "Token file of the encoded corpus: read if it exists, else written");
  app.add_option("--save", o.save, "Write a checkpoint (safetensors, nanoGPT's names) at every evaluation and at the end");
  app.add_option("--resume", o.resume, "Continue from a checkpoint written by --save");
  app.add_option("--metrics", o.metrics, "Write step,train_loss,val_loss,lr,seconds at every evaluation to this CSV");
  app.add_option("--plot", o.plot, "Draw the train and validation loss into this SVG");
  app.add_option("--scale-log", o.scale_log, "16-mixed: write step,scale,stepped (the loss scale of every step) to this CSV");
  app.add_option("--growth-interval", o.growth_interval, "16-mixed: clean steps before the loss scale doubles")->check(samples::positive_integer())->capture_default_str();
  app.add_option("--sample-chars", o.sample_chars, "Characters of text to generate at the end (0: none)")->check(samples::non_negative_integer())->capture_default_str();
  app.add_option("--temperature", o.temperature, "Sampling temperature (0: always the likeliest character)")->check(samples::non_negative_number())->capture_default_str();
  app.add_option("--top-k", o.top_k, "Sample among the k likeliest characters (0: all)")->check(samples::non_negative_integer())->capture_default_str();
  app.add_flag("--sample-only", o.sample_only, "With --resume: print a sample from the checkpoint alone (its weights and vocabulary; no data is read, no step taken)");
  std::string precision = "32-true";
  app.add_option("--precision", precision, "32-true, bf16-mixed (float32 weights, bfloat16 autocast), 16-mixed (float16 autocast, loss scaling) or bf16-true (bfloat16 weights, float32 masters)")
      ->check(CLI::IsMember(samples::precision_names()))->capture_default_str();
  app.add_flag("--fsdp-mp-policy", o.fsdp_mp_policy, "With --zero 3 and --precision bf16-mixed or 16-mixed: FSDP's MixedPrecisionPolicy (torchtitan's: float32 shards, units gathered in the 16-bit dtype, gradients reduce-scattered in float32) in place of autocast");
  samples::add_trace_options(app, o.trace, "training step");
  app.add_flag("--memory-blocks", o.memory_blocks, "After the run, list the allocator's blocks live at each rank's training peak, by size (one CPU device a rank): what docs/planning.md's memory terms were read off");
  CLI::Option* dp = app.add_option("--dp", o.split.dp, "Data-parallel ranks (under minigrad-run): the batch's windows cut over them")->check(positive);
  CLI::Option* tp = app.add_option("--tp", o.split.tp, "Tensor-parallel ranks: every layer split over them (Megatron's)")->check(positive);
  CLI::Option* pp = app.add_option("--pp", o.split.pp, "Pipeline-parallel ranks: the blocks cut into stages (the 4-D pipeline)")->check(positive);
  std::string schedule = "1f1b";
  CLI::Option* sched = app.add_option("--schedule", schedule, "With --pp: 1f1b or interleaved")->check(CLI::IsMember({"1f1b", "interleaved"}))->capture_default_str();
  CLI::Option* mb = app.add_option("--micro-batches", o.split.micro_batches, "With --pp: micro-batches per pipeline step (default: --pp)")->check(positive);
  CLI::Option* chunks = app.add_option("--model-chunks", o.split.model_chunks, "With --pp --schedule interleaved: model chunks per rank")->check(positive);
  CLI::Option* zero = app.add_option("--zero", o.split.zero, "ZeRO over --dp: 1 (optimizer state sharded; with any split), 2 (gradients too), 3 (FSDP by block) (2 and 3 not with --pp)")->check(CLI::IsMember({1, 2, 3}));
  app.add_flag("--recompute", o.split.recompute, "Recompute each block's activations in backward (block checkpointing)");
  CLI::Option* cp = app.add_option("--cp", o.split.cp, "Context-parallel ranks: every window's positions split over them (ring attention)")->check(positive);
  CLI::Option* sp = app.add_flag("--sequence-parallel", o.split.sequence_parallel, "With --tp: the activations between the layers split along the sequence too");
  app.add_option("--dist-timeout", o.dist_timeout, "Seconds to wait for the other ranks (--dp/--tp/--cp)")->check(CLI::PositiveNumber)->capture_default_str();
  if (const std::optional<int> exit_code = samples::parse_command_line(app, kProgram, argc, argv))
    return exit_code;
  try {
    MG_CHECK(m.n_embd % m.n_head == 0, "--n-embd {} does not divide into --n-head {} heads", m.n_embd, m.n_head);
    if (m.model != "llama" && (m.n_kv_head > 0 || m.intermediate_size > 0))
      throw samples::OptionError("--n-kv-head and --intermediate-size size the Llama: they need --model llama");
    MG_CHECK(o.min_lr <= o.lr, "--min-lr {} is above --lr {}", o.min_lr, o.lr);
    if (o.decay_iters == 0) o.decay_iters = o.iters;
    if (warmup->count() == 0) o.warmup = std::min(o.warmup, o.decay_iters);
    MG_CHECK(o.warmup <= o.decay_iters, "--warmup {} is past --decay-iters {}", o.warmup, o.decay_iters);
    o.device_list = samples::parse_devices(o.devices);
    o.split.interleaved = schedule == "interleaved";
    o.precision = samples::parse_precision(precision);
    if (o.split.micro_batches == 0) o.split.micro_batches = o.split.pp;
    if (!o.scale_log.empty() && o.precision != samples::Precision::F16Mixed)
      throw samples::OptionError("--scale-log records 16-mixed's loss scale: it needs --precision 16-mixed");
    if (o.fsdp_mp_policy && (o.split.zero != 3 || (o.precision != samples::Precision::BF16Mixed &&
                                                   o.precision != samples::Precision::F16Mixed)))
      throw samples::OptionError(fmt::format("--fsdp-mp-policy is FSDP's way of a mixed precision: it needs --zero 3 and "
                                             "--precision bf16-mixed or 16-mixed (got --zero {}, --precision {})",
                                             o.split.zero, precision));
    if (o.memory_blocks && (o.device_list.size() != 1 || !o.device_list.front().is_cpu()))
      throw samples::OptionError("--memory-blocks reads the CPU allocator: it needs one CPU device a rank (--devices cpu)");
    if (o.sample_only && o.resume.empty())
      throw samples::OptionError("--sample-only samples from a checkpoint: it needs --resume CHECKPOINT");
    if (o.sample_only && o.sample_chars == 0)
      throw samples::OptionError("--sample-only with --sample-chars 0 has nothing to do");
    if (o.sample_only && (o.device_list.size() > 1 || dp->count() + tp->count() + pp->count() + cp->count() +
                                                          sp->count() + zero->count() > 0))
      throw samples::OptionError("--sample-only runs on one device: --devices with one device, no --dp/--tp/--pp/--cp/--zero");
    if (o.split.pp == 1 && sched->count() + mb->count() + chunks->count() > 0)
      throw samples::OptionError("--schedule, --micro-batches and --model-chunks are the pipeline's: they need --pp 2 or more");
    if (dp->count() + tp->count() + pp->count() + cp->count() + sp->count() + zero->count() > 0) {
      samples::check_split(o.split, o.batch_size, m.block_size, m.dropout, o.weight_decay);
      // --dp 1 alone is the single-device run; under a launcher a job of one rank.
      o.distributed = o.split.ranks() > 1 || parallel::in_launched_job();
    }
    // Under a split rank 0 alone writes the files (the others would see its checkpoint's
    // temporary file as a stale one).
    const bool elsewhere = o.distributed && parallel::LaunchEnvironment::from_environment().rank != 0;
    samples::check_file_flags(kProgram, {{"--save", o.save, elsewhere, ""}, {"--metrics", o.metrics, elsewhere, ""},
                                         {"--plot", o.plot, elsewhere, ""}, {"--scale-log", o.scale_log, elsewhere, ""}},
                              {{"--resume", o.resume, false, ""}});
  } catch (const Error& e) {
    return samples::report_error(kProgram, samples::OptionError(e.what()));
  }
  return std::nullopt;
}

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// --sample-chars characters from `model`, decoded with `tokenizer`, printed. The sample
// starts after a newline, where a fortune starts (token 0 if the corpus has none).
void print_sample(const Options& o, samples::LanguageModel& model, const data::CharTokenizer& tokenizer, Device device,
                  const samples::MixedPrecision& amp) {
  model.module()->eval();
  const auto region = amp.autocast();  // nanoGPT's sample.py samples under the training's autocast
  Generator sampler(o.seed);
  const std::vector<uint8_t>& chars = tokenizer.vocab();
  const auto newline = std::find(chars.begin(), chars.end(), '\n');
  const int64_t first = newline == chars.end() ? 0 : newline - chars.begin();
  const Tensor start = from_vector(std::vector<int64_t>{first}, Shape{1, 1});
  const Tensor out = model.generate(ops::copy_to(start, device), o.sample_chars, o.temperature, o.top_k, &sampler);
  fmt::print("---- a sample (temperature {}{}) ----\n{}\n", o.temperature,
             o.top_k > 0 ? fmt::format(", top_k {}", o.top_k) : "",
             tokenizer.decode(ops::copy_to(out, Device::cpu()).to_vector<int64_t>()));
}

// The corpus as tokens: from --tokens when that file exists, else encoded from the
// fortune files (and written to --tokens when given).
data::TokenFile load_tokens(const Options& o) {
  if (!o.tokens.empty() && std::filesystem::exists(o.tokens)) return data::read_token_file(o.tokens);
  const std::string text = data::read_fortunes(o.data_dir);
  data::CharTokenizer tokenizer = data::CharTokenizer::from_text(text);
  std::vector<uint8_t> tokens = tokenizer.encode(text);
  if (!o.tokens.empty()) data::write_token_file(o.tokens, tokenizer, tokens);
  return data::TokenFile{std::move(tokenizer), std::move(tokens)};
}

// A checkpoint's model: "model" (gpt when absent: written before --model) and its config,
// against what the flags make. mg::Error naming the flags to pass.
void check_checkpoint_model(const nn::Checkpoint& ck, const samples::LanguageModel& model, const std::string& path) {
  const auto kind = ck.metadata.find("model");
  const std::string written = kind == ck.metadata.end() ? "gpt" : kind->second;
  MG_CHECK(written == model.kind(), "--resume {}: written by --model {}, not {}; pass --model {}", path, written,
           model.kind(), written);
  const auto config = ck.metadata.find(model.config_key());
  MG_CHECK(config != ck.metadata.end(), "--resume {}: not a train_gpt checkpoint (no '{}')", path, model.config_key());
  MG_CHECK(config->second == model.config_json(),
           "--resume {}: the checkpoint's model is {}, but the flags make {}; pass the flags it "
           "was trained with", path, config->second, model.config_json());
}

struct Run {
  Options options;
  samples::DistributedRun dist;             // --dp/--tp/--cp: this rank of the job
  std::unique_ptr<samples::SplitModel> split;  // ... and its part of the model; null otherwise
  std::unique_ptr<samples::LanguageModel> model;
  nn::ModulePtr forward;  // the model, or a DataParallel over it
  std::unique_ptr<optim::Optimizer> optimizer;  // AdamW, or MasterWeights over it (bf16-true)
  // --zero 1|2: the sharded optimizers (support/split_model.h), in place of `optimizer`.
  std::vector<std::unique_ptr<optim::Optimizer>> zero;
  std::vector<optim::Optimizer*> optimizers;  // the step's: `optimizer` or the `zero` pair
  data::TokenSplits splits;
  const data::CharTokenizer* tokenizer = nullptr;  // the corpus's, written into checkpoints
  std::vector<samples::LossPoint> history;
  std::string metrics_csv = "step,train_loss,val_loss,lr,seconds\n";
  Device device = Device::cpu();
  std::unique_ptr<samples::MixedPrecision> amp;  // --precision
  // The region a forward runs under: --precision's autocast, or none when FSDP's
  // MixedPrecisionPolicy casts instead (--fsdp-mp-policy).
  std::unique_ptr<AutocastGuard> autocast(bool cache_enabled = true) const {
    return options.fsdp_mp_policy ? nullptr : amp->autocast(cache_enabled);
  }
  // What the clip reads: the gradients the optimizers step (float32 masters under bf16-true).
  std::vector<Tensor> clipped;
  int64_t skipped_steps = 0;  // 16-mixed: steps the scaler skipped
};

// Every rank calls it (under a split the single-device layout is gathered first: the same
// file under every split); rank 0 writes.
void save_checkpoint(Run& run, int64_t step) {
  const nn::TensorDict model = run.split ? run.split->model_state_dict() : run.model->state_dict();
  const optim::TensorDict optim = run.split ? run.split->optimizer_state_dict(run.optimizers)
                                            : run.optimizer->state_dict();
  const std::vector<Generator::State> generators =
      run.split ? run.split->dp_generator_states() : std::vector<Generator::State>{default_generator().state()};
  if (run.dist.rank != 0) return;
  nn::Checkpoint ck;
  ck.put("model.", model);
  ck.put("optim.", optim);
  ck.put("scaler.", run.amp->state_dict());
  const Generator::State gen = generators[0];
  std::string dp_generators;  // "seed:offset" of each dp rank, comma-separated
  for (const Generator::State& g : generators)
    dp_generators += fmt::format("{}{}:{}", dp_generators.empty() ? "" : ",", g.seed, g.offset);
  ck.metadata = {{"step", std::to_string(step)},
                 {"model", run.model->kind()},
                 {run.model->config_key(), run.model->config_json()},
                 {"seed", std::to_string(run.options.seed)},
                 {"generator_seed", std::to_string(gen.seed)},
                 {"generator_offset", std::to_string(gen.offset)},
                 {"dp_generators", dp_generators},
                 {"metrics", run.metrics_csv},
                 {"precision", run.amp->name()},
                 {samples::kVocabularyKey, samples::vocabulary_metadata(*run.tokenizer)}};
  nn::save_tensors(ck, run.options.save);
}

// The metadata's "dp_generators" ("seed:offset" per dp rank, comma-separated), checked.
std::vector<Generator::State> parse_generators(const std::string& text, const std::string& path) {
  std::vector<Generator::State> states;
  size_t at = 0;
  while (at <= text.size()) {
    const size_t end = std::min(text.find(',', at), text.size());
    const std::string item = text.substr(at, end - at);
    const size_t colon = item.find(':');
    const auto number = [&](const std::string& digits) {
      MG_CHECK(!digits.empty() && digits.size() <= 20 && digits.find_first_not_of("0123456789") == std::string::npos,
               "--resume {}: dp_generators '{}' is not a list of seed:offset", path, text);
      try {
        return static_cast<uint64_t>(std::stoull(digits));
      } catch (const std::out_of_range&) {
        MG_FAIL("--resume {}: dp_generators '{}' holds a number past 64 bits", path, text);
      }
    };
    MG_CHECK(colon != std::string::npos, "--resume {}: dp_generators '{}' is not a list of seed:offset", path, text);
    states.push_back({number(item.substr(0, colon)), number(item.substr(colon + 1))});
    at = end + 1;
  }
  return states;
}

// Loads --resume into the model, the optimizer and the generator; returns its step. Every
// rank reads the file (under --tp, --pp and --zero each takes its part of the model and
// of the state).
int64_t load_checkpoint(Run& run) {
  const std::string& path = run.options.resume;
  const nn::Checkpoint ck = nn::load_tensors(path);
  const auto meta = [&](const char* key) {
    const auto it = ck.metadata.find(key);
    MG_CHECK(it != ck.metadata.end(), "--resume {}: not a train_gpt checkpoint (no '{}')", path, key);
    return it->second;
  };
  // Its vocabulary first: a corpus of other characters also changes vocab_size, and this
  // says why. (A checkpoint from before the vocabulary was stored has none to check.)
  if (const auto vocab = ck.metadata.find(samples::kVocabularyKey); vocab != ck.metadata.end())
    samples::check_same_vocabulary(samples::tokenizer_from_metadata(vocab->second, "--resume " + path),
                                   *run.tokenizer, "--resume " + path);
  check_checkpoint_model(ck, *run.model, path);
  MG_CHECK(meta("seed") == std::to_string(run.options.seed),
           "--resume {}: written with --seed {}, not {}", path, meta("seed"), run.options.seed);
  // A checkpoint of another precision holds other tensors (bfloat16 weights and masters, a
  // scaler): said so rather than misread. One written before --precision is 32-true.
  const auto precision = ck.metadata.find("precision");
  const std::string written = precision == ck.metadata.end() ? "32-true" : precision->second;
  MG_CHECK(written == run.amp->name(), "--resume {}: written with --precision {}, not {}; pass --precision {}",
           path, written, run.amp->name(), written);
  const nn::TensorDict model_state = ck.get("model."), optim_state = ck.get("optim.");
  if (run.split) {  // each rank its part, every tensor checked against the single-device shapes first
    run.split->load_model_state_dict(model_state, path);
    run.split->load_optimizer_state_dict(run.optimizers, optim_state, path);
  } else {  // both checked before either is loaded
    run.model->check_state_dict(model_state, path);
    run.optimizer->check_state_dict(optim_state, path);
    run.optimizer->load_state_dict(optim_state, path);
    run.model->load_state_dict(model_state, path);
  }
  run.amp->load_state_dict(ck.get("scaler."), path);
  const Generator::State rank0{std::stoull(meta("generator_seed")), std::stoull(meta("generator_offset"))};
  if (run.split)  // each dp rank its own (a checkpoint from before they were kept: rank 0's alone)
    run.split->set_dp_generator_state(ck.metadata.count("dp_generators") ? parse_generators(meta("dp_generators"), path)
                                                                         : std::vector<Generator::State>{rank0});
  else
    default_generator().set_state(rank0);
  run.metrics_csv = meta("metrics");
  return std::stoll(meta("step"));
}

// A 0-dim loss as a float: bf16-true's losses are bfloat16.
float as_float(const Tensor& loss) { return ops::to_dtype(loss, DType::Float32).item<float>(); }

// nanoGPT's estimate_loss: the mean loss over eval_iters batches of each split, in eval
// mode and without gradients. The windows are the same at every evaluation.
std::pair<double, double> estimate_loss(Run& run) {
  NoGradGuard no_grad;
  if (run.split) run.split->set_training(false);
  else run.model->module()->eval();
  const int64_t n = run.options.eval_iters;
  const data::TokenWindows* splits[2] = {run.splits.train.get(), run.splits.val.get()};
  std::vector<float> losses;  // each batch's mean loss, the train split's then the val split's
  for (int s = 0; s < 2; ++s) {
    for (int64_t k = 0; k < n; ++k) {
      const data::Batch b = splits[s]->get_batch(data::random_windows(
          run.options.batch_size, splits[s]->size(), run.options.seed ^ 0x5EEDE7A1u, k)).to(run.device);
      // The training step's precision (the pipeline's micro-batches without the cast cache).
      const auto region = run.autocast(!(run.split && run.split->pipelined()));
      losses.push_back(run.split && run.split->pipelined()
                           ? static_cast<float>(run.split->eval_loss(b.data, b.target))
                           : as_float(run.split ? run.split->loss_share(b.data, b.target)
                                                : run.model->loss(run.forward->forward(b.data), b.target)));
    }
  }
  if (run.split && !run.split->pipelined()) {  // the dp ranks' shares of each batch's mean, summed
    Tensor shares = ops::copy_to(from_vector(losses, Shape{2 * n}), run.device);
    run.split->sum_over_dp(shares);
    losses = ops::copy_to(shares, Device::cpu()).to_vector<float>();
  }
  double means[2] = {0, 0};
  for (int s = 0; s < 2; ++s) {
    for (int64_t k = 0; k < n; ++k) means[s] += losses[static_cast<size_t>(s * n + k)];
    means[s] /= static_cast<double>(n);
  }
  if (run.split) run.split->set_training(true);
  else run.model->module()->train();
  return {means[0], means[1]};
}

// --sample-only: the checkpoint's model and vocabulary, and a sample; no data, no step. The
// model flags must be those it was trained with (as for --resume); vocab_size is its own.
int sample_only(const Options& o) {
  const nn::Checkpoint ck = nn::load_tensors(o.resume);
  const auto meta = ck.metadata.find(samples::kVocabularyKey);
  MG_CHECK(meta != ck.metadata.end(),
           "--sample-only: {} holds no vocabulary (a checkpoint written before train_gpt stored "
           "it, or not train_gpt's); sample at the end of a --resume run on the text it was "
           "trained on instead",
           o.resume);
  const data::CharTokenizer tokenizer = samples::tokenizer_from_metadata(meta->second, o.resume);
  const Device device = o.device_list.front();
  manual_seed(o.seed);
  samples::LanguageModel model(o.model, tokenizer.vocab_size());
  check_checkpoint_model(ck, model, o.resume);
  const nn::TensorDict state = ck.get("model.");
  // A bf16-true checkpoint's weights are bfloat16: the model takes their dtype.
  if (!state.empty()) model.module()->to(state.begin()->second.dtype());
  model.check_state_dict(state, o.resume);
  model.load_state_dict(state, o.resume);
  model.module()->to(device);
  const auto step = ck.metadata.find("step");
  fmt::print("{}; from {} (step {}), a vocabulary of {}\n", model.str(), o.resume,
             step == ck.metadata.end() ? "?" : step->second, samples::describe_vocabulary(tokenizer));
  print_sample(o, model, tokenizer, device, samples::MixedPrecision(samples::Precision::True32, device));
  return 0;
}

// A collective: a fresh single-device model holding the split's trained weights (for the
// sample; on every rank, on this rank's device).
std::unique_ptr<samples::LanguageModel> whole_model(Run& run) {
  const nn::TensorDict state = run.split->model_state_dict();
  // Building a model draws its initial weights: the generator is left where training left
  // it, so the sample draws what the single-device run's does.
  const Generator::State generator = default_generator().state();
  auto model = std::make_unique<samples::LanguageModel>(run.options.model, run.tokenizer->vocab_size());
  default_generator().set_state(generator);
  model->module()->to(state.begin()->second.dtype());  // bf16-true's weights are bfloat16
  model->load_state_dict(state, "the gathered model");
  model->module()->to(run.device);
  return model;
}

int train(Options options) {
  Run run;
  run.options = options;
  Options& o = run.options;
  if (o.distributed) run.dist = samples::join_job(o.dist_timeout, o.device_list);
  const bool rank0 = run.dist.rank == 0;
  run.device = o.device_list.front();
  if (o.memory_blocks) cpu_record_memory_history(true);  // from the start: the model's blocks counted too
  manual_seed(o.seed);

  const auto load_start = Clock::now();
  const data::TokenFile corpus = load_tokens(o);
  run.tokenizer = &corpus.tokenizer;
  const int64_t vocab = corpus.tokenizer.vocab_size();
  const auto n_tokens = static_cast<int64_t>(corpus.tokens.size());
  run.splits = data::split_tokens(corpus.tokens, o.model.block_size);

  run.model = std::make_unique<samples::LanguageModel>(o.model, vocab);
  const nn::ModulePtr module = run.model->module();
  module->to(run.device);
  // bf16-true: the weights themselves in bfloat16 (the masters are made from them below).
  if (o.precision == samples::Precision::BF16True) module->to(DType::BFloat16);
  // Counted before a split cuts the model in place: nanoGPT's count, and every parameter.
  const int64_t model_parameters = run.model->num_parameters();
  int64_t all_parameters = 0;
  for (const Tensor& p : module->parameters()) all_parameters += p.numel();
  // --recompute: each block's activations recomputed in backward (under --pp the
  // pipeline's own checkpointing, set in SplitModel).
  if (o.split.recompute && o.split.pp == 1) run.model->split_spec().recompute();
  run.forward = module;
  if (o.device_list.size() > 1) run.forward = std::make_shared<parallel::DataParallel>(module, o.device_list);
  parallel::FSDPOptions fsdp;
  if (o.fsdp_mp_policy)  // torchtitan's: compute in the 16-bit dtype, reduce in float32, float32 logits for the loss
    fsdp.mp_policy = {samples::MixedPrecision(o.precision, run.device).autocast_dtype(), DType::Float32, DType::Float32};
  if (o.distributed)
    run.split = std::make_unique<samples::SplitModel>(run.model->split_spec(), o.split, run.dist, o.seed, fsdp);
  const std::vector<Tensor> trained = run.split ? run.split->parameters() : module->parameters();
  // nanoGPT's configure_optimizers: weight decay on the matmul and embedding weights only;
  // shakespeare_char's betas (0.9, 0.99), as the batches are small.
  const auto adamw = [&](std::vector<Tensor> params) -> std::unique_ptr<optim::Optimizer> {
    return std::make_unique<optim::AdamW>(optim::weight_decay_groups(
        params, optim::AdamWOptions(o.lr).betas({0.9, 0.99}).weight_decay(o.weight_decay)));
  };
  // --precision: 16-mixed's scaler skips a step when any rank found an inf or NaN.
  amp::FoundInfReducer agree;
  if (run.split) agree = [split = run.split.get()](Tensor& found_inf) { split->reduce_found_inf(found_inf); };
  run.amp = std::make_unique<samples::MixedPrecision>(o.precision, run.device, agree, o.growth_interval);
  if (o.split.zero == 1 || o.split.zero == 2)
    run.zero = run.split->make_zero_optimizers(optim::AdamWOptions(o.lr).betas({0.9, 0.99}).weight_decay(o.weight_decay),
                                               o.precision == samples::Precision::BF16True);
  else
    run.optimizer = run.amp->wrap_optimizer(trained, adamw);  // MasterWeights(AdamW) under bf16-true
  if (run.split && run.optimizer && o.precision == samples::Precision::BF16True)
    run.split->place_masters(dynamic_cast<const optim::MasterWeights&>(*run.optimizer));
  if (run.optimizer) run.optimizers.push_back(run.optimizer.get());
  for (const auto& z : run.zero) run.optimizers.push_back(z.get());
  // The clip's tensors: the model's gradients alone, what the optimizers step under a split
  // (ZeRO-1's shards once prepared; the placements count each element once), and the
  // float32 masters under bf16-true.
  if (run.split || o.precision == samples::Precision::BF16True)
    for (const optim::Optimizer* opt : run.optimizers)
      run.clipped.insert(run.clipped.end(), opt->parameters().begin(), opt->parameters().end());
  else
    run.clipped = module->parameters();
  const optim::WarmupCosine schedule(o.lr, o.min_lr, o.warmup, o.decay_iters);

  int64_t step = 0;
  if (!o.resume.empty()) step = load_checkpoint(run);
  if (rank0) {
    fmt::print("fortunes: {} characters, a vocabulary of {}; {} to train on, {} to validate ({:.1f} s)\n",
               n_tokens, vocab, run.splits.train->token_count(), run.splits.val->token_count(),
               seconds_since(load_start));
    fmt::print("{}; {:.2f}M parameters on {}\n", run.model->str(),
               static_cast<double>(model_parameters) / 1e6, samples::devices_str(o.device_list));
    fmt::print("AdamW lr {} (warmup {}, cosine to {} at step {}), weight decay {}; {} steps of {} x {} x {} tokens{}\n",
               o.lr, o.warmup, o.min_lr, o.decay_iters, o.weight_decay, o.iters, o.grad_accum,
               o.batch_size, o.model.block_size, step > 0 ? fmt::format(", resumed at step {}", step) : "");
    if (o.fsdp_mp_policy)
      fmt::print("precision {}: float32 shards, FSDP's MixedPrecisionPolicy (param_dtype {}, reduce_dtype float32, "
                 "float32 logits; no autocast)\n", run.amp->name(), dtype_name(*run.amp->autocast_dtype()));
    else
      fmt::print("precision {}\n", run.amp->str());
    if (run.split) {
      // Counted with the position embedding (num_parameters(), nanoGPT's count, leaves it out).
      int64_t held = 0;
      for (const Tensor& p : trained) held += p.numel();
      const int64_t whole = all_parameters;
      fmt::print("split: {} over {} ranks ({}); {} parameters on each rank (of {})\n",
                 o.split.str(), run.dist.world_size, run.dist.group->backend_name(), held, whole);
    }
    std::fflush(stdout);
  }

  // Tokens/s and MFU (support/throughput.h): the whole job's tokens against every device's peak.
  const std::unique_ptr<plan::ModelArithmetic> arithmetic = run.model->arithmetic();
  const samples::ThroughputMeter meter(arithmetic->flops_per_token(o.model.block_size), samples::device_peak(run.device, o.precision),
                                       samples::devices_in_job(o.device_list, run.dist.world_size));
  if (rank0) fmt::print("{}\n", meter.describe());

  // The step's optimizer calls: AdamW, or the --zero pair.
  const std::vector<optim::Optimizer*>& optimizers = run.optimizers;
  samples::install_stop_handlers();
  samples::StepTracer tracer(o.trace, run.dist.group);
  const auto run_start = Clock::now();
  const int64_t tokens_per_step = o.grad_accum * o.batch_size * o.model.block_size;
  auto window_start = Clock::now();
  int64_t window_steps = 0;
  double last_loss = 0.0;
  double eval_seconds = 0;  // left out of the rates
  const auto evaluate = [&](int64_t at) {
    const auto eval_start = Clock::now();
    const auto [train_loss, val_loss] = estimate_loss(run);
    if (rank0) {
      fmt::print("step {}: train loss {:.4f}, val loss {:.4f}\n", at, train_loss, val_loss);
      std::fflush(stdout);
      run.history.push_back({static_cast<double>(at), train_loss, val_loss});
      run.metrics_csv += fmt::format("{},{:.6f},{:.6f},{:.6g},{:.2f}\n", at, train_loss, val_loss,
                                     optimizers.front()->lr(), seconds_since(run_start));
      if (!o.metrics.empty()) files::write_atomically("--metrics", o.metrics, run.metrics_csv);
      if (!o.plot.empty()) samples::write_loss_plot(o.plot, run.history, "step", "train_gpt: " + run.model->str());
    }
    if (!o.save.empty()) save_checkpoint(run, at);
    eval_seconds += seconds_since(eval_start);
    window_start = Clock::now();
    window_steps = 0;
  };

  samples::ProgressBar bar("train", o.iters, rank0 && samples::stdout_is_terminal());
  const int64_t first_step = step;
  samples::reset_peak_memory(run.device);  // the training's peak, set-up left out
  for (; step < o.iters; ++step) {
    if (step % o.eval_interval == 0) {
      bar.finish();
      evaluate(step);
    }
    tracer.begin_step(step + 1);
    for (optim::Optimizer* opt : optimizers) {
      opt->set_lr(schedule(step));
      opt->zero_grad();
    }
    // Gradient accumulation: each micro-batch's loss is divided by their number, so the
    // summed gradients are those of the mean loss over all of them.
    Tensor step_loss;
    for (int64_t micro = 0; micro < o.grad_accum; ++micro) {
      const data::Batch b = run.splits.train->get_batch(data::random_windows(
          o.batch_size, run.splits.train->size(), o.seed, step * o.grad_accum + micro)).to(run.device);
      Tensor scaled;
      if (run.split && run.split->pipelined()) {  // forward and backward in the pipeline
        const auto region = run.autocast(false);  // over every micro-batch's backward
        scaled = run.split->pipeline_step(b.data, b.target, static_cast<double>(b.data.numel() * o.grad_accum),
                                          run.amp->loss_scale());
      } else {
        Tensor loss;
        {  // the forward and the loss under --precision's autocast; backward outside, as torch's
          const auto region = run.autocast();
          loss = run.split ? run.split->loss_share(b.data, b.target)
                           : run.model->loss(run.forward->forward(b.data), b.target);
        }
        scaled = loss * (1.0 / static_cast<double>(o.grad_accum));
        // --zero 2|3 average the gradients over dp: the share times dp (backward_scale);
        // 16-mixed's loss scale multiplies what backward starts from.
        if (run.split && run.split->backward_scale() != 1.0) run.amp->scale(scaled * run.split->backward_scale()).backward();
        else run.amp->scale(scaled).backward();
      }
      const Tensor part = ops::to_dtype(scaled.detach(), DType::Float32);  // bf16-true's is bfloat16
      step_loss = micro == 0 ? part : step_loss + part;
    }
    if (run.split) run.split->reduce_gradients(step_loss);  // now the whole batch's
    // The gradients the optimizers step, made current (masters, ZeRO-1's shards) and, under
    // 16-mixed, divided by the loss scale, an inf or NaN on any rank noted.
    run.amp->unscale_(optimizers);
    if (o.grad_clip > 0) {
      if (run.split) run.split->clip_grad_norm_(run.clipped, o.grad_clip);
      else nn::utils::clip_grad_norm_(run.clipped, o.grad_clip);
    }
    if (!run.amp->step(optimizers)) ++run.skipped_steps;  // 16-mixed: skipped after an inf or NaN
    tracer.end_step();
    ++window_steps;
    // Every rank checks every step under the split (they hold the same loss and must
    // agree to stop); alone, only when the bar shows it (a device sync).
    if (bar.due(step + 1) || step + 1 == o.iters || run.split) {
      last_loss = step_loss.item<float>();
      MG_CHECK(std::isfinite(last_loss), "the loss is {} at step {}", last_loss, step + 1);
      bar.update(step + 1, fmt::format("loss {:.4f}  lr {:.2e}  {}", last_loss, optimizers.front()->lr(),
                                       meter.rate(static_cast<double>(window_steps * tokens_per_step),
                                                  seconds_since(window_start))));
      window_start = Clock::now();
      window_steps = 0;
    }
    if (const int signo = samples::agreed_stop_signal(run.dist, run.device)) {
      bar.finish();
      if (!o.save.empty()) save_checkpoint(run, step + 1);
      if (rank0) fmt::print("stopped by {} after step {}{}\n", samples::signal_name(signo), step + 1,
                 o.save.empty() ? "" : fmt::format("; --resume {} continues", o.save));
      return 128 + signo;
    }
  }
  bar.finish();
  tracer.finish();
  const size_t peak_bytes = samples::max_memory_allocated(run.device);
  const std::vector<LiveBlocks> blocks_at_peak = o.memory_blocks ? cpu_live_blocks_at_peak() : std::vector<LiveBlocks>{};
  evaluate(o.iters);
  const double seconds = seconds_since(run_start);
  if (rank0) fmt::print("trained {} steps in {:.1f} s: {}\n", o.iters, seconds,
             meter.rate(static_cast<double>((o.iters - first_step) * tokens_per_step), seconds - eval_seconds));
  if (o.device_list.size() == 1)  // every rank its own line (DataParallel's replicas share one count)
    fmt::print("{}\n", samples::memory_report(peak_bytes, run.dist.rank, run.split ? &run.split->mesh() : nullptr,
                                              *arithmetic, o.split, o.batch_size, o.model.block_size, o.precision,
                                              o.fsdp_mp_policy));
  if (o.memory_blocks) fmt::print("{}", samples::live_blocks_report(run.dist.rank, blocks_at_peak));
  if (rank0 && run.amp->scaling())
    fmt::print("16-mixed: {} step{} skipped for an inf or NaN gradient; loss scale {}\n", run.skipped_steps,
               run.skipped_steps == 1 ? "" : "s", run.amp->loss_scale());
  if (rank0 && !o.scale_log.empty()) run.amp->write_scale_history("--scale-log", o.scale_log, o.iters - static_cast<int64_t>(run.amp->scale_history().size()));

  // Under a split the whole model is gathered first (tp shards, pp stages, FSDP's shards).
  const bool sample = o.sample_chars > 0;
  if (run.split && sample) run.model = whole_model(run);  // every rank: the whole model gathered
  if (sample && rank0) print_sample(o, *run.model, corpus.tokenizer, run.device, *run.amp);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options options;
  if (const std::optional<int> exit_code = parse_options(argc, argv, options)) return *exit_code;
  try {
    return options.sample_only ? sample_only(options) : train(std::move(options));
  } catch (const std::exception& e) {
    return samples::report_error(kProgram, e);
  }
}
