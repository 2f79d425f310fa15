#include <minigrad/parallel/distributed/process_group.h>

#include <minigrad/core/ops.h>
#include <minigrad/parallel/coalesce.h>

namespace mg::parallel {

const char* reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return "sum";
    case ReduceOp::Average: return "average";
  }
  return "?";
}

ProcessGroup::ProcessGroup(int rank, int size) : rank_(rank), size_(size) {
  MG_CHECK(size >= 1, "ProcessGroup: world size must be at least 1, got {}", size);
  MG_CHECK(rank >= 0 && rank < size, "ProcessGroup: rank {} is outside [0, {})", rank, size);
}

void ProcessGroup::check_tensors(const char* collective, const std::vector<Tensor>& tensors,
                                 bool average) const {
  MG_CHECK(!tensors.empty(), "{} ({}): expected at least one tensor (rank {})", collective,
           backend_name(), rank_);
  const Device device = this->device();
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& t = tensors[i];
    MG_CHECK(t.defined(), "{} ({}): tensor {} is undefined (rank {})", collective,
             backend_name(), i, rank_);
    MG_CHECK(t.device() == device,
             "{} ({}): tensor {} of shape {} is on {}, but this process group works on {} "
             "(rank {})",
             collective, backend_name(), i, t.shape(), t.device(), device, rank_);
    MG_CHECK(t.dtype() == tensors[0].dtype(),
             "{} ({}): tensor {} is {} but tensor 0 is {}; one call takes one dtype (rank {})",
             collective, backend_name(), i, t.dtype(), tensors[0].dtype(), rank_);
    MG_CHECK(t.dtype() == DType::Float32 || t.dtype() == DType::Int64,
             "{} ({}): tensor {} is {}; float32 and int64 are supported (rank {})", collective,
             backend_name(), i, t.dtype(), rank_);
    MG_CHECK(!average || t.dtype() == DType::Float32,
             "{} ({}): ReduceOp::Average needs float32 tensors, tensor {} is {} (rank {})",
             collective, backend_name(), i, t.dtype(), rank_);
  }
}

CoalescedBuffer::CoalescedBuffer(std::vector<Tensor> tensors, const char* collective)
    : tensors_(std::move(tensors)) {
  for (const Tensor& t : tensors_) bump_version(t, collective);
  flat_ = flatten_dense_tensors(tensors_);
  aliased_ = tensors_.size() == 1 && flat_.storage().is_alias_of(tensors_[0].storage());
}

void CoalescedBuffer::copy_back() const {
  if (aliased_) return;
  const std::vector<Tensor> views = unflatten_dense_tensors(flat_, tensors_);
  for (size_t i = 0; i < tensors_.size(); ++i) ops::copy_(tensors_[i], views[i]);
}

}  // namespace mg::parallel
