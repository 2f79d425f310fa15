// train_fashion_mnist: an MLP classifier trained on Fashion-MNIST with minigrad.
//
//   build/bin/train_fashion_mnist                       # the defaults: >= 88% test accuracy
//   build/bin/train_fashion_mnist --epochs 3 --hidden 512 --metrics run.csv --plot run.svg
//   build/bin/train_fashion_mnist --devices cpu,cpu     # DataParallel over two CPU replicas
//   build/bin/train_fashion_mnist --optimizer adamw     # AdamW (lr 1e-3, weight decay 1e-2)
//   build/bin/train_fashion_mnist --pipeline 2 --chunks 4 --devices cpu,cpu   # a pipeline
//   build/bin/train_fashion_mnist --save ck.safetensors ...; ... --resume ck.safetensors
//   build/bin/train_fashion_mnist --devices cpu,cpu --trace t.json  # 3 steps for Perfetto
//   build/bin/minigrad-run --nproc-per-node 2 build/bin/train_fashion_mnist --distributed
//   build/bin/minigrad-run --nproc-per-node 2 build/bin/train_fashion_mnist --distributed
//       --zero 3 --optimizer adamw           # sharded (docs/sharded-data-parallel.md)
//   build/bin/train_fashion_mnist --devices cpu,cpu --tensor-parallel 2  # Megatron's split
//   build/bin/minigrad-run --nproc-per-node 4 build/bin/train_fashion_mnist --distributed
//       --tensor-parallel 2                             # 2 x 2: data parallel over TP pairs
//
// The loop is the one every PyTorch user knows: for each epoch, shuffled batches from a
// DataLoader; forward, cross-entropy, zero_grad, backward, optimizer step; then the test
// loss and accuracy with autograd off (samples/train_minimal.cpp is that loop and nothing
// else). What this program adds to it lives in samples/support/, one piece per file:
//
//   train_options        every flag, and the learning-rate schedule
//   devices              --devices: cpu, GPU ids, cpu,cpu
//   distributed_run      --distributed: joining the job, agreeing over the ranks
//   training_checkpoint  --save / --resume: model, optimizer, where the run stands
//   run_files            the paths of --save, --metrics, --plot, --resume, checked first
//   stop_signal          Ctrl-C / SIGTERM: stop after the step in progress, checkpoint
//   running_loss         the epoch's training loss, kept on the device
//   evaluate             the test loss and accuracy
//   training_reports     --metrics (CSV) and --plot (SVG); progress: the bar
//   trace                --trace: a few steps as a Chrome trace (Perfetto), per rank
//   mlp_memory_report    the last line: the training steps' memory peak beside the MLP's
//                        formulas (plan/mlp_formulas.h); --memory-blocks: what was live
//
// A run stopped by a signal leaves a checkpoint of exactly where it stands, mid-epoch
// included; --resume continues from it to the same parameters, bit for bit on the CPU, as
// a run that was never stopped. A NaN or infinite loss stops the run naming the step;
// --detect-anomaly then names the op whose backward first produced a non-finite gradient.
//
// The CPU matmuls run on OpenBLAS, which uses every core by default; on a machine busy
// with other work, OPENBLAS_NUM_THREADS=1 is often faster (bench/train_fashion_mnist.md).
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <minigrad/autograd/anomaly_mode.h>
#include <minigrad/autograd/functions.h>
#include <minigrad/core/allocator.h>
#include <minigrad/core/generator.h>
#include <minigrad/core/ops.h>
#include <minigrad/core/profiler.h>
#include <minigrad/core/tensor.h>
#include <minigrad/data/dataloader.h>
#include <minigrad/data/distributed_sampler.h>
#include <minigrad/data/fashion_mnist.h>
#include <minigrad/nn/layers.h>
#include <minigrad/nn/optim/adam.h>
#include <minigrad/nn/optim/sgd.h>
#include <minigrad/parallel/data_parallel.h>
#include <minigrad/parallel/ddp/distributed_data_parallel.h>
#include <minigrad/parallel/pipeline/pipe.h>
#include <minigrad/parallel/sharded/fully_sharded_data_parallel.h>
#include <minigrad/parallel/sharded/zero_redundancy_optimizer.h>
#include <minigrad/parallel/tensor_parallel/layers.h>
#include <minigrad/parallel/tensor_parallel/tensor_parallel.h>
#include "support/command_line.h"
#include "support/devices.h"
#include "support/distributed_run.h"
#include "support/precision.h"
#include "support/evaluate.h"
#include "support/memory_report.h"
#include "support/mlp_memory_report.h"
#include "support/progress.h"
#include "support/run_files.h"
#include "support/running_loss.h"
#include "support/stop_signal.h"
#include "support/trace.h"
#include "support/train_options.h"
#include "support/training_checkpoint.h"
#include "support/training_reports.h"
#include "support/training_state.h"

