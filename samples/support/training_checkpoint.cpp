#include "training_checkpoint.h"

#include <charconv>
#include <cstdlib>
#include <limits>
#include <utility>

#include <minigrad/core/checked_math.h>
#include <minigrad/core/error.h>
#include <minigrad/core/files.h>
#include <minigrad/core/generator.h>
#include <minigrad/nn/serialize.h>

namespace mg::samples {

namespace {

// A metadata value as an integer of type T in [low, high], or an mg::Error naming the key,
// the file and the range: all of the text must be the number (std::stoi would take "3abc"
// as 3, and says only "stoi" when it fails). A value is shown cut to 40 characters.
template <typename T>
T metadata_number(const std::string& path, const std::string& key, const std::string& text,
                  T low = T{0}, T high = std::numeric_limits<T>::max()) {
  const std::string shown =
      text.size() <= 40 ? text : text.substr(0, 40) + fmt::format("... ({} characters)", text.size());
  T value{};
  const char* end = text.data() + text.size();
  const auto [stop, error] = std::from_chars(text.data(), end, value);
  if (error == std::errc::result_out_of_range && stop == end)
    MG_FAIL("--resume {}: metadata '{}' is '{}', larger than {}", path, key, shown, high);
  MG_CHECK(error == std::errc() && stop == end && !text.empty() && value >= T{0},
           "--resume {}: metadata '{}' is '{}', not a non-negative integer", path, key, shown);
  MG_CHECK(value >= low && value <= high,
           "--resume {}: metadata '{}' is {}, outside [{}, {}]; the checkpoint does not fit this "
           "run",
           path, key, value, low, high);
  return value;
}

// 64-bit FNV-1a over bytes: the digest that --distributed ranks compare after a resume.
uint64_t fnv1a(uint64_t hash, const void* data, std::size_t n) {
  const auto* bytes = static_cast<const unsigned char*>(data);
  for (std::size_t i = 0; i < n; ++i) hash = (hash ^ bytes[i]) * 0x100000001b3ull;
  return hash;
}

// Everything a checkpoint holds, names included (std::map keeps them in order).
uint64_t checkpoint_digest(const nn::Checkpoint& ck) {
  uint64_t hash = 0xcbf29ce484222325ull;
  for (const auto& [name, tensor] : ck.tensors) {
    hash = fnv1a(hash, name.data(), name.size() + 1);
    const Tensor bytes = tensor.contiguous();
    hash = fnv1a(hash, bytes.data_ptr(), bytes.nbytes());
  }
  for (const auto& [key, value] : ck.metadata) {
    hash = fnv1a(hash, key.data(), key.size() + 1);
    hash = fnv1a(hash, value.data(), value.size() + 1);
  }
  return hash;
}

}  // namespace

void save_training_checkpoint(const std::string& path, const nn::TensorDict& model_state,
                              const nn::TensorDict& optimizer_state, const TrainOptions& options,
                              const RunPosition& position,
                              const std::vector<EpochMetrics>& history,
                              const MixedPrecision& precision) {
  nn::Checkpoint ck;
  ck.put("model.", model_state);
  ck.put("optim.", optimizer_state);
  ck.put("scaler.", precision.state_dict());
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
                 {"metrics", metrics_csv(history)},
                 {"precision", precision.name()}};
  // For the launcher's tests: a save slower than a stop's old grace period, its temporary
  // file written and not yet renamed (see files::set_write_pause_for_testing).
  const char* pause = std::getenv("MINIGRAD_TEST_SAVE_PAUSE_SECONDS");
  files::set_write_pause_for_testing(pause != nullptr ? std::atof(pause) : 0.0);
  nn::save_tensors(ck, path);
  files::set_write_pause_for_testing(0.0);
}

RunPosition load_training_checkpoint(const std::string& path, TrainingState& state,
                                     const TrainOptions& options,
                                     std::vector<EpochMetrics>& history,
                                     MixedPrecision& precision,
                                     int64_t batches_per_epoch) {
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
  // bfloat16 weights and masters, or a scaler: another precision's checkpoint holds other
  // tensors. One written before --precision existed is 32-true's.
  const auto precision_entry = ck.metadata.find("precision");
  const std::string saved_precision = precision_entry == ck.metadata.end() ? "32-true" : precision_entry->second;
  MG_CHECK(saved_precision == precision.name(),
           "--resume {}: written with --precision {}, but --precision is {}; pass --precision {}", path,
           saved_precision, precision.name(), saved_precision);
  const auto number = [&](const char* key, auto type) {
    return metadata_number<decltype(type)>(path, key, meta(key));
  };
  RunPosition position;
  // No run has more epochs than --epochs takes (an int); one past it is "nothing to do".
  position.epochs_done = number("epoch", int{});
  // Written at an interrupt, the checkpoint stands in the middle of an epoch (checkpoints
  // from before interrupts existed have no "epoch_batches": they never do). It stands at
  // most after the epoch's last batch (stopped before the epoch's evaluation).
  const int64_t max_batches =
      batches_per_epoch > 0 ? batches_per_epoch : std::numeric_limits<int64_t>::max();
  const int64_t batches = ck.metadata.count("epoch_batches")
                              ? metadata_number<int64_t>(path, "epoch_batches",
                                                         meta("epoch_batches"), 0, max_batches)
                              : 0;
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
    // Every batch has a row at least and batch_size at most (batches < 2^63 / batch_size:
    // batches is below an epoch's, whose rows are a dataset's).
    const int64_t most_seen = checked_mul(batches, options.batch_size, "--resume epoch_seen");
    position.seen = metadata_number<int64_t>(path, "epoch_seen", meta("epoch_seen"), batches,
                                             most_seen);
    position.loss_sum = loss_sum->second.reshape({});
  }
  // Everything is read and checked before the model, the optimizer or the generator change.
  const Generator::State generator{number("generator_seed", uint64_t{}),
                                   number("generator_offset", uint64_t{})};
  std::vector<EpochMetrics> epochs = parse_metrics_csv(meta("metrics"), path + " (metrics)");
  position.digest = checkpoint_digest(ck);
  state.load(ck.get("model."), ck.get("optim."), path);  // checks both before loading either
  precision.load_state_dict(ck.get("scaler."), path);
  history = std::move(epochs);
  default_generator().set_state(generator);
  return position;
}

}  // namespace mg::samples
