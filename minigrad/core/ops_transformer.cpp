// The transformer's non-differentiable ops (declared in core/ops.h): each checks its inputs,
// brings them into the layout its kernel takes (broadcast, contiguous rows, the batch
// dimensions flattened) and calls the backend. autograd/functions/ builds the
// differentiable ops on these.
#include <algorithm>
#include <cmath>

#include <fmt/ranges.h>

#include <minigrad/core/checked_math.h>
#include <minigrad/core/ops.h>

namespace mg::ops {
namespace {

Backend& backend_of(const Tensor& t) { return backend(t.device()); }

std::vector<int64_t> sizes_of(const Tensor& t) { return t.shape().sizes(); }

// x seen as [rows, cols] with cols its last `inner` dimensions' product (a view of a
// contiguous tensor).
Tensor as_matrix(const Tensor& x, int64_t inner_dims) {
  int64_t cols = 1;
  for (int64_t d = x.dim() - inner_dims; d < x.dim(); ++d) cols *= x.size(d);
  const int64_t rows = cols == 0 ? 0 : x.numel() / cols;
  return view(x, Shape{rows, cols});
}

}  // namespace

Tensor permute(const Tensor& t, const std::vector<int64_t>& dims) {
  MG_CHECK(static_cast<int64_t>(dims.size()) == t.dim(),
           "permute: the permutation [{}] has {} entries for a tensor of {} dimensions (shape {})",
           fmt::join(dims, ", "), dims.size(), t.dim(), t.shape());
  std::vector<int64_t> sizes(dims.size()), strides(dims.size());
  std::vector<bool> seen(dims.size(), false);
  for (size_t i = 0; i < dims.size(); ++i) {
    const int64_t d = wrap_dim(dims[i], t.dim(), "permute");
    MG_CHECK(!seen[static_cast<size_t>(d)],
             "permute: dimension {} appears more than once in [{}] (shape {})", d,
             fmt::join(dims, ", "), t.shape());
    seen[static_cast<size_t>(d)] = true;
    sizes[i] = t.size(d);
    strides[i] = t.stride(d);
  }
  return as_strided(t, Shape(std::move(sizes)), std::move(strides), t.storage_offset());
}

Tensor bmm(const Tensor& a, const Tensor& b) {
  check_same_device("matmul", a, b);
  MG_CHECK(a.dim() >= 2 && b.dim() >= 2,
           "matmul: expected tensors of at least 2 dimensions for a batched product, got shapes "
           "{} and {}",
           a.shape(), b.shape());
  MG_CHECK(is_floating_point(a.dtype()) && a.dtype() == b.dtype(),
           "matmul: expected two floating-point tensors of one dtype, got {} and {}", a.dtype(),
           b.dtype());
  const int64_t m = a.size(-2), k = a.size(-1), n = b.size(-1);
  MG_CHECK(b.size(-2) == k,
           "matmul: shapes {} and {} cannot be multiplied (inner dimensions {} and {} differ)",
           a.shape(), b.shape(), k, b.size(-2));
  const std::vector<int64_t> sa = sizes_of(a), sb = sizes_of(b);
  const Shape batch = broadcast_shapes(Shape(std::vector<int64_t>(sa.begin(), sa.end() - 2)),
                                       Shape(std::vector<int64_t>(sb.begin(), sb.end() - 2)),
                                       "matmul");
  std::vector<int64_t> out_sizes = batch.sizes(), a_sizes = batch.sizes(), b_sizes = batch.sizes();
  out_sizes.insert(out_sizes.end(), {m, n});
  a_sizes.insert(a_sizes.end(), {m, k});
  b_sizes.insert(b_sizes.end(), {k, n});
  Tensor out = empty(Shape(out_sizes), a.dtype(), a.device());
  if (out.numel() == 0) return out;
  if (k == 0) {
    backend_of(a).fill(out, 0.0);
    return out;
  }
  const Tensor ea = a.shape() == Shape(a_sizes) ? a : expand(a, Shape(a_sizes));
  const Tensor eb = b.shape() == Shape(b_sizes) ? b : expand(b, Shape(b_sizes));
  backend_of(a).bmm(out, ea, eb);
  return out;
}

namespace {
// Runs a last-dim row op on x over `dim`: the dim is moved last and the rows made
// contiguous; the result is moved back.
template <typename F>
Tensor over_rows(const Tensor& x, int64_t dim, const char* op, F&& rows_op) {
  dim = wrap_dim(dim, x.dim(), op);
  if (x.dim() > 0 && dim != x.dim() - 1)
    return transpose(over_rows(transpose(x, dim, -1), -1, op, rows_op), dim, -1);
  const Tensor in = contiguous(x.dim() == 0 ? view(x, Shape{1}) : x);
  Tensor out = empty(x.shape(), x.dtype(), x.device());
  if (x.numel() > 0)
    rows_op(as_matrix(x.dim() == 0 ? view(out, Shape{1}) : out, 1), as_matrix(in, 1));
  return out;
}
}  // namespace

Tensor softmax(const Tensor& x, int64_t dim) {
  check_float("softmax", x);
  return over_rows(x, dim, "softmax", [&](const Tensor& out, const Tensor& in) {
    backend_of(x).softmax(out, in);
  });
}

Tensor softmax_backward(const Tensor& grad_out, const Tensor& output, int64_t dim) {
  dim = wrap_dim(dim, output.dim(), "softmax_backward");
  if (output.dim() > 0 && dim != output.dim() - 1)
    return transpose(
        softmax_backward(transpose(grad_out, dim, -1), transpose(output, dim, -1), -1), dim, -1);
  const auto rows = [&](const Tensor& t) {
    return as_matrix(output.dim() == 0 ? view(t, Shape{1}) : t, 1);
  };
  const Tensor g = contiguous(grad_out), y = contiguous(output);
  Tensor out = empty(output.shape(), output.dtype(), output.device());
  if (out.numel() > 0) backend_of(output).softmax_backward(rows(out), rows(g), rows(y));
  return out;
}

Tensor tanh(const Tensor& x) { return unary(UnaryOp::Tanh, x); }

Tensor gelu(const Tensor& x, bool tanh_form) {
  check_float("gelu", x);
  Tensor out = empty(x.shape(), x.dtype(), x.device());
  if (x.numel() > 0) backend_of(x).gelu(out, x, tanh_form);
  return out;
}

Tensor gelu_backward(const Tensor& grad_out, const Tensor& input, bool tanh_form) {
  Tensor out = empty(input.shape(), input.dtype(), input.device());
  if (out.numel() > 0) backend_of(input).gelu_backward(out, grad_out, input, tanh_form);
  return out;
}

Tensor silu(const Tensor& x) {
  check_float("silu", x);
  Tensor out = empty(x.shape(), x.dtype(), x.device());
  if (x.numel() > 0) backend_of(x).silu(out, x);
  return out;
}

Tensor silu_backward(const Tensor& grad_out, const Tensor& input) {
  Tensor out = empty(input.shape(), input.dtype(), input.device());
  if (out.numel() > 0) backend_of(input).silu_backward(out, grad_out, input);
  return out;
}

Tensor masked_fill(const Tensor& x, const Tensor& mask, double value) {
  check_same_device("masked_fill", x, mask);
  const Shape shape = broadcast_shapes(x.shape(), mask.shape(), "masked_fill");
  MG_CHECK(shape == x.shape(),
           "masked_fill: a mask of shape {} does not broadcast to the input's shape {}",
           mask.shape(), x.shape());
  if (x.dtype() == DType::Int64) checked_int64(value, "masked_fill");
  Tensor out = empty(x.shape(), x.dtype(), x.device());
  if (out.numel() > 0)
    backend_of(x).masked_fill(out, x, mask.shape() == shape ? mask : expand(mask, shape), value);
  return out;
}

Tensor dropout(const Tensor& x, double p, uint64_t seed, uint64_t offset) {
  check_float("dropout", x);
  MG_CHECK(p >= 0.0 && p < 1.0, "dropout: probability has to be in [0, 1), but got {}", p);
  Tensor out = empty(x.shape(), x.dtype(), x.device());
  if (out.numel() > 0) backend_of(x).dropout(out, x, p, seed, offset);
  return out;
}

LayerNormOutput layer_norm(const Tensor& x, int64_t normalized_dims, const Tensor& weight,
                           const Tensor& bias, double eps) {
  check_float("layer_norm", x);
  const std::vector<int64_t> xs = sizes_of(x);
  const Shape normalized(std::vector<int64_t>(xs.end() - normalized_dims, xs.end()));
  for (const Tensor* p : {&weight, &bias}) {
    if (!p->defined()) continue;
    check_same_device("layer_norm", x, *p);
    MG_CHECK(p->shape() == normalized && p->dtype() == x.dtype(),
             "layer_norm: expected {} of shape {} ({}, the normalized shape), got {} ({})",
             p == &weight ? "weight" : "bias", normalized, x.dtype(), p->shape(), p->dtype());
  }
  const Tensor in = as_matrix(contiguous(x), normalized_dims);
  MG_CHECK(in.size(1) > 0, "layer_norm: cannot normalise over an empty shape {} (input {})",
           normalized, x.shape());
  Tensor out = empty(x.shape(), x.dtype(), x.device());
  // The statistics in float32 for a 16-bit x: backward reads them unrounded.
  Tensor mean = empty(Shape{in.size(0)}, compute_dtype(x.dtype()), x.device());
  Tensor rstd = empty(Shape{in.size(0)}, compute_dtype(x.dtype()), x.device());
  const auto flat = [](const Tensor& t) {
    return t.defined() ? view(contiguous(t), Shape{t.numel()}) : Tensor();
  };
  if (in.size(0) > 0)
    backend_of(x).layer_norm(as_matrix(out, normalized_dims), mean, rstd, in, flat(weight),
                             flat(bias), eps);
  return {out, mean, rstd};
}

std::vector<Tensor> layer_norm_backward(const Tensor& grad_out, const Tensor& x,
                                        int64_t normalized_dims, const Tensor& mean,
                                        const Tensor& rstd, const Tensor& weight,
                                        bool grad_weight, bool grad_bias) {
  const Tensor in = as_matrix(contiguous(x), normalized_dims);
  const Tensor g = as_matrix(contiguous(grad_out), normalized_dims);
  const std::vector<int64_t> xs = sizes_of(x);
  const Shape normalized(std::vector<int64_t>(xs.end() - normalized_dims, xs.end()));
  Tensor gi = empty(x.shape(), x.dtype(), x.device());
  Tensor gw = grad_weight ? empty(normalized, x.dtype(), x.device()) : Tensor();
  Tensor gb = grad_bias ? empty(normalized, x.dtype(), x.device()) : Tensor();
  if (in.size(0) == 0) {
    for (Tensor* t : {&gw, &gb})
      if (t->defined()) backend_of(x).fill(*t, 0.0);
    return {gi, gw, gb};
  }
  const auto flat = [](const Tensor& t) { return t.defined() ? view(t, Shape{t.numel()}) : Tensor(); };
  backend_of(x).layer_norm_backward(as_matrix(gi, normalized_dims), flat(gw), flat(gb), g, in, mean,
                                    rstd, weight.defined() ? flat(contiguous(weight)) : Tensor());
  return {gi, gw, gb};
}

RmsNormOutput rms_norm(const Tensor& x, int64_t normalized_dims, const Tensor& weight, double eps) {
  check_float("rms_norm", x);
  const std::vector<int64_t> xs = sizes_of(x);
  const Shape normalized(std::vector<int64_t>(xs.end() - normalized_dims, xs.end()));
  if (weight.defined()) {
    check_same_device("rms_norm", x, weight);
    MG_CHECK(weight.shape() == normalized && weight.dtype() == x.dtype(),
             "rms_norm: expected weight of shape {} ({}, the normalized shape), got {} ({})", normalized,
             x.dtype(), weight.shape(), weight.dtype());
  }
  const Tensor in = as_matrix(contiguous(x), normalized_dims);
  MG_CHECK(in.size(1) > 0, "rms_norm: cannot normalise over an empty shape {} (input {})", normalized, x.shape());
  Tensor out = empty(x.shape(), x.dtype(), x.device());
  // rstd in float32 for a 16-bit x: backward reads it unrounded.
  Tensor rstd = empty(Shape{in.size(0)}, compute_dtype(x.dtype()), x.device());
  const Tensor w = weight.defined() ? view(contiguous(weight), Shape{weight.numel()}) : Tensor();
  if (in.size(0) > 0) backend_of(x).rms_norm(as_matrix(out, normalized_dims), rstd, in, w, eps);
  return {out, rstd};
}

std::vector<Tensor> rms_norm_backward(const Tensor& grad_out, const Tensor& x, int64_t normalized_dims,
                                      const Tensor& rstd, const Tensor& weight, bool grad_weight) {
  const Tensor in = as_matrix(contiguous(x), normalized_dims);
  const Tensor g = as_matrix(contiguous(grad_out), normalized_dims);
  const std::vector<int64_t> xs = sizes_of(x);
  const Shape normalized(std::vector<int64_t>(xs.end() - normalized_dims, xs.end()));
  Tensor gi = empty(x.shape(), x.dtype(), x.device());
  Tensor gw = grad_weight ? empty(normalized, x.dtype(), x.device()) : Tensor();
  if (in.size(0) == 0) {
    if (gw.defined()) backend_of(x).fill(gw, 0.0);
    return {gi, gw};
  }
  backend_of(x).rms_norm_backward(as_matrix(gi, normalized_dims), gw.defined() ? view(gw, Shape{gw.numel()}) : Tensor(),
                                  g, in, rstd,
                                  weight.defined() ? view(contiguous(weight), Shape{weight.numel()}) : Tensor());
  return {gi, gw};
}

Tensor rotary_embedding(const Tensor& x, const Tensor& cos, const Tensor& sin, bool inverse) {
  check_float("rotary_embedding", x);
  check_same_device("rotary_embedding", x, cos);
  check_same_device("rotary_embedding", x, sin);
  MG_CHECK(x.dim() == 4 && x.size(3) % 2 == 0,
           "rotary_embedding: expected x [B, T, H, D] with D even (pairs i, i + D/2 rotate), got {}", x.shape());
  const Shape table{x.size(1), x.size(3) / 2};
  MG_CHECK(cos.shape() == table && sin.shape() == table && cos.dtype() == x.dtype() && sin.dtype() == x.dtype(),
           "rotary_embedding: expected cos and sin of shape {} ([T, D/2]) and dtype {} for x {}, got cos {} ({}) and "
           "sin {} ({})",
           table, x.dtype(), x.shape(), cos.shape(), cos.dtype(), sin.shape(), sin.dtype());
  const Tensor in = contiguous(x);
  Tensor out = empty(x.shape(), x.dtype(), x.device());
  if (x.numel() > 0) backend_of(x).rotary_embedding(out, in, contiguous(cos), contiguous(sin), inverse);
  return out;
}

Tensor embedding(const Tensor& weight, const Tensor& indices) {
  check_same_device("embedding", weight, indices);
  MG_CHECK(weight.dim() == 2, "embedding: expected a weight of shape [num_embeddings, "
           "embedding_dim], got {}", weight.shape());
  check_float("embedding", weight);
  MG_CHECK(indices.dtype() == DType::Int64,
           "embedding: expected int64 indices, got {} (shape {})", indices.dtype(),
           indices.shape());
  std::vector<int64_t> out_sizes = sizes_of(indices);
  out_sizes.push_back(weight.size(1));
  Tensor out = empty(Shape(out_sizes), weight.dtype(), weight.device());
  if (indices.numel() == 0) return out;
  const Tensor idx = view(contiguous(indices), Shape{indices.numel()});
  backend_of(weight).embedding(view(out, Shape{indices.numel(), weight.size(1)}), weight, idx);
  return out;
}

Tensor embedding_backward(const Tensor& grad_out, const Tensor& indices, int64_t vocab) {
  const int64_t dim = grad_out.size(-1);
  Tensor grad = empty(Shape{vocab, dim}, grad_out.dtype(), grad_out.device());
  backend_of(grad_out).fill(grad, 0.0);
  if (indices.numel() == 0 || dim == 0) return grad;
  const Tensor idx = view(contiguous(indices), Shape{indices.numel()});
  const Tensor g = view(contiguous(grad_out), Shape{indices.numel(), dim});
  backend_of(grad_out).embedding_backward(grad, g, idx);
  return grad;
}

namespace {
// [..., t, d] -> [batch, t, d] contiguous.
Tensor as_batch3(const Tensor& t) {
  const Tensor c = contiguous(t);
  const int64_t rows = t.size(-2), cols = t.size(-1);
  const int64_t batch = rows * cols == 0 ? 0 : t.numel() / (rows * cols);
  return view(c, Shape{batch, rows, cols});
}
}  // namespace

void check_attention(const Tensor& q, const Tensor& k, const Tensor& v) {
  const char* op = "scaled_dot_product_attention";
  check_same_device(op, q, k);
  check_same_device(op, q, v);
  check_float(op, q);
  MG_CHECK(q.dtype() == k.dtype() && q.dtype() == v.dtype(),
           "{}: expected query, key and value of one dtype, got {}, {} and {}", op, q.dtype(),
           k.dtype(), v.dtype());
  MG_CHECK(q.dim() >= 2 && k.dim() == q.dim() && v.dim() == q.dim(),
           "{}: expected query, key and value of the same rank (at least 2), got shapes {}, {} "
           "and {}",
           op, q.shape(), k.shape(), v.shape());
  const std::vector<int64_t> qs = sizes_of(q), ks = sizes_of(k), vs = sizes_of(v);
  MG_CHECK(std::equal(qs.begin(), qs.end() - 2, ks.begin()) &&
               std::equal(qs.begin(), qs.end() - 2, vs.begin()) && q.size(-1) == k.size(-1) &&
               k.size(-2) == v.size(-2),
           "{}: shapes do not fit: query {}, key {}, value {} (expected [..., L, E], "
           "[..., S, E] and [..., S, Ev])",
           op, q.shape(), k.shape(), v.shape());
  // A query with no key to attend to has no softmax; no query at all (an empty batch, or
  // no positions) is an empty result, whatever the keys.
  int64_t query_rows = 1;
  for (int64_t d = 0; d + 1 < q.dim(); ++d) query_rows = checked_mul(query_rows, q.size(d), op);
  MG_CHECK(k.size(-2) > 0 || query_rows == 0,
           "{}: expected at least one key, got key of shape {} for query of shape {}", op,
           k.shape(), q.shape());
}

std::vector<Tensor> attention(const Tensor& q, const Tensor& k, const Tensor& v, double scale,
                              bool causal, double dropout_p, uint64_t seed, uint64_t offset) {
  check_attention(q, k, v);
  const std::vector<int64_t> qs = sizes_of(q);
  std::vector<int64_t> out_sizes = qs, lse_sizes(qs.begin(), qs.end() - 1);
  out_sizes.back() = v.size(-1);
  Tensor out = empty(Shape(out_sizes), q.dtype(), q.device());
  Tensor lse = empty(Shape(lse_sizes), compute_dtype(q.dtype()), q.device());  // float32 for 16-bit q
  if (out.numel() == 0) return {out, lse};
  const Tensor q3 = as_batch3(q), k3 = as_batch3(k), v3 = as_batch3(v);
  backend_of(q).attention(view(out, Shape{q3.size(0), q3.size(1), v.size(-1)}),
                          view(lse, Shape{q3.size(0), q3.size(1)}), q3, k3, v3, scale, causal,
                          dropout_p, seed, offset);
  return {out, lse};
}

std::vector<Tensor> attention_backward(const Tensor& grad_out, const Tensor& q, const Tensor& k,
                                       const Tensor& v, const Tensor& out, const Tensor& lse,
                                       double scale, bool causal, double dropout_p,
                                       uint64_t seed, uint64_t offset) {
  Tensor gq = empty(q.shape(), q.dtype(), q.device());
  Tensor gk = empty(k.shape(), k.dtype(), k.device());
  Tensor gv = empty(v.shape(), v.dtype(), v.device());
  if (out.numel() == 0) {
    for (Tensor* t : {&gq, &gk, &gv})
      if (t->numel() > 0) backend_of(q).fill(*t, 0.0);
    return {gq, gk, gv};
  }
  const Tensor q3 = as_batch3(q), k3 = as_batch3(k), v3 = as_batch3(v);
  const Tensor o3 = as_batch3(out), g3 = as_batch3(grad_out);
  backend_of(q).attention_backward(view(gq, q3.shape()), view(gk, k3.shape()), view(gv, v3.shape()),
                                   g3, q3, k3, v3, o3,
                                   view(contiguous(lse), Shape{q3.size(0), q3.size(1)}), scale,
                                   causal, dropout_p, seed, offset);
  return {gq, gk, gv};
}

}  // namespace mg::ops
