// A stand-in CUDA backend for tests on machines without a GPU: it reports two "cuda"
// devices whose memory is ordinary host memory and whose ops are the CPU backend's.
// Tensors made on it carry Device::cuda(i), so the ops layer's device checks (which
// never look at where memory really is) can be exercised everywhere. Installed for one
// scope; the real backend table entry is restored on exit. It also counts what a test
// may want to see: the bytes its tensors hold on each device (now and at the peak) and
// the fused Linear+ReLU calls; and it reports whatever free memory a test sets.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>

#include <minigrad/core/backend.h>
#include <minigrad/core/cpu/cpu_backend.h>
#include <minigrad/cuda/memory_stats.h>

namespace mg::testing {

// The CPU allocator, counting the bytes of live allocations and their high-water mark.
// Thread-safe (a pipeline's stages allocate from their own threads); it also answers
// cuda::memory_allocated and friends, as the real CUDA allocator does.
class CountingAllocator final : public Allocator, public cuda::DeviceMemoryStats {
 public:
  void* allocate(std::size_t nbytes) override {
    void* ptr = cpu_allocator().allocate(nbytes);
    const std::size_t now = current_.fetch_add(nbytes) + nbytes;
    std::size_t peak = peak_.load();
    while (now > peak && !peak_.compare_exchange_weak(peak, now)) {
    }
    return ptr;
  }
  void deallocate(void* ptr, std::size_t nbytes) override {
    cpu_allocator().deallocate(ptr, nbytes);
    current_ -= nbytes;
  }
  std::size_t current_bytes() const { return current_; }
  std::size_t peak_bytes() const { return peak_; }
  void reset_peak() override { peak_ = current_.load(); }

  std::size_t allocated_bytes() const override { return current_bytes(); }
  std::size_t peak_allocated_bytes() const override { return peak_bytes(); }
  std::size_t reserved_bytes() const override { return current_bytes(); }

 private:
  std::atomic<std::size_t> current_{0}, peak_{0};
};

// The stand-in's memory, one counter per device: for the process and never destroyed,
// so a tensor that outlives the stand-in can still be freed.
inline CountingAllocator& host_backed_memory(int device = 0) {
  static CountingAllocator* memory = new CountingAllocator[2];
  return memory[device];
}

class HostBackedCudaBackend final : public Backend {
 public:
  DeviceType type() const override { return DeviceType::CUDA; }
  int device_count() const override { return 2; }
  Allocator& allocator(int index) override { return host_backed_memory(index); }
  int addmm_relu_calls() const { return addmm_relu_calls_; }
  // The current device is per thread, as CUDA's is.
  int current_device() const override { return current(); }
  void set_device(int index) override { current() = index; }
  // What memory_info reports as free on every device; unknown until set.
  void set_free_bytes(std::size_t bytes) { free_bytes_ = bytes; }
  std::size_t memory_allocated(int index) override {
    return host_backed_memory(index).current_bytes();
  }
  MemoryInfo memory_info(int) override {
    const std::size_t free = free_bytes_;
    return free == 0 ? MemoryInfo{} : MemoryInfo{free, std::size_t{1} << 30, true};
  }
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
  void cross_entropy(const Tensor& loss, const Tensor& logits, const Tensor& targets,
                     const CrossEntropyOptions& options) override {
    cpu().cross_entropy(loss, logits, targets, options);
  }
  void cross_entropy_backward(const Tensor& grad_logits, const Tensor& grad_loss,
                              const Tensor& logits, const Tensor& targets,
                              const CrossEntropyOptions& options) override {
    cpu().cross_entropy_backward(grad_logits, grad_loss, logits, targets, options);
  }

 private:
  static Backend& cpu() { return cpu_backend(); }
  static int& current() {
    thread_local int device = 0;
    return device;
  }
  std::atomic<int> addmm_relu_calls_{0};
  std::atomic<std::size_t> free_bytes_{0};
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
