#include <minigrad/parallel/sharded/fully_sharded_data_parallel.h>

#include <fmt/format.h>

#include <minigrad/nn/layers.h>

namespace mg::parallel {

FullyShardedDataParallel::FullyShardedDataParallel(nn::ModulePtr module, std::shared_ptr<ProcessGroup> process_group,
                                                   FSDPOptions options)
    : nn::Module("FullyShardedDataParallel"), module_(std::move(module)) {
  MG_CHECK(module_ != nullptr, "FullyShardedDataParallel: module is null");
  // FSDP1's units: the children of a Sequential that have parameters, then the rest.
  if (dynamic_cast<nn::Sequential*>(module_.get()) != nullptr)
    for (const nn::ModulePtr& child : module_->children())
      if (!child->named_parameters().empty()) fully_shard(child, process_group, options);
  fsdp_ = fully_shard(module_, std::move(process_group), options);
  for (size_t u = 0; u < fsdp_->num_units(); ++u) register_parameter(fmt::format("flat_shard_{}", u), fsdp_->unit(u).shard());
}

Tensor FullyShardedDataParallel::forward(const Tensor& input) {
  module_->train(is_training());
  return (*module_)(input);  // the hooks of fully_shard gather and free each unit around its use
}

std::string FullyShardedDataParallel::extra_repr() const {
  const ProcessGroup& pg = *fsdp_->process_group();
  return fmt::format("backend={}, rank={}, world_size={}, units={}", pg.backend_name(), pg.rank(), pg.size(),
                     fsdp_->num_units());
}

nn::ModulePtr FullyShardedDataParallel::copy_node() const {
  MG_FAIL("FullyShardedDataParallel cannot be copied (clone, shallow_clone): it is bound to its "
          "process group, and the wrapped module's parameters are views of its shards' "
          "gathered buffers; copy full_state_dict() into a plain module instead");
}

}  // namespace mg::parallel
