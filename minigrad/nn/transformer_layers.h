// The layers a transformer adds to an MLP's, as torch.nn has them: Embedding, LayerNorm,
// RMSNorm, GELU, SiLU, Dropout. Each forward takes activations of any rank ([B, T, C] in a GPT).
// Dropout follows Module::train()/eval() (train() reaches every child), as in PyTorch.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <minigrad/autograd/functions.h>
#include <minigrad/nn/module.h>

namespace mg {
class Generator;
}

namespace mg::nn {

// Rows of a [num_embeddings, embedding_dim] table at int64 indices of any shape:
// [..., embedding_dim]. The weight starts N(0, 1), as torch.nn.Embedding's.
class Embedding : public Cloneable<Embedding> {
 public:
  Embedding(int64_t num_embeddings, int64_t embedding_dim);
  Tensor forward(const Tensor& indices) override;
  std::string extra_repr() const override;

  Tensor& weight() { return parameter("weight"); }
  const Tensor& weight() const { return parameter("weight"); }
  int64_t num_embeddings() const { return num_embeddings_; }
  int64_t embedding_dim() const { return embedding_dim_; }

 private:
  int64_t num_embeddings_, embedding_dim_;
};

// Normalises over the trailing `normalized_shape` dimensions (biased variance), then
// scales by weight (ones at first) and shifts by bias (zeros at first). bias = false
// leaves the shift out (nanoGPT's LayerNorm(ndim, bias)); elementwise_affine = false
// leaves out both.
class LayerNorm : public Cloneable<LayerNorm> {
 public:
  LayerNorm(std::vector<int64_t> normalized_shape, double eps = 1e-5,
            bool elementwise_affine = true, bool bias = true);
  LayerNorm(int64_t normalized_size, double eps = 1e-5, bool elementwise_affine = true,
            bool bias = true)
      : LayerNorm(std::vector<int64_t>{normalized_size}, eps, elementwise_affine, bias) {}
  Tensor forward(const Tensor& input) override;
  std::string extra_repr() const override;

  const std::vector<int64_t>& normalized_shape() const { return normalized_shape_; }
  double eps() const { return eps_; }
  bool has_weight() const { return affine_; }
  bool has_bias() const { return has_bias_; }

 private:
  std::vector<int64_t> normalized_shape_;
  double eps_;
  bool affine_, has_bias_;
};

// torch.nn.RMSNorm (the Llama's norm): x / sqrt(mean(x^2) + eps) over the trailing
// normalized_shape dimensions, times weight (ones at first) unless !elementwise_affine.
// torch's eps=None (the dtype's epsilon) has no default here: a Llama names its eps
// (rms_norm_eps, 1e-5 or 1e-6).
class RMSNorm : public Cloneable<RMSNorm> {
 public:
  RMSNorm(std::vector<int64_t> normalized_shape, double eps, bool elementwise_affine = true);
  RMSNorm(int64_t normalized_size, double eps, bool elementwise_affine = true)
      : RMSNorm(std::vector<int64_t>{normalized_size}, eps, elementwise_affine) {}
  Tensor forward(const Tensor& input) override;
  std::string extra_repr() const override;
  double eps() const { return eps_; }

 private:
  std::vector<int64_t> normalized_shape_;
  double eps_;
  bool affine_;
};

// x * sigmoid(x), as torch.nn.SiLU (the gate of the Llama's MLP).
class SiLU : public Cloneable<SiLU> {
 public:
  SiLU() : Cloneable<SiLU>("SiLU") {}
  Tensor forward(const Tensor& input) override { return silu(input); }
};

// x * Phi(x) (approximate "none", exact with erf) or GPT-2's tanh form ("tanh").
class GELU : public Cloneable<GELU> {
 public:
  explicit GELU(std::string approximate = "none");
  Tensor forward(const Tensor& input) override;
  std::string extra_repr() const override;
  const std::string& approximate() const { return approximate_; }

 private:
  std::string approximate_;
};

// In training, zeroes each element with probability p and scales the others by
// 1 / (1 - p); in eval() mode (or with p = 0), the identity. The mask comes from the
// default generator, or from `generator` when one is set: a form of parallelism gives the
// dropout of a region each rank holds a different part of a generator of each rank's own
// (Megatron's model-parallel RNG tracker), so that the ranks draw different masks there
// and the same ones where they hold the same activation.
class Dropout : public Cloneable<Dropout> {
 public:
  explicit Dropout(double p = 0.5);
  Tensor forward(const Tensor& input) override;
  std::string extra_repr() const override;
  double p() const { return p_; }
  void set_generator(std::shared_ptr<Generator> generator) { generator_ = std::move(generator); }
  // Null: the default generator.
  Generator* generator() const { return generator_.get(); }

 private:
  double p_;
  std::shared_ptr<Generator> generator_;
};

// A module that attends through a function a form of parallelism may replace: context
// parallelism puts ring attention over its group in place of scaled_dot_product_attention
// (parallel/context_parallel/style.h). CausalSelfAttention (models/gpt.h) is one.
class AttentionHost {
 public:
  // q, k, v [B, heads, T, head_size] and the attention dropout -> [B, heads, T, head_size].
  using AttentionFunction =
      std::function<Tensor(const Tensor& q, const Tensor& k, const Tensor& v, double dropout_p)>;
  virtual ~AttentionHost() = default;
  // Empty: scaled_dot_product_attention again.
  virtual void set_attention_function(AttentionFunction attention) = 0;
};

}  // namespace mg::nn
