#include <minigrad/parallel/ddp/distributed_data_parallel.h>

#include <unordered_set>

#include <minigrad/autograd/grad_mode.h>
#include <minigrad/parallel/c10d/same_model.h>
#include <minigrad/parallel/placement.h>

namespace mg::parallel {

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
    // Every dp rank holds it whole; DDP itself averages the gradients (not Partial).
    const ParameterSpec* spec = spec_of(p);
    record_placement(p, name, spec ? spec->pieces[0].shape : p.shape(),
                     DimPlacement{"dp", process_group_, process_group_->rank(), process_group_->size(),
                                  Placement::replicate(), false});
  }

  // Replicas start equal: same shapes on every rank, then rank 0's values everywhere.
  sync_module_states(*process_group_, *module_, "DistributedDataParallel");
  // The buffers, broadcast from rank 0, are replicas too.
  for (const auto& [name, b] : module_->named_buffers())
    record_placement(b, name, b.shape(),
                     DimPlacement{"dp", process_group_, process_group_->rank(), process_group_->size(),
                                  Placement::replicate(), false});

  const char* who = "DistributedDataParallel";
  reducer_ = Reducer::create(std::move(params), std::move(names), process_group_,
                             bucket_bytes_from_mib(options_.first_bucket_mb, who, "first_bucket_mb"),
                             bucket_bytes_from_mib(options_.bucket_cap_mb, who, "bucket_cap_mb"),
                             options_.find_unused_parameters, options_.gradient_as_bucket_view);
  reducer_->set_comm_hook(options_.comm_hook);
}

Tensor DistributedDataParallel::forward(const Tensor& input) {
  reducer_->prepare_for_forward();
  if (options_.broadcast_buffers && process_group_->size() > 1) {
    const std::vector<Tensor> buffers = module_->buffers();
    if (!buffers.empty()) broadcast_from_rank0(*process_group_, buffers);
  }
  Tensor output = (*module_)(input);
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
