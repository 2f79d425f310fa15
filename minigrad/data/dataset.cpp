#include <minigrad/data/dataset.h>

#include <cstring>

#include <minigrad/core/ops.h>

namespace mg::data {

Batch Batch::to(Device device) const {
  Batch out;
  auto move = [device](const Tensor& t) {
    return !t.defined() || t.device() == device ? t : ops::copy_to(t, device);
  };
  out.data = move(data);
  out.target = move(target);
  return out;
}

void Dataset::check_index(int64_t index, const char* dataset_name) const {
  MG_CHECK(index >= 0 && index < size(), "{}: index {} out of range for a dataset of size {}",
           dataset_name, index, size());
}

namespace {

// An empty [count, ...example shape] tensor like `example`, or undefined.
Tensor batch_like(const Tensor& example, int64_t count) {
  if (!example.defined()) return Tensor();
  std::vector<int64_t> sizes{count};
  sizes.insert(sizes.end(), example.shape().begin(), example.shape().end());
  return empty(Shape(std::move(sizes)), example.dtype(), example.device());
}

void check_like(const Tensor& first, const Tensor& other, const char* what, size_t position,
                int64_t index) {
  MG_CHECK(first.defined() == other.defined(),
           "Dataset::get_batch: example {} (position {} in the batch) {} a {} but the first "
           "example {}",
           index, position, other.defined() ? "has" : "lacks", what,
           first.defined() ? "has one" : "does not");
  if (!first.defined()) return;
  MG_CHECK(first.shape() == other.shape() && first.dtype() == other.dtype() &&
               first.device() == other.device(),
           "Dataset::get_batch: cannot stack examples of different kinds: example {} (position "
           "{} in the batch) has {} of shape {}, {} on {}, but the first has shape {}, {} on {}",
           index, position, what, other.shape(), other.dtype(), other.device(), first.shape(),
           first.dtype(), first.device());
}

// Copies `example` into row `row` of `batch` (any device; broadcast adds the row dim).
void copy_row(const Tensor& batch, int64_t row, const Tensor& example) {
  if (!batch.defined()) return;
  ops::copy_(ops::narrow(batch, 0, row, 1), example);
}

}  // namespace

Batch Dataset::get_batch(const std::vector<int64_t>& indices) const {
  MG_CHECK(!indices.empty(), "Dataset::get_batch: empty list of indices");
  const auto count = static_cast<int64_t>(indices.size());
  const Example first = get(indices[0]);
  Batch batch{batch_like(first.data, count), batch_like(first.target, count)};
  copy_row(batch.data, 0, first.data);
  copy_row(batch.target, 0, first.target);
  for (size_t i = 1; i < indices.size(); ++i) {
    const Example e = get(indices[i]);
    check_like(first.data, e.data, "data", i, indices[i]);
    check_like(first.target, e.target, "target", i, indices[i]);
    copy_row(batch.data, static_cast<int64_t>(i), e.data);
    copy_row(batch.target, static_cast<int64_t>(i), e.target);
  }
  return batch;
}

// ---------------------------------------------------------------- TensorDataset

TensorDataset::TensorDataset(const Tensor& data, const Tensor& targets) {
  MG_CHECK(data.defined(), "TensorDataset: the data tensor is undefined");
  MG_CHECK(data.dim() >= 1, "TensorDataset: data must have a leading example dimension, got a "
                            "0-d tensor");
  data_ = ops::contiguous(data.detach());
  if (targets.defined()) {
    MG_CHECK(targets.dim() >= 1 && targets.size(0) == data.size(0),
             "TensorDataset: data of shape {} holds {} examples but targets of shape {} hold {}",
             data.shape(), data.size(0), targets.shape(), targets.dim() >= 1 ? targets.size(0) : 0);
    targets_ = ops::contiguous(targets.detach());
  }
}

namespace {

// Row `index` of a contiguous [N, ...] tensor, as a view.
Tensor row_view(const Tensor& t, int64_t index) {
  std::vector<int64_t> sizes(t.shape().begin() + 1, t.shape().end());
  std::vector<int64_t> strides(t.strides().begin() + 1, t.strides().end());
  return ops::as_strided(t, Shape(std::move(sizes)), std::move(strides),
                         t.storage_offset() + index * t.stride(0));
}

// Gathers rows of a contiguous CPU [N, ...] tensor into a new [indices, ...] tensor.
// Consecutive indices (a sequential sampler, an unshuffled test set) are one memcpy.
Tensor gather_rows(const Tensor& source, const std::vector<int64_t>& indices) {
  if (!source.defined()) return Tensor();
  std::vector<int64_t> sizes = source.shape().sizes();
  sizes[0] = static_cast<int64_t>(indices.size());
  Tensor out = empty(Shape(std::move(sizes)), source.dtype(), Device::cpu());
  const size_t row_bytes =
      static_cast<size_t>(source.numel() / std::max<int64_t>(source.size(0), 1)) *
      element_size(source.dtype());
  const auto* src = static_cast<const char*>(source.data_ptr());
  auto* dst = static_cast<char*>(out.data_ptr());
  size_t i = 0;
  while (i < indices.size()) {
    size_t run = 1;
    while (i + run < indices.size() && indices[i + run] == indices[i] + static_cast<int64_t>(run))
      ++run;
    std::memcpy(dst + i * row_bytes, src + static_cast<size_t>(indices[i]) * row_bytes,
                run * row_bytes);
    i += run;
  }
  return out;
}

}  // namespace

Example TensorDataset::get(int64_t index) const {
  check_index(index, "TensorDataset::get");
  return Example{row_view(data_, index),
                 targets_.defined() ? row_view(targets_, index) : Tensor()};
}

Batch TensorDataset::get_batch(const std::vector<int64_t>& indices) const {
  MG_CHECK(!indices.empty(), "TensorDataset::get_batch: empty list of indices");
  if (!data_.device().is_cpu() || (targets_.defined() && !targets_.device().is_cpu()))
    return Dataset::get_batch(indices);
  for (int64_t index : indices) check_index(index, "TensorDataset::get_batch");
  return Batch{gather_rows(data_, indices), gather_rows(targets_, indices)};
}

// ---------------------------------------------------------------- RandomDataset

RandomDataset::RandomDataset(int64_t size, int64_t length)
    : TensorDataset([&] {
        MG_CHECK(size > 0 && length > 0,
                 "RandomDataset: size and length must be positive, got size {} and length {}",
                 size, length);
        return randn(Shape{length, size});
      }()) {}

}  // namespace mg::data
