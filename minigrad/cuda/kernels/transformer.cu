// The transformer's kernels in float32 and float64, the twins of the CPU backend's
// (core/cpu/layer_norm.cpp, embedding.cpp, attention.cpp, elementwise.cpp's gelu,
// masked_fill and dropout, softmax.cpp's softmax). Plain first versions that favour being
// obviously right and deterministic: row ops take a block per row, sums over rows a
// thread per column in row order, attention a warp per query (forward) and per key
// (backward) with an online softmax. They are not yet FlashAttention's shared-memory
// tiling; tests/cuda compares every one with the CPU.
#include <cmath>

#include <stdexcept>

#include <minigrad/core/bfloat16.h>
#include <minigrad/core/float16.h>
#include <minigrad/core/philox.h>
#include <minigrad/cuda/check.h>
#include <minigrad/cuda/kernels/reduced_float.cuh>
#include <minigrad/cuda/kernels/transformer.h>

namespace mg::cuda::kernels {
namespace {

constexpr int kThreads = 256;

int blocks_for(int64_t n) {
  const int64_t b = (n + kThreads - 1) / kThreads;
  return static_cast<int>(b < 65535 ? (b > 0 ? b : 1) : 65535);
}

// A grid-stride loop over numel elements, with each operand's offset.
template <int N, typename F>
__global__ void strided_kernel(StridedIndexer<N> layout, int64_t numel, F f) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < numel;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t o[N];
    layout.offsets(i, o);
    f(i, o);
  }
}

template <int N, typename F>
void launch_strided(const StridedIndexer<N>& layout, int64_t numel, cudaStream_t stream, F f) {
  if (numel <= 0) return;
  strided_kernel<N><<<blocks_for(numel), kThreads, 0, stream>>>(layout, numel, f);
  MG_CUDA_CHECK_LAUNCH();
}


// The per-element work of the strided kernels, as functors (device lambdas would need
// nvcc's --extended-lambda).
template <typename To, typename From>
struct ConvertOp {
  To* d;
  const From* s;
  __device__ void operator()(int64_t, const int64_t (&o)[2]) const { d[o[0]] = convert_value<To>(s[o[1]]); }
};
template <typename T>
struct GeluOp {
  T* o;
  const T* x;
  bool tanh_form;
  __device__ void operator()(int64_t, const int64_t (&k)[2]) const;
};
template <typename T>
struct GeluBackwardOp {
  T* gi;
  const T* go;
  const T* x;
  bool tanh_form;
  __device__ void operator()(int64_t, const int64_t (&k)[3]) const;
};
template <typename T>
struct SiluOp {
  T* o;
  const T* x;
  __device__ void operator()(int64_t, const int64_t (&k)[2]) const;
};
template <typename T>
struct SiluBackwardOp {
  T* gi;
  const T* go;
  const T* x;
  __device__ void operator()(int64_t, const int64_t (&k)[3]) const;
};
template <typename T, typename M>
struct MaskedFillOp {
  T* o;
  const T* x;
  const M* m;
  T v;
  __device__ void operator()(int64_t, const int64_t (&k)[3]) const {
    o[k[0]] = to_compute(m[k[2]]) != compute_t<M>(0) ? v : x[k[1]];
  }
};
template <typename T>
struct DropoutOp {
  T* o;
  const T* x;
  compute_t<T> scale;
  float threshold;
  uint64_t seed, offset;
  __device__ void operator()(int64_t i, const int64_t (&k)[2]) const {
    const bool keep = philox::uniform(seed, offset, static_cast<uint64_t>(i)) >= threshold;
    o[k[0]] = from_compute<T>(keep ? to_compute(x[k[1]]) * scale : compute_t<T>(0));
  }
};

// float32 and float64: the kernels that compute in T.
template <typename F>
void with_float(FloatType type, F f) {
  switch (type) {
    case FloatType::Float32: f(float{}); return;
    case FloatType::Float64: f(double{}); return;
    default: break;
  }
  throw std::logic_error("CUDA kernel: a 16-bit tensor reached a float32/float64-only kernel");
}
// The kernels that load as compute_t<T> and round once on store: the 16-bit floats too.
template <typename F>
void with_float_or_reduced(FloatType type, F f) {
  switch (type) {
    case FloatType::Float32: f(float{}); break;
    case FloatType::Float64: f(double{}); break;
    case FloatType::BFloat16: f(__nv_bfloat16{}); break;
    case FloatType::Float16: f(__half{}); break;
  }
}
template <typename F>
void with_any(AnyType type, F f) {
  switch (type) {
    case AnyType::Float32: f(float{}); break;
    case AnyType::Float64: f(double{}); break;
    case AnyType::Int64: f(int64_t{}); break;
    case AnyType::BFloat16: f(__nv_bfloat16{}); break;
    case AnyType::Float16: f(__half{}); break;
  }
}

