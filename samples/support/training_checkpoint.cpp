#include "training_checkpoint.h"

#include <minigrad/core/error.h>
#include <minigrad/core/generator.h>
#include <minigrad/nn/serialize.h>

namespace mg::samples {

void save_training_checkpoint(const std::string& path, const nn::Module& model,
                              const optim::Optimizer& optimizer, const TrainOptions& options,
                              const RunPosition& position,
                              const std::vector<EpochMetrics>& history) {
  nn::Checkpoint ck;
  ck.put("model.", nn::state_dict(model));
  ck.put("optim.", optimizer.state_dict());
  if (position.batches > 0) ck.tensors.emplace("progress.loss_sum", position.loss_sum);
  const Generator::State rng = default_generator().state();
  ck.metadata = {{"format", "pt"},
                 {"program", "train_fashion_mnist"},
                 {"epoch", std::to_string(position.epochs_done)},
                 {"epoch_batches", std::to_string(position.batches)},
                 {"epoch_seen", std::to_string(position.seen)},
                 {"batch_size", std::to_string(options.batch_size)},
                 {"optimizer", options.optimizer},
                 {"hidden", hidden_str(options.hidden)},
                 {"seed", std::to_string(options.seed)},
                 {"generator_seed", std::to_string(rng.seed)},
                 {"generator_offset", std::to_string(rng.offset)},
                 {"metrics", metrics_csv(history)}};
  nn::save_tensors(ck, path);
}

RunPosition load_training_checkpoint(const std::string& path, nn::Module& model,
                                     optim::Optimizer& optimizer, const TrainOptions& options,
                                     std::vector<EpochMetrics>& history) {
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
  // Checkpoints from before --optimizer existed are SGD's.
  const auto optimizer_entry = ck.metadata.find("optimizer");
  const std::string saved_optimizer =
      optimizer_entry == ck.metadata.end() ? "sgd" : optimizer_entry->second;
  MG_CHECK(saved_optimizer == options.optimizer,
           "--resume {}: the checkpoint holds the state of --optimizer {}, but --optimizer is {}; "
           "pass --optimizer {}",
           path, saved_optimizer, options.optimizer, saved_optimizer);
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
  optimizer.check_state_dict(optim_state, path);
  nn::load_state_dict(model, model_state, path);
  optimizer.load_state_dict(optim_state, path);
  history = parse_metrics_csv(meta("metrics"), path + " (metrics)");
  default_generator().set_state(
      {std::stoull(meta("generator_seed")), std::stoull(meta("generator_offset"))});
  return position;
}

}  // namespace mg::samples
