#include "train_options.h"

#include <cmath>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "command_line.h"
#include "devices.h"
#include "precision.h"

namespace mg::samples {

std::optional<int> parse_train_options(int argc, char** argv, TrainOptions& options) {
  CLI::App app{"Trains an MLP classifier on Fashion-MNIST with minigrad and reports the test "
               "accuracy after every epoch."};
  app.add_option("--epochs", options.epochs, "Epochs to train (in all, counting resumed ones)")
      ->check(positive_integer())
      ->capture_default_str();
  app.add_option("--batch-size", options.batch_size, "Training batch size")
      ->check(positive_integer())
      ->capture_default_str();
  app.add_option("--optimizer", options.optimizer,
                 "sgd (SGD with momentum) or adamw (AdamW, decoupled weight decay)")
      ->check(CLI::IsMember({"sgd", "adamw"}))
      ->capture_default_str();
  CLI::Option* lr = app.add_option("--lr", options.lr,
                                   fmt::format("Learning rate (default: {} with sgd, {} with adamw)",
                                               kSgdLr, kAdamWLr))
                        ->check(non_negative_number());
  CLI::Option* momentum = app.add_option("--momentum", options.momentum, "SGD's momentum")
                              ->check(non_negative_number())
                              ->capture_default_str();
  CLI::Option* weight_decay =
      app.add_option("--weight-decay", options.weight_decay,
                     fmt::format("Weight decay (default: 0 with sgd, where it is an L2 penalty in "
                                 "the gradient; {} with adamw, where it shrinks the weights by "
                                 "lr * weight_decay each step)",
                                 kAdamWWeightDecay))
          ->check(non_negative_number());
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
                 "cpu, all (every GPU), or GPU ids such as 0 or 0,1; several devices (0,1, or "
                 "cpu,cpu for replicas on the CPU) train with DataParallel")
      ->capture_default_str();
  CLI::Option* pipeline = app.add_option("--pipeline", options.pipeline,
                 "Train as a pipeline of this many stages (parallel::Pipe), stage s on the s-th "
                 "of --devices (one device given: all stages on it)")
      ->check(positive_integer());
  // Without --pipeline they would do nothing: refused (CLI11: "--chunks requires --pipeline").
  app.add_option("--chunks", options.chunks, "With --pipeline: micro-batches per batch")
      ->check(positive_integer())
      ->capture_default_str()
      ->needs(pipeline);
  app.add_option("--schedule", options.schedule, "With --pipeline: gpipe or 1f1b")
      ->check(CLI::IsMember({"gpipe", "1f1b"}))
      ->capture_default_str()
      ->needs(pipeline);
  app.add_option("--data-dir", options.data_dir,
                 "Directory with the Fashion-MNIST IDX files (raw or .gz)")
      ->capture_default_str();
  app.add_flag("--no-normalize", options.no_normalize,
               "Scale pixels to [0, 1] only (default: also normalise with mean 0.2860, std 0.3530)");
  app.add_option("--save", options.save,
                 "Write a checkpoint (safetensors) here after every epoch, replacing the file "
                 "atomically; a symbolic link is followed and the file it points to replaced; "
                 "anything else that is not a regular file is refused");
  app.add_option("--resume", options.resume,
                 "Continue from a checkpoint written by --save (a regular file; one holding NaN "
                 "or infinite values is refused)");
  app.add_option("--metrics", options.metrics,
                 "Write per-epoch metrics to this CSV (epoch,train_loss,test_loss,test_accuracy,"
                 "seconds), replaced as --save is");
  app.add_option("--plot", options.plot,
                 "Draw the loss and accuracy curves into this SVG, replaced as --save is");
  app.add_flag("--distributed", options.distributed,
               "One process per device with DistributedDataParallel; start with minigrad-run, "
               "torchrun, mpirun or srun (docs/launching.md; --batch-size stays the global batch)");
  app.add_option("--zero", options.zero,
                 "With --distributed: 0 (DistributedDataParallel), or shard over the ranks the "
                 "optimizer state (1), the gradients too (2), the parameters too (3, "
                 "FullyShardedDataParallel)")
      ->check(CLI::IsMember({0, 1, 2, 3}));
  app.add_option("--tensor-parallel", options.tensor_parallel,
                 "Split each pair of Linear layers over this many ranks (Megatron's column and "
                 "row parallel layers): in one process over as many --devices (cpu,cpu for 2), "
                 "or with --distributed over neighbouring ranks, data parallel across them "
                 "(--nproc-per-node 4 --tensor-parallel 2: 2 x 2); checkpoints are not written")
      ->check(positive_integer())
      ->capture_default_str();
  app.add_option("--dist-timeout,--timeout", options.dist_timeout,
                 "With --distributed: seconds a rank waits for the others before failing")
      ->check(seconds())
      ->capture_default_str();
  app.add_flag("--detect-anomaly", options.detect_anomaly,
               "Check every gradient of every backward for NaN and infinity, and name the op "
               "whose backward produced the first one (slow; as torch.autograd.detect_anomaly)");
  app.add_option("--precision", options.precision,
                 "32-true, bf16-mixed (float32 weights, bfloat16 autocast), 16-mixed (float16 autocast, "
                 "loss scaling) or bf16-true (bfloat16 weights, float32 master weights)")
      ->check(CLI::IsMember(precision_names()))
      ->capture_default_str();
  app.add_flag("--memory-blocks", options.memory_blocks,
               "After the run, list the allocator's blocks live at the training peak, by size "
               "(CPU devices only): what the memory line's terms are read off");
  add_trace_options(app, options.trace, "training step");
  // For tests: raise a real SIGINT after this global step, so that the interrupt and
  // resume path runs deterministically. Hidden from --help (an empty group).
  app.add_option("--stop-after-steps", options.stop_after_steps)->group("");

