// Datasets: indexed collections of (data, target) examples, as torch.utils.data.
//
// A Dataset hands out single examples with get(i) and whole batches with get_batch(
// indices). The default get_batch stacks get(i) results; datasets that already hold
// their examples as rows of one tensor (TensorDataset, FashionMNIST) gather the rows
// straight into the batch tensor, which is what keeps the training loop fast.
#pragma once

#include <cstdint>
#include <vector>

#include <minigrad/core/tensor.h>

namespace mg::data {

// One example. `target` is undefined for datasets without targets (RandomDataset).
struct Example {
  Tensor data;
  Tensor target;
};

// Examples stacked along a new leading dimension: data [B, ...], target [B, ...].
struct Batch {
  Tensor data;
  Tensor target;  // undefined when the dataset has no targets

  int64_t size() const { return data.defined() ? data.size(0) : 0; }
  // The batch on `device` (a copy unless it is already there). Not differentiable:
  // batches are inputs, not part of the graph.
  Batch to(Device device) const;
};

class Dataset {
 public:
  virtual ~Dataset() = default;
  virtual int64_t size() const = 0;
  // Example `index` in [0, size()); out of range is an mg::Error.
  virtual Example get(int64_t index) const = 0;
  // The examples at `indices`, stacked. Every example must have the same shapes and
  // dtypes (an mg::Error names the first that differs).
  virtual Batch get_batch(const std::vector<int64_t>& indices) const;

 protected:
  // For subclasses' get(): an mg::Error naming the dataset when index is out of range.
  void check_index(int64_t index, const char* dataset_name) const;
};

// Rows of `data` (and of `targets`, when given) are the examples, as
// torch.utils.data.TensorDataset(data, targets). The tensors are detached (a dataset
// is not part of any graph) and made contiguous.
class TensorDataset : public Dataset {
 public:
  explicit TensorDataset(const Tensor& data, const Tensor& targets = Tensor());

  int64_t size() const override { return data_.size(0); }
  // Views of row `index` (they share the dataset's memory).
  Example get(int64_t index) const override;
  // CPU tensors: each selected row is memcpy'd into one batch tensor (runs of
  // consecutive indices in one memcpy). Other devices: the generic path.
  Batch get_batch(const std::vector<int64_t>& indices) const override;

  const Tensor& data() const { return data_; }
  const Tensor& targets() const { return targets_; }

 private:
  Tensor data_;
  Tensor targets_;
};

// The dataset of PyTorch's DataParallel tutorial: `length` examples of `size` standard
// normal features, drawn from the default generator (seed it with mg::manual_seed).
// It has no targets, as the tutorial's does not: batches carry an undefined target.
class RandomDataset : public TensorDataset {
 public:
  RandomDataset(int64_t size, int64_t length);
};

}  // namespace mg::data
