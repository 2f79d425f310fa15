// bfloat16 and float16 on CUDA against the CPU: every row of the 16-bit table
// (tests/reduced_float_rows.h: every op of the Backend interface) run on the GPU with the
// CPU run's very inputs, on odd sizes; the GEMMs (cuBLAS and cuBLASLt with CUBLAS_COMPUTE_32F)
// on larger odd shapes and views; stochastic rounding's bits; and a bfloat16 Linear's
// training step.
//
// Both backends compute each 16-bit op in float32 and round once, but their float32 values
// differ where they sum in other orders (GEMMs, reductions, softmax) or call other
// libraries (exp, erf): by a few float32 ulps of the terms summed. Rounded to 16 bits the
// two land on the same value or on neighbours, so a 16-bit output is held to
//
//   |gpu - cpu| <= 2u (|cpu| + max|cpu| / 8)
//
// (u = 2^-8 or 2^-11; the max/8 floor covers an output near 0 that is a cancelling sum, where
// the float32 difference, n 2^-24 sum|terms| for n <= 100 terms, is all there is). Outputs
// kept in float32 (layer norm's statistics, attention's log-sum-exp) are held to float32's
// own 64 ulps of that scale; int64 ones (argmax) must be equal.
#include "gpu_compare.h"
#include "reduced_float_compare.h"
#include "reduced_float_rows.h"

#include <algorithm>

using namespace mg;
using mg::cuda_test::gpu;

namespace {

double max_abs(const Tensor& t) {
  double m = 0.0;
  for (double v : mg::testing::values_of(t))
    if (std::isfinite(v)) m = std::max(m, std::fabs(v));
  return m;
}

}  // namespace

TEST_CASE("reduced floats on CUDA: every backend op in bfloat16 and float16 matches the CPU", "[gpu][reduced_float]") {
  const std::vector<mg::testing::Row> table = mg::testing::reduced_float_rows();
  for (DType dtype : {DType::BFloat16, DType::Float16}) {
    for (size_t r = 0; r < table.size(); ++r) {
      const mg::testing::Row& row = table[r];
      INFO(row.name << " in " << dtype_name(dtype));
      manual_seed(3000 + r);
      std::vector<Tensor> cpu, on_gpu;
      for (const mg::testing::Input& in : row.inputs) {
        Tensor x = mg::testing::draw(in);
        if (x.dtype() != DType::Int64) x = ops::to_dtype(x, dtype);
        cpu.push_back(x);
        on_gpu.push_back(x.to(gpu()));
      }
      const std::vector<Tensor> expected = row.run(cpu, dtype);
      const std::vector<Tensor> actual = row.run(on_gpu, dtype);
      REQUIRE(actual.size() == expected.size());
      for (size_t i = 0; i < actual.size(); ++i) {
        INFO("output " << i);
        REQUIRE(actual[i].device() == gpu());
        REQUIRE(actual[i].dtype() == expected[i].dtype());
        const Tensor got = actual[i].to(Device::cpu());
        if (got.dtype() == DType::Int64) {
          CHECK(got.to_vector<int64_t>() == expected[i].to_vector<int64_t>());
        } else if (got.dtype() == DType::Float32) {
          mg::testing::check_within(row.name, got, expected[i], DType::Float32, 64.0, max_abs(expected[i]));
        } else {
          mg::testing::check_within(row.name, got, expected[i], dtype, 2.0, max_abs(expected[i]) / 8.0);
        }
      }
    }
  }
}

