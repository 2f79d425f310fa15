#include "training_checkpoint.h"

#include <charconv>
#include <limits>
#include <utility>

#include <minigrad/core/error.h>
#include <minigrad/core/generator.h>
#include <minigrad/nn/serialize.h>

namespace mg::samples {

namespace {

// A metadata value as a non-negative integer of type T, or an mg::Error naming the key
// and the file: all of the text must be the number (std::stoi would take "3abc" as 3,
// and says only "stoi" when it fails).
template <typename T>
T metadata_number(const std::string& path, const std::string& key, const std::string& text) {
  T value{};
  const char* end = text.data() + text.size();
  const auto [stop, error] = std::from_chars(text.data(), end, value);
  if (error == std::errc::result_out_of_range && stop == end)
    MG_FAIL("--resume {}: metadata '{}' is '{}', larger than {}", path, key, text,
            std::numeric_limits<T>::max());
  MG_CHECK(error == std::errc() && stop == end && !text.empty() && value >= T{0},
           "--resume {}: metadata '{}' is '{}', not a non-negative integer", path, key, text);
  return value;
}

}  // namespace

void save_training_checkpoint(const std::string& path, const nn::TensorDict& model_state,
                              const nn::TensorDict& optimizer_state, const TrainOptions& options,
                              const RunPosition& position,
                              const std::vector<EpochMetrics>& history) {
  nn::Checkpoint ck;
  ck.put("model.", model_state);
  ck.put("optim.", optimizer_state);
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

RunPosition load_training_checkpoint(const std::string& path, TrainingState& state,
                                     const TrainOptions& options,
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
  const auto number = [&](const char* key, auto type) {
    return metadata_number<decltype(type)>(path, key, meta(key));
  };
  RunPosition position;
  position.epochs_done = number("epoch", int{});
  // Written at an interrupt, the checkpoint stands in the middle of an epoch (checkpoints
  // from before interrupts existed have no "epoch_batches": they never do).
  const int64_t batches =
      ck.metadata.count("epoch_batches") ? number("epoch_batches", int64_t{}) : 0;
  if (batches > 0) {
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
    position.batches = batches;
    position.seen = number("epoch_seen", int64_t{});
    position.loss_sum = loss_sum->second.reshape({});
  }
  // Everything is read and checked before the model, the optimizer or the generator change.
  const Generator::State generator{number("generator_seed", uint64_t{}),
                                   number("generator_offset", uint64_t{})};
  std::vector<EpochMetrics> epochs = parse_metrics_csv(meta("metrics"), path + " (metrics)");
  state.load(ck.get("model."), ck.get("optim."), path);  // checks both before loading either
  history = std::move(epochs);
  default_generator().set_state(generator);
  return position;
}

}  // namespace mg::samples
