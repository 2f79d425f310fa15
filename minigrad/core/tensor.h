// Tensor: a view (shape, strides, offset) of a refcounted Storage, plus the autograd
// state of that view: requires_grad, grad, and grad_fn (the Node that produced it).
//
// A Tensor is a cheap handle (one shared_ptr); copies share the same tensor, as in
// PyTorch. Views (reshape, transpose, narrow, chunk) share storage; contiguous(), to()
// and the arithmetic ops allocate.
//
// The differentiable methods below (to, reshape, t, sum, operators, ...) are defined in
// autograd/, next to their gradients; the data-level ones in core/tensor.cpp.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <minigrad/core/checked_math.h>
#include <minigrad/core/device.h>
#include <minigrad/core/dtype.h>
#include <minigrad/core/error.h>
#include <minigrad/core/scalar.h>
#include <minigrad/core/shape.h>
#include <minigrad/core/storage.h>

namespace mg {

class Node;  // autograd/node.h
class Tensor;

// What autograd keeps for one tensor. Leaves accumulate into `grad`; non-leaves point
// at the Node that made them (`grad_fn`) and which of its outputs they are.
struct AutogradMeta {
  bool requires_grad = false;
  std::shared_ptr<class TensorImpl> grad;
  std::shared_ptr<Node> grad_fn;
  uint32_t output_nr = 0;
  // Called after backward accumulated into this leaf's grad (DDP launches buckets here).
  std::vector<std::function<void(Tensor&)>> post_accumulate_grad_hooks;
  // A leaf's gradient accumulator is created once and shared by every graph using it.
  std::weak_ptr<Node> grad_accumulator;
};

// What the form of parallelism that split a parameter says this rank's tensor is of the
// single-device one (its placement on each mesh dimension: parallel/placement.h). core only
// carries it, as DTensor's spec rides on a tensor that stays a plain local tensor here.
struct DistributedSpec {
  virtual ~DistributedSpec() = default;
};

class TensorImpl {
 public:
  TensorImpl(Storage storage_, Shape shape_, std::vector<int64_t> strides_, int64_t offset_,
             DType dtype_)
      : storage(std::move(storage_)), shape(std::move(shape_)), strides(std::move(strides_)),
        offset(offset_), dtype(dtype_) {}

  Storage storage;
  Shape shape;
  std::vector<int64_t> strides;  // in elements
  int64_t offset;                // in elements, from storage.data()
  DType dtype;
  AutogradMeta autograd;
  std::shared_ptr<const DistributedSpec> distributed_spec;  // null unless a form split it
};

class Tensor {
 public:
  Tensor() = default;
  explicit Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}

  bool defined() const { return impl_ != nullptr; }
  TensorImpl* impl() const { return impl_.get(); }
  const std::shared_ptr<TensorImpl>& impl_ptr() const { return impl_; }
  bool is_same(const Tensor& other) const { return impl_ == other.impl_; }

  // ---- metadata ----
  const Shape& shape() const { return checked().shape; }
  const std::vector<int64_t>& strides() const { return checked().strides; }
  int64_t dim() const { return shape().dim(); }
  int64_t numel() const { return shape().numel(); }
  int64_t size(int64_t d) const;
  int64_t stride(int64_t d) const;
  int64_t storage_offset() const { return checked().offset; }
  DType dtype() const { return checked().dtype; }
  Device device() const { return checked().storage.device(); }
  const Storage& storage() const { return checked().storage; }
  bool is_contiguous() const;
  // numel * element size; an mg::Error for a broadcast view too large to hold in memory.
  std::size_t nbytes() const {
    return static_cast<std::size_t>(
        checked_mul(numel(), static_cast<int64_t>(element_size(dtype())), "nbytes"));
  }

  // Pointer to the first element (storage + offset). Device memory on CUDA.
  void* data_ptr() const;
  template <typename T>
  T* data() const {
    MG_CHECK(dtype() == dtype_of<T>(), "Tensor::data: tensor is {}, asked for {}", dtype(),
             dtype_of<T>());
    return static_cast<T*>(data_ptr());
  }

