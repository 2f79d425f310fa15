#include <minigrad/autograd/saved_tensor.h>

namespace mg {

SavedTensor::SavedTensor(const Tensor& t) {
  if (!t.defined()) return;
  data_ = t.detach();
  saved_version_ = t.version();
}

const Tensor& SavedTensor::unpack(const BackwardArgs& args) const {
  if (data_.defined() && data_.version() != saved_version_) {
    const char* writer = data_.storage().last_writer();
    MG_FAIL("{}: one of the tensors needed for gradient computation has been modified by an "
            "in-place operation: {}, version {}, expected {} (the tensor of shape {}, {} on {}, "
            "that {} saved in forward). Hint: move the in-place update after backward(), or "
            "update a clone() of the tensor; a rewrite that restores exactly what forward saw "
            "can be declared with mg::autograd::UnsafePreserveVersionCounter",
            args.node_name(), writer != nullptr ? writer : "an unnamed operation",
            data_.version(), saved_version_, data_.shape(), data_.dtype(), data_.device(),
            args.node_name());
  }
  return data_;
}

}  // namespace mg
