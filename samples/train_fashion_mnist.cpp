// train_fashion_mnist: an MLP classifier trained on Fashion-MNIST with minigrad.
//
//   build/bin/train_fashion_mnist                       # the defaults: >= 88% test accuracy
//   build/bin/train_fashion_mnist --epochs 3 --hidden 512 --metrics run.csv --plot run.svg
//   build/bin/train_fashion_mnist --save ck.safetensors ...; ... --resume ck.safetensors
//   build/bin/minigrad-run --nproc-per-node 2 build/bin/train_fashion_mnist --distributed
//
// The loop is the one every PyTorch user knows: for each epoch, shuffled batches from
// a DataLoader; forward, cross-entropy, zero_grad, backward, SGD step; then the test
// loss and accuracy with autograd off. --save writes a checkpoint after every epoch
// (model, optimizer momentum, epoch, metrics so far) in the safetensors format; --resume
// continues from one, with the same shuffling as an uninterrupted run.
//
// Ctrl-C (SIGINT) or SIGTERM stops the run after the step in progress and writes a
// checkpoint of exactly where it stands, mid-epoch included; --resume continues from it
// to the same parameters, bit for bit on the CPU, as a run that was never stopped. A NaN
// or infinite loss stops the run naming the step; --detect-anomaly then names the op
// whose backward first produced a non-finite gradient.
//
// The CPU matmuls run on OpenBLAS, which uses every core by default; on a machine busy
// with other work, OPENBLAS_NUM_THREADS=1 is often faster (bench/train_fashion_mnist.md).
#include <CLI/CLI.hpp>

#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <minigrad/autograd/anomaly_mode.h>
#include <minigrad/autograd/functions.h>
#include <minigrad/autograd/grad_mode.h>
#include <minigrad/core/backend.h>
#include <minigrad/core/generator.h>
#include <minigrad/core/ops.h>
#include <minigrad/core/tensor.h>
#include <minigrad/data/dataloader.h>
#include <minigrad/data/fashion_mnist.h>
#include <minigrad/nn/layers.h>
#include <minigrad/nn/optim/sgd.h>
#include <minigrad/nn/serialize.h>
#include <minigrad/data/distributed_sampler.h>
#include <minigrad/parallel/data_parallel.h>
#include <minigrad/parallel/distributed/distributed_data_parallel.h>
#include <minigrad/parallel/distributed/rendezvous.h>
#include "support/devices.h"
#include "support/metrics.h"
#include "support/progress.h"
#include "support/svg_plot.h"