// A host value as a T, rounded as the CPU rounds it (a 16-bit one through float).
template <typename T>
T host_value(double v) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    __nv_bfloat16_raw raw;
    raw.x = bfloat16(static_cast<float>(v)).bits;
    return T(raw);
  } else if constexpr (std::is_same_v<T, __half>) {
    __half_raw raw;
    raw.x = float16(static_cast<float>(v)).bits;
    return T(raw);
  } else {
    return static_cast<T>(v);
  }
}

// ---- gelu ----
template <typename T>
__device__ __forceinline__ T gelu_value(T x, bool tanh_form) {
  if (tanh_form) {
    const T inner = T(0.7978845608028654) * (x + T(0.044715) * x * x * x);
    return T(0.5) * x * (T(1) + tanh(inner));
  }
  return T(0.5) * x * (T(1) + erf(x * T(0.7071067811865476)));
}
template <typename T>
__device__ __forceinline__ T gelu_grad(T g, T x, bool tanh_form) {
  if (tanh_form) {
    const T k = T(0.7978845608028654), c = T(0.044715);
    const T t = tanh(k * (x + c * x * x * x));
    const T d_inner = k * (T(1) + T(3) * c * x * x);
    return g * (T(0.5) * (T(1) + t) + T(0.5) * x * (T(1) - t * t) * d_inner);
  }
  const T cdf = T(0.5) * (T(1) + erf(x * T(0.7071067811865476)));
  const T pdf = T(0.3989422804014327) * exp(T(-0.5) * x * x);
  return g * (cdf + x * pdf);
}

template <typename T>
__device__ void GeluOp<T>::operator()(int64_t, const int64_t (&k)[2]) const {
  o[k[0]] = from_compute<T>(gelu_value(to_compute(x[k[1]]), tanh_form));
}
template <typename T>
__device__ void GeluBackwardOp<T>::operator()(int64_t, const int64_t (&k)[3]) const {
  gi[k[0]] = from_compute<T>(gelu_grad(to_compute(go[k[1]]), to_compute(x[k[2]]), tanh_form));
}

// ---- silu: x * sigmoid(x); d/dx = s (1 + x (1 - s)) ----
template <typename T>
__device__ __forceinline__ T sigmoid_value(T x) {
  return T(1) / (T(1) + exp(-x));
}
template <typename T>
__device__ void SiluOp<T>::operator()(int64_t, const int64_t (&k)[2]) const {
  const auto v = to_compute(x[k[1]]);
  o[k[0]] = from_compute<T>(v * sigmoid_value(v));
}
template <typename T>
__device__ void SiluBackwardOp<T>::operator()(int64_t, const int64_t (&k)[3]) const {
  const auto v = to_compute(x[k[2]]);
  const auto sg = sigmoid_value(v);
  using C = decltype(v);
  gi[k[0]] = from_compute<T>(to_compute(go[k[1]]) * sg * (C(1) + v * (C(1) - sg)));
}

// ---- block reductions (a block of kThreads per row) ----
template <typename T>
__device__ T block_sum(T value) {
  __shared__ T partial[kThreads / 32];
  for (int delta = 16; delta > 0; delta >>= 1) value += __shfl_xor_sync(0xffffffffu, value, delta);
  __syncthreads();
  if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = value;
  __syncthreads();
  T total = 0;
  for (int w = 0; w < kThreads / 32; ++w) total += partial[w];
  return total;
}
template <typename T>
__device__ T block_max(T value) {
  __shared__ T partial[kThreads / 32];
  for (int delta = 16; delta > 0; delta >>= 1)
    value = fmax(value, __shfl_xor_sync(0xffffffffu, value, delta));
  __syncthreads();
  if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = value;
  __syncthreads();
  T best = partial[0];
  for (int w = 1; w < kThreads / 32; ++w) best = fmax(best, partial[w]);
  return best;
}

