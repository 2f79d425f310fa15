#include <minigrad/data/dataloader.h>

#include <algorithm>

#include <minigrad/core/checked_math.h>
#include <minigrad/core/error.h>

namespace mg::data {

DataLoader::DataLoader(std::shared_ptr<const Dataset> dataset, DataLoaderOptions options)
    : dataset_(std::move(dataset)), options_(options) {
  MG_CHECK(dataset_ != nullptr, "DataLoader: the dataset is null");
  if (options_.shuffle) {
    sampler_ = std::make_shared<RandomSampler>(dataset_->size(), options_.seed);
  } else {
    sampler_ = std::make_shared<SequentialSampler>(dataset_->size());
  }
  check_options();
}

DataLoader::DataLoader(std::shared_ptr<const Dataset> dataset,
                       std::shared_ptr<const Sampler> sampler, DataLoaderOptions options)
    : dataset_(std::move(dataset)), sampler_(std::move(sampler)), options_(options) {
  MG_CHECK(dataset_ != nullptr, "DataLoader: the dataset is null");
  MG_CHECK(sampler_ != nullptr, "DataLoader: the sampler is null");
  MG_CHECK(!options_.shuffle,
           "DataLoader: shuffle=true cannot be combined with a sampler (the sampler decides "
           "the order; use a RandomSampler, or pass no sampler)");
  check_options();
}

void DataLoader::check_options() const {
  MG_CHECK(options_.batch_size > 0, "DataLoader: batch_size must be positive, got {}",
           options_.batch_size);
}

void DataLoader::set_epoch(int64_t epoch) {
  MG_CHECK(epoch >= 0, "DataLoader::set_epoch: epoch must be non-negative, got {}", epoch);
  epoch_ = epoch;
}

void DataLoader::set_start_batch(int64_t batch) {
  MG_CHECK(batch >= 0 && batch <= size(),
           "DataLoader::set_start_batch: batch {} is outside [0, {}] (the batches per epoch)",
           batch, size());
  start_batch_ = batch;
}

int64_t DataLoader::size() const {
  const int64_t n = sampler_->size(), b = options_.batch_size;
  return options_.drop_last ? n / b : ceil_div(n, b);
}

DataLoader::Iterator DataLoader::begin() {
  auto order = std::make_shared<const std::vector<int64_t>>(sampler_->indices(epoch_));
  ++epoch_;
  const int64_t start = start_batch_;
  start_batch_ = 0;
  return Iterator(this, std::move(order), start);
}

DataLoader::Iterator DataLoader::end() const { return Iterator(this, nullptr, size()); }

DataLoader::Iterator::Iterator(const DataLoader* loader,
                               std::shared_ptr<const std::vector<int64_t>> order,
                               int64_t position)
    : loader_(loader), order_(std::move(order)), position_(position) {
  if (order_ != nullptr) load();
}

DataLoader::Iterator& DataLoader::Iterator::operator++() {
  ++position_;
  load();
  return *this;
}

void DataLoader::Iterator::load() {
  batch_ = Batch{};
  if (position_ >= loader_->size()) return;
  const int64_t b = loader_->options_.batch_size;
  const auto first = static_cast<size_t>(position_ * b);
  const size_t last = std::min(order_->size(), first + static_cast<size_t>(b));
  const std::vector<int64_t> indices(order_->begin() + static_cast<std::ptrdiff_t>(first),
                                     order_->begin() + static_cast<std::ptrdiff_t>(last));
  batch_ = loader_->dataset_->get_batch(indices);
}

}  // namespace mg::data
