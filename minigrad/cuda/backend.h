// CudaBackend: core's Backend interface on NVIDIA GPUs. Registered into the backend
// table when libminigrad loads; CUDA itself is initialised lazily, on first use.
//
// Every op runs on the device of its output, on this thread's current stream of that
// device, and returns without waiting for the GPU. Only a copy to the host waits (the
// host reads the values right after).
//
// The methods are spread over files by family: backend.cpp (devices, streams, events),
// backend_copy.cpp (copies), backend_data.cpp (fill, arange, random),
// backend_math.cpp (elementwise, reductions, softmax, cross-entropy), blas.cpp (matmul),
// blas_lt.cpp (addmm: the bias fused into a cuBLASLt GEMM), backend_optim.cpp (optimizer
// updates).
#pragma once

#include <cuda_runtime_api.h>

#include <minigrad/core/backend.h>
#include <minigrad/cuda/device.h>

namespace mg::cuda {

class CudaBackend final : public Backend {
 public:
  DeviceType type() const override { return DeviceType::CUDA; }
  int device_count() const override;
  Allocator& allocator(int index) override;

  // backend.cpp
  int current_device() const override;
  void set_device(int index) override;
  Stream current_stream(int index) override;
  void set_current_stream(const Stream& stream) override;
  Stream compute_stream(int index) override;
  Stream copy_stream(int index) override;
  void synchronize(int index) override;
  void* event_create(int index) override;
  void event_destroy(void* event) override;
  void event_record(void* event, const Stream& stream) override;
  void event_block(void* event, const Stream& stream) override;
  void event_synchronize(void* event) override;
  Stream pool_stream(int index, int slot) override;
  MemoryInfo memory_info(int index) override;
  std::size_t memory_allocated(int index) override;
  // The profiler's device spans (core/profiler.h): events that time a stream's work.
  void* timing_event_record(const Stream& stream) override;
  double event_elapsed_ms(void* start, void* end) override;

  // backend_copy.cpp
  void copy(const Tensor& dst, const Tensor& src) override;
  // backend_data.cpp
  void fill(const Tensor& dst, double value) override;
  void arange(const Tensor& dst, double start, double step) override;
  void random_uniform(const Tensor& dst, double low, double high, uint64_t seed,
                      uint64_t offset) override;
  void round_stochastic(const Tensor& out, const Tensor& in, uint64_t seed,
                        uint64_t offset) override;
  void random_normal(const Tensor& dst, double mean, double stddev, uint64_t seed,
                     uint64_t offset) override;

  // backend_math.cpp
  void unary(UnaryOp op, const Tensor& out, const Tensor& in) override;
  void binary(BinaryOp op, const Tensor& out, const Tensor& a, const Tensor& b,
              double alpha) override;
  void binary_scalar(BinaryOp op, const Tensor& out, const Tensor& in, double scalar) override;
  void relu_backward(const Tensor& grad_in, const Tensor& grad_out, const Tensor& input) override;
  void sum(const Tensor& out, const Tensor& in) override;
  void argmax(const Tensor& out, const Tensor& in) override;
  void abs_max(const Tensor& out, const Tensor& in) override;
  void log_softmax(const Tensor& out, const Tensor& in) override;
  void log_softmax_backward(const Tensor& grad_in, const Tensor& grad_out,
                            const Tensor& output) override;
  void cross_entropy(const Tensor& loss, const Tensor& logits, const Tensor& targets,
                     const CrossEntropyOptions& options) override;
  void cross_entropy_backward(const Tensor& grad_logits, const Tensor& grad_loss,
                              const Tensor& logits, const Tensor& targets,
                              const CrossEntropyOptions& options) override;

  // blas.cpp
  void matmul(const Tensor& out, const Tensor& a, const Tensor& b) override;
  // blas_lt.cpp
  void addmm(const Tensor& out, const Tensor& bias, const Tensor& a, const Tensor& b) override;
  void addmm_relu(const Tensor& out, const Tensor& bias, const Tensor& a,
                  const Tensor& b) override;

  // backend_optim.cpp
  // backend_transformer.cpp: the transformer's ops, float32 and float64
  void convert(const Tensor& dst, const Tensor& src) override;
  void gelu(const Tensor& out, const Tensor& in, bool tanh_form) override;
  void gelu_backward(const Tensor& grad_in, const Tensor& grad_out, const Tensor& input,
                     bool tanh_form) override;
  void silu(const Tensor& out, const Tensor& in) override;
  void silu_backward(const Tensor& grad_in, const Tensor& grad_out, const Tensor& input) override;
  void masked_fill(const Tensor& out, const Tensor& in, const Tensor& mask, double value) override;
  void dropout(const Tensor& out, const Tensor& in, double p, uint64_t seed,
               uint64_t offset) override;
  void bmm(const Tensor& out, const Tensor& a, const Tensor& b) override;
  void softmax(const Tensor& out, const Tensor& in) override;
  void softmax_backward(const Tensor& grad_in, const Tensor& grad_out,
                        const Tensor& output) override;
  void layer_norm(const Tensor& out, const Tensor& mean, const Tensor& rstd, const Tensor& in,
                  const Tensor& weight, const Tensor& bias, double eps) override;
  void layer_norm_backward(const Tensor& grad_in, const Tensor& grad_weight,
                           const Tensor& grad_bias, const Tensor& grad_out, const Tensor& in,
                           const Tensor& mean, const Tensor& rstd, const Tensor& weight) override;
  void rms_norm(const Tensor& out, const Tensor& rstd, const Tensor& in, const Tensor& weight,
                double eps) override;
  void rms_norm_backward(const Tensor& grad_in, const Tensor& grad_weight, const Tensor& grad_out,
                         const Tensor& in, const Tensor& rstd, const Tensor& weight) override;
  void rotary_embedding(const Tensor& out, const Tensor& in, const Tensor& cos, const Tensor& sin,
                        bool inverse) override;
  void embedding(const Tensor& out, const Tensor& weight, const Tensor& indices) override;
  void embedding_backward(const Tensor& grad_weight, const Tensor& grad_out,
                          const Tensor& indices) override;
  void attention(const Tensor& out, const Tensor& lse, const Tensor& q, const Tensor& k,
                 const Tensor& v, double scale, bool causal, double dropout_p, uint64_t seed,
                 uint64_t offset) override;
  void attention_backward(const Tensor& grad_q, const Tensor& grad_k, const Tensor& grad_v,
                          const Tensor& grad_out, const Tensor& q, const Tensor& k,
                          const Tensor& v, const Tensor& out, const Tensor& lse, double scale,
                          bool causal, double dropout_p, uint64_t seed, uint64_t offset) override;

  void sgd_step(const SgdStep& step) override;
  void adam_step(const AdamStep& step) override;
};

CudaBackend& cuda_backend();

// Everything a device needs before its first op (streams, memory pool, the invalid-
// target flag), created once. Done eagerly on first use so that nothing is created
// later inside a CUDA graph capture.
void prepare_device(int index);

// Opened by every op: checks the device, makes it current for this thread for the
// op's duration (restoring the caller's device after, as PyTorch's device guard does)
// and finds the thread's current stream there.
class OpScope {
 public:
  explicit OpScope(int device);
  explicit OpScope(const Tensor& tensor) : OpScope(tensor.device().index()) {}
  cudaStream_t stream() const { return stream_; }
  int device() const { return device_; }

 private:
  int device_;
  ScopedDevice scoped_device_;
  cudaStream_t stream_;
};

}  // namespace mg::cuda
