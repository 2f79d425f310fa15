// Fused scaled-dot-product attention on the host: the fast path of
// scaled_dot_product_attention (autograd/functions/attention.cpp, where the composition it
// equals is written out). FlashAttention's algorithm, blocked for a CPU's caches instead of
// a GPU's shared memory: a block of queries meets the keys one block at a time, scores come
// from a GEMM, and an online softmax (a running max m and sum l per query, the partial
// output rescaled by exp(m_old - m_new) whenever the max grows) means the [tq, tk] score
// matrix never exists, only one [block, block] tile of it. Backward recomputes each tile's
// probabilities from the saved log-sum-exp instead of keeping them (memory O(t), not O(t^2)).
// bfloat16 and float16 run the float32 kernels on widened copies (cpu/widen.h), their
// log-sum-exp float32 (compute_dtype), as FlashAttention keeps it.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include <minigrad/core/cpu/blas.h>
#include <minigrad/core/cpu/cpu_backend.h>
#include <minigrad/core/cpu/widen.h>
#include <minigrad/core/cpu/vector_exp.h>
#include <minigrad/core/dispatch.h>
#include <minigrad/core/philox.h>

namespace mg {
namespace {

using cpu::blas_gemm;

// out[j] = exp(in[j] - shift): float rows take cpu/vector_exp.h's exp, which vectorises
// (this file is built with -fno-trapping-math, as softmax.cpp), double rows std::exp.
inline void exp_row(float* out, const float* in, float shift, int64_t n) {
  cpu::exp_row(out, in, shift, n);
}
inline void exp_row(double* out, const double* in, double shift, int64_t n) {
  for (int64_t j = 0; j < n; ++j) out[j] = std::exp(in[j] - shift);
}

constexpr int64_t kBlockQ = 64;  // queries per tile
constexpr int64_t kBlockK = 64;  // keys per tile

int as_int(int64_t v) { return static_cast<int>(v); }

struct Problem {
  int64_t batch, tq, tk, d, dv;
  double scale;
  bool causal;
  double dropout_p;
  uint64_t seed, offset;