template <typename T>
__global__ void softmax_kernel(T* out, const T* in, int64_t cols) {
  const T* x = in + blockIdx.x * cols;
  T* y = out + blockIdx.x * cols;
  T m = -INFINITY;
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) m = fmax(m, x[j]);
  m = block_max(m);
  if (isinf(m)) {  // a row of -inf (or holding +inf) is NaN, as on the CPU
    for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) y[j] = NAN;
    return;
  }
  T s = 0;
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) s += exp(x[j] - m);
  s = block_sum(s);
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) y[j] = exp(x[j] - m) / s;
}

template <typename T>
__global__ void softmax_backward_kernel(T* gi, const T* go, const T* y, int64_t cols) {
  const int64_t base = blockIdx.x * cols;
  T dot = 0;
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) dot += go[base + j] * y[base + j];
  dot = block_sum(dot);
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x)
    gi[base + j] = y[base + j] * (go[base + j] - dot);
}

template <typename T>
__global__ void layer_norm_kernel(T* out, T* mean, T* rstd, const T* in, const T* w, const T* b,
                                  int64_t cols, double eps) {
  const T* x = in + blockIdx.x * cols;
  T* y = out + blockIdx.x * cols;
  double s = 0;
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) s += static_cast<double>(x[j]);
  const double mu = block_sum(s) / static_cast<double>(cols);
  double sq = 0;
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
    const double d = static_cast<double>(x[j]) - mu;
    sq += d * d;
  }
  const double r = 1.0 / sqrt(block_sum(sq) / static_cast<double>(cols) + eps);
  if (threadIdx.x == 0) {
    mean[blockIdx.x] = static_cast<T>(mu);
    rstd[blockIdx.x] = static_cast<T>(r);
  }
  const T m = static_cast<T>(mu), rs = static_cast<T>(r);
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
    T v = (x[j] - m) * rs;
    if (w != nullptr) v = v * w[j];
    if (b != nullptr) v = v + b[j];
    y[j] = v;
  }
}

template <typename T>
__global__ void layer_norm_backward_kernel(T* gi, const T* go, const T* in, const T* mean,
                                           const T* rstd, const T* w, int64_t cols) {
  const int64_t row = blockIdx.x, base = row * cols;
  const T mu = mean[row], rs = rstd[row];
  double s1 = 0, s2 = 0;
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
    const T xhat = (in[base + j] - mu) * rs;
    const T dxhat = w != nullptr ? go[base + j] * w[j] : go[base + j];
    s1 += static_cast<double>(dxhat);
    s2 += static_cast<double>(dxhat) * static_cast<double>(xhat);
  }
  const T mean_dxhat = static_cast<T>(block_sum(s1) / static_cast<double>(cols));
  const T mean_dxhat_xhat = static_cast<T>(block_sum(s2) / static_cast<double>(cols));
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
    const T xhat = (in[base + j] - mu) * rs;
    const T dxhat = w != nullptr ? go[base + j] * w[j] : go[base + j];
    gi[base + j] = rs * (dxhat - mean_dxhat - xhat * mean_dxhat_xhat);
  }
}

// grad_weight[j] = sum_i grad_out[i, j] * xhat[i, j]; grad_bias[j] = sum_i grad_out[i, j].
template <typename T>
__global__ void layer_norm_param_grads_kernel(T* gw, T* gb, const T* go, const T* in,
                                              const T* mean, const T* rstd, int64_t rows,
                                              int64_t cols) {
  const int64_t j = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (j >= cols) return;
  double sw = 0, sb = 0;
  for (int64_t i = 0; i < rows; ++i) {
    const double g = static_cast<double>(go[i * cols + j]);
    sw += g * static_cast<double>((in[i * cols + j] - mean[i]) * rstd[i]);
    sb += g;
  }
  if (gw != nullptr) gw[j] = static_cast<T>(sw);
  if (gb != nullptr) gb[j] = static_cast<T>(sb);
}

// RMS normalisation: a block per row, the sum of squares in double (as the CPU's).
template <typename T>
__global__ void rms_norm_kernel(T* out, T* rstd, const T* in, const T* w, int64_t cols, double eps) {
  const T* x = in + blockIdx.x * cols;
  T* y = out + blockIdx.x * cols;
  double sq = 0;
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) sq += static_cast<double>(x[j]) * static_cast<double>(x[j]);
  const T r = static_cast<T>(1.0 / sqrt(block_sum(sq) / static_cast<double>(cols) + eps));
  if (threadIdx.x == 0) rstd[blockIdx.x] = r;
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) y[j] = w != nullptr ? x[j] * r * w[j] : x[j] * r;
}

