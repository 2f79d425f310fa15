// Pipeline stages cut by module name: torchtitan's pipeline split (its
// pipeline_parallel_split_points), torch.distributed.pipelining's split points by FQN. Any
// model whose forward passes absent children through is cut into stages; a stage is a copy
// of the whole model with the other stages' modules removed (Module::remove_child), so its
// parameters keep their single-device names.
//
//   auto pp = parallel::init_process_group("gloo");           // a rank per stage
//   manual_seed(0);
//   auto model = std::make_shared<MyModel>();                  // the same on every rank
//   parallel::PipelineCut cut;
//   cut.split_points = {"blocks.2"};                           // blocks.0 1 | blocks.2 3
//   cut.ties = {{"embed.weight", "head.weight"}};              // one tensor, used twice
//   auto chunks = parallel::split_module(*model, cut, pp);     // this rank's stage
//   parallel::PipelineStage stage(chunks, pp, options);
//   Tensor loss = stage.train_step(x, y, loss_fn);             // x on rank 0, y on the last
//   parallel::reduce_partial_gradients(parallel::chunk_parameter_tensors(chunks));
//   opt.step();                                                // each rank its own parameters
//
// Split points are the first module of every stage after the first, as torchtitan's
// --parallelism.pipeline_parallel_split_points: "blocks.2" starts stage 1. S - 1 points make
// S stages; over p ranks each rank holds v = S / p of them, rank r the virtual stages r,
// r + p, r + 2p, ... (the interleaved schedule's order). The points are children of one
// container (a Sequential or ModuleList: the GPT's "transformer.h"), given in its order,
// none its first child: every stage holds at least one of the container's modules.
//
// Every other module goes by where it stands beside the container: walking from the model
// down to the container, the children each module registers before that path go to the
// first stage, those after it to the last. The GPT: transformer.wte, wpe and drop (before h
// in transformer) to the first stage; transformer.ln_f (after h) and lm_head (after
// transformer in the GPT) to the last. A module on the path holding parameters of its own
// (not in a child) cannot be cut so and is refused.
//
// Ties name one tensor the model uses in several modules (the GPT's
// {"transformer.wte.weight", "lm_head.weight"}). Each stage using it holds its own copy,
// equal at the start; each copy gets only its own uses' share of the gradient, whose sum is
// the single-device gradient (Megatron's embedding group). On one rank, its chunks share
// one tensor (autograd adds the shares). Across ranks, each holder's copy records a
// placement (parallel/placement.h): dim "tied", a group of the holding ranks (one group for
// every tie held by the same ranks), Replicate, gradient Partial -- so the sum of partial
// gradients adds the shares (reduce_partial_gradients, parallel/partial_gradients.h), and a
// clip counts the tensor on the group's rank 0 alone. With one stage the tie stays the one
// tensor it is. A tensor shared across stages but not named as a tie is refused: each stage
// would silently train its own copy.
//
// A model already split by a plan (its Linears swapped for ColumnParallelLinear, its
// parameters carrying tp placements) splits the same way: the copies keep their modules,
// hooks and placements, and a tie's placement is added after the ones already there.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <minigrad/core/device.h>
#include <minigrad/nn/module.h>
#include <minigrad/parallel/c10d/process_group.h>

namespace mg::parallel {

struct PipelineCut {
  // The first module of every stage after the first ("transformer.h.2"); none: one stage.
  std::vector<std::string> split_points;
  // Parameter names that are one tensor of the model, e.g. {"transformer.wte.weight",
  // "lm_head.weight"}.
  std::vector<std::vector<std::string>> ties;
  int stages() const { return static_cast<int>(split_points.size()) + 1; }
};

// Split points that deal the `count` children container.0 .. container.<count - 1> (a
// Sequential's or ModuleList's names) over `stages` as even_balance deals layers: the first
// count mod stages stages one more. mg::Error when there are fewer children than stages.
std::vector<std::string> even_split_points(const std::string& container, int64_t count, int stages);

// The stage (0 .. cut.stages() - 1) holding the module or parameter `name` of `model`.
// mg::Error naming the problem when the cut does not fit the model (see above).
int stage_of(const nn::Module& model, const PipelineCut& cut, const std::string& name);

// Stage `stage` of `model` under `cut`: a copy on `device` without the other stages'
// modules. The model is left as it is. Ties are not touched: a copy of the tied tensor.
nn::ModulePtr cut_stage(const nn::Module& model, const PipelineCut& cut, int stage, Device device);

// This rank's stages of `model`: virtual stages pp->rank(), + p, ..., copies on the group's
// device, ties placed as above. Every rank of `pp` calls it with the same model and cut (it
// makes a group per tie whose copies sit on several ranks: a collective call of `pp`).
// mg::Error when the stages do not divide over the ranks, and wherever stage_of refuses.
std::vector<nn::ModulePtr> split_module(const nn::Module& model, const PipelineCut& cut,
                                        const std::shared_ptr<ProcessGroup>& pp);

// The parameters of a rank's chunks, each tensor once (chunks on one rank share a tied
// tensor), under its name in the first chunk that holds it.
std::vector<nn::NamedTensor> chunk_parameters(const std::vector<nn::ModulePtr>& chunks);
std::vector<Tensor> chunk_parameter_tensors(const std::vector<nn::ModulePtr>& chunks);

}  // namespace mg::parallel
