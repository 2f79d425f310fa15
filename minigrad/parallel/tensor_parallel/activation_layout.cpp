#include <minigrad/parallel/tensor_parallel/activation_layout.h>

namespace mg::parallel {
namespace {

struct MadeWhole : DistributedSpec {
  explicit MadeWhole(const TensorParallelGroup* g) : group(g) {}
  const TensorParallelGroup* group;  // compared, never used: the mark outlives no step
};

}  // namespace

void mark_made_whole(const Tensor& x, const TensorParallelGroup& group) {
  x.set_distributed_spec(std::make_shared<MadeWhole>(&group));
}

bool is_made_whole_for(const Tensor& x, const TensorParallelGroup& group) {
  const auto* mark = dynamic_cast<const MadeWhole*>(x.distributed_spec().get());
  return mark != nullptr && mark->group == &group;
}

}  // namespace mg::parallel
