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
  void abs_max(const Tensor&, const Tensor&) override { fail(); }
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
  void cross_entropy(const Tensor&, const Tensor&, const Tensor&,
                     const CrossEntropyOptions&) override {
    fail();
  }
  void cross_entropy_backward(const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                              const CrossEntropyOptions&) override {
    fail();
  }

 private:
  [[noreturn]] static void fail() {
    MG_FAIL("minigrad was built without CUDA: CUDA devices are not available "
            "(rebuild with the CUDA toolkit installed and MINIGRAD_CUDA=AUTO or ON)");
  }
};

}  // namespace

double Backend::event_elapsed_ms(void*, void*) {
  MG_FAIL("event_elapsed_ms: the {} backend records no timing events",
          type() == DeviceType::CPU ? "CPU" : "CUDA");
}

namespace {
[[noreturn]] void missing_kernel(const Backend& b, const char* op) {
  MG_FAIL("{}: the {} backend has no kernel for this op", op,
          b.type() == DeviceType::CPU ? "CPU" : "CUDA");
}
}  // namespace

void Backend::convert(const Tensor&, const Tensor&) { missing_kernel(*this, "to (dtype)"); }
void Backend::round_stochastic(const Tensor&, const Tensor&, uint64_t, uint64_t) {
  missing_kernel(*this, "round_stochastic");
}
void Backend::gelu(const Tensor&, const Tensor&, bool) { missing_kernel(*this, "gelu"); }
void Backend::gelu_backward(const Tensor&, const Tensor&, const Tensor&, bool) {
  missing_kernel(*this, "gelu_backward");
}
void Backend::silu(const Tensor&, const Tensor&) { missing_kernel(*this, "silu"); }
void Backend::silu_backward(const Tensor&, const Tensor&, const Tensor&) {
  missing_kernel(*this, "silu_backward");
}
void Backend::masked_fill(const Tensor&, const Tensor&, const Tensor&, double) {
  missing_kernel(*this, "masked_fill");
}
void Backend::dropout(const Tensor&, const Tensor&, double, uint64_t, uint64_t) {
  missing_kernel(*this, "dropout");
}
void Backend::bmm(const Tensor&, const Tensor&, const Tensor&) { missing_kernel(*this, "matmul (batched)"); }
void Backend::softmax(const Tensor&, const Tensor&) { missing_kernel(*this, "softmax"); }
void Backend::softmax_backward(const Tensor&, const Tensor&, const Tensor&) {
  missing_kernel(*this, "softmax_backward");
}
void Backend::layer_norm(const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                         const Tensor&, const Tensor&, double) {
  missing_kernel(*this, "layer_norm");
}
void Backend::layer_norm_backward(const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                                  const Tensor&, const Tensor&, const Tensor&, const Tensor&) {
  missing_kernel(*this, "layer_norm_backward");
}
void Backend::rms_norm(const Tensor&, const Tensor&, const Tensor&, const Tensor&, double) {
  missing_kernel(*this, "rms_norm");
}
void Backend::rms_norm_backward(const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                                const Tensor&, const Tensor&) {
  missing_kernel(*this, "rms_norm_backward");
}
void Backend::rotary_embedding(const Tensor&, const Tensor&, const Tensor&, const Tensor&, bool) {
  missing_kernel(*this, "rotary_embedding");
}
void Backend::embedding(const Tensor&, const Tensor&, const Tensor&) {
  missing_kernel(*this, "embedding");
}
void Backend::embedding_backward(const Tensor&, const Tensor&, const Tensor&) {
  missing_kernel(*this, "embedding_backward");
}
void Backend::attention(const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                        const Tensor&, double, bool, double, uint64_t, uint64_t) {
  missing_kernel(*this, "scaled_dot_product_attention");
}
void Backend::attention_backward(const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                                 const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                                 const Tensor&, double, bool, double, uint64_t, uint64_t) {
  missing_kernel(*this, "scaled_dot_product_attention backward");
}

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

std::string describe_operand(const Tensor& t) {
  if (!t.defined()) return "undefined";
  return fmt::format("shape {} {}{} on {}", t.shape(), t.dtype(),
                     t.is_contiguous() ? "" : " (not contiguous)", t.device());
}

}  // namespace

void check_sgd_step(const SgdStep& step, Device device) {
  const bool momentum = step.momentum != 0.0;
  for (size_t i = 0; i < step.tensors.size(); ++i) {
    const SgdTensor& t = step.tensors[i];
    MG_CHECK(t.param.defined(), "sgd_step: parameter {} is undefined", i);
    const auto fits = [&](const Tensor& x) {
      return x.defined() && x.dtype() == DType::Float32 && x.is_contiguous() &&
             x.shape() == t.param.shape() && x.device() == device;
    };
    const bool buffer_fits = momentum ? fits(t.momentum_buffer) : !t.momentum_buffer.defined();
    MG_CHECK(fits(t.param) && fits(t.grad) && buffer_fits,
             "sgd_step on {}: tensor {} does not fit (param: {}; grad: {}; momentum buffer: {}; "
             "momentum {}): expected float32 contiguous tensors of the param's shape on {}, "
             "with a buffer exactly when momentum != 0",
             device, i, describe_operand(t.param), describe_operand(t.grad),
             describe_operand(t.momentum_buffer), step.momentum, device);
  }
}

