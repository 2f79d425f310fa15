// Every op of the Backend interface (core/backend.h) in bfloat16 and float16 against the
// same op in float32 on the same inputs, as ggml's test-backend-ops does for its backends:
// a table, one row per op (forward and backward entry points alike), walked in both dtypes.
//
// How a row is checked. Its inputs are drawn in float32 and rounded to the 16-bit dtype;
// the float32 run gets those rounded values widened back (exactly), so both runs see the
// same numbers. The CPU computes every 16-bit op in float32 and rounds each output once
// (cpu/widen.h, compute_t), so the 16-bit output must be the float32 output rounded:
//
//   |y16 - y32| <= u |y32|    (+ 2^-25 below float16's smallest normal)
//
// with u the unit roundoff, 2^-8 for bfloat16 and 2^-11 for float16 (tests/
// reduced_float_compare.h). The condition of the op does not enter: the inputs are the
// same, only the output is rounded. Outputs that stay float32 for a 16-bit input (layer
// norm's mean and rstd, attention's log-sum-exp) must equal float32's bit for bit, and
// int64 ones (argmax) exactly. An op that rounds several times (the Adam step, a
// composition of elementwise ops in 16 bits, as torch's foreach Adam on bfloat16
// parameters) has its bound derived beside it.
//
// The last test walks the row names against the Backend's methods, so an op added to the
// interface without a row here is a failure, not an omission.
#include "catch_compat.h"
#include "reduced_float_compare.h"
#include "reduced_float_rows.h"

#include <cctype>
#include <cstdio>
#include <functional>
#include <set>
#include <string>
#include <vector>

#include <minigrad/core/backend.h>
#include <minigrad/core/generator.h>
#include <minigrad/core/ops.h>
#include <minigrad/core/tensor.h>

using namespace mg;
using mg::testing::check_within;
using mg::testing::Input;
using mg::testing::Kind;
using mg::testing::Row;
using mg::testing::unit_roundoff;

namespace {

// The dtypes a row's outputs must have in the 16-bit run.
void compare_outputs(const Row& row, const std::vector<Tensor>& low, const std::vector<Tensor>& wide, DType dtype) {
  REQUIRE(low.size() == wide.size());
  for (size_t i = 0; i < low.size(); ++i) {
    const std::string what = row.name + ", output " + std::to_string(i) + " in " + std::string(dtype_name(dtype));
    INFO(what);
    if (wide[i].dtype() == DType::Int64) {
      CHECK(low[i].dtype() == DType::Int64);
      CHECK(low[i].to_vector<int64_t>() == wide[i].to_vector<int64_t>());
    } else if (low[i].dtype() == DType::Float32) {
      // Statistics kept in float32: computed from the same values by the same kernel.
      CHECK(wide[i].dtype() == DType::Float32);
      CHECK(low[i].to_vector<float>() == wide[i].to_vector<float>());
    } else {
      CHECK(low[i].dtype() == dtype);
      check_within(what, low[i], wide[i], dtype, /*k=*/1.0);  // one rounding
    }
  }
}

}  // namespace

TEST_CASE("reduced floats: every backend op in bfloat16 and float16 is float32's result rounded once",
          "[reduced_float][ops]") {
  const std::vector<Row> table = mg::testing::reduced_float_rows();
  for (DType dtype : {DType::BFloat16, DType::Float16}) {
    for (size_t r = 0; r < table.size(); ++r) {
      const Row& row = table[r];
      manual_seed(1000 + r);
      std::vector<Tensor> low, wide;
      for (const Input& in : row.inputs) {
        const Tensor x = mg::testing::draw(in);
        if (x.dtype() == DType::Int64) {
          low.push_back(x);
          wide.push_back(x);
        } else {
          low.push_back(ops::to_dtype(x, dtype));
          wide.push_back(ops::to_dtype(low.back(), DType::Float32));  // exact
        }
      }
      const std::vector<Tensor> out_low = row.run(low, dtype);
      const std::vector<Tensor> out_wide = row.run(wide, dtype);
      compare_outputs(row, out_low, out_wide, dtype);
    }
  }
}

