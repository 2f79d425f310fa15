// The data-level half of Tensor: metadata, element access, printing, autograd fields.
// (The differentiable methods live in autograd/tensor_methods.cpp.)
#include <minigrad/core/tensor.h>

#include <fmt/ranges.h>

#include <minigrad/core/checked_math.h>
#include <minigrad/core/ops.h>

namespace mg {

// wrap_dim accepts dim 0 and -1 of a 0-dim tensor (reductions allow them, as PyTorch
// does), but there is no size or stride to read there.
int64_t Tensor::size(int64_t d) const {
  MG_CHECK(dim() > 0, "size: dimension {} requested, but the tensor has no dimensions (shape [])",
           d);
  return shape()[wrap_dim(d, dim(), "size")];
}

int64_t Tensor::stride(int64_t d) const {
  MG_CHECK(dim() > 0,
           "stride: dimension {} requested, but the tensor has no dimensions (shape [])", d);
  return strides()[static_cast<size_t>(wrap_dim(d, dim(), "stride"))];
}

bool Tensor::is_contiguous() const {
  int64_t expected = 1;
  for (int64_t d = dim() - 1; d >= 0; --d) {
    if (size(d) == 1) continue;  // a size-1 dim's stride never matters
    if (stride(d) != expected) return false;
    expected *= size(d);
  }
  return true;
}

void* Tensor::data_ptr() const {
  const TensorImpl& t = checked();
  void* data = t.storage.data();
  // A storage freed by Storage::resize_(0) (FSDP's parameters outside
  // their unit's forward and backward): an error here, not a read of freed memory.
  MG_CHECK(data != nullptr || t.shape.numel() == 0,
           "Tensor: the memory of this tensor (shape {}, {}, {}) has been freed "
           "(Storage::resize_(0)). FSDP (fully_shard) frees a unit's full parameters outside "
           "its forward and backward: call the module through operator() (its hooks gather "
           "them), read them through full_state_dict(), or train the shards its parameters() "
           "returns",
           t.shape, t.dtype, t.storage.device());
  // An empty tensor of an empty storage (its offset may be anything, as in PyTorch): no
  // address to offset from, and nothing is read through it.
  if (data == nullptr) return nullptr;
  // An empty view may carry any offset too, past its storage's end (even one whose byte
  // count overflows): nothing is read through it, so it points at the storage's start
  // rather than past the allocation.
  const auto size = static_cast<int64_t>(element_size(t.dtype));
  if (t.shape.numel() == 0 &&
      (mul_overflows(t.offset, size) || static_cast<uint64_t>(t.offset * size) > t.storage.nbytes()))
    return data;
  return static_cast<char*>(data) + t.offset * size;
}

template <typename T>
std::vector<T> Tensor::to_vector() const {
  MG_CHECK(dtype() == dtype_of<T>(), "to_vector: tensor is {}, asked for {}", dtype(),
           dtype_of<T>());
  const Tensor host = ops::contiguous(device().is_cpu() ? *this : ops::copy_to(*this, Device::cpu()));
  const T* p = host.data<T>();
  return std::vector<T>(p, p + numel());
}

template <typename T>
T Tensor::item() const {
  MG_CHECK(numel() == 1, "item: expected a tensor with one element, got shape {}", shape());
  return to_vector<T>()[0];
}

template std::vector<float> Tensor::to_vector<float>() const;
template std::vector<double> Tensor::to_vector<double>() const;
template std::vector<int64_t> Tensor::to_vector<int64_t>() const;
template std::vector<bfloat16> Tensor::to_vector<bfloat16>() const;
template std::vector<float16> Tensor::to_vector<float16>() const;
template float Tensor::item<float>() const;
template double Tensor::item<double>() const;
template int64_t Tensor::item<int64_t>() const;
template bfloat16 Tensor::item<bfloat16>() const;
template float16 Tensor::item<float16>() const;

namespace {
// Nested brackets like PyTorch, eliding the middle of long dimensions.
template <typename T>
void format_values(std::string& out, const std::vector<T>& values, const Shape& shape,
                   int64_t dim, int64_t offset, int64_t block) {
  constexpr int64_t kEdge = 3;
  if (shape.dim() == 0) {
    out += fmt::format("{}", values[0]);
    return;
  }
  const int64_t n = shape[dim];
  const int64_t inner = block / std::max<int64_t>(n, 1);  // elements per entry of `dim`
  out += '[';
  for (int64_t i = 0; i < n; ++i) {
    if (n > 2 * kEdge && i == kEdge) {
      out += "..., ";
      i = n - kEdge;
    }
    if (dim == shape.dim() - 1) {
      const T v = values[static_cast<size_t>(offset + i)];
      if constexpr (!std::is_same_v<T, int64_t>) {  // the floats, 16-bit ones as float
        out += fmt::format("{:.4g}", v);
      } else {
        out += fmt::format("{}", v);
      }
    } else {
      format_values(out, values, shape, dim + 1, offset + i * inner, inner);
    }
    if (i + 1 < n) out += ", ";
  }
  out += ']';
}
}  // namespace

std::string Tensor::str() const {
  std::string values;
  switch (dtype()) {
    case DType::Float32: format_values(values, to_vector<float>(), shape(), 0, 0, numel()); break;
    case DType::Float64: format_values(values, to_vector<double>(), shape(), 0, 0, numel()); break;
    case DType::Int64: format_values(values, to_vector<int64_t>(), shape(), 0, 0, numel()); break;
    case DType::BFloat16: format_values(values, to_vector<bfloat16>(), shape(), 0, 0, numel()); break;
    case DType::Float16: format_values(values, to_vector<float16>(), shape(), 0, 0, numel()); break;
  }
  std::string extra;
  if (dtype() != DType::Float32) extra += fmt::format(", dtype={}", dtype());
  if (!device().is_cpu()) extra += fmt::format(", device={}", device());
  if (requires_grad()) extra += ", requires_grad=true";
  return fmt::format("tensor({}, shape={}{})", values, shape(), extra);
}

Tensor& Tensor::set_requires_grad(bool requires_grad) {
  MG_CHECK(!requires_grad || is_floating_point(dtype()),
           "set_requires_grad: only floating-point tensors (float32, float64, bfloat16, "
           "float16) can require gradients, got {}",
           dtype());
  MG_CHECK(is_leaf() || requires_grad,
           "set_requires_grad: cannot turn off gradients of a non-leaf tensor; use detach()");
  checked().autograd.requires_grad = requires_grad;
  return *this;
}

Tensor Tensor::grad() const {
  const auto& g = checked().autograd.grad;
  return g ? Tensor(g) : Tensor();
}

void Tensor::set_grad(const Tensor& grad) const {
  if (grad.defined()) {
    MG_CHECK(grad.shape() == shape() && grad.device() == device() && grad.dtype() == dtype(),
             "set_grad: gradient of shape {} ({}, {}) does not match tensor of shape {} ({}, {})",
             grad.shape(), grad.dtype(), grad.device(), shape(), dtype(), device());
  }
  checked().autograd.grad = grad.impl_ptr();
}

void Tensor::set_data(const Tensor& new_data) const {
  MG_CHECK(new_data.defined(), "set_data: the new data is an undefined tensor");
  TensorImpl& t = checked();
  const bool same_dtype = new_data.dtype() == t.dtype;
  MG_CHECK(new_data.shape() == t.shape && new_data.device() == t.storage.device() &&
               (same_dtype || (is_floating_point(t.dtype) && is_floating_point(new_data.dtype()))),
           "set_data: new data of shape {} ({}, {}) does not match the tensor's shape {} ({}, {})",
           new_data.shape(), new_data.dtype(), new_data.device(), t.shape, t.dtype,
           t.storage.device());
  MG_CHECK(same_dtype || t.autograd.grad == nullptr,
           "set_data: new data of dtype {} for a {} tensor of shape {} that has a {} gradient; clear the "
           "gradient first", new_data.dtype(), t.dtype, t.shape, t.dtype);
  const TensorImpl& src = *new_data.impl();
  t.dtype = src.dtype;
  t.storage = src.storage;
  t.strides = src.strides;
  t.offset = src.offset;
}

Tensor Tensor::detach() const {
  return ops::as_strided(*this, shape(), strides(), storage_offset());
}

void Tensor::register_post_accumulate_grad_hook(std::function<void(Tensor&)> hook) const {
  MG_CHECK(is_leaf() && requires_grad(),
           "register_post_accumulate_grad_hook: only leaf tensors that require grad accumulate "
           "gradients");
  checked().autograd.post_accumulate_grad_hooks.push_back(std::move(hook));
}

}  // namespace mg
