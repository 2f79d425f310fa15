// gemm-bench: one matrix product C = A @ B, [n, n] @ [n, n], in float32, bfloat16 and
// float16, timed on the CPU (or a GPU with --device cuda): what a 16-bit GEMM costs here.
// On the CPU a 16-bit product widens A and B to float32, calls OpenBLAS's sgemm and rounds
// C once (core/cpu/widen.h), so it is float32's time plus three conversions; on a GPU it
// is cuBLAS with 16-bit inputs and float32 compute (the tensor cores). Prints one JSON
// line per dtype and size.
//
//   build/bin/gemm-bench                       # n = 256, 512, 1024 on the CPU
//   build/bin/gemm-bench --sizes 4096 --device cuda
#include <chrono>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <minigrad/core/backend.h>
#include <minigrad/core/generator.h>
#include <minigrad/core/ops.h>
#include <minigrad/core/tensor.h>

#include "bench_common.h"

int main(int argc, char** argv) {
  std::vector<int64_t> sizes{256, 512, 1024};
  int steps = 20, warmup = 3;
  std::string device_name = "cpu";
  CLI::App app{"Times an [n, n] @ [n, n] matrix product in float32, bfloat16 and float16."};
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  app.add_option("--sizes", sizes)->capture_default_str();
  app.add_option("--steps", steps)->capture_default_str();
  app.add_option("--warmup", warmup)->capture_default_str();
  app.add_option("--device", device_name, "cpu | cuda")->check(CLI::IsMember({"cpu", "cuda"}));
  CLI11_PARSE(app, argc, argv);
  const mg::Device device = device_name == "cpu" ? mg::Device::cpu() : mg::Device::cuda(0);
  for (int64_t n : sizes) {
    mg::manual_seed(0);
    const mg::Tensor a32 = mg::randn(mg::Shape{n, n}), b32 = mg::randn(mg::Shape{n, n});
    for (mg::DType dtype : {mg::DType::Float32, mg::DType::BFloat16, mg::DType::Float16}) {
      const mg::Tensor a = mg::ops::copy_to(mg::ops::to_dtype(a32, dtype), device);
      const mg::Tensor b = mg::ops::copy_to(mg::ops::to_dtype(b32, dtype), device);
      std::vector<double> ms;
      for (int s = 0; s < warmup + steps; ++s) {
        const auto start = std::chrono::steady_clock::now();
        const mg::Tensor c = mg::ops::matmul(a, b);
        mg::backend(device).synchronize(device.index());
        if (s >= warmup)
          ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
      }
      const double median = minigrad_bench::median(ms);
      fmt::print("{{\"framework\":\"minigrad\",\"work\":\"gemm\",\"device\":\"{}\",\"dtype\":\"{}\",\"n\":{},"
                 "\"steps\":{},\"median_ms\":{:.3f},\"gflops\":{:.1f}}}\n",
                 device_name, mg::dtype_name(dtype), n, steps, median,
                 2.0 * static_cast<double>(n) * n * n / (median * 1e6));
    }
  }
  return 0;
}
