// parallelize_module: a model split by naming its modules, the model itself unchanged
// (torch.distributed.tensor.parallel.parallelize_module; torchtitan's plans).
//
//   parallel::ParallelPlan plan{"tp", {
//       {"layers.*.attn.qkv", std::make_shared<parallel::ColwiseParallel>()},
//       {"layers.*.attn.out", std::make_shared<parallel::RowwiseParallel>()},
//       {"layers.*.mlp.up",   std::make_shared<parallel::ColwiseParallel>()},
//       {"layers.*.mlp.down", std::make_shared<parallel::RowwiseParallel>()}}};
//   parallel::parallelize_module(*model, mesh, plan);   // every rank, the same model and seed
//
// A plan is a mesh dimension ("tp", "cp") and a list of (module name pattern, style),
// applied in order, in place: a style swaps a module for its shard (Module::replace_child:
// a Linear becomes a ColumnParallelLinear holding this rank's rows) or hooks it (forward
// pre/post hooks that move an activation between layouts), and records on every parameter
// it splits what this rank holds of the single-device tensor (placement.h). Patterns are
// dotted module names whose parts may hold '*' (one part: "h.*.attn" matches "h.0.attn",
// not "h.0.x.attn"; "" is the root); every pattern must name at least one module.
//
// After the styles, every parameter the plan did not place on its dimension is recorded
// Replicate there: under tp every rank holds it whole (each rank's copy counted once by the
// distributed clip); under cp every rank holds it whole and sees a share of the tokens, so
// its gradient is Partial over cp (summed by reduce_partial_gradients).
//
// Ties: a parameter two modules hold (a GPT's wte and lm_head) is one parameter after the
// plan too: the second module's style finds the first's shard and takes the same tensor
// (their placements must agree); a tied parameter split in one of its modules and left whole
// in another is an mg::Error.
//
// Apply a cp plan before a tp plan: both hook the position embedding's input, and cp's
// positions are what tp's sequence parallelism cuts.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <minigrad/core/generator.h>
#include <minigrad/nn/module.h>
#include <minigrad/parallel/c10d/device_mesh.h>
#include <minigrad/parallel/c10d/process_group.h>
#include <minigrad/parallel/placement.h>
#include <minigrad/parallel/tensor_parallel/group.h>

namespace mg::parallel {

// What a style needs of the split it applies.
struct ParallelContext {
  std::string dim;                       // the mesh dimension: "tp", "cp"
  std::shared_ptr<ProcessGroup> group;   // this rank's group along it
  TensorParallelGroupPtr collectives;    // the same ranks, as the tensor-parallel layers talk
  // Dropout where the ranks hold different parts of an activation (a rank's heads; its
  // positions under sequence parallelism) draws from this rank's own generator, so that
  // the ranks' masks differ there and agree everywhere else (Megatron's RNG tracker).
  std::shared_ptr<Generator> sharded_generator;

  // A placement on this dimension for this rank.
  DimPlacement placement(Placement p, bool partial_gradient = false) const;
};

// One form applied to one module (torch's ParallelStyle).
class ParallelStyle {
 public:
  virtual ~ParallelStyle() = default;
  // Applies the style to the module at `name` (dotted; "" is the root) of `root`.
  virtual void apply(nn::Module& root, const std::string& name, const ParallelContext& context) const = 0;
  // "ColwiseParallel(stride 3)": for messages.
  virtual std::string str() const = 0;
};
using StylePtr = std::shared_ptr<const ParallelStyle>;

struct ParallelPlan {
  std::string dim;  // "tp" or "cp"
  std::vector<std::pair<std::string, StylePtr>> styles;
};

struct ParallelizeOptions {
  // Rank r's sharded-region generator (ParallelContext) is seeded seed + 2718 + r.
  uint64_t seed = 1337;
};

// Applies `plan` to `model` over mesh.group(plan.dim) (see above). Every rank calls it with
// the same model (the same seed) on the group's device. mg::Error naming the pattern, the
// module and the style when a pattern names nothing, a style does not fit its module, or a
// size does not divide.
void parallelize_module(nn::Module& model, const DeviceMesh& mesh, const ParallelPlan& plan,
                        ParallelizeOptions options = {});
// The same over one group (a mesh of one dimension, plan.dim).
void parallelize_module(nn::Module& model, std::shared_ptr<ProcessGroup> group, const ParallelPlan& plan,
                        ParallelizeOptions options = {});

// Whether `name` (a dotted module name) matches `pattern` (parts with '*').
bool module_name_matches(const std::string& pattern, const std::string& name);
// The module at `name` in `root` ("" is root itself): what a style works on.
nn::Module& module_at(nn::Module& root, const std::string& name);
// "h.0.attn" + "weight" -> "h.0.attn.weight" ("" + "weight" -> "weight").
std::string join_name(const std::string& prefix, const std::string& name);

}  // namespace mg::parallel
