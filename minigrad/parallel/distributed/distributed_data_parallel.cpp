#include <minigrad/parallel/distributed/distributed_data_parallel.h>

#include <cmath>
#include <unordered_set>

#include <minigrad/autograd/grad_mode.h>
#include <minigrad/parallel/coalesce.h>

namespace mg::parallel {

namespace {

size_t mib_to_bytes(double mib, const char* what) {
  MG_CHECK(std::isfinite(mib) && mib > 0.0, "DistributedDataParallel: {} must be positive, got {}",
           what, mib);
  return std::max<size_t>(1, static_cast<size_t>(mib * 1024.0 * 1024.0));
}

// [count, then per tensor: dim, sizes..., dtype]: what must agree across ranks.
std::vector<int64_t> shape_signature(const std::vector<nn::NamedTensor>& tensors) {
  std::vector<int64_t> sig{static_cast<int64_t>(tensors.size())};
  for (const auto& [name, t] : tensors) {
    sig.push_back(t.dim());
    for (int64_t s : t.shape()) sig.push_back(s);
    sig.push_back(static_cast<int64_t>(t.dtype()));
  }
  return sig;
}

// Reads one entry of a signature at `pos`; false when it runs past the end.
bool read_entry(const std::vector<int64_t>& sig, size_t& pos, Shape& shape, int64_t& dtype) {
  if (pos >= sig.size()) return false;
  const int64_t dim = sig[pos++];
  if (dim < 0 || pos + static_cast<size_t>(dim) + 1 > sig.size()) return false;
  std::vector<int64_t> sizes(sig.begin() + static_cast<std::ptrdiff_t>(pos),
                             sig.begin() + static_cast<std::ptrdiff_t>(pos + static_cast<size_t>(dim)));
  pos += static_cast<size_t>(dim);
  dtype = sig[pos++];
  shape = Shape(std::move(sizes));
  return true;
}

}  // namespace

DistributedDataParallel::DistributedDataParallel(nn::ModulePtr module,
                                                 std::shared_ptr<ProcessGroup> process_group,
                                                 DDPOptions options)
    : nn::Module("DistributedDataParallel"),
      module_(std::move(module)),
      process_group_(std::move(process_group)),
      options_(options) {
  MG_CHECK(module_ != nullptr, "DistributedDataParallel: module is null");
  MG_CHECK(process_group_ != nullptr, "DistributedDataParallel: process group is null");
  register_module("module", module_);

  // The trained parameters: those requiring grad, each once (a shared one appears once).
  std::vector<Tensor> params;
  std::vector<std::string> names;
  std::unordered_set<const TensorImpl*> seen;
  const Device device = process_group_->device();
  for (const auto& [name, p] : module_->named_parameters()) {
    MG_CHECK(p.device() == device,
             "DistributedDataParallel: parameter '{}' is on {}, but the process group ({}) works "
             "on {}; move the module there first (module->to(process_group->device()))",
             name, p.device(), process_group_->backend_name(), device);
    if (!p.requires_grad() || !seen.insert(p.impl()).second) continue;
    params.push_back(p);
    names.push_back(name);
  }

  // Replicas start equal: same shapes on every rank, then rank 0's values everywhere.
  std::vector<nn::NamedTensor> state = module_->named_parameters();
  for (auto& b : module_->named_buffers()) state.push_back(b);
  check_same_shapes_across_ranks(state);
  std::vector<Tensor> values;
  for (const auto& [name, t] : state) values.push_back(t);
  broadcast_from_rank0(values);

  reducer_ = Reducer::create(std::move(params), std::move(names), process_group_,
                             mib_to_bytes(options_.first_bucket_mb, "first_bucket_mb"),
                             mib_to_bytes(options_.bucket_cap_mb, "bucket_cap_mb"),
                             options_.find_unused_parameters, options_.gradient_as_bucket_view);
}

void DistributedDataParallel::check_same_shapes_across_ranks(
    const std::vector<nn::NamedTensor>& tensors) {
  ProcessGroup& pg = *process_group_;
  const int rank = pg.rank();
  // Every rank runs the same three collectives whatever it finds, so a mismatch makes all
  // ranks fail together instead of leaving some waiting in the next collective.
  const std::vector<int64_t> mine = shape_signature(tensors);
  Tensor length = from_vector(std::vector<int64_t>{static_cast<int64_t>(mine.size())}, Shape{1})
                      .to(pg.device());
  pg.broadcast(length, 0)->wait();
  const int64_t root_length = length.to(Device::cpu()).item<int64_t>();
  std::vector<int64_t> padded(static_cast<size_t>(root_length), -1);
  std::copy_n(mine.begin(), std::min(mine.size(), padded.size()), padded.begin());
  Tensor root_sig_tensor = from_vector(padded, Shape{root_length}).to(pg.device());
  pg.broadcast(root_sig_tensor, 0)->wait();
  const std::vector<int64_t> root_sig = root_sig_tensor.to(Device::cpu()).to_vector<int64_t>();

  std::string problem;
  if (root_sig != mine) {
    if (root_sig.empty() || root_sig[0] != mine[0]) {
      problem = fmt::format("rank {} has {} parameters and buffers but rank 0 has {}", rank,
                            mine[0], root_sig.empty() ? 0 : root_sig[0]);
    } else {
      size_t my_pos = 1, root_pos = 1;
      for (const auto& [name, t] : tensors) {
        Shape shape, root_shape;
        int64_t dtype = 0, root_dtype = 0;
        read_entry(mine, my_pos, shape, dtype);
        if (!read_entry(root_sig, root_pos, root_shape, root_dtype)) {
          problem = fmt::format("rank {}'s '{}' has no counterpart on rank 0", rank, name);
          break;
        }
        if (shape != root_shape || dtype != root_dtype) {
          problem = fmt::format("rank {}'s '{}' is {} {} but rank 0's is {} {}", rank, name,
                                t.dtype(), shape, static_cast<DType>(root_dtype), root_shape);
          break;
        }
      }
      if (problem.empty()) problem = fmt::format("rank {}'s parameters differ from rank 0's", rank);
    }
  }
  Tensor mismatches = from_vector(std::vector<int64_t>{problem.empty() ? 0 : 1}, Shape{1})
                          .to(pg.device());
  pg.allreduce(mismatches, ReduceOp::Sum)->wait();
  const int64_t count = mismatches.to(Device::cpu()).item<int64_t>();
  MG_CHECK(problem.empty(),
           "DistributedDataParallel: {}; every rank must build the same model before wrapping it",
           problem);
  MG_CHECK(count == 0,
           "DistributedDataParallel: {} rank(s) have parameters or buffers whose shapes differ "
           "from rank 0's (their own errors say which); every rank must build the same model",
           count);
}

void DistributedDataParallel::broadcast_from_rank0(const std::vector<Tensor>& tensors) {
  if (tensors.empty()) return;
  for (const std::vector<size_t>& group : group_by_dtype(tensors)) {
    std::vector<Tensor> same_dtype;
    for (size_t i : group) same_dtype.push_back(tensors[i]);
    process_group_->broadcast(same_dtype, 0)->wait();
  }
}

Tensor DistributedDataParallel::forward(const Tensor& input) {
  reducer_->prepare_for_forward();
  if (options_.broadcast_buffers && process_group_->size() > 1) {
    const std::vector<Tensor> buffers = module_->buffers();
    if (!buffers.empty()) broadcast_from_rank0(buffers);
  }
  Tensor output = module_->forward(input);
  if (require_sync_ && GradMode::is_enabled() && output.requires_grad()) {
    reducer_->prepare_for_backward(output);
  } else {
    reducer_->disarm();
  }
  return output;
}

std::string DistributedDataParallel::extra_repr() const {
  return fmt::format("backend={}, rank={}, world_size={}, buckets={}",
                     process_group_->backend_name(), process_group_->rank(),
                     process_group_->size(), reducer_->bucket_indices().size());
}

nn::ModulePtr DistributedDataParallel::copy_node() const {
  MG_FAIL("DistributedDataParallel cannot be copied (clone, shallow_clone): it is bound to its "
          "process group and gradient hooks; copy ddp->module() instead");
}

}  // namespace mg::parallel
