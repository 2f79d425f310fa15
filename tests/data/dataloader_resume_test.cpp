// DataLoader::set_start_batch: resuming in the middle of an epoch visits
// exactly the batches an uninterrupted epoch had left, then later epochs start at 0.
#include "catch_compat.h"

#include <memory>

#include <minigrad/data/dataloader.h>

using namespace mg;

namespace {

// n examples whose single feature is their index.
std::shared_ptr<data::TensorDataset> indexed(int64_t n) {
  std::vector<float> values;
  std::vector<int64_t> targets;
  for (int64_t i = 0; i < n; ++i) {
    values.push_back(static_cast<float>(i));
    targets.push_back(i);
  }
  return std::make_shared<data::TensorDataset>(from_vector(values, {n, 1}), from_vector(targets, {n}));
}

data::DataLoader shuffled(int64_t n, int64_t batch_size) {
  data::DataLoaderOptions options;
  options.batch_size = batch_size;
  options.shuffle = true;
  options.seed = 7;
  return data::DataLoader(indexed(n), options);
}

// The batches of one iteration, each as its example indices.
std::vector<std::vector<int64_t>> one_pass(data::DataLoader& loader) {
  std::vector<std::vector<int64_t>> out;
  for (const data::Batch& b : loader) out.push_back(b.target.to_vector<int64_t>());
  return out;
}

}  // namespace

TEST_CASE("DataLoader::set_start_batch: the rest of the epoch, then whole epochs again") {
  data::DataLoader straight = shuffled(23, 5);  // 5 batches, the last one of 3
  straight.set_epoch(2);
  const auto epoch2 = one_pass(straight);
  const auto epoch3 = one_pass(straight);
  REQUIRE(epoch2.size() == 5);

  data::DataLoader resumed = shuffled(23, 5);
  resumed.set_epoch(2);
  resumed.set_start_batch(3);
  CHECK(resumed.begin().position() == 3);  // begin() used the start and advanced the epoch
  resumed.set_epoch(2);
  resumed.set_start_batch(3);
  const auto rest = one_pass(resumed);
  CHECK(rest == std::vector<std::vector<int64_t>>(epoch2.begin() + 3, epoch2.end()));
  CHECK(one_pass(resumed) == epoch3);  // the next epoch starts at 0

  // Starting at size() is an epoch with nothing left: resuming right after its last batch.
  resumed.set_epoch(2);
  resumed.set_start_batch(5);
  CHECK(one_pass(resumed).empty());
}

TEST_CASE("DataLoader::set_start_batch: a batch outside the epoch is refused") {
  data::DataLoader loader = shuffled(23, 5);
  REQUIRE_THROWS_WITH(loader.set_start_batch(6),
                      MG_CONTAINS("DataLoader::set_start_batch: batch 6 is outside [0, 5]"));
  REQUIRE_THROWS_WITH(loader.set_start_batch(-1), MG_CONTAINS("batch -1 is outside [0, 5]"));
}