// grad_in = rstd * (dxhat - xhat * mean(dxhat * xhat)), xhat = x rstd, dxhat = grad_out w.
template <typename T>
__global__ void rms_norm_backward_kernel(T* gi, const T* go, const T* in, const T* rstd, const T* w, int64_t cols) {
  const int64_t base = blockIdx.x * cols;
  const T rs = rstd[blockIdx.x];
  double s = 0;
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
    const T dxhat = w != nullptr ? go[base + j] * w[j] : go[base + j];
    s += static_cast<double>(dxhat) * static_cast<double>(in[base + j] * rs);
  }
  const T mean_dxhat_xhat = static_cast<T>(block_sum(s) / static_cast<double>(cols));
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
    const T dxhat = w != nullptr ? go[base + j] * w[j] : go[base + j];
    gi[base + j] = rs * (dxhat - in[base + j] * rs * mean_dxhat_xhat);
  }
}

// grad_weight[j] = sum_i grad_out[i, j] * x[i, j] * rstd[i], a thread per column in row order.
template <typename T>
__global__ void rms_norm_weight_grad_kernel(T* gw, const T* go, const T* in, const T* rstd, int64_t rows,
                                            int64_t cols) {
  const int64_t j = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (j >= cols) return;
  double sw = 0;
  for (int64_t i = 0; i < rows; ++i)
    sw += static_cast<double>(go[i * cols + j]) * static_cast<double>(in[i * cols + j] * rstd[i]);
  gw[j] = static_cast<T>(sw);
}

// Rotary embedding: a thread per pair (i, i + D/2) of one head at one position, grid-stride.
template <typename T>
__global__ void rotary_kernel(T* out, const T* in, const T* cos, const T* sin, int64_t pairs, int64_t S,
                              int64_t H, int64_t half, bool inverse) {
  for (int64_t p = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; p < pairs;
       p += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t i = p % half, row = p / half;  // row = (b S + t) H + h
    const int64_t t = (row / H) % S, base = row * 2 * half;
    const auto c = to_compute(cos[t * half + i]);
    const auto sn = inverse ? -to_compute(sin[t * half + i]) : to_compute(sin[t * half + i]);
    const auto x1 = to_compute(in[base + i]), x2 = to_compute(in[base + i + half]);
    out[base + i] = from_compute<T>(x1 * c - x2 * sn);
    out[base + i + half] = from_compute<T>(x2 * c + x1 * sn);
  }
}

template <typename T>
__global__ void embedding_kernel(T* out, const T* w, int64_t rs, int64_t cs, const int64_t* idx,
                                 int64_t n, int64_t dim) {
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < n * dim;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t i = e / dim, j = e % dim;
    out[e] = w[idx[i] * rs + j * cs];
  }
}

template <typename T>
__global__ void embedding_backward_kernel(T* gw, const T* go, const int64_t* idx, int64_t n,
                                          int64_t dim) {
  const int64_t j = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (j >= dim) return;
  for (int64_t i = 0; i < n; ++i) gw[idx[i] * dim + j] += go[i * dim + j];
}

// ---- attention: a warp per row, each lane holding up to kPerLane of its d (dv) values ----
constexpr int kPerLane = kAttentionMaxDim / 32;

template <typename T>
__device__ __forceinline__ T warp_sum(T v) {
  for (int delta = 16; delta > 0; delta >>= 1) v += __shfl_xor_sync(0xffffffffu, v, delta);
  return v;
}

// x[0..n) . y[0..n) over the warp (every lane gets it).
template <typename T>
__device__ __forceinline__ T warp_dot(const T* x, const T* y, int64_t n) {
  T s = 0;
  for (int64_t c = threadIdx.x % 32; c < n; c += 32) s += x[c] * y[c];
  return warp_sum(s);
}

__device__ __forceinline__ double dropout_factor(const AttentionShape& sh, int64_t b, int64_t i,
                                                 int64_t j) {
  if (sh.dropout_p <= 0.0) return 1.0;
  const auto index = static_cast<uint64_t>((b * sh.tq + i) * sh.tk + j);
  return philox::uniform(sh.seed, sh.offset, index) >= static_cast<float>(sh.dropout_p)
             ? 1.0 / (1.0 - sh.dropout_p)
             : 0.0;
}

