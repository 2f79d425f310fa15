#include <minigrad/parallel/tensor_parallel/group.h>

#include <map>
#include <mutex>

#include <minigrad/core/ops.h>
#include <minigrad/core/profiler.h>
#include <minigrad/parallel/c10d/process_group.h>
#include <minigrad/parallel/context_parallel/wire.h>

namespace mg::parallel {

void TensorParallelGroup::check(const char* collective, const Tensor& tensor) const {
  MG_CHECK(tensor.defined(), "tensor-parallel {} ({}): the tensor is undefined", collective,
           describe());
  MG_CHECK(tensor.device() == device(),
           "tensor-parallel {} ({}): the tensor of shape {} is on {}, but this rank works on {}",
           collective, describe(), tensor.shape(), tensor.device(), device());
}

Tensor TensorParallelGroup::all_reduce(const Tensor& tensor) {
  check("all_reduce", tensor);
  all_reduces_ += 1;
  all_reduce_bytes_ += static_cast<int64_t>(tensor.nbytes());
  profiler::Span span(tensor.device(), "tp all_reduce");
  span.category("comm").arg("bytes", tensor.nbytes());
  return all_reduce_impl(tensor);
}

Tensor TensorParallelGroup::all_gather(const Tensor& tensor) {
  check("all_gather", tensor);
  all_gathers_ += 1;
  all_gather_bytes_ += static_cast<int64_t>(tensor.nbytes());
  profiler::Span span(tensor.device(), "tp all_gather");
  span.category("comm").arg("bytes", tensor.nbytes());
  return all_gather_impl(tensor);
}

Tensor TensorParallelGroup::reduce_scatter(const Tensor& tensor) {
  check("reduce_scatter", tensor);
  MG_CHECK(tensor.dim() >= 1 && tensor.size(0) % size() == 0,
           "tensor-parallel reduce_scatter ({}): dimension 0 of shape {} does not divide into {} "
           "equal parts", describe(), tensor.shape(), size());
  reduce_scatters_ += 1;
  reduce_scatter_bytes_ += static_cast<int64_t>(tensor.nbytes());
  profiler::Span span(tensor.device(), "tp reduce_scatter");
  span.category("comm").arg("bytes", tensor.nbytes());
  return reduce_scatter_impl(tensor);
}

Tensor TensorParallelGroup::reduce_scatter_impl(const Tensor& tensor) {
  const int64_t part = tensor.size(0) / size();
  return ops::contiguous(ops::narrow(all_reduce_impl(tensor), 0, rank() * part, part));
}

TensorParallelStats TensorParallelGroup::stats() const {
  TensorParallelStats s;
  s.all_reduces = all_reduces_.load();
  s.all_gathers = all_gathers_.load();
  s.all_reduce_bytes = all_reduce_bytes_.load();
  s.all_gather_bytes = all_gather_bytes_.load();
  s.reduce_scatters = reduce_scatters_.load();
  s.reduce_scatter_bytes = reduce_scatter_bytes_.load();
  return s;
}

void TensorParallelGroup::reset_stats() {
  all_reduces_ = 0;
  all_gathers_ = 0;
  all_reduce_bytes_ = 0;
  all_gather_bytes_ = 0;
  reduce_scatters_ = 0;
  reduce_scatter_bytes_ = 0;
}

DimPlacement tensor_parallel_placement(const TensorParallelGroup& group, Placement placement,
                                       bool partial_gradient) {
  return DimPlacement{"tp", group.process_group(), group.rank(), group.size(), placement, partial_gradient};
}

int64_t shard_size(int64_t size, int parts, const char* what) {
  MG_CHECK(parts >= 1, "{}: the tensor-parallel size must be at least 1, got {}", what, parts);
  MG_CHECK(size % parts == 0,
           "{} = {} is not divisible by the tensor-parallel size {}: every rank holds an equal "
           "shard (no padding), so choose a width that is a multiple of {}",
           what, size, parts, parts);
  return size / parts;
}

namespace {

// One process per rank: the process group's collectives, waited for at once.
class ProcessGroupTensorParallel final : public TensorParallelGroup {
 public:
  explicit ProcessGroupTensorParallel(std::shared_ptr<ProcessGroup> group)
      : group_(std::move(group)) {}

  int rank() const override { return group_->rank(); }
  int size() const override { return group_->size(); }
  Device device() const override { return group_->device(); }
  std::string describe() const override {
    return fmt::format("{} rank {} of {}", group_->backend_name(), rank(), size());
  }
  std::shared_ptr<ProcessGroup> process_group() const override { return group_; }

 protected:
  // Float64: an all-gather (context_parallel/wire.h) and the parts added in rank order on
  // every rank, so every rank gets the same sum in a fixed order whatever the backend's
  // reduction algorithm; the composed mesh's tests check in float64 against that.
  Tensor all_reduce_impl(const Tensor& tensor) override {
    if (tensor.dtype() == DType::Float64) return sum_in_rank_order(all_gather_impl(tensor));
    Tensor out = ops::clone(tensor);  // allreduce works in place; the input stays as it was
    group_->allreduce(out)->wait();
    return out;
  }

  Tensor all_gather_impl(const Tensor& tensor) override {
    std::vector<int64_t> sizes{size()};
    for (int64_t s : tensor.shape().sizes()) sizes.push_back(s);
    Tensor out = empty(Shape(sizes), tensor.dtype(), device());
    group_->all_gather(context_parallel::wire_view(out),
                       context_parallel::wire_view(ops::contiguous(tensor)))->wait();
    return out;
  }

  Tensor reduce_scatter_impl(const Tensor& tensor) override {
    if (tensor.dtype() == DType::Float64) return TensorParallelGroup::reduce_scatter_impl(tensor);
    std::vector<int64_t> sizes = tensor.shape().sizes();
    sizes[0] /= size();
    Tensor out = empty(Shape(sizes), tensor.dtype(), device());
    group_->reduce_scatter(out, ops::contiguous(tensor))->wait();
    return out;
  }

 private:
  // [size, ...] -> the sum over dimension 0, rank 0's part first.
  static Tensor sum_in_rank_order(const Tensor& parts) {
    std::vector<int64_t> sizes = parts.shape().sizes();
    sizes.erase(sizes.begin());
    const auto part = [&](int64_t r) { return ops::view(ops::narrow(parts, 0, r, 1), Shape(sizes)); };
    Tensor sum = ops::clone(part(0));
    for (int64_t r = 1; r < parts.size(0); ++r) sum = ops::binary(BinaryOp::Add, sum, part(r));
    return sum;
  }

  std::shared_ptr<ProcessGroup> group_;
};

}  // namespace

TensorParallelGroupPtr tensor_parallel_group(std::shared_ptr<ProcessGroup> process_group) {
  MG_CHECK(process_group != nullptr,
           "tensor_parallel_group: the process group is null (is this rank outside the group "
           "that new_group made?)");
  // One view per process group while it is in use, so that everything talking over it
  // (a plan's layers, the loss, the partial sums) counts into one stats().
  static std::mutex mutex;
  static std::map<const ProcessGroup*, std::weak_ptr<TensorParallelGroup>> views;
  std::lock_guard<std::mutex> lock(mutex);
  for (auto it = views.begin(); it != views.end();) it = it->second.expired() ? views.erase(it) : std::next(it);
  if (auto view = views[process_group.get()].lock()) return view;
  auto view = std::make_shared<ProcessGroupTensorParallel>(process_group);
  views[process_group.get()] = view;
  return view;
}

}  // namespace mg::parallel
