#include <minigrad/core/backend.h>

#include <array>

#include <minigrad/core/cpu/cpu_backend.h>
#include <minigrad/core/ops.h>

namespace mg {
namespace {

// Stands in for CUDA in a build without it: no devices, and a clear error (never a
// crash or a link error) when a CUDA device is used anyway.
class MissingCudaBackend final : public Backend {
 public:
  DeviceType type() const override { return DeviceType::CUDA; }
  int device_count() const override { return 0; }
  Allocator& allocator(int) override { fail(); }
  int current_device() const override { return 0; }
  void set_device(int) override { fail(); }
  Stream current_stream(int) override { fail(); }
  void set_current_stream(const Stream&) override { fail(); }
  Stream compute_stream(int) override { fail(); }
  Stream copy_stream(int) override { fail(); }
  void synchronize(int) override { fail(); }
  void* event_create(int) override { fail(); }
  void event_destroy(void*) override {}
  void event_record(void*, const Stream&) override { fail(); }
  void event_block(void*, const Stream&) override { fail(); }
  void event_synchronize(void*) override { fail(); }
  void copy(const Tensor&, const Tensor&) override { fail(); }
  void fill(const Tensor&, double) override { fail(); }
  void arange(const Tensor&, double, double) override { fail(); }
  void random_uniform(const Tensor&, double, double, uint64_t, uint64_t) override { fail(); }
  void random_normal(const Tensor&, double, double, uint64_t, uint64_t) override { fail(); }
  void unary(UnaryOp, const Tensor&, const Tensor&) override { fail(); }
  void binary(BinaryOp, const Tensor&, const Tensor&, const Tensor&, double) override { fail(); }
  void binary_scalar(BinaryOp, const Tensor&, const Tensor&, double) override { fail(); }
  void relu_backward(const Tensor&, const Tensor&, const Tensor&) override { fail(); }
  void sum(const Tensor&, const Tensor&) override { fail(); }
  void argmax(const Tensor&, const Tensor&) override { fail(); }
  void matmul(const Tensor&, const Tensor&, const Tensor&) override { fail(); }
  void log_softmax(const Tensor&, const Tensor&) override { fail(); }
  void log_softmax_backward(const Tensor&, const Tensor&, const Tensor&) override { fail(); }
  void cross_entropy(const Tensor&, const Tensor&, const Tensor&) override { fail(); }
  void cross_entropy_backward(const Tensor&, const Tensor&, const Tensor&,
                              const Tensor&) override {
    fail();
  }

 private:
  [[noreturn]] static void fail() {
    MG_FAIL("minigrad was built without CUDA: CUDA devices are not available "
            "(rebuild with the CUDA toolkit installed and MINIGRAD_CUDA=AUTO or ON)");
  }
};

}  // namespace

void Backend::addmm(const Tensor& out, const Tensor& bias, const Tensor& a, const Tensor& b) {
  matmul(out, a, b);
  binary(BinaryOp::Add, out, out, ops::expand(bias, out.shape()), 1.0);  // out may alias a
}

void Backend::addmm_relu(const Tensor& out, const Tensor& bias, const Tensor& a,
                         const Tensor& b) {
  addmm(out, bias, a, b);
  unary(UnaryOp::Relu, out, out);
}

namespace {

std::array<Backend*, kNumDeviceTypes>& backend_table() {
  static MissingCudaBackend missing_cuda;
  static std::array<Backend*, kNumDeviceTypes> table{&cpu_backend(), &missing_cuda};
  return table;
}

}  // namespace

Backend& backend(DeviceType type) { return *backend_table()[static_cast<size_t>(type)]; }

void register_backend(DeviceType type, Backend* b) {
  backend_table()[static_cast<size_t>(type)] = b;
}

}  // namespace mg