__device__ __forceinline__ int64_t last_key(const AttentionShape& sh, int64_t i) {
  return sh.causal ? (i + 1 < sh.tk ? i + 1 : sh.tk) : sh.tk;
}

template <typename T>
__global__ void attention_kernel(T* out, T* lse, const T* q, const T* k, const T* v,
                                 AttentionShape sh) {
  const int64_t row = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) / 32;
  if (row >= sh.batch * sh.tq) return;
  const int lane = threadIdx.x % 32;
  const int64_t b = row / sh.tq, i = row % sh.tq;
  const T* Q = q + row * sh.d;
  const T* K = k + b * sh.tk * sh.d;
  const T* V = v + b * sh.tk * sh.dv;
  T acc[kPerLane];
  for (int c = 0; c < kPerLane; ++c) acc[c] = 0;
  T m = -INFINITY, l = 0;
  const auto scale = static_cast<T>(sh.scale);
  for (int64_t j = 0; j < last_key(sh, i); ++j) {
    const T s = scale * warp_dot(Q, K + j * sh.d, sh.d);
    const T m_new = fmax(m, s);
    const T correction = exp(m - m_new);
    const T p = exp(s - m_new);
    l = l * correction + p;
    const T pz = p * static_cast<T>(dropout_factor(sh, b, i, j));
    for (int c = 0; c < kPerLane; ++c) {
      const int64_t col = lane + 32 * c;
      if (col < sh.dv) acc[c] = acc[c] * correction + pz * V[j * sh.dv + col];
    }
    m = m_new;
  }
  for (int c = 0; c < kPerLane; ++c) {
    const int64_t col = lane + 32 * c;
    if (col < sh.dv) out[row * sh.dv + col] = acc[c] / l;
  }
  if (lane == 0) lse[row] = m + log(l);
}

template <typename T>
__global__ void attention_delta_kernel(T* delta, const T* grad_out, const T* out, int64_t rows,
                                       int64_t dv) {
  const int64_t row = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) / 32;
  if (row >= rows) return;
  const T d = warp_dot(grad_out + row * dv, out + row * dv, dv);
  if (threadIdx.x % 32 == 0) delta[row] = d;
}

// dq_i = scale * sum_j ds_ij k_j, ds_ij = p_ij (z_ij dO_i . v_j - delta_i).
template <typename T>
__global__ void attention_grad_q_kernel(T* gq, const T* go, const T* q, const T* k, const T* v,
                                        const T* lse, const T* delta, AttentionShape sh) {
  const int64_t row = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) / 32;
  if (row >= sh.batch * sh.tq) return;
  const int lane = threadIdx.x % 32;
  const int64_t b = row / sh.tq, i = row % sh.tq;
  const T* K = k + b * sh.tk * sh.d;
  const T* V = v + b * sh.tk * sh.dv;
  const auto scale = static_cast<T>(sh.scale);
  T acc[kPerLane];
  for (int c = 0; c < kPerLane; ++c) acc[c] = 0;
  for (int64_t j = 0; j < last_key(sh, i); ++j) {
    const T p = exp(scale * warp_dot(q + row * sh.d, K + j * sh.d, sh.d) - lse[row]);
    const T dp = warp_dot(go + row * sh.dv, V + j * sh.dv, sh.dv) *
                 static_cast<T>(dropout_factor(sh, b, i, j));
    const T ds = p * (dp - delta[row]);
    for (int c = 0; c < kPerLane; ++c) {
      const int64_t col = lane + 32 * c;
      if (col < sh.d) acc[c] += scale * ds * K[j * sh.d + col];
    }
  }
  for (int c = 0; c < kPerLane; ++c) {
    const int64_t col = lane + 32 * c;
    if (col < sh.d) gq[row * sh.d + col] = acc[c];
  }
}

