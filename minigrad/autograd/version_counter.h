// The escape hatch of the in-place check (autograd/saved_tensor.h), as PyTorch's
// torch.autograd.graph._unsafe_preserve_version_counter:
//
//   {
//     mg::autograd::UnsafePreserveVersionCounter keep(param);
//     all_gather_into(param);   // rewrites param's memory in place
//   }                           // param.version() is back to what it was
//   loss.backward();            // the saved param still counts as unmodified
//
// What it is for: code that must rewrite the memory of a tensor the graph has saved,
// and that guarantees the memory holds, by the time backward reads it, exactly the
// values forward used. Sharded data parallelism is the example: FSDP frees a unit's
// gathered parameters after forward and all-gathers them back into the same storage
// before that unit's backward; the values are the same, the version counter would say
// otherwise, and backward would refuse them.
//
// Why "unsafe": inside the scope the check is blind. Whatever else writes the same
// storage meanwhile (any view of it, on any thread) is forgotten too, and a rewrite that
// does not restore the saved values turns the refused backward back into a silently
// wrong gradient — the bug the version counter exists to catch. Keep the scope to the
// one rewrite, and never use it to silence an error you do not understand.
//
// On destruction the counter of each tensor's storage is set back to its value at
// construction (Storage::set_version). A tensor that is undefined is ignored.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include <minigrad/core/tensor.h>

namespace mg::autograd {

class UnsafePreserveVersionCounter {
 public:
  explicit UnsafePreserveVersionCounter(const Tensor& tensor)
      : UnsafePreserveVersionCounter(std::vector<Tensor>{tensor}) {}
  explicit UnsafePreserveVersionCounter(std::vector<Tensor> tensors) : tensors_(std::move(tensors)) {
    versions_.reserve(tensors_.size());
    for (const Tensor& t : tensors_) versions_.push_back(t.defined() ? t.version() : 0);
  }
  // Restored in reverse order, so that two tensors sharing one storage end at the
  // version the first of them had on entry.
  ~UnsafePreserveVersionCounter() {
    for (size_t i = tensors_.size(); i-- > 0;)
      if (tensors_[i].defined()) tensors_[i].storage().set_version(versions_[i]);
  }
  UnsafePreserveVersionCounter(const UnsafePreserveVersionCounter&) = delete;
  UnsafePreserveVersionCounter& operator=(const UnsafePreserveVersionCounter&) = delete;

 private:
  std::vector<Tensor> tensors_;
  std::vector<uint64_t> versions_;
};

}  // namespace mg::autograd
