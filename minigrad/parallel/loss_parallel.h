// LossParallel: torch's loss_parallel() context. While one lives, this thread's
// cross_entropy computes the loss of the split model from what the rank holds, so the
// model's own loss code (GPT::loss: cross_entropy over its logits) stays as it is:
//
//   tp   the logits are this rank's slice of the vocabulary [.., V/tp] (a plan's head left
//        Shard(-1)): vocab_parallel_cross_entropy, the logits never gathered
//   cp   the targets are this rank's two chunks of each sequence: the mean over every cp
//        rank's tokens (its tokens' sum over the count over cp), the value summed over cp,
//        the gradient reaching this rank's logits only
//
//   parallel::LossParallel loss_parallel(mesh);   // tp and cp of the mesh, where > 1
//   Tensor loss = models::GPT::loss(model->forward(x), y);
//
// ignore_index and the reductions mean and sum are those of cross_entropy; label smoothing
// and Reduction::None are refused (an mg::Error naming them). One thread: each pipeline
// stage that computes a loss installs its own.
#pragma once

#include <memory>
#include <optional>

#include <minigrad/autograd/cross_entropy_override.h>
#include <minigrad/parallel/c10d/device_mesh.h>
#include <minigrad/parallel/c10d/process_group.h>

namespace mg::parallel {

class LossParallel {
 public:
  // Either group may be null (or of one rank): that split is not there.
  LossParallel(std::shared_ptr<ProcessGroup> tp, std::shared_ptr<ProcessGroup> cp);
  // The mesh's tp and cp groups, where it has them.
  explicit LossParallel(const DeviceMesh& mesh);

 private:
  std::optional<CrossEntropyOverrideGuard> guard_;
};

}  // namespace mg::parallel