// dk_j = scale * sum_i ds_ij q_i;  dv_j = sum_i p_ij z_ij dO_i.
template <typename T>
__global__ void attention_grad_kv_kernel(T* gk, T* gv, const T* go, const T* q, const T* k,
                                         const T* v, const T* lse, const T* delta,
                                         AttentionShape sh) {
  const int64_t key_row = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) / 32;
  if (key_row >= sh.batch * sh.tk) return;
  const int lane = threadIdx.x % 32;
  const int64_t b = key_row / sh.tk, j = key_row % sh.tk;
  const auto scale = static_cast<T>(sh.scale);
  T acc_k[kPerLane], acc_v[kPerLane];
  for (int c = 0; c < kPerLane; ++c) acc_k[c] = acc_v[c] = 0;
  for (int64_t i = sh.causal ? j : 0; i < sh.tq; ++i) {
    const int64_t row = b * sh.tq + i;
    const T p = exp(scale * warp_dot(q + row * sh.d, k + key_row * sh.d, sh.d) - lse[row]);
    const auto z = static_cast<T>(dropout_factor(sh, b, i, j));
    const T dp = warp_dot(go + row * sh.dv, v + key_row * sh.dv, sh.dv) * z;
    const T ds = p * (dp - delta[row]);
    for (int c = 0; c < kPerLane; ++c) {
      const int64_t col = lane + 32 * c;
      if (col < sh.d) acc_k[c] += scale * ds * q[row * sh.d + col];
      if (col < sh.dv) acc_v[c] += p * z * go[row * sh.dv + col];
    }
  }
  for (int c = 0; c < kPerLane; ++c) {
    const int64_t col = lane + 32 * c;
    if (col < sh.d) gk[key_row * sh.d + col] = acc_k[c];
    if (col < sh.dv) gv[key_row * sh.dv + col] = acc_v[c];
  }
}

int warp_blocks(int64_t rows) {
  const int64_t warps_per_block = kThreads / 32;
  return static_cast<int>((rows + warps_per_block - 1) / warps_per_block);
}

}  // namespace

void convert(AnyType to, AnyType from, void* dst, const void* src, const StridedIndexer<2>& layout,
             int64_t numel, cudaStream_t stream) {
  with_any(to, [&](auto to_tag) {
    using To = decltype(to_tag);
    with_any(from, [&](auto from_tag) {
      using From = decltype(from_tag);
      launch_strided<2>(layout, numel, stream,
                        ConvertOp<To, From>{static_cast<To*>(dst), static_cast<const From*>(src)});
    });
  });
}

void gelu(FloatType type, void* out, const void* in, bool tanh_form,
          const StridedIndexer<2>& layout, int64_t numel, cudaStream_t stream) {
  with_float_or_reduced(type, [&](auto tag) {
    using T = decltype(tag);
    launch_strided<2>(layout, numel, stream,
                      GeluOp<T>{static_cast<T*>(out), static_cast<const T*>(in), tanh_form});
  });
}

void gelu_backward(FloatType type, void* grad_in, const void* grad_out, const void* input,
                   bool tanh_form, const StridedIndexer<3>& layout, int64_t numel,
                   cudaStream_t stream) {
  with_float_or_reduced(type, [&](auto tag) {
    using T = decltype(tag);
    launch_strided<3>(layout, numel, stream,
                      GeluBackwardOp<T>{static_cast<T*>(grad_in), static_cast<const T*>(grad_out),
                                        static_cast<const T*>(input), tanh_form});
  });
}

void silu(FloatType type, void* out, const void* in, const StridedIndexer<2>& layout, int64_t numel,
          cudaStream_t stream) {
  with_float_or_reduced(type, [&](auto tag) {
    using T = decltype(tag);
    launch_strided<2>(layout, numel, stream, SiluOp<T>{static_cast<T*>(out), static_cast<const T*>(in)});
  });
}

void silu_backward(FloatType type, void* grad_in, const void* grad_out, const void* input,
                   const StridedIndexer<3>& layout, int64_t numel, cudaStream_t stream) {
  with_float_or_reduced(type, [&](auto tag) {
    using T = decltype(tag);
    launch_strided<3>(layout, numel, stream,
                      SiluBackwardOp<T>{static_cast<T*>(grad_in), static_cast<const T*>(grad_out),
                                        static_cast<const T*>(input)});
  });
}

void masked_fill(AnyType type, AnyType mask_type, void* out, const void* in, const void* mask,
                 double value, const StridedIndexer<3>& layout, int64_t numel,
                 cudaStream_t stream) {
  with_any(type, [&](auto tag) {
    using T = decltype(tag);
    with_any(mask_type, [&](auto mask_tag) {
      using M = decltype(mask_tag);
      launch_strided<3>(layout, numel, stream,
                        MaskedFillOp<T, M>{static_cast<T*>(out), static_cast<const T*>(in),
                                           static_cast<const M*>(mask), host_value<T>(value)});
    });
  });
}