  // ---- values (copies to the host when needed; waits for the device) ----
  // T is the tensor's element type (float, double, int64_t, bfloat16, float16: a 16-bit
  // value converts to float implicitly); to(DType::Float32) first for another type.
  template <typename T>
  T item() const;
  template <typename T>
  std::vector<T> to_vector() const;
  std::string str() const;  // values, shape, dtype, device

  // ---- autograd ----
  bool requires_grad() const { return checked().autograd.requires_grad; }
  Tensor& set_requires_grad(bool requires_grad);
  // A leaf: made by the user, not by a differentiable op. Only leaves accumulate grad.
  bool is_leaf() const { return checked().autograd.grad_fn == nullptr; }
  Tensor grad() const;
  void set_grad(const Tensor& grad) const;
  const std::shared_ptr<Node>& grad_fn() const { return checked().autograd.grad_fn; }
  uint32_t output_nr() const { return checked().autograd.output_nr; }
  // Runs backward from this tensor. Gradients *accumulate* into leaves' grad(): zero
  // them before each step (Module::zero_grad / SGD::zero_grad).
  void backward(const Tensor& gradient = Tensor(), bool retain_graph = false) const;
  // Shares storage, but is a new leaf cut off from the graph.
  Tensor detach() const;
  // Makes this tensor a view of `new_data`'s storage (same shape and device; a float dtype
  // may change, as `p.data = t.to(torch.bfloat16)` does in PyTorch, when there is no
  // gradient yet), keeping its identity: its autograd state, hooks and every handle to it (a
  // module's registry, an optimizer's list) stay as they are (libtorch's set_data, PyTorch's
  // `p.data = t`). ZeRO and FSDP move parameters into one flat buffer this way, FSDP's
  // mixed precision into a bfloat16 one.
  void set_data(const Tensor& new_data) const;
  void register_post_accumulate_grad_hook(std::function<void(Tensor&)> hook) const;
  // The placement a form of parallelism recorded on this tensor (parallel/placement.h
  // reads and writes it); null for a tensor no form split. detach() leaves it behind.
  const std::shared_ptr<const DistributedSpec>& distributed_spec() const {
    return checked().distributed_spec;
  }
  void set_distributed_spec(std::shared_ptr<const DistributedSpec> spec) const {
    checked().distributed_spec = std::move(spec);
  }
  // How many times this tensor's memory has been written in place (PyTorch:
  // t._version). One counter per Storage, so every view of the memory (and detach())
  // shares it; every in-place op bumps it, and backward refuses a tensor saved for it
  // whose version moved since (autograd/saved_tensor.h).
  uint64_t version() const { return storage().version(); }

  // ---- differentiable views and copies (autograd/) ----
  Tensor to(Device device) const;
  // A copy converted to `dtype` (this tensor itself when it has that dtype already); its
  // backward converts the gradient back, as torch's x.to(torch.float64).
  Tensor to(DType dtype) const;
  Tensor reshape(const Shape& shape) const;  // a view when strides allow, else a copy
  Tensor view(const Shape& shape) const;     // always a view, or an mg::Error
  Tensor transpose(int64_t dim0, int64_t dim1) const;
  Tensor t() const;
  Tensor narrow(int64_t dim, int64_t start, int64_t length) const;
  Tensor contiguous() const;
  Tensor expand(const Shape& shape) const;  // broadcast view (stride 0)

  // ---- differentiable math (autograd/) ----
  Tensor sum() const;
  Tensor sum(const std::vector<int64_t>& dims, bool keepdim = false) const;
  Tensor mean() const;
  Tensor mean(const std::vector<int64_t>& dims, bool keepdim = false) const;
  Tensor matmul(const Tensor& other) const;
  Tensor relu() const;
  Tensor exp() const;
  Tensor log() const;
  Tensor neg() const;
  Tensor log_softmax(int64_t dim = -1) const;
  Tensor softmax(int64_t dim = -1) const;
  Tensor tanh() const;
  Tensor permute(const std::vector<int64_t>& dims) const;  // a view
  Tensor argmax(int64_t dim = -1) const;  // int64, not differentiable

