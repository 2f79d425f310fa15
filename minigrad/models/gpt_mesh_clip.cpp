// clip_mesh_grad_norm_ (gpt_mesh_clip.h): the global gradient norm of the 4-D GPT.
#include <minigrad/models/gpt_mesh_clip.h>

#include <cmath>
#include <vector>

#include <minigrad/autograd/grad_mode.h>
#include <minigrad/core/ops.h>
#include <minigrad/nn/utils/clip_grad.h>

namespace mg::models {

Tensor clip_mesh_grad_norm_(GPTMeshPipeline& model, const parallel::DeviceMesh& mesh, double max_norm) {
  NoGradGuard no_grad;
  const auto& pp = mesh.group("pp");
  const auto& tp = mesh.group("tp");
  const Device device = pp->device();
  std::vector<Tensor> counted;
  for (const auto& [name, p] : model.named_parameters()) {
    if (!p.grad().defined() || name == "lm_head.weight") continue;
    if (TensorParallelGPT::is_replicated(name) && tp->rank() != 0) continue;
    counted.push_back(p.grad());
  }
  // This rank's sum of squares, then summed over tp and over pp.
  double local = 0;
  if (!counted.empty()) {
    const double norm = ops::to_dtype(nn::utils::get_total_norm(counted, 2.0, false, nullptr, device), DType::Float64).item<double>();
    local = norm * norm;
  }
  // float32 on the wire: written when Gloo summed float32 alone, and kept (a float64 sum,
  // possible now, would move the float32 runs' clipped norms by a rounding).
  Tensor sum = full({1}, local, DType::Float32, device);
  if (tp->size() > 1) tp->allreduce({sum})->wait();
  if (pp->size() > 1) pp->allreduce({sum})->wait();
  const double total = std::sqrt(ops::copy_to(sum, Device::cpu()).to_vector<float>()[0]);
  const Tensor norm = full({}, total, DType::Float32, device);
  nn::utils::clip_grads_with_norm_(model.parameters(), max_norm, norm);
  return norm;
}

}  // namespace mg::models