void dropout(FloatType type, void* out, const void* in, double p, uint64_t seed, uint64_t offset,
             const StridedIndexer<2>& layout, int64_t numel, cudaStream_t stream) {
  with_float_or_reduced(type, [&](auto tag) {
    using T = decltype(tag);
    launch_strided<2>(layout, numel, stream,
                      DropoutOp<T>{static_cast<T*>(out), static_cast<const T*>(in),
                                   static_cast<compute_t<T>>(1.0 / (1.0 - p)), static_cast<float>(p),
                                   seed, offset});
  });
}

void softmax(FloatType type, void* out, const void* in, int64_t rows, int64_t cols,
             cudaStream_t stream) {
  if (rows == 0) return;
  with_float(type, [&](auto tag) {
    using T = decltype(tag);
    softmax_kernel<T><<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(
        static_cast<T*>(out), static_cast<const T*>(in), cols);
  });
  MG_CUDA_CHECK_LAUNCH();
}

void softmax_backward(FloatType type, void* grad_in, const void* grad_out, const void* output,
                      int64_t rows, int64_t cols, cudaStream_t stream) {
  if (rows == 0) return;
  with_float(type, [&](auto tag) {
    using T = decltype(tag);
    softmax_backward_kernel<T><<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(
        static_cast<T*>(grad_in), static_cast<const T*>(grad_out), static_cast<const T*>(output),
        cols);
  });
  MG_CUDA_CHECK_LAUNCH();
}

void layer_norm(FloatType type, void* out, void* mean, void* rstd, const void* in,
                const void* weight, const void* bias, int64_t rows, int64_t cols, double eps,
                cudaStream_t stream) {
  if (rows == 0) return;
  with_float(type, [&](auto tag) {
    using T = decltype(tag);
    layer_norm_kernel<T><<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(
        static_cast<T*>(out), static_cast<T*>(mean), static_cast<T*>(rstd),
        static_cast<const T*>(in), static_cast<const T*>(weight), static_cast<const T*>(bias),
        cols, eps);
  });
  MG_CUDA_CHECK_LAUNCH();
}

void layer_norm_backward(FloatType type, void* grad_in, void* grad_weight, void* grad_bias,
                         const void* grad_out, const void* in, const void* mean,
                         const void* rstd, const void* weight, int64_t rows, int64_t cols,
                         cudaStream_t stream) {
  if (rows == 0) return;
  with_float(type, [&](auto tag) {
    using T = decltype(tag);
    layer_norm_backward_kernel<T><<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(
        static_cast<T*>(grad_in), static_cast<const T*>(grad_out), static_cast<const T*>(in),
        static_cast<const T*>(mean), static_cast<const T*>(rstd), static_cast<const T*>(weight),
        cols);
    if (grad_weight != nullptr || grad_bias != nullptr)
      layer_norm_param_grads_kernel<T><<<blocks_for(cols), kThreads, 0, stream>>>(
          static_cast<T*>(grad_weight), static_cast<T*>(grad_bias),
          static_cast<const T*>(grad_out), static_cast<const T*>(in),
          static_cast<const T*>(mean), static_cast<const T*>(rstd), rows, cols);
  });
  MG_CUDA_CHECK_LAUNCH();
}

void rms_norm(FloatType type, void* out, void* rstd, const void* in, const void* weight, int64_t rows,
              int64_t cols, double eps, cudaStream_t stream) {
  if (rows == 0) return;
  with_float(type, [&](auto tag) {
    using T = decltype(tag);
    rms_norm_kernel<T><<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(
        static_cast<T*>(out), static_cast<T*>(rstd), static_cast<const T*>(in), static_cast<const T*>(weight), cols,
        eps);
  });
  MG_CUDA_CHECK_LAUNCH();
}

void rms_norm_backward(FloatType type, void* grad_in, void* grad_weight, const void* grad_out, const void* in,
                       const void* rstd, const void* weight, int64_t rows, int64_t cols, cudaStream_t stream) {
  if (rows == 0) return;
  with_float(type, [&](auto tag) {
    using T = decltype(tag);
    rms_norm_backward_kernel<T><<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(
        static_cast<T*>(grad_in), static_cast<const T*>(grad_out), static_cast<const T*>(in),
        static_cast<const T*>(rstd), static_cast<const T*>(weight), cols);
    MG_CUDA_CHECK_LAUNCH();
    if (grad_weight != nullptr)
      rms_norm_weight_grad_kernel<T><<<blocks_for(cols), kThreads, 0, stream>>>(
          static_cast<T*>(grad_weight), static_cast<const T*>(grad_out), static_cast<const T*>(in),
          static_cast<const T*>(rstd), rows, cols);
  });
  MG_CUDA_CHECK_LAUNCH();
}

