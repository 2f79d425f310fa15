// The flags of train_fashion_mnist: one struct, parsed in one place.
//
// A new flag is a field here and its add_option in train_options.cpp; what it changes
// is built in train_fashion_mnist.cpp (make_model_wrapper for how the model is spread
// over the devices, make_optimizer for the optimizer).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <minigrad/core/device.h>
#include <minigrad/data/fashion_mnist.h>

#include "trace.h"

namespace mg::samples {

// SGD's learning rate is the one this MLP has always trained with; AdamW's learning rate
// and weight decay are torch.optim.AdamW's defaults, which suit this MLP as they are.
inline constexpr double kSgdLr = 0.05;
inline constexpr double kAdamWLr = 1e-3;
inline constexpr double kAdamWWeightDecay = 1e-2;

struct TrainOptions {
  int epochs = 10;
  int64_t batch_size = 64;
  std::string optimizer = "sgd";  // or "adamw"
  // lr and weight_decay default per optimizer (kSgd*, kAdamW*), set after parsing when the
  // flag is not given.
  double lr = kSgdLr;
  double momentum = 0.9;  // SGD's only
  double weight_decay = 0.0;
  std::string lr_schedule = "cosine";  // or "constant"
  std::vector<int64_t> hidden{256, 256};
  uint64_t seed = 1;
  std::string devices = "cpu";       // as given to --devices
  std::vector<Device> device_list;   // what it names on this machine (samples/support/devices.h)
  std::string data_dir = data::FashionMNIST::kDefaultRoot;
  bool no_normalize = false;
  std::string save, resume, metrics, plot;  // file paths; empty: not written / not read
  int pipeline = 0;              // stages of an in-process pipeline over --devices; 0: none
  int64_t chunks = 8;            // --pipeline: micro-batches per batch
  std::string schedule = "gpipe";  // --pipeline: gpipe or 1f1b
  bool distributed = false;     // one process per device, started by minigrad-run
  int zero = 0;                 // --distributed: 0 DDP; ZeRO stage 1, 2 or 3 (FSDP)
  int tensor_parallel = 1;      // ranks each pair of Linear layers is split over (1: none)
  std::string precision = "32-true";  // or bf16-mixed, 16-mixed, bf16-true (support/precision.h)
  double dist_timeout = 300.0;  // seconds a rank waits for the others before failing
  bool detect_anomaly = false;  // check every gradient of every backward (slow)
  bool memory_blocks = false;   // the allocator's live blocks at the training peak, listed
  TraceOptions trace;           // --trace FILE.json and its --trace-* flags
  int64_t stop_after_steps = 0;  // hidden, for tests: raise SIGINT after this global step
};

// Parses argv into `options` (device_list included). Returns the exit code when the
// program should stop here (--help: 0; a bad flag: kExitBadOption, reported on stderr as
// "train_fashion_mnist: error: ..."), std::nullopt when it should train.
std::optional<int> parse_train_options(int argc, char** argv, TrainOptions& options);

// --tensor-parallel against the other flags: one device per rank in one process, no
// checkpoints (an mg::Error saying so otherwise).
void check_tensor_parallel(const TrainOptions& options);

// "SGD lr 0.05 (cosine) momentum 0.9" or "AdamW lr 0.001 (cosine) weight_decay 0.01":
// the optimizer as the setup line and the plot's title name it.
std::string optimizer_str(const TrainOptions& options);

// The layers of the MLP that --hidden describes (a Linear and a ReLU per hidden width,
// then the output Linear): what --pipeline's stages are cut from.
int64_t mlp_layer_count(const std::vector<int64_t>& hidden);

// "256,256": the hidden widths as --hidden takes them.
std::string hidden_str(const std::vector<int64_t>& hidden);

// The learning rate at training step `step` (from 0) of `total`: constant, or cosine
// annealing from --lr down to 0 over the whole run (SGDR without restarts, per step).
// Annealing lets the last epochs settle into a minimum instead of bouncing around it at
// full lr: about one point of test accuracy here. It depends on the step alone, so
// --resume continues it.
double learning_rate(const TrainOptions& options, int64_t step, int64_t total);

}  // namespace mg::samples