namespace {

using namespace mg;
using Clock = std::chrono::steady_clock;

struct Options {
  int epochs = 10;
  int64_t batch_size = 64;
  double lr = 0.05;
  double momentum = 0.9;
  std::vector<int64_t> hidden{256, 256};
  uint64_t seed = 1;
  std::string devices = "cpu";
  std::string data_dir = data::FashionMNIST::kDefaultRoot;
  std::string lr_schedule = "cosine";
  bool no_normalize = false;
  std::string save, resume, metrics, plot;
  bool distributed = false;    // one process per device, started by minigrad-run
  double dist_timeout = 300.0; // seconds a rank waits for the others before failing
  bool detect_anomaly = false;   // check every gradient of every backward (slow)
  int64_t stop_after_steps = 0;  // hidden, for tests: raise SIGINT after this global step
};

std::string hidden_str(const std::vector<int64_t>& hidden) {
  return fmt::format("{}", fmt::join(hidden, ","));
}

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

// ======================================================================================
// The one place where the model meets the devices. One device: the model moves there
// and is used as it is. Several devices (--devices 0,1, or cpu,cpu): DataParallel, which
// scatters each batch over them, replicates the model, and sums the replicas' gradients
// back into `model`'s parameters -- so the optimizer and the checkpoints keep working on
// `model` itself, whatever this returns; forward passes go through what it returns.
// ======================================================================================
nn::ModulePtr place_model(const nn::ModulePtr& model, const std::vector<Device>& devices) {
  model->to(devices.front());
  if (devices.size() == 1) return model;
  return std::make_shared<parallel::DataParallel>(model, devices);
}

// ======================================================================================
// --distributed: one process per device, started by minigrad-run (or torchrun), which
// sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT:
//   minigrad-run --nproc-per-node 2 build/bin/train_fashion_mnist --distributed --devices cpu
// Each process holds a replica wrapped in DistributedDataParallel (Gloo on the CPU, NCCL
// on GPUs) and trains on its own shard of every epoch (DistributedSampler). --batch-size
// stays the global batch, split evenly over the ranks, so the run takes the same SGD
// steps on the same averaged gradients as one process and reaches the same accuracy.
// Rank 0 alone writes checkpoints, metrics and plots.
// ======================================================================================
struct DistributedRun {
  std::shared_ptr<parallel::ProcessGroup> group;  // null without --distributed
  int rank = 0;
  int world_size = 1;
  bool writes_files() const { return rank == 0; }
};

// Joins the job; returns this rank's device: cpu, or the GPU of --devices at LOCAL_RANK.
DistributedRun join_distributed_run(const Options& options, std::vector<Device>& devices) {
  const parallel::DistributedEnv env = parallel::DistributedEnv::from_environment();
  const Device device = devices[static_cast<size_t>(env.local_rank) % devices.size()];
  devices = {device};
  parallel::ProcessGroupOptions pg_options;
  pg_options.timeout = std::chrono::milliseconds(static_cast<int64_t>(options.dist_timeout * 1000));
  pg_options.device_index = device.is_cuda() ? device.index() : -1;
  DistributedRun run;
  run.group = parallel::init_process_group(device.is_cuda() ? "nccl" : "gloo", pg_options);
  run.rank = run.group->rank();
  run.world_size = run.group->size();
  MG_CHECK(options.batch_size % run.world_size == 0,
           "--distributed: --batch-size {} (the global batch) must divide evenly over the {} "
           "ranks",
           options.batch_size, run.world_size);
  return run;
}

// The model on this rank's device, wrapped so that backward averages the gradients over
// the ranks (the optimizer and checkpoints keep working on `model` itself).
nn::ModulePtr distribute_model(const nn::ModulePtr& model, Device device,
                               const DistributedRun& dist) {
  model->to(device);
  return std::make_shared<parallel::DistributedDataParallel>(model, dist.group);
}

// The learning rate at training step `step` of `total`: constant, or cosine annealing
// from lr down to 0 over the whole run (SGDR without restarts, per step). Annealing lets
// the last epochs settle into a minimum instead of bouncing around it at full lr: about
// one point of test accuracy here. It depends on the step alone, so --resume continues it.
double learning_rate(const Options& options, int64_t step, int64_t total) {
  if (options.lr_schedule == "constant") return options.lr;
  constexpr double kPi = 3.14159265358979323846;
  return options.lr * 0.5 *
         (1.0 + std::cos(kPi * static_cast<double>(step) / static_cast<double>(total)));
}

struct EvalResult {
  double loss = 0.0;
  double accuracy = 0.0;
};

EvalResult evaluate(nn::Module& net, data::DataLoader& loader, Device device) {
  NoGradGuard no_grad;
  net.eval();
  double loss_sum = 0.0;
  int64_t correct = 0, seen = 0;
  for (const data::Batch& host_batch : loader) {
    const data::Batch batch = host_batch.to(device);
    const Tensor logits = net.forward(batch.data);
    loss_sum += static_cast<double>(cross_entropy(logits, batch.target).item<float>()) *
                static_cast<double>(batch.size());
    const std::vector<int64_t> predicted = logits.argmax(1).to_vector<int64_t>();
    const std::vector<int64_t> labels = host_batch.target.to_vector<int64_t>();
    for (size_t i = 0; i < labels.size(); ++i) correct += predicted[i] == labels[i];
    seen += batch.size();
  }
  net.train();
  return {loss_sum / static_cast<double>(seen),
          static_cast<double>(correct) / static_cast<double>(seen)};
}

// ---- checkpoints: model + optimizer + where the run stands, in one safetensors file ----

// Where a run stands: `epochs_done` whole epochs, then `batches` batches of the next one
// (a checkpoint written at an interrupt), whose training loss so far, summed over its
// `seen` examples, is `loss_sum`.
struct RunPosition {
  int epochs_done = 0;
  int64_t batches = 0;
  int64_t seen = 0;
  Tensor loss_sum;  // float32 scalar; undefined when batches == 0
};

void save_checkpoint(const std::string& path, const nn::Module& model, const optim::SGD& sgd,
                     const Options& options, const RunPosition& position,
                     const std::vector<samples::EpochMetrics>& history) {
  nn::Checkpoint ck;
  ck.put("model.", nn::state_dict(model));
  ck.put("optim.", sgd.state_dict());
  if (position.batches > 0) ck.tensors.emplace("progress.loss_sum", position.loss_sum);
  const Generator::State rng = default_generator().state();
  ck.metadata = {{"format", "pt"},
                 {"program", "train_fashion_mnist"},
                 {"epoch", std::to_string(position.epochs_done)},
                 {"epoch_batches", std::to_string(position.batches)},
                 {"epoch_seen", std::to_string(position.seen)},
                 {"batch_size", std::to_string(options.batch_size)},
                 {"hidden", hidden_str(options.hidden)},
                 {"seed", std::to_string(options.seed)},
                 {"generator_seed", std::to_string(rng.seed)},
                 {"generator_offset", std::to_string(rng.offset)},
                 {"metrics", samples::metrics_csv(history)}};
  nn::save_tensors(ck, path);
}

// Loads a checkpoint written by save_checkpoint into model and sgd (both checked before
// either changes); returns where the run stood when it was written, and fills `history`.
RunPosition load_checkpoint(const std::string& path, nn::Module& model, optim::SGD& sgd,
                            const Options& options, std::vector<samples::EpochMetrics>& history) {
  const nn::Checkpoint ck = nn::load_tensors(path);
  auto meta = [&](const char* key) {
    const auto it = ck.metadata.find(key);
    MG_CHECK(it != ck.metadata.end(),
             "--resume {}: not a train_fashion_mnist checkpoint (no '{}' in its metadata)", path,
             key);
    return it->second;
  };
  MG_CHECK(meta("hidden") == hidden_str(options.hidden),
           "--resume {}: the checkpoint's model has hidden layers {} but --hidden is {}; pass "
           "--hidden {}",
           path, meta("hidden"), hidden_str(options.hidden), meta("hidden"));
  RunPosition position;
  position.epochs_done = std::stoi(meta("epoch"));
  // Written at an interrupt, the checkpoint stands in the middle of an epoch (checkpoints
  // from before interrupts existed have no "epoch_batches": they never do).
  const auto batches = ck.metadata.find("epoch_batches");
  if (batches != ck.metadata.end() && std::stoll(batches->second) > 0) {
    MG_CHECK(meta("batch_size") == std::to_string(options.batch_size),
             "--resume {}: the checkpoint stopped in the middle of an epoch with --batch-size "
             "{}, but --batch-size is {}; pass --batch-size {}",
             path, meta("batch_size"), options.batch_size, meta("batch_size"));
    const auto loss_sum = ck.tensors.find("progress.loss_sum");
    MG_CHECK(loss_sum != ck.tensors.end() && loss_sum->second.numel() == 1 &&
                 loss_sum->second.dtype() == DType::Float32,
             "--resume {}: the checkpoint stopped in the middle of an epoch but has no float32 "
             "scalar 'progress.loss_sum'",
             path);
    position.batches = std::stoll(batches->second);
    position.seen = std::stoll(meta("epoch_seen"));
    position.loss_sum = loss_sum->second.reshape({});
  }
  const nn::TensorDict model_state = ck.get("model."), optim_state = ck.get("optim.");
  nn::check_state_dict(model, model_state, path);
  sgd.check_state_dict(optim_state, path);
  nn::load_state_dict(model, model_state, path);
  sgd.load_state_dict(optim_state, path);
  history = samples::parse_metrics_csv(meta("metrics"), path + " (metrics)");
  default_generator().set_state(
      {std::stoull(meta("generator_seed")), std::stoull(meta("generator_offset"))});
  return position;
}

// Writes the CSV and the plot for everything so far (rewritten after every epoch, so a
// run stopped early still leaves both behind).
void write_reports(const Options& options, const std::vector<samples::EpochMetrics>& history) {
  if (!options.metrics.empty())
    samples::write_file_atomically(options.metrics, samples::metrics_csv(history));
  if (!options.plot.empty() && !history.empty())
    samples::write_training_plot(
        options.plot, history,
        fmt::format("Fashion-MNIST MLP 784-{}-10, SGD lr {} ({}) momentum {}, batch {}",
                    fmt::join(options.hidden, "-"), options.lr, options.lr_schedule, options.momentum,
                    options.batch_size));
}

// ======================================================================================
// Interrupt and resume. The signal handler only records the signal. The training loop
// looks at it after every step (and after each epoch's evaluation), writes a checkpoint
// of exactly where the run stands -- model, SGD momentum, random generator, epoch and
// batch, the epoch's running loss -- and exits with 128 + the signal number (130 for
// Ctrl-C, 143 for SIGTERM), as a shell reports a process that a signal killed.
// --resume continues from that batch with the same shuffled order and learning rate, so
// on the CPU the run ends with the parameters of a run that was never stopped, bit for
// bit (tests/samples/train_fashion_mnist_test.cpp).
// ======================================================================================
volatile std::sig_atomic_t stop_signal = 0;

void record_stop_signal(int signo) { stop_signal = signo; }

// SA_RESETHAND: the handler runs once, so a second Ctrl-C meets the default action and
// kills the process at once, for when the step in progress is itself stuck. SA_RESTART:
// a system call the signal lands in (a Gloo socket read, say) resumes instead of failing.
void install_stop_handlers() {
  struct sigaction action {};
  action.sa_handler = record_stop_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESETHAND | SA_RESTART;
  for (int signo : {SIGINT, SIGTERM})
    MG_CHECK(sigaction(signo, &action, nullptr) == 0, "sigaction({}) failed: {}", signo,
             std::strerror(errno));
}

// The signal that stops the run, or 0 to go on. The ranks of a --distributed run agree
// on it (a sum over the ranks): one rank stopping alone would leave the others waiting
// in the next all-reduce until --dist-timeout.
int agreed_stop_signal(const DistributedRun& dist, Device device) {
  const int local = stop_signal;
  if (!dist.group) return local;
  Tensor flag = full({}, local != 0 ? 1.0 : 0.0, DType::Float32, device);
  dist.group->allreduce(std::vector<Tensor>{flag})->wait();
  if (flag.item<float>() == 0.0f) return 0;
  return local != 0 ? local : SIGTERM;
}

// This step's loss as every rank sees it: under --distributed the sum over the ranks,
// so that all of them stop at the same step when one rank's loss is not finite.
float loss_for_check(const Tensor& loss, const DistributedRun& dist) {
  if (!dist.group) return loss.item<float>();
  Tensor sum = ops::clone(loss.detach());
  dist.group->allreduce(std::vector<Tensor>{sum})->wait();
  return sum.item<float>();
}

// Where the run stands after `batches` batches of epoch `epochs_done` + 1. Under
// --distributed each rank has summed the losses of its own examples; the checkpoint holds
// the sum over all ranks, which rank 0 alone carries on after --resume.
RunPosition mid_epoch_position(const DistributedRun& dist, int epochs_done, int64_t batches,
                               int64_t seen, const Tensor& loss_sum) {
  if (!dist.group) return {epochs_done, batches, seen, loss_sum};
  Tensor loss_total = ops::clone(loss_sum);
  Tensor seen_total = full({}, static_cast<double>(seen), DType::Float32, loss_sum.device());
  dist.group->allreduce(std::vector<Tensor>{loss_total, seen_total})->wait();
  return {epochs_done, batches, static_cast<int64_t>(seen_total.item<float>()), loss_total};
}

// Where an interrupted run leaves its checkpoint: --save, or a fixed name in the
// current directory.
std::string interrupt_checkpoint_path(const Options& options) {
  return options.save.empty() ? "train_fashion_mnist.interrupted.safetensors" : options.save;
}

// Writes the checkpoint of an interrupted run (rank 0 alone) and returns the exit code.
int stop_run(int signo, const Options& options, const DistributedRun& dist,
             const nn::Module& model, const optim::SGD& sgd, const RunPosition& position,
             int64_t global_step, const std::vector<samples::EpochMetrics>& history) {
  const char* name = signo == SIGINT ? "SIGINT" : signo == SIGTERM ? "SIGTERM" : "a signal";
  const std::string path = interrupt_checkpoint_path(options);
  if (dist.writes_files()) {
    save_checkpoint(path, model, sgd, options, position, history);
    write_reports(options, history);
    const std::string where =
        position.batches > 0
            ? fmt::format("epoch {}, batch {}", position.epochs_done + 1, position.batches)
            : fmt::format("the end of epoch {}", position.epochs_done);
    fmt::print("train_fashion_mnist: interrupted by {} after step {} ({}); checkpoint written "
               "to {}; continue with --resume {}\n",
               name, global_step, where, path, path);
  }
  std::fflush(stdout);
  return 128 + signo;
}

int run(const Options& options) {
  std::vector<Device> devices = samples::parse_devices(options.devices);
  const DistributedRun dist = options.distributed ? join_distributed_run(options, devices)
                                                  : DistributedRun{};
  const Device device = devices.front();

  data::FashionMNISTOptions data_options;
  data_options.normalize = !options.no_normalize;
  auto train_set =
      std::make_shared<data::FashionMNIST>(options.data_dir, data::Split::Train, data_options);
  auto test_set =
      std::make_shared<data::FashionMNIST>(options.data_dir, data::Split::Test, data_options);

  manual_seed(options.seed);
  const std::shared_ptr<nn::Sequential> model = make_mlp(options.hidden);
  const nn::ModulePtr net =
      dist.group ? distribute_model(model, device, dist) : place_model(model, devices);
  optim::SGD sgd(model->parameters(), optim::SGDOptions(options.lr, options.momentum));

  int64_t parameter_count = 0;
  for (const Tensor& p : model->parameters()) parameter_count += p.numel();
  fmt::print("train_fashion_mnist: MLP 784-{}-10 ({} parameters) on {}\n",
             fmt::join(options.hidden, "-"), parameter_count, samples::devices_str(devices));
  if (dist.group)
    fmt::print("distributed: rank {} of {} ({}), global batch {} = {} x {} per rank\n", dist.rank,
               dist.world_size, dist.group->backend_name(), options.batch_size, dist.world_size,
               options.batch_size / dist.world_size);
  fmt::print("data: {} training and {} test images from {}{}\n", train_set->size(),
             test_set->size(), options.data_dir, options.no_normalize ? "" : " (normalised)");
  fmt::print("SGD lr {} ({}) momentum {}, batch size {}, {} epochs, seed {}\n", options.lr,
             options.lr_schedule, options.momentum, options.batch_size, options.epochs,
             options.seed);

  std::vector<samples::EpochMetrics> history;
  RunPosition resumed;
  if (!options.resume.empty()) {
    resumed = load_checkpoint(options.resume, *model, sgd, options, history);
    if (resumed.batches == 0)
      fmt::print("resumed from {} after epoch {}\n", options.resume, resumed.epochs_done);
    else
      fmt::print("resumed from {} in epoch {} after batch {}\n", options.resume,
                 resumed.epochs_done + 1, resumed.batches);
  }
  const int start_epoch = resumed.epochs_done;
  std::optional<DetectAnomalyGuard> detect_anomaly;
  if (options.detect_anomaly) {
    detect_anomaly.emplace();
    fmt::print("anomaly detection on: every backward checks its gradients for NaN and "
               "infinity (slow)\n");
  }
  install_stop_handlers();

  data::DataLoaderOptions train_options;
  train_options.batch_size = options.batch_size;
  train_options.shuffle = true;
  train_options.seed = options.seed;
  if (dist.group) {  // this rank's shard of each epoch, and its part of the global batch
    train_options.shuffle = false;
    train_options.batch_size = options.batch_size / dist.world_size;
  }
  data::DataLoader train_loader =
      dist.group ? data::DataLoader(train_set,
                                    std::make_shared<data::DistributedSampler>(
                                        train_set->size(), dist.world_size, dist.rank,
                                        /*shuffle=*/true, options.seed),
                                    train_options)
                 : data::DataLoader(train_set, train_options);
  data::DataLoaderOptions test_options;
  test_options.batch_size = 1000;
  data::DataLoader test_loader(test_set, test_options);

  const bool interactive = samples::stdout_is_terminal();
  const int64_t total_steps = train_loader.size() * options.epochs;
  optim::SGDOptions sgd_options = sgd.options();
  for (int epoch = start_epoch + 1; epoch <= options.epochs; ++epoch) {
    const Clock::time_point start = Clock::now();
    train_loader.set_epoch(epoch - 1);  // the order depends on (seed, epoch) alone
    samples::ProgressBar bar(fmt::format("epoch {}/{}", epoch, options.epochs),
                             train_loader.size(), interactive);
    // The running loss stays on the device; it is read when the bar redraws and at the
    // end. (The finiteness check below reads each step's loss on its own.)
    Tensor loss_sum = zeros({}, DType::Float32, device);
    int64_t seen = 0, step = 0;
    if (epoch == start_epoch + 1 && resumed.batches > 0) {  // --resume in mid-epoch
      train_loader.set_start_batch(resumed.batches);
      step = resumed.batches;
      if (dist.rank == 0) {  // the running loss of every rank (mid_epoch_position)
        seen = resumed.seen;
        loss_sum = resumed.loss_sum.to(device);
      }
    }
    for (const data::Batch& host_batch : train_loader) {
      const data::Batch batch = host_batch.to(device);
      const int64_t global_step = (epoch - 1) * train_loader.size() + step + 1;  // from 1
      sgd.set_options(sgd_options.lr(learning_rate(options, global_step - 1, total_steps)));
      const Tensor loss = cross_entropy(net->forward(batch.data), batch.target);
      // A NaN or infinite loss stops the run before backward and the update, so the
      // parameters stay those of the last good step. Reading the loss waits for the
      // device once per step, as loss.item() in the usual PyTorch loop does.
      const float checked_loss = loss_for_check(loss, dist);
      MG_CHECK(std::isfinite(checked_loss),
               "step {} (epoch {}, batch {} of {}): the loss is {}; stopping before this "
               "step's update. Lower the learning rate (--lr {}); --detect-anomaly names the "
               "op whose backward first produces a NaN or an infinity, if one does",
               global_step, epoch, step + 1, train_loader.size(), checked_loss, options.lr);
      sgd.zero_grad();
      loss.backward();
      sgd.step();
      {
        NoGradGuard no_grad;
        loss_sum.add_(loss.detach(), static_cast<double>(batch.size()));
      }
      seen += batch.size();
      ++step;
      if (global_step == options.stop_after_steps) std::raise(SIGINT);  // tests: a real signal
      if (const int signo = agreed_stop_signal(dist, device)) {
        bar.finish();
        return stop_run(signo, options, dist, *model, sgd,
                        mid_epoch_position(dist, epoch - 1, step, seen, loss_sum), global_step,
                        history);
      }
      if (bar.due(step)) {
        const double elapsed = std::chrono::duration<double>(Clock::now() - start).count();
        bar.update(step, fmt::format("loss {:.4f}  {:.0f} samples/s",
                                     loss_sum.item<float>() / static_cast<double>(seen),
                                     static_cast<double>(seen) / elapsed));
      }
    }
    bar.finish();
    if (dist.group) {  // the training loss over every rank's samples
      Tensor seen_tensor = full({}, static_cast<double>(seen), DType::Float32, device);
      dist.group->allreduce(std::vector<Tensor>{loss_sum, seen_tensor})->wait();
      seen = static_cast<int64_t>(seen_tensor.item<float>());
    }
    const double train_seconds = std::chrono::duration<double>(Clock::now() - start).count();
    const double train_loss = loss_sum.item<float>() / static_cast<double>(seen);
    MG_CHECK(std::isfinite(train_loss),
             "epoch {}: the training loss is {}; lower the learning rate (--lr {})", epoch,
             train_loss, options.lr);

    const EvalResult test = evaluate(*net, test_loader, device);
    const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
    history.push_back({epoch, train_loss, test.loss, test.accuracy, seconds});
    fmt::print("epoch {:>2}/{}  train_loss {:.4f}  test_loss {:.4f}  test_accuracy {:.2f}%  "
               "{:.2f} s ({:.0f} samples/s)\n",
               epoch, options.epochs, train_loss, test.loss, 100.0 * test.accuracy, seconds,
               static_cast<double>(seen) / train_seconds);
    std::fflush(stdout);

    if (dist.writes_files()) {
      write_reports(options, history);
      if (!options.save.empty())
        save_checkpoint(options.save, *model, sgd, options, RunPosition{epoch, 0, 0, Tensor()},
                        history);
    }
    // A signal during the evaluation stops the run here, between epochs.
    if (epoch < options.epochs)
      if (const int signo = agreed_stop_signal(dist, device))
        return stop_run(signo, options, dist, *model, sgd, RunPosition{epoch, 0, 0, Tensor()},
                        epoch * train_loader.size(), history);
  }

  if (history.empty()) {
    fmt::print("nothing to do: the checkpoint is already at epoch {} of {}\n", start_epoch,
               options.epochs);
    return 0;
  }
  double total_seconds = 0.0;
  int timed_epochs = 0;
  for (const samples::EpochMetrics& m : history) {
    if (m.epoch <= start_epoch) continue;  // timed by an earlier run
    total_seconds += m.seconds;
    ++timed_epochs;
  }
  fmt::print("final test accuracy {:.2f}% after {} epochs ({:.2f} s per epoch){}{}{}\n",
             100.0 * history.back().test_accuracy, history.back().epoch,
             total_seconds / std::max(timed_epochs, 1),
             options.metrics.empty() ? "" : "; metrics in " + options.metrics,
             options.plot.empty() ? "" : "; plot in " + options.plot,
             options.save.empty() ? "" : "; checkpoint in " + options.save);
  return 0;
}

// Flag validators whose messages say what is wanted (CLI11's PositiveNumber prints its
// range as 0 to 1.8e308 and calls "abc" out of range).
CLI::Validator positive_integer() {
  return CLI::Validator(
      [](std::string& value) -> std::string {
        char* end = nullptr;
        errno = 0;
        const long long v = std::strtoll(value.c_str(), &end, 10);
        if (value.empty() || *end != '\0' || errno != 0 || v <= 0)
          return fmt::format("must be a positive integer, got '{}'", value);
        return {};
      },
      "INT>0");
}

CLI::Validator non_negative_integer() {
  return CLI::Validator(
      [](std::string& value) -> std::string {
        char* end = nullptr;
        errno = 0;
        (void)std::strtoull(value.c_str(), &end, 10);
        if (value.empty() || value[0] == '-' || *end != '\0' || errno != 0)
          return fmt::format("must be an integer >= 0, got '{}'", value);
        return {};
      },
      "UINT");
}

CLI::Validator non_negative_number() {
  return CLI::Validator(
      [](std::string& value) -> std::string {
        char* end = nullptr;
        const double v = std::strtod(value.c_str(), &end);
        if (value.empty() || *end != '\0' || !std::isfinite(v) || v < 0)
          return fmt::format("must be a number >= 0, got '{}'", value);
        return {};
      },
      "FLOAT>=0");
}

}  // namespace

