// DataLoader: iterates over a dataset in batches, as torch.utils.data.DataLoader.
//
//   auto train = std::make_shared<data::FashionMNIST>(root, data::Split::Train);
//   data::DataLoaderOptions options;
//   options.batch_size = 128;
//   options.shuffle = true;                  // reproducible from options.seed
//   data::DataLoader loader(train, options);
//   for (int epoch = 0; epoch < epochs; ++epoch) {
//     loader.set_epoch(epoch);               // the order of this epoch: (seed, epoch)
//     for (const data::Batch& batch : loader) { ... batch.data, batch.target ... }
//   }
//
// The order of an epoch comes from a Sampler (sampler.h) and depends on the epoch
// number alone, so a run is reproducible and a resumed run sees the same order. Each
// iteration uses the current epoch and then advances it by one, so a loop that never
// calls set_epoch still reshuffles every epoch, as PyTorch's loader does.
#pragma once

#include <cstdint>
#include <iterator>
#include <memory>
#include <vector>

#include <minigrad/data/dataset.h>
#include <minigrad/data/sampler.h>

namespace mg::data {

struct DataLoaderOptions {
  int64_t batch_size = 1;
  bool shuffle = false;   // a RandomSampler(seed) instead of a SequentialSampler
  uint64_t seed = 0;      // the shuffle's seed
  bool drop_last = false; // drop the last batch when it is smaller than batch_size
};

class DataLoader {
 public:
  DataLoader(std::shared_ptr<const Dataset> dataset, DataLoaderOptions options = {});
  // With a sampler of one's own (a DistributedSampler, say); options.shuffle must then
  // be false, since the sampler decides the order.
  DataLoader(std::shared_ptr<const Dataset> dataset, std::shared_ptr<const Sampler> sampler,
             DataLoaderOptions options = {});

  // The epoch whose order the next iteration uses.
  void set_epoch(int64_t epoch);
  int64_t epoch() const { return epoch_; }
  // Resuming in the middle of an epoch: the next iteration starts at batch `batch` of its
  // epoch (0 <= batch <= size()) without loading the batches before it; iterations after
  // that start at 0 again.
  void set_start_batch(int64_t batch);

  // Batches per epoch (len(loader) in PyTorch).
  int64_t size() const;
  const Dataset& dataset() const { return *dataset_; }
  const Sampler& sampler() const { return *sampler_; }
  const DataLoaderOptions& options() const { return options_; }

  class Iterator {
   public:
    using iterator_category = std::input_iterator_tag;
    using value_type = Batch;
    using difference_type = std::ptrdiff_t;
    using pointer = const Batch*;
    using reference = const Batch&;

    const Batch& operator*() const { return batch_; }
    const Batch* operator->() const { return &batch_; }
    Iterator& operator++();
    bool operator==(const Iterator& o) const { return position_ == o.position_; }
    bool operator!=(const Iterator& o) const { return position_ != o.position_; }
    // The index of the current batch in this epoch.
    int64_t position() const { return position_; }

   private:
    friend class DataLoader;
    Iterator(const DataLoader* loader, std::shared_ptr<const std::vector<int64_t>> order,
             int64_t position);
    void load();

    const DataLoader* loader_ = nullptr;
    std::shared_ptr<const std::vector<int64_t>> order_;  // this epoch's indices
    int64_t position_ = 0;
    Batch batch_;
  };

  // Starts an iteration over the current epoch (and advances the epoch by one).
  Iterator begin();
  Iterator end() const;

 private:
  void check_options() const;

  std::shared_ptr<const Dataset> dataset_;
  std::shared_ptr<const Sampler> sampler_;
  DataLoaderOptions options_;
  int64_t epoch_ = 0;
  int64_t start_batch_ = 0;
};

}  // namespace mg::data
