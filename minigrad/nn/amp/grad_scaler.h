// amp::GradScaler: loss scaling for float16 training, with torch.cuda.amp.GradScaler's
// semantics (torch 1.13) step for step.
//
// Why: float16 holds nothing below 2^-24, and many gradients of a network are smaller than
// that; they would become 0 in float16 activations' gradients. Multiplying the loss by a
// large factor S before backward multiplies every gradient by S (backward is linear in the
// loss's gradient), lifting them into float16's range; dividing the parameters' gradients
// by S before the optimizer steps gives the true gradients back. S too large overflows to
// inf somewhere: such a step is skipped and S halved; after `growth_interval` clean steps S
// is doubled, so it hovers near the largest value that does not overflow. bfloat16 has
// float32's range and needs none of this (nanoGPT uses a scaler only for float16).
//
//   amp::GradScaler scaler;                          // S = 2^16
//   {
//     AutocastGuard autocast(DeviceType::CUDA, DType::Float16);
//     loss = cross_entropy(model->forward(x), y);
//   }
//   scaler.scale(loss).backward();                   // gradients times S
//   scaler.unscale_(opt);                            // gradients / S, inf/NaN found or not
//   nn::utils::clip_grad_norm_(params, 1.0);         // clip the true gradients
//   scaler.step(opt);                                // opt.step(), unless an inf/NaN was found
//   scaler.update();                                 // S halved after an inf, doubled after 2000 clean steps
//
// The rules, as torch's: unscale_ at most once per optimizer between updates, and never
// after step; step unscales first if unscale_ was not called; float16 gradients are refused
// ("Attempting to unscale FP16 gradients": unscaling in float16 would lose what scaling
// saved; keep float32 parameters under autocast, or float32 masters, optim::MasterWeights);
// update combines every optimizer's inf checks since the last update. The scale is a
// float32 value (torch keeps it in a float32 tensor), updated as torch's
// _amp_update_scale_ does.
//
// Across ranks: a step must be skipped on every rank or on none, or the replicas part.
// `reduce_found_inf` (GradScalerOptions) is called by unscale_ with this rank's flag (a
// 0-dim float32 tensor, 1 if any of this optimizer's gradients here is inf or NaN, else 0)
// and must replace it with its maximum (or sum) over every rank that holds a part of the
// model: data-parallel replicas, tensor/pipeline/sequence shards, ZeRO/FSDP shards. The
// forms of parallelism pass one (an all-reduce over their group); nn/ knows none of them.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>

#include <minigrad/core/tensor.h>
#include <minigrad/nn/optim/optimizer.h>

namespace mg::amp {

// Replaces `found_inf` (0-dim float32: 1 or 0) with its maximum, or its sum, over every rank.
using FoundInfReducer = std::function<void(Tensor& found_inf)>;

struct GradScalerOptions {
  double init_scale = 65536.0;  // 2^16
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  int64_t growth_interval = 2000;
  bool enabled = true;
  FoundInfReducer reduce_found_inf;  // none: this process decides alone
};

class GradScaler {
 public:
  explicit GradScaler(GradScalerOptions options = {});

  // outputs * scale, differentiably (a loss, or several outputs one at a time); outputs
  // itself when disabled.
  Tensor scale(const Tensor& outputs) const;
  // Divides the gradients of optimizer.parameters() by the scale, in place, and records
  // whether any is inf or NaN (over every rank, through reduce_found_inf).
  void unscale_(optim::Optimizer& optimizer);
  // optimizer.step() unless an inf or NaN was found; unscales first if unscale_ was not
  // called. Returns whether the step ran. When disabled: optimizer.step(), true.
  bool step(optim::Optimizer& optimizer);
  // The scale for the next iteration: times backoff_factor if any optimizer's step found
  // an inf or NaN since the last update (and the count of clean steps back to 0); else
  // one more clean step, and times growth_factor when they reach growth_interval (if that
  // is finite). update(new_scale) sets it instead.
  void update();
  void update(double new_scale);

  double get_scale() const;  // 1.0 when disabled, as torch's
  double get_growth_factor() const { return growth_factor_; }
  void set_growth_factor(double v) { growth_factor_ = v; }
  double get_backoff_factor() const { return backoff_factor_; }
  void set_backoff_factor(double v) { backoff_factor_ = v; }
  int64_t get_growth_interval() const { return growth_interval_; }
  void set_growth_interval(int64_t v) { growth_interval_ = v; }
  int64_t growth_tracker() const { return growth_tracker_; }  // clean steps in a row
  bool is_enabled() const { return enabled_; }

  // torch's state_dict keys: "scale", "growth_factor", "backoff_factor",
  // "growth_interval", "_growth_tracker", as 0-dim tensors (float32 scale, float64
  // factors, int64 counts) for a safetensors checkpoint; empty when disabled.
  std::map<std::string, Tensor> state_dict() const;
  // Nothing when disabled; mg::Error for an empty dict (one saved by a disabled scaler)
  // or a missing key, changing nothing.
  void load_state_dict(const std::map<std::string, Tensor>& state);

 private:
  enum class Stage { Ready, Unscaled, Stepped };
  struct OptimizerState {
    Stage stage = Stage::Ready;
    bool found_inf = false;
  };
  OptimizerState& state_of(const optim::Optimizer& optimizer);

  bool enabled_;
  float scale_;
  double growth_factor_, backoff_factor_;
  int64_t growth_interval_;
  int64_t growth_tracker_ = 0;
  FoundInfReducer reduce_found_inf_;
  std::map<const optim::Optimizer*, OptimizerState> per_optimizer_;
};

}  // namespace mg::amp
