#include <minigrad/parallel/loss_parallel.h>

#include <minigrad/autograd/functions.h>
#include <minigrad/core/ops.h>
#include <minigrad/parallel/context_parallel/context_parallel_loss.h>
#include <minigrad/parallel/context_parallel/wire.h>
#include <minigrad/parallel/tensor_parallel/group.h>
#include <minigrad/parallel/tensor_parallel/vocab_parallel.h>

namespace mg::parallel {
namespace {

std::shared_ptr<ProcessGroup> if_split(const DeviceMesh& mesh, const char* dim) {
  return mesh.has_dim(dim) && mesh.size(dim) > 1 ? mesh.group(dim) : nullptr;
}

}  // namespace

LossParallel::LossParallel(const DeviceMesh& mesh) : LossParallel(if_split(mesh, "tp"), if_split(mesh, "cp")) {}

LossParallel::LossParallel(std::shared_ptr<ProcessGroup> tp, std::shared_ptr<ProcessGroup> cp) {
  if (tp && tp->size() == 1) tp = nullptr;
  if (cp && cp->size() == 1) cp = nullptr;
  if (!tp && !cp) return;
  TensorParallelGroupPtr vocab = tp ? tensor_parallel_group(tp) : nullptr;
  guard_.emplace([vocab, cp](const Tensor& logits, const Tensor& targets, const CrossEntropyOptions& options) {
    MG_CHECK(options.label_smoothing() == 0.0 && options.reduction() != Reduction::None,
             "LossParallel: cross_entropy with label_smoothing {} and reduction {} over split logits is not "
             "supported (label smoothing 0, reduction mean or sum)",
             options.label_smoothing(), reduction_name(options.reduction()));
    const bool mean = options.reduction() == Reduction::Mean;
    // The mean's divisor: the targets that count, over the whole sequences under cp.
    double divide_by = 1.0;
    if (mean && cp) {
      int64_t counted = 0;
      for (int64_t t : ops::copy_to(targets, Device::cpu()).to_vector<int64_t>()) counted += t != options.ignore_index();
      const Tensor count = context_parallel::sum_over_group(
          from_vector(std::vector<int64_t>{counted}, Shape{1}, targets.device()), *cp);
      divide_by = static_cast<double>(ops::copy_to(count, Device::cpu()).to_vector<int64_t>()[0]);
    }
    Tensor local;
    if (vocab) {
      // divide_by 0: vocab_parallel_cross_entropy's own mean over the targets that count.
      local = vocab_parallel_cross_entropy(logits, targets, vocab, options.ignore_index(),
                                           mean && !cp ? 0.0 : divide_by);
    } else {
      local = cross_entropy(logits, targets, CrossEntropyOptions().ignore_index(options.ignore_index())
                                                 .reduction(Reduction::Sum));
      local = mul(local, 1.0 / divide_by);
    }
    return cp ? context_parallel::context_parallel_sum(local, *cp) : local;
  });
}

}  // namespace mg::parallel
