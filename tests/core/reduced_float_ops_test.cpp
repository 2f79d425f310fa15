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
using mg::testing::unit_roundoff;

namespace {

enum class Kind {
  Normal,    // N(0, 1)
  Positive,  // 0.5 + |N(0, 1)|: logs, square roots, divisors, variances
  Index,     // int64 in [0, range): targets, embedding indices (not rounded)
  Mask,      // int64 0/1
};
struct Input {
  Shape shape;
  Kind kind = Kind::Normal;
  int64_t range = 0;
};
using Run = std::function<std::vector<Tensor>(const std::vector<Tensor>& in, DType low)>;
struct Row {
  std::string name;      // the Backend method(s) it exercises, then what is special
  std::vector<Input> inputs;
  Run run;               // in: the inputs in the run's dtype; low: the 16-bit dtype under test
};

Input normal(Shape s) { return {std::move(s), Kind::Normal, 0}; }
Input positive(Shape s) { return {std::move(s), Kind::Positive, 0}; }
Input index(Shape s, int64_t range) { return {std::move(s), Kind::Index, range}; }
Input mask(Shape s) { return {std::move(s), Kind::Mask, 2}; }

Tensor draw(const Input& in) {
  switch (in.kind) {
    case Kind::Normal: return randn(in.shape);
    case Kind::Positive: return ops::binary_scalar(BinaryOp::Add, ops::unary(UnaryOp::Abs, randn(in.shape)), 0.5);
    case Kind::Index:
    case Kind::Mask: return randint(0, in.range, in.shape);
  }
  return Tensor();
}

// y's values rounded to `low`, in `dtype`: an input a row computes from its inputs (x * 3)
// is rounded in both runs, so that both meet the same numbers.
Tensor rounded_like(const Tensor& y, DType low, DType dtype) {
  return ops::to_dtype(ops::to_dtype(y, low), dtype);
}

// The table. Shapes are odd so that no vector width divides them.
std::vector<Row> rows() {
  using V = std::vector<Tensor>;
  const CrossEntropyOptions smoothing = CrossEntropyOptions().label_smoothing(0.1).ignore_index(2);
  std::vector<Row> r;
  // ---- data ----
  r.push_back({"copy (clone, a strided view)", {normal({5, 7})},
               [](const V& in, DType) { return V{ops::clone(in[0]), ops::contiguous(ops::transpose(in[0], 0, 1))}; }});
  r.push_back({"convert (to float64 and back, to int64)", {normal({5, 7})}, [](const V& in, DType low) {
                 const Tensor x = rounded_like(ops::binary_scalar(BinaryOp::Mul, in[0], 100.0), low, in[0].dtype());
                 const Tensor wide = ops::to_dtype(x, DType::Float64);
                 return V{ops::to_dtype(wide, in[0].dtype()), ops::to_dtype(wide, DType::Int64)};
               }});
  r.push_back({"fill", {normal({3})}, [](const V& in, DType) { return V{full(Shape{5, 3}, 1.0 / 3.0, in[0].dtype())}; }});
  r.push_back({"arange", {normal({3})}, [](const V& in, DType) { return V{arange(-2.0, 3.0, 0.3, in[0].dtype())}; }});
  r.push_back({"random_uniform, random_normal", {normal({3})}, [](const V& in, DType) {
                 manual_seed(7);
                 Tensor u = empty(Shape{9, 11}, in[0].dtype());
                 u.uniform_(-2.0, 3.0);
                 Tensor n = empty(Shape{9, 11}, in[0].dtype());
                 n.normal_(0.5, 2.0);
                 return V{u, n};
               }});
  // ---- elementwise ----
  for (UnaryOp op : {UnaryOp::Neg, UnaryOp::Exp, UnaryOp::Relu, UnaryOp::Abs, UnaryOp::Tanh}) {
    r.push_back({std::string("unary ") + op_name(op), {normal({6, 9})},
                 [op](const V& in, DType) { return V{ops::unary(op, in[0])}; }});
  }
  for (UnaryOp op : {UnaryOp::Log, UnaryOp::Sqrt}) {
    r.push_back({std::string("unary ") + op_name(op), {positive({6, 9})},
                 [op](const V& in, DType) { return V{ops::unary(op, in[0])}; }});
  }
  for (BinaryOp op : {BinaryOp::Add, BinaryOp::Sub, BinaryOp::Mul, BinaryOp::Maximum}) {
    // [6, 9] with [9] (a broadcast row) and with [6, 1] (a broadcast column).
    r.push_back({std::string("binary ") + op_name(op) + " (broadcast)", {normal({6, 9}), normal({9}), normal({6, 1})},
                 [op](const V& in, DType) { return V{ops::binary(op, in[0], in[1]), ops::binary(op, in[2], in[0])}; }});
    r.push_back({std::string("binary_scalar ") + op_name(op), {normal({6, 9})},
                 [op](const V& in, DType) { return V{ops::binary_scalar(op, in[0], 0.3)}; }});
  }
  r.push_back({"binary div", {normal({6, 9}), positive({6, 9})},
               [](const V& in, DType) { return V{ops::binary(BinaryOp::Div, in[0], in[1])}; }});
  r.push_back({"binary_scalar div", {normal({6, 9})},
               [](const V& in, DType) { return V{ops::binary_scalar(BinaryOp::Div, in[0], 0.3)}; }});
  r.push_back({"binary add with alpha (in place: add_)", {normal({6, 9}), normal({6, 9})}, [](const V& in, DType) {
                 Tensor a = ops::clone(in[0]);
                 a.add_(in[1], -0.7);
                 return V{a};
               }});
  r.push_back({"relu_backward", {normal({6, 9}), normal({6, 9})},
               [](const V& in, DType) { return V{ops::relu_backward(in[0], in[1])}; }});
  for (bool tanh_form : {false, true}) {
    const std::string form = tanh_form ? " (tanh)" : " (erf)";
    r.push_back({"gelu" + form, {normal({6, 9})}, [tanh_form](const V& in, DType) { return V{ops::gelu(in[0], tanh_form)}; }});
    r.push_back({"gelu_backward" + form, {normal({6, 9}), normal({6, 9})},
                 [tanh_form](const V& in, DType) { return V{ops::gelu_backward(in[0], in[1], tanh_form)}; }});
  }
  r.push_back({"masked_fill (int64 and 16-bit masks)", {normal({6, 9}), mask({6, 9}), mask({9})}, [](const V& in, DType) {
                 const Tensor float_mask = ops::to_dtype(in[2], in[0].dtype());
                 return V{ops::masked_fill(in[0], in[1], -1.5), ops::masked_fill(in[0], float_mask, 2.0)};
               }});
  r.push_back({"dropout", {normal({6, 9})}, [](const V& in, DType) { return V{ops::dropout(in[0], 0.3, 11, 5)}; }});
  // ---- reductions ----
  r.push_back({"sum (all, over dims, of columns)", {normal({7, 5, 9})}, [](const V& in, DType) {
                 return V{ops::sum(in[0], {}, false), ops::sum(in[0], {0, 2}, true), ops::sum(in[0], {1}, false)};
               }});
  r.push_back({"argmax", {normal({7, 13})}, [](const V& in, DType) { return V{ops::argmax(in[0], -1), ops::argmax(in[0], 0)}; }});
  r.push_back({"abs_max", {normal({7, 13})}, [](const V& in, DType) { return V{ops::abs_max(in[0])}; }});
  // ---- linear algebra ----
  r.push_back({"matmul", {normal({7, 13}), normal({13, 5})},
               [](const V& in, DType) { return V{ops::matmul(in[0], in[1])}; }});
  r.push_back({"matmul (transposed operands)", {normal({13, 7}), normal({5, 13})},
               [](const V& in, DType) { return V{ops::matmul(ops::transpose(in[0], 0, 1), ops::transpose(in[1], 0, 1))}; }});
  r.push_back({"addmm", {normal({5}), normal({7, 13}), normal({5, 13})},
               [](const V& in, DType) { return V{ops::addmm(in[0], in[1], ops::transpose(in[2], 0, 1))}; }});
  r.push_back({"addmm_relu", {normal({5}), normal({7, 13}), normal({5, 13})},
               [](const V& in, DType) { return V{ops::addmm_relu(in[0], in[1], ops::transpose(in[2], 0, 1))}; }});
  r.push_back({"bmm (broadcast batch)", {normal({3, 2, 7, 11}), normal({2, 11, 5})},
               [](const V& in, DType) { return V{ops::bmm(in[0], in[1])}; }});
  // ---- softmax and cross-entropy ----
  r.push_back({"softmax, log_softmax", {normal({7, 13})}, [](const V& in, DType low) {
                 const Tensor x = rounded_like(ops::binary_scalar(BinaryOp::Mul, in[0], 3.0), low, in[0].dtype());
                 return V{ops::softmax(x, -1), ops::log_softmax(x, -1), ops::softmax(x, 0)};
               }});
  r.push_back({"softmax_backward, log_softmax_backward", {normal({7, 13}), normal({7, 13})}, [](const V& in, DType) {
                 return V{ops::softmax_backward(in[0], in[1], -1), ops::log_softmax_backward(in[0], in[1], -1)};
               }});
  r.push_back({"cross_entropy (mean, sum, none; smoothing, ignore_index)", {normal({9, 13}), index({9}, 13)},
               [smoothing](const V& in, DType) {
                 const Tensor x = ops::binary_scalar(BinaryOp::Mul, in[0], 2.0);
                 return V{ops::cross_entropy(x, in[1]),
                          ops::cross_entropy(x, in[1], CrossEntropyOptions().reduction(Reduction::Sum)),
                          ops::cross_entropy(x, in[1], CrossEntropyOptions().reduction(Reduction::None)),
                          ops::cross_entropy(x, in[1], smoothing)};
               }});
  r.push_back({"cross_entropy_backward", {normal({9, 13}), index({9}, 13), normal({9})}, [smoothing](const V& in, DType) {
                 const Tensor one = ops::view(ops::clone(ops::narrow(in[2], 0, 0, 1)), Shape{});
                 return V{ops::cross_entropy_backward(one, in[0], in[1], smoothing),
                          ops::cross_entropy_backward(in[2], in[0], in[1],
                                                      CrossEntropyOptions().reduction(Reduction::None))};
               }});
  // ---- the transformer's ops ----
  r.push_back({"layer_norm (affine, plain; mean and rstd in float32)", {normal({3, 5, 11}), normal({11}), normal({11})},
               [](const V& in, DType low) {
                 // A mean far from 0, rounded as an input.
                 const Tensor x = rounded_like(ops::binary_scalar(BinaryOp::Add, in[0], 4.0), low, in[0].dtype());
                 const ops::LayerNormOutput a = ops::layer_norm(x, 1, in[1], in[2], 1e-5);
                 const ops::LayerNormOutput b = ops::layer_norm(x, 2, Tensor(), Tensor(), 1e-5);
                 return V{a.out, a.mean, a.rstd, b.out};
               }});
  r.push_back({"layer_norm_backward", {normal({3, 5, 11}), normal({11}), normal({3, 5, 11})}, [](const V& in, DType) {
                 const ops::LayerNormOutput f = ops::layer_norm(in[0], 1, in[1], Tensor(), 1e-5);
                 return ops::layer_norm_backward(in[2], in[0], 1, f.mean, f.rstd, in[1], true, true);
               }});
  r.push_back({"embedding", {normal({11, 6}), index({3, 5}, 11)},
               [](const V& in, DType) { return V{ops::embedding(in[0], in[1]), ops::embedding(ops::narrow(in[0], 1, 1, 4), in[1])}; }});
  r.push_back({"embedding_backward (repeated indices)", {normal({3, 8, 6}), index({3, 8}, 5)},
               [](const V& in, DType) { return V{ops::embedding_backward(in[0], in[1], 7)}; }});
  for (bool causal : {false, true}) {
    const std::string c = causal ? " (causal)" : "";
    r.push_back({"attention" + c + ", lse in float32", {normal({2, 3, 9, 5}), normal({2, 3, 11, 5}), normal({2, 3, 11, 7})},
                 [causal](const V& in, DType) {
                   return ops::attention(in[0], in[1], in[2], 0.4, causal, 0.0, 0, 0);
                 }});
    r.push_back({"attention with dropout" + c, {normal({2, 9, 5}), normal({2, 11, 5}), normal({2, 11, 7})},
                 [causal](const V& in, DType) {
                   return V{ops::attention(in[0], in[1], in[2], 0.4, causal, 0.2, 3, 1)[0]};
                 }});
    r.push_back({"attention_backward" + c, {normal({2, 9, 5}), normal({2, 11, 5}), normal({2, 11, 7}), normal({2, 9, 7})},
                 [causal](const V& in, DType low) {
                   // out and lse from float32's forward on the same inputs, out rounded to
                   // the 16-bit dtype in both runs: backward's inputs are the same numbers.
                   const auto wide = [](const Tensor& t) { return ops::to_dtype(t, DType::Float32); };
                   const V f = ops::attention(wide(in[0]), wide(in[1]), wide(in[2]), 0.4, causal, 0.1, 9, 2);
                   const Tensor out = rounded_like(f[0], low, in[0].dtype());
                   return ops::attention_backward(in[3], in[0], in[1], in[2], out, f[1], 0.4, causal, 0.1, 9, 2);
                 }});
  }
  return r;
}

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
  const std::vector<Row> table = rows();
  for (DType dtype : {DType::BFloat16, DType::Float16}) {
    for (size_t r = 0; r < table.size(); ++r) {
      const Row& row = table[r];
      manual_seed(1000 + r);
      std::vector<Tensor> low, wide;
      for (const Input& in : row.inputs) {
        const Tensor x = draw(in);
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
  const std::vector<Row> table = rows();
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