void rotary_embedding(FloatType type, void* out, const void* in, const void* cos, const void* sin, int64_t batch,
                      int64_t seq, int64_t heads, int64_t dim, bool inverse, cudaStream_t stream) {
  const int64_t half = dim / 2, pairs = batch * seq * heads * half;
  if (pairs == 0) return;
  with_float_or_reduced(type, [&](auto tag) {
    using T = decltype(tag);
    rotary_kernel<T><<<blocks_for(pairs), kThreads, 0, stream>>>(
        static_cast<T*>(out), static_cast<const T*>(in), static_cast<const T*>(cos), static_cast<const T*>(sin),
        pairs, seq, heads, half, inverse);
  });
  MG_CUDA_CHECK_LAUNCH();
}

void embedding(FloatType type, void* out, const void* weight, int64_t row_stride,
               int64_t col_stride, const int64_t* indices, int64_t n, int64_t dim,
               cudaStream_t stream) {
  if (n * dim == 0) return;
  // A gather moves elements as they are: any type of their width does.
  with_float_or_reduced(type, [&](auto tag) {
    using T = decltype(tag);
    embedding_kernel<T><<<blocks_for(n * dim), kThreads, 0, stream>>>(
        static_cast<T*>(out), static_cast<const T*>(weight), row_stride, col_stride, indices, n,
        dim);
  });
  MG_CUDA_CHECK_LAUNCH();
}

void embedding_backward(FloatType type, void* grad_weight, const void* grad_out,
                        const int64_t* indices, int64_t n, int64_t dim, cudaStream_t stream) {
  if (n * dim == 0) return;
  with_float(type, [&](auto tag) {
    using T = decltype(tag);
    embedding_backward_kernel<T><<<blocks_for(dim), kThreads, 0, stream>>>(
        static_cast<T*>(grad_weight), static_cast<const T*>(grad_out), indices, n, dim);
  });
  MG_CUDA_CHECK_LAUNCH();
}

void attention(FloatType type, void* out, void* lse, const void* q, const void* k, const void* v,
               const AttentionShape& shape, cudaStream_t stream) {
  const int64_t rows = shape.batch * shape.tq;
  if (rows == 0) return;
  with_float(type, [&](auto tag) {
    using T = decltype(tag);
    attention_kernel<T><<<warp_blocks(rows), kThreads, 0, stream>>>(
        static_cast<T*>(out), static_cast<T*>(lse), static_cast<const T*>(q),
        static_cast<const T*>(k), static_cast<const T*>(v), shape);
  });
  MG_CUDA_CHECK_LAUNCH();
}

void attention_backward(FloatType type, void* grad_q, void* grad_k, void* grad_v,
                        const void* grad_out, const void* q, const void* k, const void* v,
                        const void* out, const void* lse, void* delta,
                        const AttentionShape& shape, cudaStream_t stream) {
  const int64_t rows = shape.batch * shape.tq, key_rows = shape.batch * shape.tk;
  if (rows == 0) return;
  with_float(type, [&](auto tag) {
    using T = decltype(tag);
    attention_delta_kernel<T><<<warp_blocks(rows), kThreads, 0, stream>>>(
        static_cast<T*>(delta), static_cast<const T*>(grad_out), static_cast<const T*>(out), rows,
        shape.dv);
    attention_grad_q_kernel<T><<<warp_blocks(rows), kThreads, 0, stream>>>(
        static_cast<T*>(grad_q), static_cast<const T*>(grad_out), static_cast<const T*>(q),
        static_cast<const T*>(k), static_cast<const T*>(v), static_cast<const T*>(lse),
        static_cast<const T*>(delta), shape);
    attention_grad_kv_kernel<T><<<warp_blocks(key_rows), kThreads, 0, stream>>>(
        static_cast<T*>(grad_k), static_cast<T*>(grad_v), static_cast<const T*>(grad_out),
        static_cast<const T*>(q), static_cast<const T*>(k), static_cast<const T*>(v),
        static_cast<const T*>(lse), static_cast<const T*>(delta), shape);
  });
  MG_CUDA_CHECK_LAUNCH();
}

}  // namespace mg::cuda::kernels
