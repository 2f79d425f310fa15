#include <minigrad/parallel/clip_grad.h>

#include <cmath>

#include <minigrad/autograd/grad_mode.h>
#include <minigrad/core/ops.h>
#include <minigrad/nn/utils/clip_grad.h>
#include <minigrad/parallel/context_parallel/wire.h>
#include <minigrad/parallel/placement.h>

namespace mg::parallel {

std::vector<Tensor> counted_gradients(const std::vector<Tensor>& parameters) {
  std::vector<Tensor> counted;
  for (size_t i = 0; i < parameters.size(); ++i) {
    const Tensor& p = parameters[i];
    MG_CHECK(p.defined(), "clip_grad_norm_: parameter {} is an undefined tensor", i);
    const Tensor g = p.grad();
    if (!g.defined()) continue;
    const ParameterSpec* spec = spec_of(p);
    if (spec == nullptr) {
      counted.push_back(g);
      continue;
    }
    bool all_here = true;
    for (const ParameterPiece& piece : spec->pieces) all_here = all_here && piece.counted_here();
    if (all_here) {  // the whole local gradient: a flat shard's padding is zeros
      counted.push_back(g);
      continue;
    }
    for (const ParameterPiece& piece : spec->pieces)
      if (piece.counted_here()) counted.push_back(piece_values(piece, g));
  }
  return counted;
}

Tensor clip_grad_norm_(const std::vector<Tensor>& parameters, const std::shared_ptr<ProcessGroup>& world,
                       double max_norm, double norm_type, bool error_if_nonfinite) {
  MG_CHECK(max_norm >= 0.0, "clip_grad_norm_: max_norm must be >= 0, got {}", max_norm);
  MG_CHECK(norm_type > 0.0 && !std::isnan(norm_type), "clip_grad_norm_: norm_type must be > 0 or infinity, got {}",
           norm_type);
  NoGradGuard no_grad;
  std::vector<Tensor> counted = counted_gradients(parameters);
  // A rank with nothing to count still takes part, with a zero of the gradients' dtype (the
  // identity of the sum and of the maximum of magnitudes): every rank's partial must agree.
  DType dtype = DType::Float32;
  Device device = world ? world->device() : Device::cpu();
  bool found = false;
  for (const Tensor& p : parameters)
    if (!found && p.grad().defined()) {
      dtype = p.grad().dtype();
      if (!world) device = p.grad().device();
      found = true;
    }
  if (counted.empty()) counted.push_back(zeros(Shape{1}, dtype, device));
  // get_total_norm computes the partial on the first counted gradient's device; the world's
  // reduction runs on the world's device.
  const nn::utils::NormReducer over_world = [&world](Tensor& partial, nn::utils::NormReduction op) {
    if (!world) return;
    Tensor mine = ops::contiguous(partial.reshape(Shape{1}));
    if (mine.device() != world->device()) mine = ops::copy_to(mine, world->device());
    partial = op == nn::utils::NormReduction::Sum ? context_parallel::sum_over_group(mine, *world)
                                                   : ops::abs_max(context_parallel::all_gather_any(mine, *world));
  };
  const Tensor total = nn::utils::get_total_norm(counted, norm_type, error_if_nonfinite, over_world, device);
  nn::utils::clip_grads_with_norm_(parameters, max_norm, total);
  return total;
}

Tensor clip_grad_norm_(const std::vector<Tensor>& parameters, const DeviceMesh& mesh, double max_norm,
                       double norm_type, bool error_if_nonfinite) {
  return clip_grad_norm_(parameters, mesh.world(), max_norm, norm_type, error_if_nonfinite);
}

}  // namespace mg::parallel