  // The number of keys query i sees within a tile starting at key j0 of nk keys.
  int64_t visible(int64_t i, int64_t j0, int64_t nk) const {
    if (!causal) return nk;
    return std::clamp<int64_t>(i - j0 + 1, 0, nk);
  }
  // The last key (exclusive) any query of [i0, i0 + nq) sees.
  int64_t key_end(int64_t i0, int64_t nq) const { return causal ? std::min(tk, i0 + nq) : tk; }
};

// The dropout factor of probability (b, i, j): 0 or 1 / (1 - p), from the Philox uniform
// of its element index in the [batch, tq, tk] probability tensor (Backend::dropout's draw).
template <typename T>
void fill_dropout(T* z, const Problem& pr, int64_t b, int64_t i0, int64_t nq, int64_t j0,
                  int64_t nk) {
  const auto keep_scale = static_cast<T>(1.0 / (1.0 - pr.dropout_p));
  const auto threshold = static_cast<float>(pr.dropout_p);
  for (int64_t r = 0; r < nq; ++r) {
    const auto base = static_cast<uint64_t>((b * pr.tq + i0 + r) * pr.tk + j0);
    for (int64_t c = 0; c < nk; ++c)
      z[r * nk + c] = philox::uniform(pr.seed, pr.offset, base + static_cast<uint64_t>(c)) >= threshold
                          ? keep_scale
                          : T(0);
  }
}

template <typename T>
void attention_forward(const Problem& pr, const T* q, const T* k, const T* v, T* out, T* lse) {
  const bool dropout = pr.dropout_p > 0.0;
  std::vector<T> s(static_cast<size_t>(kBlockQ * kBlockK)), z(dropout ? s.size() : 0);
  std::vector<T> acc(static_cast<size_t>(kBlockQ * pr.dv));
  std::vector<T> m(static_cast<size_t>(kBlockQ)), l(static_cast<size_t>(kBlockQ));
  for (int64_t b = 0; b < pr.batch; ++b) {
    const T* Q = q + b * pr.tq * pr.d;
    const T* K = k + b * pr.tk * pr.d;
    const T* V = v + b * pr.tk * pr.dv;
    for (int64_t i0 = 0; i0 < pr.tq; i0 += kBlockQ) {
      const int64_t nq = std::min(kBlockQ, pr.tq - i0);
      std::fill(m.begin(), m.end(), -std::numeric_limits<T>::infinity());
      std::fill(l.begin(), l.end(), T(0));
      std::fill(acc.begin(), acc.end(), T(0));
      const int64_t kend = pr.key_end(i0, nq);
      for (int64_t j0 = 0; j0 < kend; j0 += kBlockK) {
        const int64_t nk = std::min(kBlockK, kend - j0);
        // s = scale * Q[i0:i0+nq] @ K[j0:j0+nk]^T
        blas_gemm(CblasNoTrans, CblasTrans, as_int(nq), as_int(nk), as_int(pr.d),
                  static_cast<T>(pr.scale), Q + i0 * pr.d, as_int(pr.d), K + j0 * pr.d,
                  as_int(pr.d), T(0), s.data(), as_int(nk));
        if (dropout) fill_dropout(z.data(), pr, b, i0, nq, j0, nk);
        for (int64_t r = 0; r < nq; ++r) {
          T* row = s.data() + r * nk;
          const int64_t seen = pr.visible(i0 + r, j0, nk);
          T block_max = -std::numeric_limits<T>::infinity();
          for (int64_t c = 0; c < seen; ++c) block_max = std::max(block_max, row[c]);
          const auto ru = static_cast<size_t>(r);
          const T m_new = std::max(m[ru], block_max);
          if (seen == 0 || m_new == -std::numeric_limits<T>::infinity()) {
            std::fill(row, row + nk, T(0));
            continue;
          }
          // The softmax so far was relative to m[r]; rescale it to m_new.
          const T correction = std::exp(m[ru] - m_new);
          exp_row(row, row, m_new, seen);
          T sum = 0;
          for (int64_t c = 0; c < seen; ++c) sum += row[c];
          if (dropout)
            for (int64_t c = 0; c < seen; ++c) row[c] *= z[static_cast<size_t>(r * nk + c)];
          std::fill(row + seen, row + nk, T(0));
          l[ru] = l[ru] * correction + sum;
          if (correction != T(1)) {
            T* a = acc.data() + r * pr.dv;
            for (int64_t c = 0; c < pr.dv; ++c) a[c] *= correction;
          }
          m[ru] = m_new;
        }
        // acc += P @ V[j0:j0+nk]
        blas_gemm(CblasNoTrans, CblasNoTrans, as_int(nq), as_int(pr.dv), as_int(nk), T(1),
                  s.data(), as_int(nk), V + j0 * pr.dv, as_int(pr.dv), T(1), acc.data(),
                  as_int(pr.dv));
      }
      for (int64_t r = 0; r < nq; ++r) {
        const auto ru = static_cast<size_t>(r);
        T* o = out + (b * pr.tq + i0 + r) * pr.dv;
        const T inv = T(1) / l[ru];
        for (int64_t c = 0; c < pr.dv; ++c) o[c] = acc[ru * static_cast<size_t>(pr.dv) + static_cast<size_t>(c)] * inv;
        lse[b * pr.tq + i0 + r] = m[ru] + std::log(l[ru]);
      }
    }
  }
}

// With P = exp(S - lse) (S the scaled scores), Z the dropout factors, O = (P*Z) V:
//   dV = (P*Z)^T dO,  dP = (dO V^T) * Z,  dS = P * (dP - rowsum(dO * O)),
//   dQ = scale * dS K,  dK = scale * dS^T Q.
// (rowsum(P * dP) = rowsum(dO * O), which is why out is saved and P never is.)
template <typename T>
void attention_backward_typed(const Problem& pr, const T* q, const T* k, const T* v, const T* out,
                              const T* lse, const T* grad_out, T* gq, T* gk, T* gv) {
  const bool dropout = pr.dropout_p > 0.0;
  const size_t tile = static_cast<size_t>(kBlockQ * kBlockK);
  std::vector<T> p(tile), pz(dropout ? tile : 0), dp(tile), z(dropout ? tile : 0);
  std::vector<T> delta(static_cast<size_t>(pr.tq));
  std::fill(gq, gq + pr.batch * pr.tq * pr.d, T(0));
  std::fill(gk, gk + pr.batch * pr.tk * pr.d, T(0));
  std::fill(gv, gv + pr.batch * pr.tk * pr.dv, T(0));
  for (int64_t b = 0; b < pr.batch; ++b) {
    const T* Q = q + b * pr.tq * pr.d;
    const T* K = k + b * pr.tk * pr.d;
    const T* V = v + b * pr.tk * pr.dv;
    const T* O = out + b * pr.tq * pr.dv;
    const T* dO = grad_out + b * pr.tq * pr.dv;
    const T* L = lse + b * pr.tq;
    T* dQ = gq + b * pr.tq * pr.d;
    T* dK = gk + b * pr.tk * pr.d;
    T* dV = gv + b * pr.tk * pr.dv;
    for (int64_t i = 0; i < pr.tq; ++i) {
      double dot = 0.0;
      for (int64_t c = 0; c < pr.dv; ++c)
        dot += static_cast<double>(dO[i * pr.dv + c]) * static_cast<double>(O[i * pr.dv + c]);
      delta[static_cast<size_t>(i)] = static_cast<T>(dot);
    }
    for (int64_t i0 = 0; i0 < pr.tq; i0 += kBlockQ) {
      const int64_t nq = std::min(kBlockQ, pr.tq - i0);
      const int64_t kend = pr.key_end(i0, nq);
      for (int64_t j0 = 0; j0 < kend; j0 += kBlockK) {
        const int64_t nk = std::min(kBlockK, kend - j0);
        blas_gemm(CblasNoTrans, CblasTrans, as_int(nq), as_int(nk), as_int(pr.d),
                  static_cast<T>(pr.scale), Q + i0 * pr.d, as_int(pr.d), K + j0 * pr.d,
                  as_int(pr.d), T(0), p.data(), as_int(nk));
        for (int64_t r = 0; r < nq; ++r) {
          T* row = p.data() + r * nk;
          const int64_t seen = pr.visible(i0 + r, j0, nk);
          const T row_lse = L[i0 + r];
          exp_row(row, row, row_lse, seen);
          std::fill(row + seen, row + nk, T(0));
        }
        const T* p_used = p.data();  // the probabilities after dropout
        if (dropout) {
          fill_dropout(z.data(), pr, b, i0, nq, j0, nk);
          for (size_t e = 0; e < static_cast<size_t>(nq * nk); ++e) pz[e] = p[e] * z[e];
          p_used = pz.data();
        }
        // dV[j0:] += (P*Z)^T dO[i0:]
        blas_gemm(CblasTrans, CblasNoTrans, as_int(nk), as_int(pr.dv), as_int(nq), T(1), p_used,
                  as_int(nk), dO + i0 * pr.dv, as_int(pr.dv), T(1), dV + j0 * pr.dv,
                  as_int(pr.dv));
        // dp = dO[i0:] V[j0:]^T
        blas_gemm(CblasNoTrans, CblasTrans, as_int(nq), as_int(nk), as_int(pr.dv), T(1),
                  dO + i0 * pr.dv, as_int(pr.dv), V + j0 * pr.dv, as_int(pr.dv), T(0), dp.data(),
                  as_int(nk));
        for (int64_t r = 0; r < nq; ++r) {
          const T dr = delta[static_cast<size_t>(i0 + r)];
          for (int64_t c = 0; c < nk; ++c) {
            const auto e = static_cast<size_t>(r * nk + c);
            const T dpe = dropout ? dp[e] * z[e] : dp[e];
            dp[e] = p[e] * (dpe - dr);  // dS, 0 where masked (p = 0)
          }
        }
        // dQ[i0:] += scale * dS K[j0:];  dK[j0:] += scale * dS^T Q[i0:]
        blas_gemm(CblasNoTrans, CblasNoTrans, as_int(nq), as_int(pr.d), as_int(nk),
                  static_cast<T>(pr.scale), dp.data(), as_int(nk), K + j0 * pr.d, as_int(pr.d),
                  T(1), dQ + i0 * pr.d, as_int(pr.d));
        blas_gemm(CblasTrans, CblasNoTrans, as_int(nk), as_int(pr.d), as_int(nq),
                  static_cast<T>(pr.scale), dp.data(), as_int(nk), Q + i0 * pr.d, as_int(pr.d),
                  T(1), dK + j0 * pr.d, as_int(pr.d));
      }
    }
  }
}

Problem problem_of(const Tensor& q, const Tensor& k, const Tensor& v, double scale, bool causal,
                   double dropout_p, uint64_t seed, uint64_t offset) {
  return Problem{q.size(0), q.size(1), k.size(1), q.size(2), v.size(2), scale, causal,
                 dropout_p, seed, offset};
}

}  // namespace

void CpuBackend::attention(const Tensor& out, const Tensor& lse, const Tensor& q, const Tensor& k,
                           const Tensor& v, double scale, bool causal, double dropout_p,
                           uint64_t seed, uint64_t offset) {
  if (is_reduced_float(q.dtype())) {
    const Tensor wide = cpu::float32_stand_in(out);
    attention(wide, lse, cpu::widen(q), cpu::widen(k), cpu::widen(v), scale, causal, dropout_p,
              seed, offset);
    return cpu::round_into(out, wide);
  }
  const Problem pr = problem_of(q, k, v, scale, causal, dropout_p, seed, offset);
  MG_DISPATCH_FLOATING_TYPES(q.dtype(), "scaled_dot_product_attention", [&] {
    using T = scalar_t;
    attention_forward<T>(pr, static_cast<const T*>(q.data_ptr()),
                         static_cast<const T*>(k.data_ptr()), static_cast<const T*>(v.data_ptr()),
                         static_cast<T*>(out.data_ptr()), static_cast<T*>(lse.data_ptr()));
  });
}

void CpuBackend::attention_backward(const Tensor& grad_q, const Tensor& grad_k,
                                    const Tensor& grad_v, const Tensor& grad_out, const Tensor& q,
                                    const Tensor& k, const Tensor& v, const Tensor& out,
                                    const Tensor& lse, double scale, bool causal,
                                    double dropout_p, uint64_t seed, uint64_t offset) {
  if (is_reduced_float(q.dtype())) {
    const Tensor gq = cpu::float32_stand_in(grad_q), gk = cpu::float32_stand_in(grad_k),
                 gv = cpu::float32_stand_in(grad_v);
    attention_backward(gq, gk, gv, cpu::widen(grad_out), cpu::widen(q), cpu::widen(k),
                       cpu::widen(v), cpu::widen(out), lse, scale, causal, dropout_p, seed, offset);
    cpu::round_into(grad_q, gq);
    cpu::round_into(grad_k, gk);
    return cpu::round_into(grad_v, gv);
  }
  const Problem pr = problem_of(q, k, v, scale, causal, dropout_p, seed, offset);
  MG_DISPATCH_FLOATING_TYPES(q.dtype(), "scaled_dot_product_attention backward", [&] {
    using T = scalar_t;
    attention_backward_typed<T>(
        pr, static_cast<const T*>(q.data_ptr()), static_cast<const T*>(k.data_ptr()),
        static_cast<const T*>(v.data_ptr()), static_cast<const T*>(out.data_ptr()),
        static_cast<const T*>(lse.data_ptr()), static_cast<const T*>(grad_out.data_ptr()),
        static_cast<T*>(grad_q.data_ptr()), static_cast<T*>(grad_k.data_ptr()),
        static_cast<T*>(grad_v.data_ptr()));
  });
}

}  // namespace mg