// Adam in 16 bits: torch's single-tensor and foreach Adam on bfloat16 parameters keep
// their state in bfloat16 and round after every in-place op; Backend::adam_step's
// composition (core/backend.cpp) does the same, the CPU's fused float32 kernel does not
// apply. Each result below carries the roundings of its chain:
//   m' = round(round(m b1) + (1 - b1) g)               two roundings of terms <= |m| + |g|
//   v' = round(round(v b2) + round(round((1-b2) g) g))  four, all terms positive
//   p' = round(round(p (1 - lr wd)) + update)          update = -step m' / (sqrt(v')/c + eps),
//        rounded four times more (sqrt, /c, +eps, the quotient) on top of m' and v'.
// So |m' - m'32| <= 2u (|m| + |g|) (the terms, before any cancellation between them),
// |v' - v'32| <= 4u |v'32| + a few u of the tiny (1-b2) g^2 term, and the parameter within
// 2u |p| + 8u |update| (m' two roundings, v' four halved by the square root, four more).
TEST_CASE("reduced floats: adam_step in bfloat16 and float16 rounds as torch's 16-bit Adam does",
          "[reduced_float][ops]") {
  for (DType dtype : {DType::BFloat16, DType::Float16}) {
    manual_seed(77);
    const Tensor p0 = randn({7, 13}), g0 = ops::binary_scalar(BinaryOp::Mul, randn({7, 13}), 0.1);
    const Tensor m0 = ops::binary_scalar(BinaryOp::Mul, randn({7, 13}), 0.05);
    const Tensor v0 = ops::binary_scalar(BinaryOp::Mul, ops::unary(UnaryOp::Abs, randn({7, 13})), 0.01);
    std::vector<Tensor> result[2];
    for (int wide = 0; wide < 2; ++wide) {
      const auto in = [&](const Tensor& t) {
        const Tensor low = ops::to_dtype(t, dtype);
        return wide ? ops::to_dtype(low, DType::Float32) : low;
      };
      AdamTensor t{in(p0), in(g0), in(m0), in(v0), Tensor(), 0.0, 1.0};
      t.step_size = 1e-2 / (1.0 - 0.9 * 0.9);  // the second step
      t.bias_correction2_sqrt = std::sqrt(1.0 - 0.999 * 0.999);
      AdamStep step;
      step.lr = 1e-2;
      step.weight_decay = 0.1;
      step.decoupled_weight_decay = true;
      step.tensors.push_back(t);
      backend(Device::cpu()).adam_step(step);
      result[wide] = {t.param, t.exp_avg, t.exp_avg_sq};
    }
    const double u = unit_roundoff(dtype);
    const std::vector<double> p = mg::testing::values_of(ops::to_dtype(p0, dtype));
    const std::vector<double> m = mg::testing::values_of(ops::to_dtype(m0, dtype));
    const std::vector<double> g = mg::testing::values_of(ops::to_dtype(g0, dtype));
    const std::vector<double> p16 = mg::testing::values_of(result[0][0]), p32 = mg::testing::values_of(result[1][0]);
    const std::vector<double> m16 = mg::testing::values_of(result[0][1]), m32 = mg::testing::values_of(result[1][1]);
    const std::vector<double> v16 = mg::testing::values_of(result[0][2]), v32 = mg::testing::values_of(result[1][2]);
    CHECK(result[0][0].dtype() == dtype);
    for (size_t i = 0; i < p.size(); ++i) {
      INFO(dtype_name(dtype) << " element " << i);
      CHECK(std::fabs(m16[i] - m32[i]) <= 2 * u * (std::fabs(m[i]) + std::fabs(g[i])) + 2 * mg::testing::subnormal_half_spacing(dtype));
      CHECK(std::fabs(v16[i] - v32[i]) <= 5 * u * std::fabs(v32[i]) + 4 * mg::testing::subnormal_half_spacing(dtype));
      const double update = std::fabs(p32[i] - p[i] * (1.0 - 1e-2 * 0.1));
      CHECK(std::fabs(p16[i] - p32[i]) <= 2 * u * std::fabs(p[i]) + 8 * u * update);
    }
  }
}

// Every virtual method of Backend that computes on tensor values, and the rows (or test
// cases) above that exercise it in both 16-bit dtypes. A method added to core/backend.h
// must be added here, with a row: the list is read from the header.
TEST_CASE("reduced floats: the table covers every op of the Backend interface", "[reduced_float][ops]") {
  // Backend methods that do not compute on tensor values (devices, streams, events,
  // memory, timing), and sgd_step, whose contract is float32 only: optim::SGD takes the
  // in-place ops (add_, mul_, rows above) for any other dtype.
  const std::set<std::string> not_ops = {
      "type", "device_count", "allocator", "current_device", "set_device", "current_stream",
      "set_current_stream", "compute_stream", "copy_stream", "synchronize", "event_create",
      "event_destroy", "event_record", "event_block", "event_synchronize", "pool_stream",
      "memory_info", "memory_allocated", "timing_event_record", "event_elapsed_ms", "sgd_step"};
  // adam_step: the test case above; round_stochastic (float32 into 16 bits, no float32 op to
  // compare with): tests/nn/master_weights_test.cpp, its neighbours, mean and seeds.
  const std::set<std::string> covered_elsewhere = {"adam_step", "round_stochastic"};
  std::string header;
  {
    const std::string path = std::string(MINIGRAD_SOURCE_DIR) + "/minigrad/core/backend.h";
    std::FILE* f = std::fopen(path.c_str(), "r");
    REQUIRE(f != nullptr);
    char buffer[4096];
    size_t n;
    while ((n = std::fread(buffer, 1, sizeof buffer, f)) > 0) header.append(buffer, n);
    std::fclose(f);
  }
  const size_t begin = header.find("class Backend {");
  REQUIRE(begin != std::string::npos);
  const std::vector<Row> table = mg::testing::reduced_float_rows();
  size_t pos = begin;
  int methods = 0;
  while ((pos = header.find("virtual ", pos)) != std::string::npos) {
    pos += 8;
    // virtual <type> <name>(: the name is the identifier before the first '('.
    const size_t paren = header.find('(', pos);
    size_t start = paren;
    while (start > pos && (std::isalnum(static_cast<unsigned char>(header[start - 1])) || header[start - 1] == '_')) --start;
    const std::string name = header.substr(start, paren - start);
    if (name.empty() || name == "Backend" || not_ops.count(name) || covered_elsewhere.count(name)) continue;
    ++methods;
    bool found = false;
    for (const Row& row : table) {
      // A row names its methods as whole words, e.g. "softmax_backward, log_softmax_backward".
      size_t at = 0;
      while (!found && (at = row.name.find(name, at)) != std::string::npos) {
        const bool left = at == 0 || !(std::isalnum(static_cast<unsigned char>(row.name[at - 1])) || row.name[at - 1] == '_');
        const size_t end = at + name.size();
        const bool right = end == row.name.size() || !(std::isalnum(static_cast<unsigned char>(row.name[end])) || row.name[end] == '_');
        found = left && right;
        at = end;
      }
      if (found) break;
    }
    INFO("Backend::" << name << " has no row in the 16-bit table");
    CHECK(found);
  }
  CHECK(methods >= 30);
}
