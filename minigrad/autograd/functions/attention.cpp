// Scaled dot-product attention, two ways that compute the same function.
//
// scaled_dot_product_attention_composed is the one to read: attention is a matmul, a
// scale, a mask, a softmax, a dropout and a matmul, each an op of its own with its own
// backward, so the [.., L, S] score and probability matrices live in memory from forward
// to backward (for GPT-2 small at T = 1024: 12 heads x 1024 x 1024 floats, 48 MiB per
// sequence and layer, twice).
//
// scaled_dot_product_attention_fused is the fast path (Backend::attention): FlashAttention's
// online softmax over blocks of keys, which never forms those matrices and keeps only
// each query's log-sum-exp; its backward recomputes the probabilities tile by tile from it
// (it does not save them). It is tested equal to the composition, values and gradients,
// with and without the causal mask and dropout (tests/autograd/attention_test.cpp).
//
// scaled_dot_product_attention takes the fused path unless set_fused_attention_enabled(false)
// or a FusedAttentionGuard says otherwise, as nn::set_fusion_enabled does for Linear+ReLU.
#include <atomic>
#include <cmath>

#include <minigrad/autograd/autocast.h>
#include <minigrad/autograd/functions.h>
#include <minigrad/autograd/node.h>
#include <minigrad/autograd/saved_tensor.h>
#include <minigrad/core/checked_math.h>
#include <minigrad/core/generator.h>
#include <minigrad/core/ops.h>

namespace mg {

namespace {
// Read on every attention call, from any thread; relaxed: it orders nothing else.
std::atomic<bool> fused_enabled{true};

// Checks the inputs (both paths give the same errors) and returns 1 / sqrt(E).
double attention_scale(const Tensor& q, const Tensor& k, const Tensor& v) {
  ops::check_attention(q, k, v);
  return 1.0 / std::sqrt(static_cast<double>(q.size(-1)));
}
}  // namespace

bool fused_attention_enabled() { return fused_enabled.load(std::memory_order_relaxed); }
void set_fused_attention_enabled(bool enabled) {
  fused_enabled.store(enabled, std::memory_order_relaxed);
}

Tensor scaled_dot_product_attention_composed(const Tensor& q_in, const Tensor& k_in, const Tensor& v_in,
                                            bool is_causal, double dropout_p, Generator* gen) {
  const std::vector<Tensor> cast = autocast::cast_inputs(autocast::AutocastOp::Attention, {q_in, k_in, v_in});
  const Tensor &q = cast[0], &k = cast[1], &v = cast[2];
  // Its inner ops keep the dtype attention chose (a softmax in the 16-bit dtype too), as
  // the fused path computes: torch runs an autocast op's body with autocast excluded.
  const autocast::ExcludeGuard inner_ops_as_cast;
  const double scale = attention_scale(q, k, v);
  Tensor scores = matmul(q, k.transpose(-2, -1)) * scale;  // [..., L, S]
  if (is_causal) {
    // Key j is hidden from query i when j > i: a [L, S] mask broadcast over the batch.
    const int64_t L = scores.size(-2), S = scores.size(-1);
    std::vector<int64_t> mask(static_cast<size_t>(L * S));
    for (int64_t i = 0; i < L; ++i)
      for (int64_t j = 0; j < S; ++j) mask[static_cast<size_t>(i * S + j)] = j > i ? 1 : 0;
    scores = masked_fill(scores, from_vector(mask, Shape{L, S}, q.device()),
                         -std::numeric_limits<double>::infinity());
  }
  Tensor probabilities = softmax(scores, -1);
  probabilities = dropout(probabilities, dropout_p, dropout_p > 0.0, gen);
  return matmul(probabilities, v);  // [..., L, Ev]
}

Tensor scaled_dot_product_attention_fused(const Tensor& q_in, const Tensor& k_in, const Tensor& v_in,
                                         bool is_causal, double dropout_p, Generator* gen) {
  const std::vector<Tensor> cast = autocast::cast_inputs(autocast::AutocastOp::Attention, {q_in, k_in, v_in});
  const Tensor &q = cast[0], &k = cast[1], &v = cast[2];
  const double scale = attention_scale(q, k, v);
  MG_CHECK(dropout_p >= 0.0 && dropout_p < 1.0,
           "scaled_dot_product_attention: dropout_p has to be in [0, 1), but got {}", dropout_p);
  Generator::Draw draw{0, 0};
  if (dropout_p > 0.0) {
    // The blocks the composed path's dropout would take for its [..., L, S] probabilities,
    // so both paths draw the same mask after the same manual_seed.
    const int64_t L = q.size(-2), S = k.size(-2);
    const int64_t batch = q.numel() / std::max<int64_t>(checked_mul(L, q.size(-1), "scaled_dot_product_attention"), 1);
    const auto elements = static_cast<uint64_t>(
        checked_mul(checked_mul(L, S, "scaled_dot_product_attention"), batch,
                    "scaled_dot_product_attention"));
    draw = (gen != nullptr ? *gen : default_generator()).reserve((elements + 3) / 4);
  }
  // The kernels read q, k, v as contiguous [batch, T, E]; a GPT's q, k, v are views of
  // c_attn's output cut by heads, so they are copied once here and the copies saved for
  // backward (which would otherwise copy them again; c_attn's output is freed instead).
  const Tensor qc = ops::contiguous(q), kc = ops::contiguous(k), vc = ops::contiguous(v);
  std::vector<Tensor> r = ops::attention(qc, kc, vc, scale, is_causal, dropout_p, draw.seed, draw.offset);
  Tensor out = r[0];
  record_function("ScaledDotProductAttentionBackward", {q, k, v}, {out},
                  [q = SavedTensor(qc), k = SavedTensor(kc), v = SavedTensor(vc),
                   out = SavedTensor(out), lse = SavedTensor(r[1]), scale, is_causal, dropout_p,
                   draw](const BackwardArgs& g) {
                    return ops::attention_backward(g.grad(), q.unpack(g), k.unpack(g),
                                                   v.unpack(g), out.unpack(g), lse.unpack(g),
                                                   scale, is_causal, dropout_p, draw.seed,
                                                   draw.offset);
                  });
  return out;
}

Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                   bool is_causal, double dropout_p, Generator* gen) {
  return fused_attention_enabled()
             ? scaled_dot_product_attention_fused(q, k, v, is_causal, dropout_p, gen)
             : scaled_dot_product_attention_composed(q, k, v, is_causal, dropout_p, gen);
}

}  // namespace mg