TEST_CASE("reduced floats on CUDA: cuBLAS GEMMs in bfloat16 and float16 on odd shapes and views", "[gpu][reduced_float]") {
  // CUBLAS_COMPUTE_32F: products and sums in float32, one rounding of the result, as the
  // CPU's sgemm on widened copies; their float32 sums differ in order only.
  for (DType dtype : {DType::BFloat16, DType::Float16}) {
    for (int64_t n : {1, 7, 33, 257}) {
      CAPTURE(n);
      manual_seed(static_cast<uint64_t>(n));
      const Tensor a = ops::to_dtype(randn({n, 37}), dtype), b = ops::to_dtype(randn({37, 19}), dtype);
      const Tensor bias = ops::to_dtype(randn({19}), dtype);
      const Tensor wt = ops::to_dtype(randn({19, 37}), dtype);  // a Linear's weight [out, in]
      const Tensor ag = a.to(gpu()), bg = b.to(gpu()), biasg = bias.to(gpu()), wtg = wt.to(gpu());
      const auto compare = [&](const Tensor& g, const Tensor& c) {
        mg::testing::check_within("GEMM", g.to(Device::cpu()), c, dtype, 2.0, max_abs(c) / 8.0);
      };
      compare(ops::matmul(ag, bg), ops::matmul(a, b));
      compare(ops::matmul(ops::transpose(bg, 0, 1), ops::transpose(ag, 0, 1)),
              ops::matmul(ops::transpose(b, 0, 1), ops::transpose(a, 0, 1)));
      // addmm through cuBLASLt's bias epilogue (or its fallback) and addmm_relu.
      compare(ops::addmm(biasg, ag, ops::transpose(wtg, 0, 1)), ops::addmm(bias, a, ops::transpose(wt, 0, 1)));
      compare(ops::addmm_relu(biasg, ag, ops::transpose(wtg, 0, 1)),
              ops::addmm_relu(bias, a, ops::transpose(wt, 0, 1)));
      const Tensor q = ops::to_dtype(randn({3, n, 16}), dtype), k = ops::to_dtype(randn({3, 16, 5}), dtype);
      compare(ops::bmm(q.to(gpu()), k.to(gpu())), ops::bmm(q, k));
    }
  }
}

TEST_CASE("reduced floats on CUDA: stochastic rounding draws the CPU's bits", "[gpu][reduced_float]") {
  // The same Philox uniform per element and the same neighbours: bit for bit.
  manual_seed(9);
  const Tensor x = randn({4097});
  for (DType dtype : {DType::BFloat16, DType::Float16}) {
    const Tensor cpu = ops::round_stochastic(x, dtype, 77, 3);
    const Tensor on_gpu = ops::round_stochastic(x.to(gpu()), dtype, 77, 3).to(Device::cpu());
    CHECK(ops::to_dtype(on_gpu, DType::Float32).to_vector<float>() ==
          ops::to_dtype(cpu, DType::Float32).to_vector<float>());
  }
}

TEST_CASE("reduced floats on CUDA: a bfloat16 Linear's step with float32 masters tracks the CPU's",
          "[gpu][reduced_float]") {
  manual_seed(10);
  auto cpu_model = std::make_shared<nn::Linear>(33, 7);
  cpu_model->to(DType::BFloat16);
  auto gpu_model = std::make_shared<nn::Linear>(33, 7);
  gpu_model->to(DType::BFloat16);
  for (size_t i = 0; i < cpu_model->parameters().size(); ++i) {
    NoGradGuard no_grad;
    gpu_model->parameters()[i].copy_(cpu_model->parameters()[i]);
  }
  gpu_model->to(gpu());
  const Tensor x = ops::to_dtype(randn({9, 33}), DType::BFloat16);
  const auto make = [](std::vector<Tensor> m) {
    return std::make_unique<optim::AdamW>(std::move(m), optim::AdamWOptions(1e-2));
  };
  optim::MasterWeights cpu_opt(cpu_model->parameters(), make), gpu_opt(gpu_model->parameters(), make);
  for (int step = 0; step < 3; ++step) {
    cpu_opt.zero_grad();
    sum(mul(cpu_model->forward(x), cpu_model->forward(x))).backward();
    cpu_opt.step();
    gpu_opt.zero_grad();
    const Tensor xg = x.to(gpu());
    sum(mul(gpu_model->forward(xg), gpu_model->forward(xg))).backward();
    gpu_opt.step();
  }
  // Three steps of lr 1e-2 from the same start: the masters within float32-sum noise of
  // each other (1e-4 of a step's size), the bfloat16 parameters their rounding.
  for (size_t i = 0; i < cpu_model->parameters().size(); ++i) {
    const Tensor c = cpu_opt.parameters()[i], g = gpu_opt.parameters()[i].to(Device::cpu());
    mg::cuda_test::require_close(g, c, 1e-4, 1e-5);
    mg::testing::check_within("parameter", gpu_model->parameters()[i].to(Device::cpu()), cpu_model->parameters()[i],
                              DType::BFloat16, 2.0, max_abs(cpu_model->parameters()[i]) / 8.0);
  }
}
