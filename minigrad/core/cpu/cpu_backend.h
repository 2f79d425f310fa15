// The CPU backend: plain loops over strided views, OpenBLAS for matmul. It is also the
// reference every other backend is tested against, so it favours obvious code.
// Its methods are spread over the files of core/cpu/, one family of ops each.
#pragma once

#include <minigrad/core/backend.h>

namespace mg {

class CpuBackend final : public Backend {
 public:
  DeviceType type() const override { return DeviceType::CPU; }
  int device_count() const override { return 1; }
  Allocator& allocator(int) override { return cpu_allocator(); }

  // The host runs work in order on the calling thread: streams and events are no-ops.
  int current_device() const override { return 0; }
  void set_device(int) override {}
  Stream current_stream(int) override { return Stream{Device::cpu(), nullptr}; }
  void set_current_stream(const Stream&) override {}
  Stream compute_stream(int) override { return Stream{Device::cpu(), nullptr}; }
  Stream copy_stream(int) override { return Stream{Device::cpu(), nullptr}; }
  void synchronize(int) override {}
  void* event_create(int) override { return nullptr; }
  void event_destroy(void*) override {}
  void event_record(void*, const Stream&) override {}
  void event_block(void*, const Stream&) override {}
  void event_synchronize(void*) override {}
  // memory.cpp
  MemoryInfo memory_info(int index) override;
  std::size_t memory_allocated(int) override { return cpu_memory_allocated(); }

  // data.cpp
  void copy(const Tensor& dst, const Tensor& src) override;
  void convert(const Tensor& dst, const Tensor& src) override;
  void fill(const Tensor& dst, double value) override;
  void arange(const Tensor& dst, double start, double step) override;
  void random_uniform(const Tensor& dst, double low, double high, uint64_t seed,
                      uint64_t offset) override;
  void random_normal(const Tensor& dst, double mean, double stddev, uint64_t seed,
                     uint64_t offset) override;
  void round_stochastic(const Tensor& out, const Tensor& in, uint64_t seed,
                        uint64_t offset) override;
  // elementwise.cpp
  void unary(UnaryOp op, const Tensor& out, const Tensor& in) override;
  void binary(BinaryOp op, const Tensor& out, const Tensor& a, const Tensor& b,
              double alpha) override;
  void binary_scalar(BinaryOp op, const Tensor& out, const Tensor& in, double scalar) override;
  void relu_backward(const Tensor& grad_in, const Tensor& grad_out, const Tensor& input) override;
  void gelu(const Tensor& out, const Tensor& in, bool tanh_form) override;
  void gelu_backward(const Tensor& grad_in, const Tensor& grad_out, const Tensor& input,
                     bool tanh_form) override;
  void silu(const Tensor& out, const Tensor& in) override;
  void silu_backward(const Tensor& grad_in, const Tensor& grad_out, const Tensor& input) override;
  void masked_fill(const Tensor& out, const Tensor& in, const Tensor& mask, double value) override;
  void dropout(const Tensor& out, const Tensor& in, double p, uint64_t seed,
               uint64_t offset) override;
  // reduce.cpp
  void sum(const Tensor& out, const Tensor& in) override;
  void argmax(const Tensor& out, const Tensor& in) override;
  void abs_max(const Tensor& out, const Tensor& in) override;
  // matmul.cpp
  void matmul(const Tensor& out, const Tensor& a, const Tensor& b) override;
  void addmm(const Tensor& out, const Tensor& bias, const Tensor& a, const Tensor& b) override;
  void bmm(const Tensor& out, const Tensor& a, const Tensor& b) override;
  // softmax.cpp
  void log_softmax(const Tensor& out, const Tensor& in) override;
  void log_softmax_backward(const Tensor& grad_in, const Tensor& grad_out,
                            const Tensor& output) override;
  void softmax(const Tensor& out, const Tensor& in) override;
  void softmax_backward(const Tensor& grad_in, const Tensor& grad_out,
                        const Tensor& output) override;
  void cross_entropy(const Tensor& loss, const Tensor& logits, const Tensor& targets,
                     const CrossEntropyOptions& options) override;
  void cross_entropy_backward(const Tensor& grad_logits, const Tensor& grad_loss,
                              const Tensor& logits, const Tensor& targets,
                              const CrossEntropyOptions& options) override;
  // layer_norm.cpp
  void layer_norm(const Tensor& out, const Tensor& mean, const Tensor& rstd, const Tensor& in,
                  const Tensor& weight, const Tensor& bias, double eps) override;
  void layer_norm_backward(const Tensor& grad_in, const Tensor& grad_weight,
                           const Tensor& grad_bias, const Tensor& grad_out, const Tensor& in,
                           const Tensor& mean, const Tensor& rstd, const Tensor& weight) override;
  // rms_norm.cpp
  void rms_norm(const Tensor& out, const Tensor& rstd, const Tensor& in, const Tensor& weight,
                double eps) override;
  void rms_norm_backward(const Tensor& grad_in, const Tensor& grad_weight, const Tensor& grad_out,
                         const Tensor& in, const Tensor& rstd, const Tensor& weight) override;
  // rotary_embedding.cpp
  void rotary_embedding(const Tensor& out, const Tensor& in, const Tensor& cos, const Tensor& sin,
                        bool inverse) override;
  // embedding.cpp
  void embedding(const Tensor& out, const Tensor& weight, const Tensor& indices) override;
  void embedding_backward(const Tensor& grad_weight, const Tensor& grad_out,
                          const Tensor& indices) override;
  // attention.cpp
  void attention(const Tensor& out, const Tensor& lse, const Tensor& q, const Tensor& k,
                 const Tensor& v, double scale, bool causal, double dropout_p, uint64_t seed,
                 uint64_t offset) override;
  void attention_backward(const Tensor& grad_q, const Tensor& grad_k, const Tensor& grad_v,
                          const Tensor& grad_out, const Tensor& q, const Tensor& k,
                          const Tensor& v, const Tensor& out, const Tensor& lse, double scale,
                          bool causal, double dropout_p, uint64_t seed, uint64_t offset) override;
  // optim.cpp
  void sgd_step(const SgdStep& step) override;
  void adam_step(const AdamStep& step) override;
};

CpuBackend& cpu_backend();

}  // namespace mg
