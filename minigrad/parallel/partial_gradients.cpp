#include <minigrad/parallel/partial_gradients.h>

#include <algorithm>
#include <map>

#include <minigrad/autograd/functions.h>
#include <minigrad/autograd/grad_mode.h>
#include <minigrad/core/fault_injection.h>
#include <minigrad/core/ops.h>
#include <minigrad/parallel/placement.h>
#include <minigrad/parallel/tensor_parallel/group.h>

namespace mg::parallel {
namespace {

int order_of(const std::string& dim) {
  static const std::vector<std::string> known{"tied", "tp", "cp"};
  const auto it = std::find(known.begin(), known.end(), dim);
  return it == known.end() ? static_cast<int>(known.size()) : static_cast<int>(it - known.begin());
}

bool skipped_by_fault(const std::string& dim) {
  using testing::Fault;
  return (dim == "tp" && testing::fault_is_on(Fault::SequenceParallelGradsNotReduced)) ||
         (dim == "cp" && testing::fault_is_on(Fault::ContextParallelGradsNotReduced)) ||
         (dim == "tied" && testing::fault_is_on(Fault::PipelineTiedGradNotSummed));
}

}  // namespace

void reduce_partial_gradients(const std::vector<Tensor>& parameters) {
  // The parameters Partial on each (dimension, group), in the parameters' order.
  using Key = std::pair<int, std::string>;
  std::map<Key, std::pair<std::shared_ptr<ProcessGroup>, std::vector<Tensor>>> partial;
  for (const Tensor& p : parameters) {
    const ParameterSpec* spec = spec_of(p);
    if (spec == nullptr) continue;
    for (const DimPlacement& d : spec->pieces[0].placements) {
      if (!d.partial_gradient || d.size == 1) continue;
      MG_CHECK(d.group != nullptr, "reduce_partial_gradients: {} is Partial on {} but has no process group",
               spec->pieces[0].name, d.dim);
      auto& [group, tensors] = partial[{order_of(d.dim), d.dim}];
      MG_CHECK(group == nullptr || group == d.group,
               "reduce_partial_gradients: parameters Partial on {} name two different groups", d.dim);
      group = d.group;
      tensors.push_back(p);
    }
  }
  NoGradGuard no_grad;
  for (auto& [key, entry] : partial) {
    if (skipped_by_fault(key.second)) continue;  // parity faults: the sum left out
    auto& [group, tensors] = entry;
    std::vector<Tensor> flat;
    for (const Tensor& p : tensors) {
      if (!p.grad().defined()) p.set_grad(zeros_like(p));
      flat.push_back(ops::view(ops::contiguous(p.grad()), Shape{p.numel()}));
    }
    const Tensor summed = tensor_parallel_group(group)->all_reduce(cat(flat, 0));
    int64_t at = 0;
    for (const Tensor& p : tensors) {
      Tensor g = p.grad();
      ops::copy_(g, ops::view(ops::narrow(summed, 0, at, p.numel()), g.shape()));
      at += p.numel();
    }
  }
}

}  // namespace mg::parallel