  // ---- in-place, outside the graph (optimizers, initialisation) ----
  // Refused on a tensor that requires grad while grad mode is on, as in PyTorch. Each
  // bumps version(): a tensor that a graph saved for backward and that is modified here
  // makes that backward throw instead of computing a wrong gradient.
  Tensor& copy_(const Tensor& src);
  Tensor& fill_(double value);
  Tensor& zero_() { return fill_(0.0); }
  // The scalar's category must fit the tensor's dtype, as in torch: an int64 tensor takes
  // integer scalars only (ints.mul_(2), not ints.mul_(2.0), whose result is float32).
  Tensor& add_(const Tensor& other, Scalar alpha = 1);
  Tensor& mul_(Scalar value);
  Tensor& mul_(const Tensor& other);
  Tensor& uniform_(double low, double high);
  Tensor& normal_(double mean = 0.0, double stddev = 1.0);

 private:
  TensorImpl& checked() const {
    MG_CHECK(impl_ != nullptr, "Tensor: use of an undefined tensor");
    return *impl_;
  }
  std::shared_ptr<TensorImpl> impl_;
};

// Records an in-place write to t's memory by `op` (a string literal), for every tensor
// that shares it (libtorch: torch::autograd::impl::bump_version). The in-place methods
// above, ops::copy_, the optimizers' fused steps, gradient accumulation and the
// collectives call it; code that writes a tensor's memory through a Backend directly
// must call it too. A write into an output it has just allocated needs none.
inline void bump_version(const Tensor& t, const char* op) { t.storage().bump_version(op); }

// ---- creation (core/factory.cpp) ----
Tensor empty(const Shape& shape, DType dtype = DType::Float32, Device device = Device::cpu());
Tensor zeros(const Shape& shape, DType dtype = DType::Float32, Device device = Device::cpu());
Tensor ones(const Shape& shape, DType dtype = DType::Float32, Device device = Device::cpu());
Tensor full(const Shape& shape, double value, DType dtype = DType::Float32,
            Device device = Device::cpu());
Tensor zeros_like(const Tensor& t);
Tensor ones_like(const Tensor& t);
Tensor empty_like(const Tensor& t);
Tensor arange(double end, DType dtype = DType::Int64, Device device = Device::cpu());
Tensor arange(double start, double end, double step = 1.0, DType dtype = DType::Int64,
              Device device = Device::cpu());
Tensor from_vector(const std::vector<float>& values, const Shape& shape,
                   Device device = Device::cpu());
Tensor from_vector(const std::vector<double>& values, const Shape& shape,
                   Device device = Device::cpu());
Tensor from_vector(const std::vector<int64_t>& values, const Shape& shape,
                   Device device = Device::cpu());
Tensor from_vector(const std::vector<bfloat16>& values, const Shape& shape,
                   Device device = Device::cpu());
Tensor from_vector(const std::vector<float16>& values, const Shape& shape,
                   Device device = Device::cpu());
// float values rounded to `dtype` (any floating dtype: torch.tensor(values, dtype=...)).
Tensor from_vector(const std::vector<float>& values, const Shape& shape, DType dtype,
                   Device device = Device::cpu());
Tensor scalar_tensor(double value, DType dtype = DType::Float32, Device device = Device::cpu());
// Random tensors from the default generator (seed it with manual_seed).
Tensor rand(const Shape& shape, Device device = Device::cpu());   // uniform [0, 1)
Tensor randn(const Shape& shape, Device device = Device::cpu());  // standard normal
// Uniform int64 values in [low, high).
Tensor randint(int64_t low, int64_t high, const Shape& shape, Device device = Device::cpu());

}  // namespace mg

template <>
struct fmt::formatter<mg::Tensor> : fmt::formatter<std::string_view> {
  template <typename Ctx>
  auto format(const mg::Tensor& t, Ctx& ctx) const {
    return fmt::formatter<std::string_view>::format(t.defined() ? t.str() : "Tensor(undefined)",
                                                   ctx);
  }
};
