// A stand-in CUDA backend for tests on machines without a GPU: it reports two "cuda"
// devices whose memory is ordinary host memory and whose ops are the CPU backend's.
// Tensors made on it carry Device::cuda(i), so the ops layer's device checks (which
// never look at where memory really is) can be exercised everywhere. Installed for one
// scope; the real backend table entry is restored on exit. It also counts what a test
// may want to see: the bytes its tensors hold (now and at the peak) and the fused
// Linear+ReLU calls.
#pragma once

#include <algorithm>
#include <cstddef>

#include <minigrad/core/backend.h>
#include <minigrad/core/cpu/cpu_backend.h>

namespace mg::testing {

// The CPU allocator, counting the bytes of live allocations and their high-water mark
// (not thread-safe: for single-threaded tests).
class CountingAllocator final : public Allocator {
 public:
  void* allocate(std::size_t nbytes) override {
    void* ptr = cpu_allocator().allocate(nbytes);
    current_ += nbytes;
    peak_ = std::max(peak_, current_);
    return ptr;
  }
  void deallocate(void* ptr, std::size_t nbytes) override {
    cpu_allocator().deallocate(ptr, nbytes);
    current_ -= nbytes;
  }
  std::size_t current_bytes() const { return current_; }
  std::size_t peak_bytes() const { return peak_; }
  void reset_peak() { peak_ = current_; }

 private:
  std::size_t current_ = 0, peak_ = 0;
};

// The stand-in's memory: one for the process and never destroyed, so a tensor that
// outlives the stand-in can still be freed.
inline CountingAllocator& host_backed_memory() {
  static CountingAllocator* memory = new CountingAllocator();
  return *memory;
}

class HostBackedCudaBackend final : public Backend {
 public:
  DeviceType type() const override { return DeviceType::CUDA; }
  int device_count() const override { return 2; }
  Allocator& allocator(int) override { return host_backed_memory(); }
  int addmm_relu_calls() const { return addmm_relu_calls_; }
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
  void abs_max(const Tensor& out, const Tensor& in) override { cpu().abs_max(out, in); }
  void matmul(const Tensor& out, const Tensor& a, const Tensor& b) override {
    cpu().matmul(out, a, b);
  }
  void addmm(const Tensor& out, const Tensor& bias, const Tensor& a, const Tensor& b) override {
    cpu().addmm(out, bias, a, b);
  }
  void addmm_relu(const Tensor& out, const Tensor& bias, const Tensor& a,
                  const Tensor& b) override {
    ++addmm_relu_calls_;
    cpu().addmm_relu(out, bias, a, b);
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
  int addmm_relu_calls_ = 0;
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
  HostBackedCudaBackend& stand_in() { return fake_; }

 private:
  HostBackedCudaBackend fake_;
  Backend* previous_;
};

}  // namespace mg::testing