namespace {

using namespace mg;
using samples::DistributedRun;
using samples::RunningLoss;
using samples::RunPosition;
using samples::TrainOptions;
using Clock = std::chrono::steady_clock;

const char* plural(int64_t n) { return n == 1 ? "" : "s"; }

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// ---- what a run is made of: a new flag changes one of these ----

// 784 -> hidden[0] -> ReLU -> ... -> 10.
std::shared_ptr<nn::Sequential> make_mlp(const std::vector<int64_t>& hidden) {
  auto mlp = std::make_shared<nn::Sequential>();
  int64_t width = data::FashionMNIST::kImageSize * data::FashionMNIST::kImageSize;
  for (int64_t h : hidden) {
    mlp->push_back(std::make_shared<nn::Linear>(width, h));
    mlp->push_back(std::make_shared<nn::ReLU>());
    width = h;
  }
  mlp->push_back(std::make_shared<nn::Linear>(width, data::FashionMNIST::kNumClasses));
  return mlp;
}

// The one place where the model meets the devices; returns what forward runs through.
// The model moves to the first device. One device: the model itself. Several (--devices
// 0,1 or cpu,cpu): DataParallel, which scatters each batch over them, replicates the model
// and sums the replicas' gradients back into `model`'s parameters. --distributed:
// DistributedDataParallel, which averages the gradients over the ranks; with --zero 2 the
// model itself (its optimizer reduces the gradients); with --zero 3
// FullyShardedDataParallel, which keeps only this rank's shards of the parameters.
// --pipeline N: a Pipe, the model's layers cut into N stages, stage s on devices[s] (the
// layers move there). Either way the optimizer and the checkpoints keep working on
// `model` itself.
//
// --tensor-parallel N: the model's Linear layers split in column/row pairs
// (parallelize_mlp), which then hold the parameters that train (the optimizer takes
// `net`'s parameters); `model` is only where they were cut from. In one process:
// TensorParallel, a thread per device. --distributed: this rank's shard, its collectives
// in its tensor-parallel group, inside DistributedDataParallel over the data-parallel
// group when there is one.
nn::ModulePtr make_model_wrapper(const TrainOptions& options, const nn::ModulePtr& model,
                                 const std::vector<Device>& devices, const DistributedRun& dist) {
  model->to(devices.front());
  // --precision bf16-true: the weights themselves in bfloat16 (their float32 masters are the
  // optimizer's, make_optimizer).
  if (options.precision == "bf16-true") model->to(DType::BFloat16);
  if (options.tensor_parallel > 1) {
    const auto& mlp = static_cast<const nn::Sequential&>(*model);
    if (!options.distributed) return std::make_shared<parallel::TensorParallel>(mlp, devices);
    nn::ModulePtr shard =
        parallel::parallelize_mlp(mlp, parallel::tensor_parallel_group(dist.tensor_group));
    if (!dist.data_group) return shard;
    return std::make_shared<parallel::DistributedDataParallel>(shard, dist.data_group);
  }
  if (options.distributed) {
    if (options.zero == 2) return model;
    if (options.zero == 3) return std::make_shared<parallel::FullyShardedDataParallel>(model, dist.group);
    return std::make_shared<parallel::DistributedDataParallel>(model, dist.group);
  }
  if (options.pipeline > 0) {
    parallel::PipeOptions pipe_options;
    pipe_options.chunks = options.chunks;
    pipe_options.schedule = parallel::parse_schedule(options.schedule);
    return std::make_shared<parallel::Pipe>(model, devices, pipe_options);
  }
  if (devices.size() == 1) return model;
  return std::make_shared<parallel::DataParallel>(model, devices);
}

// --optimizer sgd: SGD with momentum (and an L2 penalty with --weight-decay); adamw:
// AdamW with PyTorch's betas and eps, its weight decay decoupled from the gradient. Over
// what `net` trains: the model's parameters, or under --zero 3 this rank's shards of them;
// --zero 1 and 2 wrap it in a ZeroRedundancyOptimizer, which builds it over this rank's
// shards.
std::unique_ptr<optim::Optimizer> make_optimizer(const TrainOptions& options,
                                                 const nn::Module& net, const nn::Module& model,
                                                 const DistributedRun& dist,
                                                 const samples::MixedPrecision& precision) {
  auto make = [&options](std::vector<Tensor> params) -> std::unique_ptr<optim::Optimizer> {
    if (options.optimizer == "adamw")
      return std::make_unique<optim::AdamW>(
          std::move(params), optim::AdamWOptions(options.lr).weight_decay(options.weight_decay));
    return std::make_unique<optim::SGD>(
        std::move(params),
        optim::SGDOptions(options.lr, options.momentum).weight_decay(options.weight_decay));
  };
  if (options.zero == 1 || options.zero == 2) {
    parallel::ZeroOptions zero;
    zero.stage = options.zero;
    // bf16-true: MasterWeights over this rank's bfloat16 shards (float32 master shards).
    return std::make_unique<parallel::ZeroRedundancyOptimizer>(
        model.parameters(), dist.group,
        [&precision, make](std::vector<Tensor> shards) { return precision.wrap_optimizer(std::move(shards), make); },
        zero);
  }
  return precision.wrap_optimizer(net.parameters(), make);  // MasterWeights under bf16-true
}

// Shuffled per (seed, epoch). Under --distributed each data-parallel rank takes its shard
// of every epoch (DistributedSampler) in its part of the global batch, so the run takes
// the same steps on the same averaged gradients as one process; the ranks of a
// tensor-parallel group take the same shard.
data::DataLoader make_train_loader(const TrainOptions& options,
                                   std::shared_ptr<const data::Dataset> train_set,
                                   const DistributedRun& dist) {
  data::DataLoaderOptions loader_options;
  loader_options.batch_size = options.batch_size;
  loader_options.shuffle = true;
  loader_options.seed = options.seed;
  if (!dist.active() || dist.data_ranks == 1)
    return data::DataLoader(std::move(train_set), loader_options);
  loader_options.shuffle = false;  // the sampler shuffles
  loader_options.batch_size = options.batch_size / dist.data_ranks;
  auto sampler = std::make_shared<data::DistributedSampler>(
      train_set->size(), dist.data_ranks, dist.data_rank, /*shuffle=*/true, options.seed);
  return data::DataLoader(std::move(train_set), std::move(sampler), loader_options);
}

// ---- the run ----

// Everything a training run holds.
struct Run {
  const TrainOptions& options;
  DistributedRun dist;
  Device device;                                // this process's first device
  std::shared_ptr<nn::Sequential> model;        // the parameters that train and are saved
  nn::ModulePtr net;                            // what forward runs through: model or wrapper
  std::unique_ptr<optim::Optimizer> optimizer;  // of net's parameters (or their shards)
  data::DataLoader train_loader, test_loader;
  std::vector<samples::EpochMetrics> history;   // every finished epoch, resumed ones too
  std::unique_ptr<samples::StepTracer> tracer;  // --trace
  std::unique_ptr<samples::MixedPrecision> amp;  // --precision
  int64_t first_step = 1;                       // the first global step this process runs
  std::size_t training_peak = 0;                // the allocator's bytes at the steps' peak
  std::vector<LiveBlocks> blocks_at_peak{};     // --memory-blocks: what was live then
  int64_t total_steps() const { return train_loader.size() * options.epochs; }
  // The model's and the optimizer's state, however --zero spreads them over the ranks.
  samples::TrainingState state() { return {*model, *net, *optimizer}; }
};

// The loss so far of the epoch that `start` stands in: zero, or (a checkpoint written in
// mid-epoch) the sum over every rank, which rank 0 alone carries on.
RunningLoss loss_at(const RunPosition& start, const Run& run) {
  if (start.batches > 0 && run.dist.rank == 0) return {start.loss_sum.to(run.device), start.seen};
  return RunningLoss::zero(run.device);
}

// Every rank calls it (under --zero the state is gathered from all of them); rank 0 writes.
void save_checkpoint(Run& run, const std::string& path, const RunPosition& position) {
  const samples::TrainingState state = run.state();
  const nn::TensorDict model_state = state.model_state();
  const nn::TensorDict optimizer_state = state.optimizer_state();
  if (run.dist.writes_files())
    samples::save_training_checkpoint(path, model_state, optimizer_state, run.options, position,
                                      run.history, *run.amp);
}

// Ranks on machines of their own read --resume from their own disks: one of them holding
// another file would train on, out of step, without a word. Rank 0's digest of what it
// loaded goes to every rank (a sum in which the others put zeros, in 16-bit pieces that
// float32 holds exactly), each compares it with its own, and all learn whether one differs.
void check_ranks_resumed_alike(const Run& run, uint64_t digest) {
  if (!run.dist.active()) return;
  std::vector<float> pieces(4);
  for (int i = 0; i < 4; ++i)
    pieces[static_cast<size_t>(i)] =
        run.dist.rank == 0 ? static_cast<float>((digest >> (16 * i)) & 0xFFFF) : 0.0f;
  Tensor rank0 = from_vector(pieces, {4}).to(run.device);
  samples::sum_over_ranks(run.dist, {rank0});
  const std::vector<float> got = rank0.to(Device::cpu()).to_vector<float>();
  uint64_t theirs = 0;
  for (int i = 0; i < 4; ++i)
    theirs |= static_cast<uint64_t>(got[static_cast<size_t>(i)]) << (16 * i);
  Tensor differ = full({}, theirs != digest ? 1.0 : 0.0, DType::Float32, run.device);
  samples::sum_over_ranks(run.dist, {differ});
  const int count = static_cast<int>(differ.item<float>());
  MG_CHECK(count == 0,
           "--resume {}: {} rank{} loaded a checkpoint whose contents differ from rank 0's{} "
           "(each rank reads the file on its own machine); give every rank the same file. "
           "Stopping before the first step",
           run.options.resume, count, count == 1 ? "" : "s",
           theirs != digest ? fmt::format(", this rank ({}) among them", run.dist.rank) : "");
}

// --resume: the model, the optimizer and the generator as the checkpoint left them, and
// the epochs so far; returns where the run stood. Without --resume, the start.
RunPosition resume(Run& run) {
  const std::string& path = run.options.resume;
  if (path.empty()) return {};
  samples::TrainingState state = run.state();
  const RunPosition position =
      samples::load_training_checkpoint(path, state, run.options, run.history, *run.amp,
                                        run.train_loader.size());
  check_ranks_resumed_alike(run, position.digest);
  if (position.batches == 0)
    fmt::print("resumed from {} after epoch {}\n", path, position.epochs_done);
  else
    fmt::print("resumed from {} in epoch {} after batch {}\n", path, position.epochs_done + 1,
               position.batches);
  return position;
}

// A run stopped by signal `signo` after `global_step`: rank 0 writes the checkpoint of
// `position` (--save, or a fixed name in the current directory) and the reports. Returns
// the exit code, 128 + signo, as a shell reports a process that a signal killed.
int stop_run(Run& run, int signo, const RunPosition& position, int64_t global_step) {
  const std::string path = run.options.save.empty()
                               ? "train_fashion_mnist.interrupted.safetensors"
                               : run.options.save;
  run.tracer->finish();
  if (run.options.tensor_parallel > 1) {  // the shards are not checkpointed
    if (run.dist.writes_files())
      fmt::print("train_fashion_mnist: interrupted by {} after step {}; no checkpoint "
                 "(--tensor-parallel runs do not write one)\n",
                 samples::signal_name(signo), global_step);
    std::fflush(stdout);
    return 128 + signo;
  }
  save_checkpoint(run, path, position);
  if (run.dist.writes_files()) {
    samples::write_training_reports(run.options, run.history);
    const std::string where =
        position.batches > 0
            ? fmt::format("epoch {}, batch {}", position.epochs_done + 1, position.batches)
            : fmt::format("the end of epoch {}", position.epochs_done);
    fmt::print("train_fashion_mnist: interrupted by {} after step {} ({}); checkpoint written "
               "to {}; continue with --resume {}\n",
               samples::signal_name(signo), global_step, where, path, path);
  }
  std::fflush(stdout);
  return 128 + signo;
}

// What to do about a NaN or infinite loss at `global_step`. Before this process's first
// update the learning rate has done nothing yet: the parameters are those of --resume (or
// of the initialisation), so lowering it would not help.
std::string non_finite_loss_advice(const Run& run, int64_t global_step) {
  if (global_step == run.first_step && !run.options.resume.empty())
    return fmt::format(
        "It is the first step after --resume {}, before any update: the checkpoint's "
        "parameters give it (a checkpoint of a run that was already diverging?), not the "
        "learning rate; resume from an earlier checkpoint",
        run.options.resume);
  if (global_step == run.first_step)
    return "It is the first step, before any update: the data or the initial parameters give "
           "it, not the learning rate";
  return fmt::format(
      "Lower the learning rate (--lr {}); --detect-anomaly names the op whose backward first "
      "produces a NaN or an infinity, if one does",
      run.options.lr);
}

// One optimizer step on `batch`, the `global_step`-th of the run (from 1); returns the
// loss. A NaN or infinite loss stops the run before backward and the update, so the
// parameters stay those of the last good step. Reading the loss waits for the device
// once per step, as loss.item() in the usual PyTorch loop does; under --distributed the
// ranks check the sum of their losses, so that all of them stop at the same step.
// A pipeline's step is the Pipe's own (forward and backward interleaved as its schedule
// says): the gradients are made before the loss is checked, and the update waits for it.
Tensor pipeline_step(Run& run, parallel::Pipe& pipe, const data::Batch& batch,
                     int64_t global_step) {
  run.optimizer->zero_grad();
  // Under --precision's autocast without the cast cache: the region spans every
  // micro-batch's backward, and a cached cast would be a node of each one's graph.
  Tensor loss;
  {
    const auto region = run.amp->autocast(false);
    const samples::MixedPrecision& amp = *run.amp;
    loss = pipe.train_step(batch.data, batch.target, [&amp](const Tensor& out, const Tensor& target) {
                 return amp.scale(parallel::cross_entropy_loss(out, target));  // 16-mixed: times S
               }).loss;
  }
  loss = ops::to_dtype(loss, DType::Float32) * (1.0 / run.amp->loss_scale());  // S a power of 2: exact
  const float value = loss.item<float>();
  MG_CHECK(std::isfinite(value), "step {}: the loss is {}; stopping before this step's update. {}",
           global_step, value, non_finite_loss_advice(run, global_step));
  run.amp->unscale_({run.optimizer.get()});
  run.amp->step({run.optimizer.get()});
  // The loss comes out on the last stage's device; the running loss lives on the first.
  return loss.device() == run.device ? loss : loss.to(run.device);
}

Tensor train_step(Run& run, const data::Batch& batch, int64_t global_step) {
  run.optimizer->set_lr(samples::learning_rate(run.options, global_step - 1, run.total_steps()));
  if (auto* pipe = dynamic_cast<parallel::Pipe*>(run.net.get()))
    return pipeline_step(run, *pipe, batch, global_step);
  Tensor loss;
  {
    profiler::Span span("forward");  // in a --trace; backward and the step name themselves
    span.category("forward");
    const auto region = run.amp->autocast();  // --precision: bf16-mixed and 16-mixed
    loss = cross_entropy(run.net->forward(batch.data), batch.target);
  }
  // Read in float32 (bf16-true's loss is bfloat16; the running loss sums float32).
  const Tensor local = ops::to_dtype(loss.detach(), DType::Float32);
  Tensor checked = run.dist.active() ? ops::clone(local) : local;
  samples::sum_over_ranks(run.dist, {checked});
  const float value = checked.item<float>();
  const int64_t per_epoch = run.train_loader.size();
  MG_CHECK(std::isfinite(value),
           "step {} (epoch {}, batch {} of {}): the loss is {}; stopping before this step's "
           "update. {}",
           global_step, (global_step - 1) / per_epoch + 1, (global_step - 1) % per_epoch + 1,
           per_epoch, value, non_finite_loss_advice(run, global_step));
  run.optimizer->zero_grad();
  run.amp->scale(loss).backward();  // 16-mixed: the loss times the scale
  // The optimizer's gradients made current (bf16-true's masters) and, under 16-mixed,
  // unscaled with the ranks agreeing on an inf; then the step (skipped after one) and the
  // scale's update.
  run.amp->unscale_({run.optimizer.get()});
  run.amp->step({run.optimizer.get()});
  return local;
}

// The end of an epoch: the training loss over every rank, the test set, the epoch's line,
// and (rank 0) the reports and the checkpoint.
void end_epoch(Run& run, int epoch, const RunningLoss& running, Clock::time_point start) {
  const RunningLoss total = running.over_ranks(run.dist);
  const double train_seconds = seconds_since(start);
  const double train_loss = total.mean();
  MG_CHECK(std::isfinite(train_loss),
           "epoch {}: the training loss is {}; lower the learning rate (--lr {})", epoch,
           train_loss, run.options.lr);
  samples::EvalResult test;
  {
    const auto region = run.amp->autocast();  // the training's precision
    test = samples::evaluate(*run.net, run.test_loader, run.device, run.amp->param_dtype());
  }
  const double seconds = seconds_since(start);
  run.history.push_back({epoch, train_loss, test.loss, test.accuracy, seconds});
  fmt::print("epoch {:>2}/{}  train_loss {:.4f}  test_loss {:.4f}  test_accuracy {:.2f}%  "
             "{:.2f} s ({:.0f} samples/s)\n",
             epoch, run.options.epochs, train_loss, test.loss, 100.0 * test.accuracy, seconds,
             static_cast<double>(total.seen) / train_seconds);
  std::fflush(stdout);
  if (run.dist.writes_files()) samples::write_training_reports(run.options, run.history);
  if (!run.options.save.empty()) save_checkpoint(run, run.options.save, RunPosition::after_epoch(epoch));
}

// The training steps' high-water mark so far: the peak is reset before each epoch's steps
// and read after them, so the evaluation and the checkpoint between epochs are left out.
void note_training_peak(Run& run) {
  const std::size_t peak = samples::max_memory_allocated(run.device);
  if (peak <= run.training_peak) return;
  run.training_peak = peak;
  if (run.options.memory_blocks) run.blocks_at_peak = cpu_live_blocks_at_peak();
}

// The run as the MLP's formulas see it (support/mlp_memory_report.h).
samples::MLPRun mlp_run(const Run& run, const data::Dataset& train_set, const data::Dataset& test_set) {
  const TrainOptions& o = run.options;
  samples::MLPRun m;
  m.config.hidden = o.hidden;
  m.split.dp = run.dist.active() ? run.dist.data_ranks : 1;
  m.split.tp = o.tensor_parallel;
  m.split.pp = std::max(o.pipeline, 1);
  m.split.zero = o.zero;
  m.split.micro_batches = o.pipeline > 0 ? o.chunks : 0;
  m.pipe_1f1b = o.pipeline > 0 && o.schedule == "1f1b";
  m.devices_in_one_process = run.dist.active() || o.pipeline > 0 ? 1 : static_cast<int>(o.device_list.size());
  switch (run.amp->precision()) {
    case samples::Precision::True32: m.precision = plan::MLPPrecision::True32; break;
    case samples::Precision::BF16Mixed: m.precision = plan::MLPPrecision::BF16Mixed; break;
    case samples::Precision::F16Mixed: m.precision = plan::MLPPrecision::F16Mixed; break;
    case samples::Precision::BF16True: m.precision = plan::MLPPrecision::BF16True; break;
  }
  m.cpu = run.device.is_cpu();
  m.rank_rows = o.batch_size / m.split.dp;
  m.train_images = train_set.size();
  m.test_images = test_set.size();
  m.optimizer = o.optimizer == "adamw" ? plan::MLPOptimizer::AdamW
                : o.momentum > 0         ? plan::MLPOptimizer::SGDMomentum
                                         : plan::MLPOptimizer::SGD;
  m.gloo = run.dist.active() && run.dist.group != nullptr && run.dist.group->backend_name() == "gloo";
  return m;
}

// Trains the epoch that `start` stands in, from its batch (0, or where a checkpoint
// written in mid-epoch stopped), then ends it. Returns 0, or the exit code of a run that
// a signal stopped.
int train_epoch(Run& run, const RunPosition& start) {
  const int epoch = start.epochs_done + 1;
  const Clock::time_point start_time = Clock::now();
  data::DataLoader& loader = run.train_loader;
  loader.set_epoch(epoch - 1);  // the order depends on (seed, epoch) alone
  loader.set_start_batch(start.batches);
  samples::ProgressBar bar(fmt::format("epoch {}/{}", epoch, run.options.epochs), loader.size());
  RunningLoss running = loss_at(start, run);
  int64_t step = start.batches;
  samples::reset_peak_memory(run.device);
  for (const data::Batch& host_batch : loader) {
    data::Batch batch = host_batch.to(run.device);
    batch.data = ops::to_dtype(batch.data, run.amp->param_dtype());  // bf16-true: bfloat16 images
    const int64_t global_step = (epoch - 1) * loader.size() + step + 1;
    run.tracer->begin_step(global_step);
    running.add(train_step(run, batch, global_step), batch.size());
    run.tracer->end_step();
    ++step;
    if (global_step == run.options.stop_after_steps) std::raise(SIGINT);  // tests: a real signal
    if (const int signo = samples::agreed_stop_signal(run.dist, run.device)) {
      bar.finish();
      const RunningLoss total = running.over_ranks(run.dist);
      return stop_run(run, signo, RunPosition{epoch - 1, step, total.seen, total.sum},
                      global_step);
    }
    if (bar.due(step))
      bar.update(step, fmt::format("loss {:.4f}  {:.0f} samples/s", running.mean(),
                                   static_cast<double>(running.seen) / seconds_since(start_time)));
  }
  note_training_peak(run);
  bar.finish();
  end_epoch(run, epoch, running, start_time);
  return 0;
}

void print_setup(const Run& run, const std::vector<Device>& devices,
                 const data::Dataset& train_set, const data::Dataset& test_set) {
  const TrainOptions& o = run.options;
  int64_t parameter_count = 0;
  for (const Tensor& p : run.model->parameters()) parameter_count += p.numel();
  fmt::print("train_fashion_mnist: MLP 784-{}-10 ({} parameters) on {}\n",
             fmt::join(o.hidden, "-"), parameter_count, samples::devices_str(devices));
  if (const auto* pipe = dynamic_cast<const parallel::Pipe*>(run.net.get()))
    fmt::print("pipeline: {} stages of [{}] layers, {} micro-batches per batch, schedule {}, "
               "checkpoint {}\n",
               pipe->num_stages(), fmt::join(pipe->balance(), ", "), o.chunks, o.schedule,
               parallel::checkpoint_name(pipe->options().checkpoint));
  if (run.dist.active()) {
    fmt::print("distributed: rank {} of {} ({}), global batch {} = {} x {} per data-parallel "
               "rank\n",
               run.dist.rank, run.dist.world_size, run.dist.group->backend_name(), o.batch_size,
               run.dist.data_ranks, o.batch_size / run.dist.data_ranks);
    static const char* const kSharding[] = {
        "none (DistributedDataParallel)",
        "ZeRO-1, optimizer state (DistributedDataParallel + ZeroRedundancyOptimizer)",
        "ZeRO-2, optimizer state and gradients (ZeroRedundancyOptimizer)",
        "ZeRO-3, optimizer state, gradients and parameters (FullyShardedDataParallel)"};
    if (o.tensor_parallel == 1) fmt::print("sharded over the ranks: {}\n", kSharding[o.zero]);
  }
  if (o.tensor_parallel > 1) {
    int64_t held = 0;
    for (const Tensor& p : run.optimizer->parameters()) held += p.numel();
    const int64_t per_rank = run.dist.active() ? held : held / o.tensor_parallel;
    fmt::print("tensor parallel: the Linear layers in column/row pairs over {} ranks{}; "
               "{} parameters per rank (of {})\n",
               o.tensor_parallel,
               run.dist.active() ? fmt::format(", data parallel over {}", run.dist.data_ranks)
                                 : fmt::format(" in one process ({})", run.net->extra_repr()),
               per_rank, parameter_count);
  }
  fmt::print("data: {} training and {} test images from {}{}\n", train_set.size(),
             test_set.size(), o.data_dir, o.no_normalize ? "" : " (normalised)");
  fmt::print("{}, batch size {}, {} epoch{}, seed {}\n", samples::optimizer_str(o),
             o.batch_size, o.epochs, plural(o.epochs), o.seed);
  fmt::print("precision {}\n", run.amp->str());
}

// The last line: the final test accuracy, the time per epoch trained in this run (not
// in the run a checkpoint came from), and where the files are.
void print_summary(const Run& run, int start_epoch) {
  const TrainOptions& o = run.options;
  double total_seconds = 0.0;
  int timed_epochs = 0;
  for (const samples::EpochMetrics& m : run.history) {
    if (m.epoch <= start_epoch) continue;
    total_seconds += m.seconds;
    ++timed_epochs;
  }
  const samples::EpochMetrics& last = run.history.back();
  fmt::print("final test accuracy {:.2f}% after {} epoch{} ({:.2f} s per epoch){}{}{}\n",
             100.0 * last.test_accuracy, last.epoch, plural(last.epoch),
             total_seconds / std::max(timed_epochs, 1),
             o.metrics.empty() ? "" : "; metrics in " + o.metrics,
             o.plot.empty() ? "" : "; plot in " + o.plot,
             o.save.empty() ? "" : "; checkpoint in " + o.save);
}

// A trace whose warm-up outlasts the steps left is refused before any training.
void check_trace_fits(const Run& run, const RunPosition& start) {
  const int64_t done =
      static_cast<int64_t>(start.epochs_done) * run.train_loader.size() + start.batches;
  samples::check_trace_fits(run.options.trace, run.total_steps() - done, "training step",
                            "train_fashion_mnist");
}

int run(const TrainOptions& options) {
  std::vector<Device> devices = options.device_list;
  const DistributedRun dist =
      options.distributed
          ? samples::join_distributed_run(options.dist_timeout, options.batch_size,
                                          options.tensor_parallel, devices)
          : DistributedRun{};
  // Before the data loads and anything trains: a path that cannot be used fails now, not
  // when the first epoch is done (or never, as a FIFO given to --resume would).
  samples::check_run_files(options, dist, devices.front());
  // From the start: the data's and the model's blocks are listed too.
  if (options.memory_blocks) cpu_record_memory_history(true);
  data::FashionMNISTOptions data_options;
  data_options.normalize = !options.no_normalize;
  auto train_set =
      std::make_shared<data::FashionMNIST>(options.data_dir, data::Split::Train, data_options);
  auto test_set =
      std::make_shared<data::FashionMNIST>(options.data_dir, data::Split::Test, data_options);

  manual_seed(options.seed);
  const std::shared_ptr<nn::Sequential> model = make_mlp(options.hidden);
  const nn::ModulePtr net = make_model_wrapper(options, model, devices, dist);
  data::DataLoaderOptions test_options;
  test_options.batch_size = 1000;
  Run run{options,
          dist,
          devices.front(),
          model,
          net,
          nullptr,
          make_train_loader(options, train_set, dist),
          data::DataLoader(test_set, test_options),
          {},
          std::make_unique<samples::StepTracer>(options.trace, dist.group),
          nullptr};  // amp: made below, once the run can agree over its ranks
  // --precision: under 16-mixed the GradScaler's skip is agreed by every rank (a sum of
  // their found-inf flags), so that no replica steps alone.
  amp::FoundInfReducer agree;
  if (dist.active()) agree = [&run](Tensor& found_inf) { samples::sum_over_ranks(run.dist, {found_inf}); };
  run.amp = std::make_unique<samples::MixedPrecision>(samples::parse_precision(options.precision), run.device, agree);
  run.optimizer = make_optimizer(options, *run.net, *model, dist, *run.amp);
  print_setup(run, devices, *train_set, *test_set);
  const RunPosition resumed = resume(run);
  run.first_step =
      static_cast<int64_t>(resumed.epochs_done) * run.train_loader.size() + resumed.batches + 1;
  check_trace_fits(run, resumed);
  std::optional<DetectAnomalyGuard> detect_anomaly;
  if (options.detect_anomaly) {
    detect_anomaly.emplace();
    fmt::print("anomaly detection on: every backward checks its gradients for NaN and "
               "infinity (slow)\n");
  }
  samples::install_stop_handlers();

  for (int epoch = resumed.epochs_done + 1; epoch <= options.epochs; ++epoch) {
    const RunPosition start = epoch == resumed.epochs_done + 1 ? resumed : RunPosition::after_epoch(epoch - 1);
    if (const int exit_code = train_epoch(run, start)) return exit_code;
    // A signal during the evaluation stops the run here, between epochs.
    if (epoch < options.epochs)
      if (const int signo = samples::agreed_stop_signal(run.dist, run.device))
        return stop_run(run, signo, RunPosition::after_epoch(epoch), epoch * run.train_loader.size());
  }
  run.tracer->finish();
  if (run.history.empty()) {
    fmt::print("nothing to do: the checkpoint is already at epoch {} of {}\n",
               resumed.epochs_done, options.epochs);
    return 0;
  }
  print_summary(run, resumed.epochs_done);
  fmt::print("{}\n", samples::mlp_memory_report(run.training_peak, run.dist.rank, mlp_run(run, *train_set, *test_set)));
  if (options.memory_blocks) fmt::print("{}", samples::live_blocks_report(run.dist.rank, run.blocks_at_peak));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  TrainOptions options;
  if (const std::optional<int> exit_code = samples::parse_train_options(argc, argv, options))
    return *exit_code;
  try {
    return run(options);
  } catch (const std::exception& e) {
    return samples::report_error("train_fashion_mnist", e);
  }
}
