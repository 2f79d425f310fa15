// --precision: the four ways the trainers train, under the names Lightning users know.
//
//   32-true     float32 everywhere (the default).
//   bf16-mixed  nanoGPT's way: float32 parameters, gradients and AdamW state; the forward
//               and the loss under AutocastGuard(bfloat16): the GEMMs in bfloat16, the
//               softmax, LayerNorm and loss in float32. No loss scaling (bfloat16 has
//               float32's exponent: no gradient underflows that float32 would keep).
//   16-mixed    the same with float16, and amp::GradScaler: float16's smallest normal is
//               2^-14 and its smallest subnormal 2^-24, so the activations' gradients are
//               computed from a loss times S (2^16 to start), unscaled in float32 before
//               the clip, and a step with an inf or NaN anywhere -- on any rank -- is
//               skipped and S halved.
//   bf16-true   llm.c's way: bfloat16 parameters, gradients and activations; AdamW over
//               float32 master weights with float32 moments (optim::MasterWeights), each
//               step's result rounded into the bfloat16 parameters.
//
// MixedPrecision is the loop's side of it: the region its forward runs under, the loss it
// calls backward on, the optimizer it wraps, the step it takes. A trainer holds one:
//
//   samples::MixedPrecision amp(precision, device);          // reduce_found_inf under a split
//   auto opt = amp.wrap_optimizer(params, make_adamw);       // MasterWeights for bf16-true
//   { auto region = amp.autocast(); loss = loss_fn(model(x), y); }
//   amp.scale(loss).backward();
//   amp.unscale_(optimizers); clip(...); amp.step(optimizers);
//
// Checkpoints: the scaler's state (torch's keys) is state_dict()'s, saved under "scaler.";
// the masters are MasterWeights' own optimizer state ("master.<i>"), so --resume continues
// bit for bit in every precision.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <minigrad/autograd/autocast.h>
#include <minigrad/core/device.h>
#include <minigrad/core/dtype.h>
#include <minigrad/core/tensor.h>
#include <minigrad/nn/amp/grad_scaler.h>
#include <minigrad/nn/optim/master_weights.h>
#include <minigrad/nn/optim/optimizer.h>

namespace mg::samples {

enum class Precision { True32, BF16Mixed, F16Mixed, BF16True };

// "32-true", "bf16-mixed", "16-mixed", "bf16-true", in that order (for --help and checks).
const std::vector<std::string>& precision_names();
// OptionError for another name, listing these.
Precision parse_precision(const std::string& name);
const char* precision_name(Precision precision);

class MixedPrecision {
 public:
  // `reduce_found_inf`: the GradScaler's agreement over the ranks (16-mixed under a split:
  // an all-reduce over every rank, so that one rank's inf skips the step everywhere).
  // `growth_interval`: the clean steps after which the scale doubles (torch's 2000; fewer
  // shows the scale's growth and backoffs within a short run).
  explicit MixedPrecision(Precision precision, Device device, amp::FoundInfReducer reduce_found_inf = {},
                          int64_t growth_interval = 2000);

  Precision precision() const { return precision_; }
  const char* name() const { return precision_name(precision_); }
  // The parameters' dtype: bfloat16 for bf16-true, float32 otherwise.
  DType param_dtype() const;
  // The autocast dtype of the mixed precisions (none for 32-true and bf16-true).
  std::optional<DType> autocast_dtype() const;
  // "bf16-mixed: float32 parameters, bfloat16 autocast" and so on, for the run's header.
  std::string str() const;

  // The region a forward and its loss run under: autocast on the device's type for the mixed
  // precisions, an empty region otherwise. `cache_enabled` false for a region over several
  // backward passes (the pipeline's micro-batches): a cached cast of a weight would be one
  // node in each micro-batch's graph, and the first backward frees it.
  std::unique_ptr<AutocastGuard> autocast(bool cache_enabled = true) const;

  // bf16-true: MasterWeights over `params` with `make` building the optimizer over the float32
  // masters; otherwise `make(params)` itself.
  std::unique_ptr<optim::Optimizer> wrap_optimizer(std::vector<Tensor> params, const optim::OptimizerFactory& make) const;

  // ---- the loss scale (16-mixed; 1 and no-ops otherwise) ----
  bool scaling() const { return scaler_ != nullptr; }
  double loss_scale() const { return scaler_ ? scaler_->get_scale() : 1.0; }
  Tensor scale(const Tensor& loss) const { return scaler_ ? scaler_->scale(loss) : loss; }
  // Every optimizer's gradients made current (MasterWeights' masters, ZeRO-1's shards) and,
  // under a scaler, divided by the scale, infs and NaNs looked for over every rank.
  void unscale_(const std::vector<optim::Optimizer*>& optimizers);
  // Each optimizer's step (skipped by the scaler after an inf or NaN), then the scale's
  // update. Returns whether the step was taken.
  bool step(const std::vector<optim::Optimizer*>& optimizers);
  amp::GradScaler* scaler() { return scaler_.get(); }
  // Every step() of this process under a scaler: the scale the step's loss was multiplied
  // by, and whether the step was taken (false: an inf or NaN, the scale halved after it).
  struct ScaleRecord {
    double scale = 0;
    bool stepped = true;
  };
  const std::vector<ScaleRecord>& scale_history() const { return scale_history_; }
  // scale_history() as CSV, "step,scale,stepped", the steps numbered from `first_step` + 1
  // (a resumed run's first), written with files::write_atomically (the flag names `flag`).
  void write_scale_history(const std::string& flag, const std::string& path, int64_t first_step) const;

  // The scaler's state dict (empty without a scaler) and its loading: mg::Error naming
  // `source` for a checkpoint that lacks it.
  std::map<std::string, Tensor> state_dict() const;
  void load_state_dict(const std::map<std::string, Tensor>& state, const std::string& source);

 private:
  Precision precision_;
  Device device_;
  std::unique_ptr<amp::GradScaler> scaler_;
  std::vector<ScaleRecord> scale_history_;
};

}  // namespace mg::samples
