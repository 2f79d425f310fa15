// Optimizer updates on the host: SGD's whole update in one pass over each tensor,
// reading p, g and buf once and writing p and buf once, where the composition of
// elementwise ops makes up to five passes and two temporaries.
//
// The arithmetic is add_'s and mul_'s (elementwise.cpp): float operands, the scalars
// rounded to float first, every product and sum rounded on its own. The branches on
// the options are template parameters, so the inner loop has none and vectorises;
// vector lanes round as scalars do, so the bits stay those of the composition.
#include <minigrad/core/cpu/cpu_backend.h>

namespace mg {
namespace {

struct SgdScalars {
  float weight_decay;
  float momentum;
  float keep;    // 1 - dampening, rounded from double as add_'s alpha is
  float neg_lr;  // -lr, as p.add_(d_p, -lr) passes it
};

template <bool kWeightDecay, bool kMomentum, bool kNewBuffer, bool kNesterov>
void sgd_update(float* p, const float* g, float* buf, int64_t n, SgdScalars s) {
  for (int64_t i = 0; i < n; ++i) {
    float d_p = g[i];
    if constexpr (kWeightDecay) d_p = d_p + s.weight_decay * p[i];
    if constexpr (kMomentum) {
      float b;
      if constexpr (kNewBuffer) {
        b = d_p;
      } else {
        b = buf[i] * s.momentum;  // mul_, rounded before the add_
        b = b + s.keep * d_p;
      }
      buf[i] = b;
      if constexpr (kNesterov) {
        d_p = d_p + s.momentum * b;
      } else {
        d_p = b;
      }
    }
    p[i] = p[i] + s.neg_lr * d_p;
  }
}

template <bool kWeightDecay>
void sgd_update_tensor(const SgdTensor& t, const SgdStep& step, const SgdScalars& s) {
  auto* p = static_cast<float*>(t.param.data_ptr());
  const auto* g = static_cast<const float*>(t.grad.data_ptr());
  const int64_t n = t.param.numel();
  if (step.momentum == 0.0) {
    sgd_update<kWeightDecay, false, false, false>(p, g, nullptr, n, s);
    return;
  }
  auto* buf = static_cast<float*>(t.momentum_buffer.data_ptr());
  if (t.new_buffer) {
    if (step.nesterov) {
      sgd_update<kWeightDecay, true, true, true>(p, g, buf, n, s);
    } else {
      sgd_update<kWeightDecay, true, true, false>(p, g, buf, n, s);
    }
  } else {
    if (step.nesterov) {
      sgd_update<kWeightDecay, true, false, true>(p, g, buf, n, s);
    } else {
      sgd_update<kWeightDecay, true, false, false>(p, g, buf, n, s);
    }
  }
}

}  // namespace

void CpuBackend::sgd_step(const SgdStep& step) {
  check_sgd_step(step, Device::cpu());
  const SgdScalars s{static_cast<float>(step.weight_decay), static_cast<float>(step.momentum),
                     static_cast<float>(1.0 - step.dampening), static_cast<float>(-step.lr)};
  for (const SgdTensor& t : step.tensors) {
    if (t.param.numel() == 0) continue;
    if (step.weight_decay != 0.0) {
      sgd_update_tensor<true>(t, step, s);
    } else {
      sgd_update_tensor<false>(t, step, s);
    }
  }
}

}  // namespace mg