  const char* program = "train_fashion_mnist";
  if (const std::optional<int> exit_code = parse_command_line(app, program, argc, argv))
    return exit_code;
  if (options.optimizer == "adamw") {
    if (lr->count() == 0) options.lr = kAdamWLr;
    if (weight_decay->count() == 0) options.weight_decay = kAdamWWeightDecay;
    if (momentum->count() != 0)
      return report_error(program, OptionError("--momentum is SGD's; AdamW keeps running "
                                               "averages with betas (0.9, 0.999) instead"));
  }
  if (options.zero != 0 && !options.distributed)
    return report_error(program, OptionError(fmt::format(
                                     "--zero {} shards the training over the ranks of a "
                                     "--distributed run; add --distributed (under minigrad-run)",
                                     options.zero)));
  try {
    options.device_list = parse_devices(options.devices);
    if (options.pipeline > 0) {
      MG_CHECK(!options.distributed, "--pipeline and --distributed do not go together (the "
               "pipeline runs in one process)");
      // Compared with what it counts before anything of that size is built.
      const int64_t layers = mlp_layer_count(options.hidden);
      MG_CHECK(options.pipeline <= layers,
               "--pipeline {}: the model (--hidden {}) has {} layers, and every stage needs at "
               "least one; give at most --pipeline {}",
               options.pipeline, hidden_str(options.hidden), layers, layers);
      const auto stages = static_cast<size_t>(options.pipeline);
      if (options.device_list.size() == 1)
        options.device_list.assign(stages, options.device_list.front());
      MG_CHECK(options.device_list.size() == stages,
               "--pipeline {}: --devices {} names {} devices; give one per stage, or one for all",
               options.pipeline, options.devices, options.device_list.size());
    }
    check_tensor_parallel(options);
    for (const Device& d : options.device_list)
      MG_CHECK(!options.memory_blocks || d.is_cpu(),
               "--memory-blocks reads the CPU allocator: give CPU devices (--devices cpu), not {}",
               d.str());
  } catch (const Error& e) {
    return report_error(program, OptionError(e.what()));
  }
  return std::nullopt;
}

void check_tensor_parallel(const TrainOptions& options) {
  const int tp = options.tensor_parallel;
  if (tp == 1) return;
  MG_CHECK(options.pipeline == 0,
           "--tensor-parallel {} and --pipeline {} do not go together: choose one split of the "
           "model", tp, options.pipeline);
  MG_CHECK(options.zero == 0,
           "--tensor-parallel {} and --zero {} do not go together (the tensor-parallel layers "
           "are not sharded further); use --zero 0", tp, options.zero);
  MG_CHECK(options.save.empty() && options.resume.empty(),
           "--tensor-parallel {}: --save and --resume are not supported with tensor parallelism "
           "(each rank holds only its shards of the model)",
           tp);
  if (options.distributed || static_cast<int64_t>(options.device_list.size()) == tp) return;
  // The example spells the devices out only for a degree one could type.
  const std::string example =
      tp <= 8 ? fmt::format(" (e.g. --devices {})",
                            fmt::join(std::vector<std::string>(static_cast<size_t>(tp), "cpu"), ","))
              : "";
  MG_FAIL("--tensor-parallel {} in one process takes one device per rank, but --devices {} "
          "names {}; pass {} devices{}, or use --distributed for data parallelism as well",
          tp, options.devices, options.device_list.size(), tp, example);
}

std::string optimizer_str(const TrainOptions& options) {
  if (options.optimizer == "adamw")
    return fmt::format("AdamW lr {} ({}) weight_decay {}", options.lr, options.lr_schedule,
                       options.weight_decay);
  std::string out = fmt::format("SGD lr {} ({}) momentum {}", options.lr, options.lr_schedule,
                                options.momentum);
  if (options.weight_decay != 0.0) out += fmt::format(" weight_decay {}", options.weight_decay);
  return out;
}

int64_t mlp_layer_count(const std::vector<int64_t>& hidden) {
  return 2 * static_cast<int64_t>(hidden.size()) + 1;
}

std::string hidden_str(const std::vector<int64_t>& hidden) {
  return fmt::format("{}", fmt::join(hidden, ","));
}

double learning_rate(const TrainOptions& options, int64_t step, int64_t total) {
  if (options.lr_schedule == "constant") return options.lr;
  constexpr double kPi = 3.14159265358979323846;
  return options.lr * 0.5 *
         (1.0 + std::cos(kPi * static_cast<double>(step) / static_cast<double>(total)));
}

}  // namespace mg::samples
