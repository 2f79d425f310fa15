// Host-side entry points of the transformer's CUDA kernels (kernels/transformer.cu), in
// float32 and float64: the twins of core/cpu/'s layer_norm.cpp, embedding.cpp,
// attention.cpp and of the elementwise gelu, masked_fill, dropout and softmax. Raw device
// pointers and plain layouts, as launch.h's. tests/cuda/transformer_ops_test.cpp compares
// each with the CPU backend.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

#include <minigrad/cuda/kernels/indexing.h>
#include <minigrad/cuda/kernels/launch.h>

namespace mg::cuda::kernels {

// The float types of these kernels (launch.h's ElementType covers float32 and int64).
// BFloat16 and Float16 (__nv_bfloat16 and __half, computed in float) reach convert, gelu,
// gelu_backward, masked_fill, dropout and embedding; the row ops and attention are float32
// and float64 only (the backend widens 16-bit tensors for them: cuda/widen.h).
enum class FloatType { Float32, Float64, BFloat16, Float16 };
// Any element type of a table: a dtype conversion's source or a mask.
enum class AnyType { Float32, Float64, Int64, BFloat16, Float16 };

// dst = src converted (layout operand 0 is dst, 1 is src).
void convert(AnyType to, AnyType from, void* dst, const void* src, const StridedIndexer<2>& layout,
             int64_t numel, cudaStream_t stream);
void gelu(FloatType type, void* out, const void* in, bool tanh_form,
          const StridedIndexer<2>& layout, int64_t numel, cudaStream_t stream);
void gelu_backward(FloatType type, void* grad_in, const void* grad_out, const void* input,
                   bool tanh_form, const StridedIndexer<3>& layout, int64_t numel,
                   cudaStream_t stream);
// out = in * sigmoid(in), and its gradient (operands grad_in, grad_out, input).
void silu(FloatType type, void* out, const void* in, const StridedIndexer<2>& layout, int64_t numel,
          cudaStream_t stream);
void silu_backward(FloatType type, void* grad_in, const void* grad_out, const void* input,
                   const StridedIndexer<3>& layout, int64_t numel, cudaStream_t stream);
// out = mask != 0 ? value : in (operands out, in, mask).
void masked_fill(AnyType type, AnyType mask_type, void* out, const void* in, const void* mask,
                 double value, const StridedIndexer<3>& layout, int64_t numel,
                 cudaStream_t stream);
// out[i] = philox::uniform(seed, offset, i) >= p ? in[i] / (1 - p) : 0, i row-major.
void dropout(FloatType type, void* out, const void* in, double p, uint64_t seed, uint64_t offset,
             const StridedIndexer<2>& layout, int64_t numel, cudaStream_t stream);
// Row ops over contiguous [rows, cols]: one block per row.
void softmax(FloatType type, void* out, const void* in, int64_t rows, int64_t cols,
             cudaStream_t stream);
void softmax_backward(FloatType type, void* grad_in, const void* grad_out, const void* output,
                      int64_t rows, int64_t cols, cudaStream_t stream);
// weight and bias may be null.
void layer_norm(FloatType type, void* out, void* mean, void* rstd, const void* in,
                const void* weight, const void* bias, int64_t rows, int64_t cols, double eps,
                cudaStream_t stream);
// grad_weight and grad_bias may be null; each is a sum over rows in row order (one thread
// per column), so deterministic.
void layer_norm_backward(FloatType type, void* grad_in, void* grad_weight, void* grad_bias,
                         const void* grad_out, const void* in, const void* mean,
                         const void* rstd, const void* weight, int64_t rows, int64_t cols,
                         cudaStream_t stream);
// RMS normalisation of contiguous [rows, cols]; weight may be null (float32 and float64).
void rms_norm(FloatType type, void* out, void* rstd, const void* in, const void* weight, int64_t rows,
              int64_t cols, double eps, cudaStream_t stream);
// grad_weight may be null; it is a sum over rows in row order (one thread per column).
void rms_norm_backward(FloatType type, void* grad_in, void* grad_weight, const void* grad_out, const void* in,
                       const void* rstd, const void* weight, int64_t rows, int64_t cols, cudaStream_t stream);
// Rotary embedding of contiguous [batch, seq, heads, dim] by cos, sin [seq, dim / 2]
// (Backend::rotary_embedding's rotate_half layout); every float type.
void rotary_embedding(FloatType type, void* out, const void* in, const void* cos, const void* sin, int64_t batch,
                      int64_t seq, int64_t heads, int64_t dim, bool inverse, cudaStream_t stream);
// out[i, :] = weight[idx[i], :] (weight strided, indices already checked in range).
void embedding(FloatType type, void* out, const void* weight, int64_t row_stride,
               int64_t col_stride, const int64_t* indices, int64_t n, int64_t dim,
               cudaStream_t stream);
// grad_weight[idx[i], :] += grad_out[i, :] in index order: one thread per column walks
// every index, so repeated indices sum in the same order on each run (no atomics).
void embedding_backward(FloatType type, void* grad_weight, const void* grad_out,
                        const int64_t* indices, int64_t n, int64_t dim, cudaStream_t stream);
// Attention over contiguous [batch, tq, d], [batch, tk, d], [batch, tk, dv] (Backend::
// attention): one warp per query row with an online softmax over the keys. d and dv up
// to kAttentionMaxDim.
constexpr int kAttentionMaxDim = 256;
struct AttentionShape {
  int64_t batch, tq, tk, d, dv;
  double scale;
  bool causal;
  double dropout_p;
  uint64_t seed, offset;
};
void attention(FloatType type, void* out, void* lse, const void* q, const void* k, const void* v,
               const AttentionShape& shape, cudaStream_t stream);
// delta: a device buffer of batch * tq elements of `type`. grad_q by query rows, grad_k
// and grad_v by key rows (each a warp that loops over the other side): no atomics.
void attention_backward(FloatType type, void* grad_q, void* grad_k, void* grad_v,
                        const void* grad_out, const void* q, const void* k, const void* v,
                        const void* out, const void* lse, void* delta,
                        const AttentionShape& shape, cudaStream_t stream);

}  // namespace mg::cuda::kernels
