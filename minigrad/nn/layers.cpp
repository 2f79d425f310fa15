#include <minigrad/nn/layers.h>

#include <cmath>

#include <minigrad/autograd/functions.h>
#include <minigrad/autograd/grad_mode.h>
#include <minigrad/nn/fusion.h>
#include <minigrad/nn/init.h>

namespace mg::nn {

Linear::Linear(int64_t in_features, int64_t out_features, bool bias)
    : Cloneable<Linear>("Linear"),
      in_features_(in_features),
      out_features_(out_features),
      has_bias_(bias) {
  MG_CHECK(in_features > 0 && out_features > 0,
           "Linear: in_features and out_features must be positive, got {} and {}", in_features,
           out_features);
  register_parameter("weight", empty(Shape{out_features, in_features}));
  if (bias) register_parameter("bias", empty(Shape{out_features}));
  reset_parameters();
}

void Linear::reset_parameters() {
  init::kaiming_uniform_(weight(), std::sqrt(5.0));
  if (has_bias_) {
    const double bound = 1.0 / std::sqrt(static_cast<double>(in_features_));
    init::uniform_(bias(), -bound, bound);
  }
}

Tensor Linear::forward(const Tensor& input) {
  return linear(input, weight(), has_bias_ ? bias() : Tensor());
}

Tensor Linear::forward_relu(const Tensor& input) {
  if (!has_bias_) return relu(forward(input));
  return linear_relu(input, weight(), bias());
}

std::string Linear::extra_repr() const {
  // Python's spelling of booleans, so the printout reads exactly as PyTorch's.
  return fmt::format("in_features={}, out_features={}, bias={}", in_features_, out_features_,
                     has_bias_ ? "True" : "False");
}

Tensor ReLU::forward(const Tensor& input) { return relu(input); }

Sequential::Sequential(std::initializer_list<ModulePtr> modules) : Sequential() {
  for (const ModulePtr& m : modules) push_back(m);
}

void Sequential::push_back(ModulePtr module) {
  register_module(std::to_string(size()), std::move(module));
}

ModulePtr Sequential::operator[](size_t index) const {
  MG_CHECK(index < size(), "Sequential: index {} out of range for {} modules", index, size());
  return named_children()[index].second;
}

Tensor Sequential::forward(const Tensor& input) {
  const auto& children = named_children();
  Tensor x = input;
  for (size_t i = 0; i < children.size(); ++i) {
    Module& module = *children[i].second;
    const Module* next = i + 1 < children.size() ? children[i + 1].second.get() : nullptr;
    if (Linear* linear = fusable_linear_relu(module, next)) {  // nn/fusion.h decides
      x = linear->call_with_hooks(x, [linear](const Tensor& in) { return linear->forward_relu(in); });
      ++i;  // the ReLU ran inside
    } else {
      x = module(x);
    }
  }
  return x;
}

Tensor CrossEntropyLoss::forward(const Tensor& logits, const Tensor& targets) const {
  return cross_entropy(logits, targets, options_);
}

}  // namespace mg::nn
