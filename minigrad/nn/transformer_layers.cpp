#include <minigrad/nn/transformer_layers.h>

#include <cmath>

#include <fmt/ranges.h>

#include <minigrad/nn/init.h>

namespace mg::nn {

Embedding::Embedding(int64_t num_embeddings, int64_t embedding_dim)
    : Cloneable<Embedding>("Embedding"),
      num_embeddings_(num_embeddings),
      embedding_dim_(embedding_dim) {
  MG_CHECK(num_embeddings > 0 && embedding_dim > 0,
           "Embedding: num_embeddings and embedding_dim must be positive, got {} and {}",
           num_embeddings, embedding_dim);
  register_parameter("weight", empty(Shape{num_embeddings, embedding_dim}));
  init::normal_(weight(), 0.0, 1.0);
}

Tensor Embedding::forward(const Tensor& indices) { return embedding(weight(), indices); }

std::string Embedding::extra_repr() const {
  return fmt::format("{}, {}", num_embeddings_, embedding_dim_);
}

LayerNorm::LayerNorm(std::vector<int64_t> normalized_shape, double eps, bool elementwise_affine,
                     bool bias)
    : Cloneable<LayerNorm>("LayerNorm"),
      normalized_shape_(std::move(normalized_shape)),
      eps_(eps),
      affine_(elementwise_affine),
      has_bias_(elementwise_affine && bias) {
  MG_CHECK(!normalized_shape_.empty(), "LayerNorm: normalized_shape is empty");
  for (const int64_t d : normalized_shape_)
    MG_CHECK(d > 0, "LayerNorm: normalized_shape must be positive sizes, got [{}]",
             fmt::join(normalized_shape_, ", "));
  MG_CHECK(std::isfinite(eps) && eps >= 0.0, "LayerNorm: eps must be >= 0, got {}", eps);
  const Shape shape(normalized_shape_);
  if (affine_) register_parameter("weight", ones(shape));
  if (has_bias_) register_parameter("bias", zeros(shape));
}

Tensor LayerNorm::forward(const Tensor& input) {
  return layer_norm(input, normalized_shape_, affine_ ? parameter("weight") : Tensor(),
                    has_bias_ ? parameter("bias") : Tensor(), eps_);
}

std::string LayerNorm::extra_repr() const {
  return fmt::format("({},), eps={}, elementwise_affine={}", fmt::join(normalized_shape_, ", "),
                     eps_, affine_ ? "True" : "False");
}

RMSNorm::RMSNorm(std::vector<int64_t> normalized_shape, double eps, bool elementwise_affine)
    : Cloneable<RMSNorm>("RMSNorm"), normalized_shape_(std::move(normalized_shape)), eps_(eps),
      affine_(elementwise_affine) {
  MG_CHECK(!normalized_shape_.empty(), "RMSNorm: normalized_shape is empty");
  for (const int64_t d : normalized_shape_)
    MG_CHECK(d > 0, "RMSNorm: normalized_shape must be positive sizes, got [{}]", fmt::join(normalized_shape_, ", "));
  MG_CHECK(std::isfinite(eps) && eps >= 0.0, "RMSNorm: eps must be >= 0, got {}", eps);
  if (affine_) register_parameter("weight", ones(Shape(normalized_shape_)));
}

Tensor RMSNorm::forward(const Tensor& input) {
  return rms_norm(input, Shape(normalized_shape_), affine_ ? parameter("weight") : Tensor(), eps_);
}

std::string RMSNorm::extra_repr() const {
  return fmt::format("({},), eps={}, elementwise_affine={}", fmt::join(normalized_shape_, ", "), eps_,
                     affine_ ? "True" : "False");
}

GELU::GELU(std::string approximate)
    : Cloneable<GELU>("GELU"), approximate_(std::move(approximate)) {
  MG_CHECK(approximate_ == "none" || approximate_ == "tanh",
           "GELU: approximate must be \"none\" or \"tanh\", got \"{}\"", approximate_);
}

Tensor GELU::forward(const Tensor& input) { return gelu(input, approximate_); }

std::string GELU::extra_repr() const {
  return approximate_ == "none" ? "" : fmt::format("approximate='{}'", approximate_);
}

Dropout::Dropout(double p) : Cloneable<Dropout>("Dropout"), p_(p) {
  MG_CHECK(std::isfinite(p) && p >= 0.0 && p <= 1.0,
           "Dropout: dropout probability has to be between 0 and 1, but got {}", p);
}

Tensor Dropout::forward(const Tensor& input) {
  return dropout(input, p_, is_training(), generator_.get());
}

std::string Dropout::extra_repr() const { return fmt::format("p={}, inplace=False", p_); }

}  // namespace mg::nn
