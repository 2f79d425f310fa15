#include <minigrad/parallel/c10d/process_group.h>

#include <cstdint>
#include <string>
#include <utility>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <minigrad/core/ops.h>
#include <minigrad/parallel/c10d/store/tcp_store.h>
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
    MG_CHECK(!average || is_floating_point(t.dtype()),
             "{} ({}): ReduceOp::Average needs float32 or float64 tensors, tensor {} is {} "
             "(rank {})",
             collective, backend_name(), i, t.dtype(), rank_);
  }
}

void ProcessGroup::check_message(const char* op, const std::vector<Tensor>& tensors, int peer,
                                 int tag) const {
  check_tensors(op, tensors, false);
  const char* peer_name = std::string(op) == "send" ? "destination" : "source";
  MG_CHECK(peer >= 0 && peer < size_, "{} ({}): {} rank {} is outside [0, {}) (rank {})", op,
           backend_name(), peer_name, peer, size_, rank_);
  MG_CHECK(peer != rank_, "{} ({}): {} rank {} is this rank itself; messages go to other ranks",
           op, backend_name(), peer_name, peer);
  MG_CHECK(tag >= 0, "{} ({}): tag {} is negative; tags are 0 or more (rank {})", op,
           backend_name(), tag, rank_);
}

namespace {

std::string list(const std::vector<int>& ranks) {
  return fmt::format("[{}]", fmt::join(ranks, ", "));
}

}  // namespace

int ProcessGroup::check_new_group(const std::vector<int>& ranks) const {
  MG_CHECK(!ranks.empty(), "new_group ({}): the list of ranks is empty (rank {})", backend_name(),
           rank_);
  int index = -1;
  for (size_t i = 0; i < ranks.size(); ++i) {
    MG_CHECK(ranks[i] >= 0 && ranks[i] < size_,
             "new_group ({}): rank {} of {} is outside this group's [0, {}) (rank {})",
             backend_name(), ranks[i], list(ranks), size_, rank_);
    MG_CHECK(i == 0 || ranks[i - 1] < ranks[i],
             "new_group ({}): the ranks {} must be sorted and distinct (rank {})", backend_name(),
             list(ranks), rank_);
    if (ranks[i] == rank_) index = static_cast<int>(i);
  }
  return index;
}

void ProcessGroup::agree_on_members(Store& store, const std::string& prefix,
                                    const std::vector<int>& ranks) const {
  const std::string mine = list(ranks);
  store.set(fmt::format("{}members/{}", prefix, rank_), mine);
  for (int member : ranks) {
    if (member == rank_) continue;
    std::string theirs;
    try {
      theirs = store.get(fmt::format("{}members/{}", prefix, member), timeout());
    } catch (const Error& e) {
      MG_FAIL("new_group ({}): rank {} did not join the sub-group {} with rank {}: every rank "
              "must call new_group in the same order, with the same ranks. {}",
              backend_name(), member, mine, rank_, e.what());
    }
    MG_CHECK(theirs == mine,
             "new_group ({}): rank {} was given the ranks {}, but rank {} was given {}: every "
             "rank must call new_group in the same order, with the same ranks",
             backend_name(), rank_, mine, member, theirs);
  }
}

bool ProcessGroup::check_flat_pair(const char* collective, const Tensor& whole,
                                   const char* whole_name, const Tensor& part,
                                   const char* part_name, bool average) const {
  const std::string backend = backend_name();
  const Device device = this->device();
  for (const auto& [t, name] : {std::pair<const Tensor&, const char*>{whole, whole_name},
                                std::pair<const Tensor&, const char*>{part, part_name}}) {
    MG_CHECK(t.defined(), "{} ({}): {} is undefined (rank {})", collective, backend, name, rank_);
    MG_CHECK(t.device() == device,
             "{} ({}): {} of shape {} is on {}, but this process group works on {} (rank {})",
             collective, backend, name, t.shape(), t.device(), device, rank_);
    MG_CHECK(t.is_contiguous(),
             "{} ({}): {} of shape {} is not contiguous; pass .contiguous() (rank {})",
             collective, backend, name, t.shape(), rank_);
  }
  MG_CHECK(whole.dtype() == part.dtype(),
           "{} ({}): {} is {} but {} is {}; both take one dtype (rank {})", collective, backend,
           whole_name, whole.dtype(), part_name, part.dtype(), rank_);
  MG_CHECK(!average || is_floating_point(whole.dtype()),
           "{} ({}): ReduceOp::Average needs float32 or float64 tensors, {} is {} (rank {})",
           collective, backend, whole_name, whole.dtype(), rank_);
  const int64_t n = part.numel();
  int64_t needed = 0;
  MG_CHECK(!__builtin_mul_overflow(n, static_cast<int64_t>(size_), &needed),
           "{} ({}): {} x {} elements overflow (rank {})", collective, backend, size_, n, rank_);
  MG_CHECK(whole.numel() == needed,
           "{} ({}): {} has {} elements (shape {}), but a group of {} needs {} x {} = {} for an "
           "{} of {} elements (rank {})",
           collective, backend, whole_name, whole.numel(), whole.shape(), size_, size_, n, needed,
           part_name, n, rank_);

  // Apart in memory, or part exactly this rank's slice of whole (the in-place form NCCL
  // takes); anything in between would read what it has already overwritten.
  if (!whole.storage().is_alias_of(part.storage()) || n == 0) return false;
  const auto begin = [](const Tensor& t) { return reinterpret_cast<std::uintptr_t>(t.data_ptr()); };
  const std::uintptr_t slice = begin(whole) + static_cast<std::uintptr_t>(rank_) * part.nbytes();
  if (begin(part) == slice) return true;
  const bool apart = begin(part) + part.nbytes() <= begin(whole) ||
                     begin(whole) + whole.nbytes() <= begin(part);
  MG_CHECK(apart,
           "{} ({}): {} overlaps {} without being its slice for rank {} (elements [{}, {})); in "
           "place, {} must be exactly that slice (rank {})",
           collective, backend, part_name, whole_name, rank_, rank_ * n, (rank_ + 1) * n,
           part_name, rank_);
  return false;
}

CoalescedBuffer::CoalescedBuffer(std::vector<Tensor> tensors, const char* writes_as)
    : tensors_(std::move(tensors)) {
  if (writes_as != nullptr)
    for (const Tensor& t : tensors_) bump_version(t, writes_as);
  flat_ = flatten_dense_tensors(tensors_);
  aliased_ = tensors_.size() == 1 && flat_.storage().is_alias_of(tensors_[0].storage());
}

void CoalescedBuffer::copy_back() const {
  if (aliased_) return;
  const std::vector<Tensor> views = unflatten_dense_tensors(flat_, tensors_);
  for (size_t i = 0; i < tensors_.size(); ++i) ops::copy_(tensors_[i], views[i]);
}

}  // namespace mg::parallel
