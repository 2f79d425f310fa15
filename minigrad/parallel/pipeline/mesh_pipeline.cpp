// MeshPipeline (mesh_pipeline.h): a cut model's stages over pp, replicated over dp.
#include <minigrad/parallel/pipeline/mesh_pipeline.h>

#include <algorithm>
#include <utility>

#include <minigrad/autograd/grad_mode.h>
#include <minigrad/core/ops.h>
#include <minigrad/parallel/context_parallel/sequence_layout.h>
#include <minigrad/parallel/context_parallel/wire.h>
#include <minigrad/parallel/partial_gradients.h>
#include <minigrad/parallel/placement.h>

namespace mg::parallel {

MeshPipeline::MeshPipeline(const nn::Module& model, const DeviceMesh& mesh, const PipelineCut& cut,
                           MeshPipelineOptions options)
    : options_(options) {
  MG_CHECK(mesh.has_dim("pp"), "MeshPipeline: the mesh {} has no pp dimension to cut the model over", mesh.str());
  // cp and tp are a plan's, applied before the cut: every parameter must say so.
  for (const char* dim : {"cp", "tp"}) {
    if (mesh.size(dim) == 1) continue;
    for (const auto& [name, p] : model.named_parameters()) {
      const ParameterSpec* spec = spec_of(p);
      const bool placed = spec != nullptr && std::any_of(spec->pieces[0].placements.begin(),
                                                         spec->pieces[0].placements.end(),
                                                         [&](const DimPlacement& d) { return d.dim == dim; });
      MG_CHECK(placed,
               "MeshPipeline: the mesh {} splits over {} ({} ranks), but '{}' has no {} placement: apply the model's "
               "{} plan (parallelize_module) before the cut", mesh.str(), dim, mesh.size(dim), name, dim, dim);
    }
  }
  pp_ = mesh.group("pp");
  if (mesh.size("dp") > 1) dp_ = mesh.group("dp");
  if (mesh.size("cp") > 1) cp_ = mesh.group("cp");
  chunks_ = split_module(model, cut, pp_);
  if (dp_)
    for (const auto& [name, p] : named_parameters()) {
      const ParameterSpec* spec = spec_of(p);
      DimPlacement placement;
      placement.dim = "dp";
      placement.group = dp_;
      placement.rank = dp_->rank();
      placement.size = dp_->size();
      placement.partial_gradient = true;
      record_placement(p, spec ? spec->pieces[0].name : name, spec ? spec->pieces[0].shape : p.shape(),
                       std::move(placement));
    }
  PipelineStageOptions stage_options;
  stage_options.chunks = options_.micro_batches;
  stage_options.schedule = options_.schedule;
  stage_options.checkpoint = options_.checkpoint;
  stage_options.weight_by_rows = false;  // each micro-batch's loss is already its share
  stage_ = std::make_unique<PipelineStage>(chunks_, pp_, stage_options);
}

Tensor MeshPipeline::local_batch(const Tensor& x) const {
  MG_CHECK(x.defined() && x.dim() >= 1, "MeshPipeline::local_batch: expected a batch [B, ...], got {}",
           x.defined() ? x.shape().str() : "an undefined tensor");
  Tensor mine = x;
  if (dp_) {
    const int64_t B = x.size(0), dp = dp_->size(), d = dp_->rank(), base = B / dp, extra = B % dp;
    const int64_t rows = base + (d < extra ? 1 : 0);
    MG_CHECK(rows >= 1, "MeshPipeline::local_batch: {} rows cannot feed {} dp ranks", B, dp);
    mine = ops::contiguous(x.narrow(0, d * base + std::min(d, extra), rows));
  }
  // Under cp, this rank's two chunks of every sequence (dimension 1).
  return cp_ ? context_parallel::shard_sequence(mine, cp_->rank(), cp_->size()) : mine;
}

Tensor MeshPipeline::train_step(const Tensor& input, const Tensor& target, const PipeLoss& loss_fn) {
  const int p = pp_->size(), s = pp_->rank();
  const Tensor loss = stage_->train_step(s == 0 ? input : Tensor(), s + 1 == p ? target : Tensor(), loss_fn);
  if (options_.finish_gradients) finish_gradients();
  // This dp rank's share on every stage, then the shares added over dp.
  Tensor total = stage_->loss_on_every_rank(loss);
  if (dp_) total = context_parallel::sum_over_group(total.reshape(Shape{1}), *dp_).reshape(Shape{});
  return total;
}

void MeshPipeline::finish_gradients() { reduce_partial_gradients(parameters()); }

void MeshPipeline::zero_grad(bool set_to_none) {
  for (const nn::ModulePtr& chunk : chunks_) chunk->zero_grad(set_to_none);
}

void MeshPipeline::train(bool on) {
  for (const nn::ModulePtr& chunk : chunks_) chunk->train(on);
}

}  // namespace mg::parallel
