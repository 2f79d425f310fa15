// What the GPT's split tests share (test_gpt_tensor_parallel, test_gpt_mesh, test_gpt_4d):
// the rows each data-parallel rank takes, and the comparison of a rank's parameters and
// gradients, shard by shard, with the single-device GPT's, keeping the worst of each and
// its name for the failure message.
#pragma once

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "multiprocess.h"

#include <minigrad/core/ops.h>

namespace mg::test {

inline double as_double(const Tensor& t) { return ops::to_dtype(t, DType::Float64).item<double>(); }
inline double max_abs(const Tensor& t) { return as_double(ops::abs_max(t)); }

// The rows [start, start + count) of a batch of B that data-parallel rank `dp_rank` of
// `dp` takes: uneven when dp does not divide B (the first B % dp ranks take one more).
inline std::pair<int64_t, int64_t> rows_of(int64_t B, int dp, int dp_rank) {
  const int64_t base = B / dp, extra = B % dp;
  return {dp_rank * base + std::min<int64_t>(dp_rank, extra), base + (dp_rank < extra ? 1 : 0)};
}

struct SplitErrors {
  double loss_error = 0, grad_error = 0, param_error = 0;
  std::string worst_grad, worst_param;

  // Each gradient against `expected(name)` (the reference's, cut to this rank's shard),
  // relative to the expected tensor's largest element.
  template <typename Named, typename Expected>
  void compare_grads(const Named& named_parameters, Expected expected) {
    for (const auto& [name, p] : named_parameters) {
      const Tensor e = expected(name);
      const double err = max_abs(p.grad() - e) / std::max(max_abs(e), 1e-6);
      if (err >= grad_error) {
        grad_error = err;
        worst_grad = name;
      }
    }
  }

  // Each parameter against `expected(name)`, absolute.
  template <typename Named, typename Expected>
  void compare_params(const Named& named_parameters, Expected expected) {
    for (const auto& [name, p] : named_parameters) {
      const double err = max_abs(p - expected(name));
      if (err >= param_error) {
        param_error = err;
        worst_param = name;
      }
    }
  }

};

// Reports "<prefix> errors" (loss, gradient, parameter) and "<prefix> where" (the worst
// tensors' names) to the parent process.
inline void report_errors(RankContext& ctx, const std::string& prefix, const SplitErrors& e) {
  ctx.report(prefix + " errors", std::vector<float>{static_cast<float>(e.loss_error),
                                                    static_cast<float>(e.grad_error),
                                                    static_cast<float>(e.param_error)});
  ctx.report(prefix + " where",
             fmt::format("loss {:.2e}, gradient {:.2e} ({}), parameter {:.2e} ({})",
                         e.loss_error, e.grad_error, e.worst_grad, e.param_error, e.worst_param));
}

}  // namespace mg::test
