// nn::utils::clip_grad_norm_: torch.nn.utils.clip_grad_norm_, with a hook for gradients
// that are sharded over ranks.
//
//   total = (sum over every gradient element of |g|^p)^(1/p)    (p = norm_type)
//   total = max |g|                                              (p = infinity)
//   coef  = min(max_norm / (total + 1e-6), 1)
//   g    *= coef                                                 (every gradient)
//
// and the total norm is returned as a 0-dim float32 tensor on the first gradient's device.
// Everything runs on the devices (no copy to the host, no synchronisation), unless
// error_if_nonfinite asks to look at the norm.
//
// Sharded gradients (ZeRO-2/3, FSDP): each rank holds only its shard of the gradients,
// and the norm is over all of them. Pass a NormReducer: clip_grad_norm_ computes this
// rank's partial -- the sum of |g|^p over its own gradient elements, or their max |g|
// for p = infinity -- as a one-element float32 tensor on the device of the first
// parameter (or the CPU if there are none), and calls reduce(partial, op), which must
// replace it in place with its reduction over all ranks: a sum for NormReduction::Sum, a
// maximum for NormReduction::Max. Then every rank has the same total norm and scales its
// shard by the same coefficient. With a process group (`pg`) that is one all-reduce:
//
//   nn::utils::clip_grad_norm_(shard_params, 1.0, 2.0, false,
//       [&](Tensor& partial, nn::utils::NormReduction op) {
//         pg.allreduce(partial, /* op == Sum */ parallel::ReduceOp::Sum)->wait();
//       });
//
// Every rank must call it, also one whose shard is empty (its partial is 0), since the
// reduction is a collective. Each gradient element must be on exactly one rank; a
// gradient replicated on every rank would be counted once per rank.
#pragma once

#include <functional>
#include <vector>

#include <minigrad/core/tensor.h>

namespace mg::nn::utils {

enum class NormReduction { Sum, Max };
// Replaces `partial` (one element of the gradients' dtype) with its sum or maximum over all ranks.
using NormReducer = std::function<void(Tensor& partial, NormReduction op)>;

// Scales the gradients of `parameters` (those that have one) so that their total
// norm_type-norm is at most max_norm; returns the total norm before clipping. norm_type
// is > 0 or infinity (std::numeric_limits<double>::infinity()). With error_if_nonfinite,
// a NaN or infinite total norm is an mg::Error and no gradient is changed.
Tensor clip_grad_norm_(const std::vector<Tensor>& parameters, double max_norm,
                       double norm_type = 2.0, bool error_if_nonfinite = false,
                       const NormReducer& reduce = nullptr);
Tensor clip_grad_norm_(const Tensor& parameter, double max_norm, double norm_type = 2.0,
                       bool error_if_nonfinite = false);

// The two halves of clip_grad_norm_ (torch.nn.utils.get_total_norm and
// clip_grads_with_norm_): the total norm of `tensors` (gradients, say), reduced over
// ranks by `reduce` when given; and scaling the parameters' gradients by
// min(max_norm / (total_norm + 1e-6), 1).
Tensor get_total_norm(const std::vector<Tensor>& tensors, double norm_type = 2.0,
                      bool error_if_nonfinite = false, const NormReducer& reduce = nullptr,
                      Device device = Device::cpu());
void clip_grads_with_norm_(const std::vector<Tensor>& parameters, double max_norm,
                           const Tensor& total_norm);

}  // namespace mg::nn::utils
