// A thread's cross_entropy replaced by another function while a guard lives: how
// parallel::LossParallel (torch's loss_parallel() context) makes a model's own loss code,
// cross_entropy over logits whose vocabulary is split over a tensor-parallel group, compute
// the vocabulary-parallel loss instead, without the model knowing. The override is not
// re-entered: inside it, cross_entropy is the plain one again.
#pragma once

#include <functional>
#include <optional>

#include <minigrad/core/cross_entropy_options.h>
#include <minigrad/core/tensor.h>

namespace mg {

using CrossEntropyFunction =
    std::function<Tensor(const Tensor& logits, const Tensor& targets, const CrossEntropyOptions& options)>;

// Guards nest: the innermost one's function is called.
class CrossEntropyOverrideGuard {
 public:
  explicit CrossEntropyOverrideGuard(CrossEntropyFunction function);
  ~CrossEntropyOverrideGuard();
  CrossEntropyOverrideGuard(const CrossEntropyOverrideGuard&) = delete;
  CrossEntropyOverrideGuard& operator=(const CrossEntropyOverrideGuard&) = delete;
};

// The override installed on this thread, or null.
const CrossEntropyFunction* cross_entropy_override();
// What the override computes (not re-entered: cross_entropy inside it is the plain op), or
// nothing when none is installed.
std::optional<Tensor> overridden_cross_entropy(const Tensor& logits, const Tensor& targets,
                                               const CrossEntropyOptions& options);

}  // namespace mg
