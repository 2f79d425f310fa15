// gradcheck: compares the gradients that backward() computes with central finite
// differences, as torch.autograd.gradcheck does. Inputs of float32 need float tolerances
// (the defaults); in float64 (random_input(..., DType::Float64) and Gradcheck64) the check
// is as tight as torch's: eps 1e-6, atol 1e-5, rtol 1e-3.
//
// For f(inputs) -> outputs, it draws a fixed random weight R_k for each output and checks
// the gradient of L = sum_k <outputs_k, R_k>: analytically by backward() seeded with the
// R_k (so every element of a non-scalar output is exercised with a different weight), and
// numerically by (L(x + eps e_i) - L(x - eps e_i)) / (2 eps) for every element i of every
// float input, with L accumulated in double. int64 inputs (class targets) are passed
// through and not differentiated.
//
// Inputs are copied into fresh contiguous leaves, so views (transposes, narrows, expands)
// belong inside f: the check then covers the view's backward too.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include <minigrad/core/dtype.h>
#include <minigrad/core/tensor.h>

namespace mg::testing {

struct GradcheckOptions {
  double eps = 1e-3;   // finite-difference step
  double atol = 1e-3;  // |analytic - numeric| <= atol + rtol * |numeric|
  double rtol = 1e-2;
};

// torch.autograd.gradcheck's tolerances, for float64 inputs.
inline GradcheckOptions Gradcheck64() { return GradcheckOptions{1e-6, 1e-5, 1e-3}; }

struct GradcheckResult {
  bool ok = true;
  int64_t checked = 0;  // number of input elements compared
  std::string report;   // the worst mismatch of each input, for INFO()
};

using MultiOutputFn = std::function<std::vector<Tensor>(const std::vector<Tensor>&)>;
using SingleOutputFn = std::function<Tensor(const std::vector<Tensor>&)>;

GradcheckResult gradcheck(const MultiOutputFn& f, const std::vector<Tensor>& inputs,
                          const GradcheckOptions& options = {});
GradcheckResult gradcheck(const SingleOutputFn& f, const std::vector<Tensor>& inputs,
                          const GradcheckOptions& options = {});

// Random float input of `shape` (float32 unless dtype says), uniform in [low, high), from a
// private generator seeded with `seed` (independent of mg::manual_seed, so tests do not
// disturb each other). The same seed gives the same values in float32 and float64, up to
// float32's rounding.
Tensor random_input(const Shape& shape, uint64_t seed, double low = -1.0, double high = 1.0,
                    DType dtype = DType::Float32);
// Like random_input but with |x| >= margin everywhere: for ops with a kink at 0 (relu),
// where a finite difference straddling the kink would be meaningless.
Tensor random_away_from_zero(const Shape& shape, uint64_t seed, double margin = 0.1,
                             double high = 1.0, DType dtype = DType::Float32);

}  // namespace mg::testing

// CHECK_GRADCHECK(f, inputs[, options]): a failed Catch2 check, with the report, when the
// gradients differ; the test case goes on, so one run shows every failing case.
#define CHECK_GRADCHECK(...)                                                \
  do {                                                                      \
    const auto mg_gradcheck_result = ::mg::testing::gradcheck(__VA_ARGS__); \
    INFO(mg_gradcheck_result.report);                                       \
    CHECK(mg_gradcheck_result.checked > 0);                                 \
    CHECK(mg_gradcheck_result.ok);                                          \
  } while (0)
