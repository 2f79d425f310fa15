#include <minigrad/parallel/tensor_parallel/group.h>

#include <minigrad/core/ops.h>

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
  return all_reduce_impl(tensor);
}

Tensor TensorParallelGroup::all_gather(const Tensor& tensor) {
  check("all_gather", tensor);
  all_gathers_ += 1;
  all_gather_bytes_ += static_cast<int64_t>(tensor.nbytes());
  return all_gather_impl(tensor);
}

TensorParallelStats TensorParallelGroup::stats() const {
  return {all_reduces_.load(), all_gathers_.load(), all_reduce_bytes_.load(),
          all_gather_bytes_.load()};
}

void TensorParallelGroup::reset_stats() {
  all_reduces_ = 0;
  all_gathers_ = 0;
  all_reduce_bytes_ = 0;
  all_gather_bytes_ = 0;
}

int64_t shard_size(int64_t size, int parts, const char* what) {
  MG_CHECK(parts >= 1, "{}: the tensor-parallel size must be at least 1, got {}", what, parts);
  MG_CHECK(size % parts == 0,
           "{} = {} is not divisible by the tensor-parallel size {}: every rank holds an equal "
           "shard (no padding), so choose a width that is a multiple of {}",
           what, size, parts, parts);
  return size / parts;
}

}  // namespace mg::parallel
