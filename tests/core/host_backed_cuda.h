// A stand-in CUDA backend for tests on machines without a GPU: it reports two "cuda"
// devices whose memory is ordinary host memory and whose ops are the CPU backend's.
// Tensors made on it carry Device::cuda(i), so the ops layer's device checks (which
// never look at where memory really is) can be exercised everywhere. Installed for one
// scope; the real backend table entry is restored on exit.
#pragma once

#include <minigrad/core/backend.h>
#include <minigrad/core/cpu/cpu_backend.h>

namespace mg::testing {

class HostBackedCudaBackend final : public Backend {
 public:
  DeviceType type() const override { return DeviceType::CUDA; }
  int device_count() const override { return 2; }
  Allocator& allocator(int) override { return cpu_allocator(); }
  int current_device() const override { return current_; }
  void set_device(int index) override { current_ = index; }
  Stream current_stream(int index) override { return Stream{Device::cuda(index), nullptr}; }
  void set_current_stream(const Stream&) override {}
  Stream compute_stream(int index) override { return Stream{Device::cuda(index), nullptr}; }
  Stream copy_stream(int index) override { return Stream{Device::cuda(index), nullptr}; }
  void synchronize(int) override {}
  void* event_create(int) override { return nullptr; }
  void event_destroy(void*) override {}
  void event_record(void*, const Stream&) override {}
  void event_block(void*, const Stream&) override {}
  void event_synchronize(void*) override {}

  void copy(const Tensor& dst, const Tensor& src) override { cpu().copy(dst, src); }
  void fill(const Tensor& dst, double value) override { cpu().fill(dst, value); }
  void arange(const Tensor& dst, double start, double step) override {
    cpu().arange(dst, start, step);
  }
  void random_uniform(const Tensor& dst, double low, double high, uint64_t seed,
                      uint64_t offset) override {
    cpu().random_uniform(dst, low, high, seed, offset);
  }
  void random_normal(const Tensor& dst, double mean, double stddev, uint64_t seed,
                     uint64_t offset) override {
    cpu().random_normal(dst, mean, stddev, seed, offset);
  }
  void unary(UnaryOp op, const Tensor& out, const Tensor& in) override { cpu().unary(op, out, in); }
  void binary(BinaryOp op, const Tensor& out, const Tensor& a, const Tensor& b,
              double alpha) override {
    cpu().binary(op, out, a, b, alpha);
  }
  void binary_scalar(BinaryOp op, const Tensor& out, const Tensor& in, double scalar) override {
    cpu().binary_scalar(op, out, in, scalar);
  }
  void relu_backward(const Tensor& grad_in, const Tensor& grad_out, const Tensor& input) override {
    cpu().relu_backward(grad_in, grad_out, input);
  }
  void sum(const Tensor& out, const Tensor& in) override { cpu().sum(out, in); }
  void argmax(const Tensor& out, const Tensor& in) override { cpu().argmax(out, in); }
  void matmul(const Tensor& out, const Tensor& a, const Tensor& b) override {
    cpu().matmul(out, a, b);
  }
  void addmm(const Tensor& out, const Tensor& bias, const Tensor& a, const Tensor& b) override {
    cpu().addmm(out, bias, a, b);
  }
  void log_softmax(const Tensor& out, const Tensor& in) override { cpu().log_softmax(out, in); }
  void log_softmax_backward(const Tensor& grad_in, const Tensor& grad_out,
                            const Tensor& output) override {
    cpu().log_softmax_backward(grad_in, grad_out, output);
  }
  void cross_entropy(const Tensor& loss, const Tensor& logits, const Tensor& targets) override {
    cpu().cross_entropy(loss, logits, targets);
  }
  void cross_entropy_backward(const Tensor& grad_logits, const Tensor& grad_loss,
                              const Tensor& logits, const Tensor& targets) override {
    cpu().cross_entropy_backward(grad_logits, grad_loss, logits, targets);
  }

 private:
  static Backend& cpu() { return cpu_backend(); }
  int current_ = 0;
};

// Installs a HostBackedCudaBackend as the CUDA backend for its lifetime.
class ScopedHostBackedCuda {
 public:
  ScopedHostBackedCuda() : previous_(&backend(DeviceType::CUDA)) {
    register_backend(DeviceType::CUDA, &fake_);
  }
  ~ScopedHostBackedCuda() { register_backend(DeviceType::CUDA, previous_); }
  ScopedHostBackedCuda(const ScopedHostBackedCuda&) = delete;
  ScopedHostBackedCuda& operator=(const ScopedHostBackedCuda&) = delete;

 private:
  HostBackedCudaBackend fake_;
  Backend* previous_;
};

}  // namespace mg::testing
