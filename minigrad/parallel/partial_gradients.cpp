#include <minigrad/parallel/partial_gradients.h>

#include <algorithm>
#include <map>
#include <string>
#include <tuple>

#include <minigrad/autograd/grad_mode.h>
#include <minigrad/core/fault_injection.h>
#include <minigrad/core/ops.h>
#include <minigrad/parallel/c10d/process_group.h>
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

// The gradients partial over one group. Laid end to end in the order of their single-device
// names (and flat offsets), the same on every rank of the group: the ranks' parameter lists
// need not come alike (a pipeline's tied copies sit at either end of different stages: wte
// first on one, lm_head.weight last on another).
struct Bucket {
  std::string dim;
  std::shared_ptr<ProcessGroup> group;
  // (name, flat offset) -> a view of the gradient (whole, or a flat shard's range)
  std::map<std::pair<std::string, int64_t>, Tensor> values;
};

// Sums `values` (one dtype) over `group` through one flat buffer.
void sum_coalesced(const std::vector<Tensor>& values, const std::shared_ptr<ProcessGroup>& group) {
  int64_t numel = 0;
  for (const Tensor& v : values) numel += v.numel();
  Tensor flat = empty(Shape{numel}, values.front().dtype(), group->device());
  int64_t at = 0;
  for (const Tensor& v : values) {
    ops::copy_(ops::view(ops::narrow(flat, 0, at, v.numel()), v.shape()), v);
    at += v.numel();
  }
  const Tensor sum = tensor_parallel_group(group)->all_reduce(flat);
  at = 0;
  for (const Tensor& v : values) {
    ops::copy_(v, ops::view(ops::narrow(sum, 0, at, v.numel()), v.shape()));
    at += v.numel();
  }
}

}  // namespace

int reduce_partial_gradients(const std::vector<Tensor>& parameters) {
  NoGradGuard no_grad;
  std::vector<Bucket> buckets;
  for (size_t i = 0; i < parameters.size(); ++i) {
    const Tensor& p = parameters[i];
    MG_CHECK(p.defined(), "reduce_partial_gradients: parameter {} is an undefined tensor", i);
    const ParameterSpec* spec = spec_of(p);
    if (spec == nullptr) continue;
    for (const ParameterPiece& piece : spec->pieces) {
      for (const DimPlacement& d : piece.placements) {
        if (!d.partial_gradient || d.size == 1) continue;
        MG_CHECK(d.group != nullptr,
                 "reduce_partial_gradients: the gradient of {} is partial over {}, whose ranks have no process "
                 "group (threads of one process): sum it over them where they meet",
                 piece.str(), d.dim);
        // FSDP moves a parameter's gradient into its unit's shards and frees the parameter
        // between uses: summing the parameter would sum zeros and leave the shards unsummed.
        MG_CHECK(p.grad().defined() || !p.storage().is_freed(),
                 "reduce_partial_gradients: {} has no gradient and its memory is freed: FSDP manages it (its "
                 "gradient is in its unit's shards); pass the shards (FSDPModule::parameters())",
                 piece.str());
        // No gradient here (nothing of it was used on this rank): zeros take part.
        if (!p.grad().defined()) p.set_grad(zeros(p.shape(), p.dtype(), p.device()));
        auto it = std::find_if(buckets.begin(), buckets.end(),
                               [&](const Bucket& b) { return b.dim == d.dim && b.group == d.group; });
        if (it == buckets.end()) it = buckets.insert(buckets.end(), Bucket{d.dim, d.group, {}});
        it->values[{piece.name, piece.flat ? piece.flat->offset : 0}] = piece_values(piece, p.grad());
      }
    }
  }
  std::sort(buckets.begin(), buckets.end(), [](const Bucket& a, const Bucket& b) {
    return std::make_tuple(order_of(a.dim), a.dim, a.values.begin()->first) <
           std::make_tuple(order_of(b.dim), b.dim, b.values.begin()->first);
  });
  int reductions = 0;
  for (const Bucket& b : buckets) {
    if (skipped_by_fault(b.dim)) continue;  // parity faults: the sum left out
    std::map<DType, std::vector<Tensor>> by_dtype;
    for (const auto& [name, v] : b.values) {
      MG_CHECK(v.device() == b.group->device(),
               "reduce_partial_gradients: a gradient of shape {} is on {}, but the {} group works on {}", v.shape(),
               v.device(), b.dim, b.group->device());
      by_dtype[v.dtype()].push_back(v);
    }
    for (const auto& [dtype, values] : by_dtype) {
      sum_coalesced(values, b.group);
      ++reductions;
    }
  }
  return reductions;
}

}  // namespace mg::parallel