// The update as the in-place ops add_ and mul_ compute it, one op at a time: the
// reference every fused sgd_step reproduces bit for bit.
void Backend::sgd_step(const SgdStep& step) {
  if (step.tensors.empty()) return;
  check_sgd_step(step, step.tensors.front().param.device());
  for (const SgdTensor& t : step.tensors) {
    if (t.param.numel() == 0) continue;
    Tensor d_p = t.grad;  // the gradient itself is never written
    if (step.weight_decay != 0.0) {
      d_p = empty(t.grad.shape(), DType::Float32, t.grad.device());
      binary(BinaryOp::Add, d_p, t.grad, t.param, step.weight_decay);
    }
    if (step.momentum != 0.0) {
      const Tensor& buf = t.momentum_buffer;
      if (t.new_buffer) {
        copy(buf, d_p);
      } else {
        binary_scalar(BinaryOp::Mul, buf, buf, step.momentum);
        binary(BinaryOp::Add, buf, buf, d_p, 1.0 - step.dampening);
      }
      if (step.nesterov) {
        const Tensor next =
            d_p.is_same(t.grad) ? empty(t.grad.shape(), DType::Float32, t.grad.device()) : d_p;
        binary(BinaryOp::Add, next, d_p, buf, step.momentum);
        d_p = next;
      } else {
        d_p = buf;
      }
    }
    binary(BinaryOp::Add, t.param, t.param, d_p, -step.lr);
  }
}

void check_adam_step(const AdamStep& step, Device device) {
  const DType dtype = adam_step_dtype(step);
  for (size_t i = 0; i < step.tensors.size(); ++i) {
    const AdamTensor& t = step.tensors[i];
    MG_CHECK(t.param.defined(), "adam_step: parameter {} is undefined", i);
    const auto fits = [&](const Tensor& x) {
      return x.defined() && x.dtype() == dtype && x.is_contiguous() &&
             x.shape() == t.param.shape() && x.device() == device;
    };
    const bool max_fits = step.amsgrad ? fits(t.max_exp_avg_sq) : !t.max_exp_avg_sq.defined();
    MG_CHECK(is_floating_point(dtype) && fits(t.param) &&
                 fits(t.grad) && fits(t.exp_avg) && fits(t.exp_avg_sq) && max_fits,
             "adam_step on {}: tensor {} does not fit (param: {}; grad: {}; exp_avg: {}; "
             "exp_avg_sq: {}; max_exp_avg_sq: {}; amsgrad {}): expected contiguous {} "
             "tensors (a floating dtype, as parameter 0's) of the param's shape on {}, with "
             "max_exp_avg_sq exactly when amsgrad",
             device, i, describe_operand(t.param), describe_operand(t.grad),
             describe_operand(t.exp_avg), describe_operand(t.exp_avg_sq),
             describe_operand(t.max_exp_avg_sq), step.amsgrad, dtype, device);
  }
}

DType adam_step_dtype(const AdamStep& step) {
  if (step.tensors.empty() || !step.tensors.front().param.defined()) return DType::Float32;
  return step.tensors.front().param.dtype();
}

// The update as PyTorch's _single_tensor_adam/_single_tensor_adamw spell it, one
// elementwise op at a time: the reference every fused adam_step reproduces bit for bit.
// (addcmul_ and addcdiv_ are value * t1 first, then * or / t2, then the add.)
void Backend::adam_step(const AdamStep& step) {
  if (step.tensors.empty()) return;
  check_adam_step(step, step.tensors.front().param.device());
  for (const AdamTensor& t : step.tensors) {
    if (t.param.numel() == 0) continue;
    const auto temporary = [&] { return empty(t.param.shape(), t.param.dtype(), t.param.device()); };
    Tensor g = t.grad;  // the gradient itself is never written
    if (step.maximize) {
      const Tensor negated = temporary();
      unary(UnaryOp::Neg, negated, g);
      g = negated;
    }
    if (step.weight_decay != 0.0) {
      if (step.decoupled_weight_decay) {
        binary_scalar(BinaryOp::Mul, t.param, t.param, 1.0 - step.lr * step.weight_decay);
      } else {
        const Tensor decayed = temporary();
        binary(BinaryOp::Add, decayed, g, t.param, step.weight_decay);
        g = decayed;
      }
    }
    binary_scalar(BinaryOp::Mul, t.exp_avg, t.exp_avg, step.beta1);
    binary(BinaryOp::Add, t.exp_avg, t.exp_avg, g, 1.0 - step.beta1);

    binary_scalar(BinaryOp::Mul, t.exp_avg_sq, t.exp_avg_sq, step.beta2);
    const Tensor g2 = temporary();
    binary_scalar(BinaryOp::Mul, g2, g, 1.0 - step.beta2);
    binary(BinaryOp::Mul, g2, g2, g, 1.0);
    binary(BinaryOp::Add, t.exp_avg_sq, t.exp_avg_sq, g2, 1.0);

    Tensor second = t.exp_avg_sq;
    if (step.amsgrad) {
      binary(BinaryOp::Maximum, t.max_exp_avg_sq, t.max_exp_avg_sq, t.exp_avg_sq, 1.0);
      second = t.max_exp_avg_sq;
    }
    const Tensor denom = temporary();
    unary(UnaryOp::Sqrt, denom, second);
    binary_scalar(BinaryOp::Div, denom, denom, t.bias_correction2_sqrt);
    binary_scalar(BinaryOp::Add, denom, denom, step.eps);

    const Tensor update = temporary();
    binary_scalar(BinaryOp::Mul, update, t.exp_avg, -t.step_size);
    binary(BinaryOp::Div, update, update, denom, 1.0);
    binary(BinaryOp::Add, t.param, t.param, update, 1.0);
  }
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
