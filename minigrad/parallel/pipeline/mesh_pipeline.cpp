// MeshPipeline (mesh_pipeline.h): a cut model's stages over pp, replicated over dp.
#include <minigrad/parallel/pipeline/mesh_pipeline.h>

#include <algorithm>
#include <utility>

#include <minigrad/autograd/grad_mode.h>
#include <minigrad/core/ops.h>
#include <minigrad/parallel/context_parallel/wire.h>
#include <minigrad/parallel/partial_gradients.h>
#include <minigrad/parallel/placement.h>

namespace mg::parallel {

MeshPipeline::MeshPipeline(const nn::Module& model, const DeviceMesh& mesh, const PipelineCut& cut,
                           MeshPipelineOptions options)
    : options_(options) {
  MG_CHECK(mesh.has_dim("pp"), "MeshPipeline: the mesh {} has no pp dimension to cut the model over", mesh.str());
  for (const char* dim : {"cp", "tp"})
    MG_CHECK(mesh.size(dim) == 1,
             "MeshPipeline: the mesh {} splits over {} ({} ranks); a plan splits the model over cp and tp "
             "before the cut, this pipeline runs pp and dp", mesh.str(), dim, mesh.size(dim));
  pp_ = mesh.group("pp");
  if (mesh.size("dp") > 1) dp_ = mesh.group("dp");
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
  if (!dp_) return x;
  const int64_t B = x.size(0), dp = dp_->size(), d = dp_->rank(), base = B / dp, extra = B % dp;
  const int64_t rows = base + (d < extra ? 1 : 0);
  MG_CHECK(rows >= 1, "MeshPipeline::local_batch: {} rows cannot feed {} dp ranks", B, dp);
  return ops::contiguous(x.narrow(0, d * base + std::min(d, extra), rows));
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
