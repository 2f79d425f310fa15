// The layers of an MLP: Linear, ReLU, Sequential; and the CrossEntropyLoss criterion.
#pragma once

#include <initializer_list>

#include <minigrad/autograd/functions.h>
#include <minigrad/core/cross_entropy_options.h>
#include <minigrad/nn/module.h>

namespace mg::nn {

// y = x W^T + b, with W of shape [out_features, in_features], initialised as PyTorch:
// W ~ U(-1/sqrt(in), 1/sqrt(in)) (kaiming-uniform, a = sqrt(5)), b ~ U(-1/sqrt(in), 1/sqrt(in)).
class Linear : public Cloneable<Linear> {
 public:
  Linear(int64_t in_features, int64_t out_features, bool bias = true);
  Tensor forward(const Tensor& input) override;
  // relu(forward(input)) as one op (mg::linear_relu): what Sequential runs for a Linear
  // followed by a ReLU. Layers without bias run the two ops.
  Tensor forward_relu(const Tensor& input);
  std::string extra_repr() const override;

  Tensor& weight() { return parameter("weight"); }
  Tensor& bias() { return parameter("bias"); }  // mg::Error when built without bias
  bool has_bias() const { return has_bias_; }
  int64_t in_features() const { return in_features_; }
  int64_t out_features() const { return out_features_; }
  void reset_parameters();

 private:
  int64_t in_features_, out_features_;
  bool has_bias_;
};

class ReLU : public Cloneable<ReLU> {
 public:
  ReLU() : Cloneable<ReLU>("ReLU") {}
  Tensor forward(const Tensor& input) override;
};

// Runs its children in order, each one's output the next one's input. A Linear directly
// followed by a ReLU runs as one fused op (Linear::forward_relu) unless fusion is off
// (nn/fusion.h, where that is decided): same values and gradients (and backward graph),
// one pass over the activations fewer.
class Sequential : public Cloneable<Sequential> {
 public:
  Sequential() : Cloneable<Sequential>("Sequential") {}
  Sequential(std::initializer_list<ModulePtr> modules);
  Tensor forward(const Tensor& input) override;
  void push_back(ModulePtr module);
  size_t size() const { return named_children().size(); }
  ModulePtr operator[](size_t index) const;
};

// The options of CrossEntropyLoss and of functional::cross_entropy, under libtorch's
// names: CrossEntropyLossOptions().ignore_index(-1).label_smoothing(0.1).reduction(...).
using CrossEntropyLossOptions = CrossEntropyOptions;

// Cross-entropy of [batch, classes] logits against int64 class indices: the mean over
// the batch unless the options say otherwise (ignore_index, label_smoothing, reduction;
// core/cross_entropy_options.h).
class CrossEntropyLoss {
 public:
  explicit CrossEntropyLoss(CrossEntropyLossOptions options = {}) : options_(options) {}
  Tensor forward(const Tensor& logits, const Tensor& targets) const;
  Tensor operator()(const Tensor& logits, const Tensor& targets) const {
    return forward(logits, targets);
  }
  const CrossEntropyLossOptions& options() const { return options_; }

 private:
  CrossEntropyLossOptions options_;
};

// libtorch's torch::nn::functional spelling: F::cross_entropy(x, y,
// F::CrossEntropyFuncOptions().label_smoothing(0.1)), with namespace F = mg::nn::functional.
namespace functional {
using CrossEntropyFuncOptions = CrossEntropyOptions;
inline Tensor cross_entropy(const Tensor& logits, const Tensor& targets,
                            const CrossEntropyFuncOptions& options = {}) {
  return mg::cross_entropy(logits, targets, options);
}
}  // namespace functional

}  // namespace mg::nn