int main(int argc, char** argv) {
  Options options;
  CLI::App app{"Trains an MLP classifier on Fashion-MNIST with minigrad and reports the test "
               "accuracy after every epoch."};
  app.add_option("--epochs", options.epochs, "Epochs to train (in all, counting resumed ones)")
      ->check(positive_integer())
      ->capture_default_str();
  app.add_option("--batch-size", options.batch_size, "Training batch size")
      ->check(positive_integer())
      ->capture_default_str();
  app.add_option("--lr", options.lr, "SGD learning rate")
      ->check(non_negative_number())
      ->capture_default_str();
  app.add_option("--momentum", options.momentum, "SGD momentum")
      ->check(non_negative_number())
      ->capture_default_str();
  app.add_option("--hidden", options.hidden, "Hidden layer widths, comma-separated (e.g. 512 or 256,256)")
      ->delimiter(',')
      ->check(positive_integer())
      ->capture_default_str();
  app.add_option("--lr-schedule", options.lr_schedule,
                 "cosine (anneal the learning rate to 0 over --epochs) or constant")
      ->check(CLI::IsMember({"cosine", "constant"}))
      ->capture_default_str();
  app.add_option("--seed", options.seed, "Seed of the initial weights and of the shuffling")
      ->check(non_negative_integer())
      ->capture_default_str();
  app.add_option("--devices", options.devices,
                 "cpu, all (every GPU), or GPU ids such as 0 or 0,1 (several: DataParallel)")
      ->capture_default_str();
  app.add_option("--data-dir", options.data_dir,
                 "Directory with the Fashion-MNIST IDX files (raw or .gz)")
      ->capture_default_str();
  app.add_flag("--no-normalize", options.no_normalize,
               "Scale pixels to [0, 1] only (default: also normalise with mean 0.2860, std 0.3530)");
  app.add_option("--save", options.save, "Write a checkpoint (safetensors) here after every epoch");
  app.add_option("--resume", options.resume, "Continue from a checkpoint written by --save");
  app.add_option("--metrics", options.metrics,
                 "Write per-epoch metrics to this CSV (epoch,train_loss,test_loss,test_accuracy,seconds)");
  app.add_option("--plot", options.plot, "Draw the loss and accuracy curves into this SVG");
  app.add_flag("--distributed", options.distributed,
               "One process per device with DistributedDataParallel; start with minigrad-run "
               "(--batch-size stays the global batch)");
  app.add_option("--dist-timeout", options.dist_timeout,
                 "With --distributed: seconds a rank waits for the others before failing")
      ->check(non_negative_number())
      ->capture_default_str();
  app.add_flag("--detect-anomaly", options.detect_anomaly,
               "Check every gradient of every backward for NaN and infinity, and name the op "
               "whose backward produced the first one (slow; as torch.autograd.detect_anomaly)");
  // For tests: raise a real SIGINT after this global step, so that the interrupt and
  // resume path runs deterministically. Hidden from --help (an empty group).
  app.add_option("--stop-after-steps", options.stop_after_steps)->group("");
  CLI11_PARSE(app, argc, argv);

  try {
    return run(options);
  } catch (const std::exception& e) {
    std::fflush(stdout);
    fmt::print(stderr, "train_fashion_mnist: error: {}\n", e.what());
    return 1;
  }
}
