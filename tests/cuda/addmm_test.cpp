// addmm (Linear's forward: a @ b + bias on every row) through cuBLASLt with the bias in
// the GEMM's epilogue, against the CPU backend: odd sizes, the transposed weight view
// Linear passes, views starting one float into their buffer, k == 0, TF32, Linear's
// backward, several threads at once, and a CUDA graph capture replayed on new inputs.
#include <algorithm>
#include <array>
#include <string>
#include <thread>
#include <vector>

#include "gpu_compare.h"

#if MINIGRAD_WITH_CUDA
#include <cuda_runtime_api.h>

#include <minigrad/cuda/blas_lt.h>
#endif

using namespace mg;
using mg::cuda_test::gpu;
using mg::cuda_test::random_cpu;
using mg::cuda_test::require_close;

namespace {

void require_addmm_close(const Tensor& actual, const Tensor& expected, int64_t k,
                         double rtol = 1e-4) {
  // cuBLAS(Lt) and OpenBLAS add the k products (and the bias) in different orders.
  require_close(actual, expected, rtol, 1e-4 * std::sqrt(static_cast<double>(k + 1)));
}

// out = x @ w^T + bias as Linear computes it, on the CPU and on the GPU.
void check_linear_shaped_addmm(int64_t m, int64_t k, int64_t n, uint64_t seed) {
  CAPTURE(m, k, n);
  const Tensor x = random_cpu({m, k}, seed);
  const Tensor w = random_cpu({n, k}, seed + 1);
  const Tensor bias = random_cpu({n}, seed + 2);
  const Tensor b = random_cpu({k, n}, seed + 3);
  const Tensor xg = x.to(gpu()), wg = w.to(gpu()), bias_g = bias.to(gpu()), bg = b.to(gpu());
  require_addmm_close(ops::addmm(bias_g, xg, wg.t()), ops::addmm(bias, x, w.t()), k);
  require_addmm_close(ops::addmm(bias_g, xg, bg), ops::addmm(bias, x, b), k);
}

#if MINIGRAD_WITH_CUDA
uint64_t fused_calls() { return cuda::addmm_path_counts().fused; }
uint64_t fallback_calls() { return cuda::addmm_path_counts().fallback; }
#endif

}  // namespace

TEST_CASE("addmm matches the CPU for odd sizes, contiguous and with Linear's transposed weight") {
  const std::vector<std::array<int64_t, 3>> shapes = {
      {1, 1, 1},     {1, 7, 33},   {7, 33, 1},   {33, 1, 7},     {7, 1, 1},
      {33, 7, 1000}, {1000, 33, 7}, {4097, 7, 33}, {1, 4097, 7}, {7, 4097, 33},
      {30, 5, 2},    {64, 128, 96}, {1000, 1000, 33}};
  uint64_t seed = 100;
  for (const auto& shape : shapes) {
    check_linear_shaped_addmm(shape[0], shape[1], shape[2], seed);
    seed += 4;
  }
}

TEST_CASE("addmm reads views that start one float into their buffer, and non-BLAS views") {
  for (int64_t m : cuda_test::sizes()) {
    CAPTURE(m);
    const Tensor wide = random_cpu({m, 40}, 200);
    const Tensor w = random_cpu({33, 12}, 201);
    const Tensor bias_buffer = random_cpu({34}, 202);
    const Tensor wide_g = wide.to(gpu()), wg = w.to(gpu()), bias_buffer_g = bias_buffer.to(gpu());
    // Input columns 1..12 (4-byte aligned, leading dimension 40), a bias one float in.
    const Tensor x = wide.narrow(1, 1, 12), xg = wide_g.narrow(1, 1, 12);
    const Tensor bias = bias_buffer.narrow(0, 1, 33), bias_g = bias_buffer_g.narrow(0, 1, 33);
    require_addmm_close(ops::addmm(bias_g, xg, wg.t()), ops::addmm(bias, x, w.t()), 12);
    // A weight that is itself a view one float in: columns 1..12 of a [33, 13] buffer
    // (leading dimension 13), transposed as Linear passes it.
    const Tensor w_buffer = random_cpu({33, 13}, 203);
    const Tensor w_buffer_g = w_buffer.to(gpu());
    require_addmm_close(ops::addmm(bias_g, xg, w_buffer_g.narrow(1, 1, 12).t()),
                        ops::addmm(bias, x, w_buffer.narrow(1, 1, 12).t()), 12);
    // Every other column: packed before the GEMM.
    const Tensor every_other = ops::as_strided(wide, {m, 12}, {40, 2}, 1);
    const Tensor every_other_g = ops::as_strided(wide_g, {m, 12}, {40, 2}, 1);
    require_addmm_close(ops::addmm(bias_g, every_other_g, wg.t()),
                        ops::addmm(bias, every_other, w.t()), 12);
  }
}

TEST_CASE("addmm with an empty inner dimension gives the bias on every row") {
  const Tensor bias = random_cpu({3}, 210);
  const Tensor a = zeros({5, 0}, DType::Float32, gpu());
  const Tensor b = zeros({0, 3}, DType::Float32, gpu());
  cuda_test::require_equal(ops::addmm(bias.to(gpu()), a, b), bias.expand({5, 3}).contiguous());
  cuda_test::require_equal(ops::addmm(bias.to(gpu()), zeros({0, 4}, DType::Float32, gpu()),
                                      zeros({4, 3}, DType::Float32, gpu())),
                           zeros({0, 3}));
}

TEST_CASE("addmm with TF32 allowed stays within TF32's precision, and exact again after") {
  REQUIRE_FALSE(cuda::allow_tf32());
  const Tensor x = random_cpu({256, 512}, 220);
  const Tensor w = random_cpu({128, 512}, 221);
  const Tensor bias = random_cpu({128}, 222);
  const Tensor expected = ops::addmm(bias, x, w.t());
  const Tensor xg = x.to(gpu()), wg = w.to(gpu()), bias_g = bias.to(gpu());
  cuda::set_allow_tf32(true);
  const Tensor tf32 = ops::addmm(bias_g, xg, wg.t());
  cuda::set_allow_tf32(false);
  // TF32 keeps 10 mantissa bits: ~1e-3 relative per product, ~0.02 over 512 of them.
  require_close(tf32, expected, 2e-2, 0.2);
  require_addmm_close(ops::addmm(bias_g, xg, wg.t()), expected, 512);
}

TEST_CASE("Linear's forward and backward on the GPU match the CPU") {
  const std::vector<std::array<int64_t, 3>> shapes = {
      {30, 5, 2}, {1, 7, 33}, {33, 1, 7}, {7, 33, 1}, {1000, 33, 7}, {257, 64, 10}};
  uint64_t seed = 230;
  for (const auto& shape : shapes) {
    const int64_t m = shape[0], k = shape[1], n = shape[2];
    CAPTURE(m, k, n);
    const Tensor x = random_cpu({m, k}, seed), w = random_cpu({n, k}, seed + 1);
    const Tensor b = random_cpu({n}, seed + 2), dy = random_cpu({m, n}, seed + 3);
    seed += 4;
    struct Run {
      Tensor y, dx, dw, db;
    };
    const auto run = [&](Device device) {
      // detach(): new leaves, even where to() hands back x itself (the CPU run).
      Tensor xd = x.to(device).detach(), wd = w.to(device).detach(), bd = b.to(device).detach();
      xd.set_requires_grad(true);
      wd.set_requires_grad(true);
      bd.set_requires_grad(true);
      const Tensor y = linear(xd, wd, bd);
      sum(y * dy.to(device)).backward();
      return Run{y.detach(), xd.grad(), wd.grad(), bd.grad()};
    };
    const Run cpu_run = run(Device::cpu()), gpu_run = run(gpu());
    require_addmm_close(gpu_run.y, cpu_run.y, k);
    require_addmm_close(gpu_run.dx, cpu_run.dx, n);
    require_addmm_close(gpu_run.dw, cpu_run.dw, m);
    require_addmm_close(gpu_run.db, cpu_run.db, m);
  }
}

TEST_CASE("Linear on a narrowed input view matches the CPU") {
  const Tensor wide = random_cpu({33, 20}, 240);
  const Tensor w = random_cpu({7, 12}, 241), b = random_cpu({7}, 242);
  const Tensor expected = linear(wide.narrow(1, 3, 12), w, b);
  const Tensor actual = linear(wide.to(gpu()).narrow(1, 3, 12), w.to(gpu()), b.to(gpu()));
  require_addmm_close(actual, expected, 12);
}

TEST_CASE("addmm from several threads at once matches the CPU") {
  // DataParallel runs replicas on worker threads: the plan cache, the per-thread handles
  // and the shared descriptors must hold up to concurrent calls on one problem.
  const Tensor x = random_cpu({257, 64}, 250), w = random_cpu({10, 64}, 251);
  const Tensor b = random_cpu({10}, 252);
  const Tensor expected = ops::addmm(b, x, w.t());
  const Tensor xg = x.to(gpu()), wg = w.to(gpu()), bg = b.to(gpu());
  constexpr int kThreads = 4, kCalls = 16;
  std::vector<std::vector<Tensor>> results(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::vector<Tensor>& mine = results[static_cast<size_t>(t)];
      for (int i = 0; i < kCalls; ++i) mine.push_back(ops::addmm(bg, xg, wg.t()));
      cuda::synchronize(0);  // results made on this thread's stream, read after join
    });
  }
  for (auto& thread : threads) thread.join();
  for (const auto& per_thread : results)
    for (const Tensor& r : per_thread) require_addmm_close(r, expected, 64);
}

#if MINIGRAD_WITH_CUDA

TEST_CASE("Linear's forward is one fused cuBLASLt call for aligned and for small odd shapes") {
  // Linear(5, 2) on a batch of 30 (the small training benchmark) and a plain aligned
  // layer: each forward must take the fused path, not the bias-copy fallback.
  using Shape3 = std::array<int64_t, 3>;
  for (const Shape3& shape : {Shape3{30, 5, 2}, Shape3{64, 128, 96}}) {
    const int64_t m = shape[0], k = shape[1], n = shape[2];
    CAPTURE(m, k, n);
    const Tensor x = random_cpu({m, k}, 260), w = random_cpu({n, k}, 261);
    const Tensor b = random_cpu({n}, 262);
    const Tensor xg = x.to(gpu()), wg = w.to(gpu()), bg = b.to(gpu());
    const uint64_t before = fused_calls();
    const Tensor y1 = linear(xg, wg, bg);
    const Tensor y2 = linear(xg, wg, bg);
    CHECK(fused_calls() - before == 2);
    const Tensor expected = linear(x, w, b);
    require_addmm_close(y1, expected, k);
    require_addmm_close(y2, expected, k);
  }
}

TEST_CASE("addmm with a bias off a 16-byte boundary takes the fallback, on one 16 bytes in fused") {
  // cuBLASLt is not told the bias's alignment, and may load it 16 bytes at a time.
  const Tensor x = random_cpu({64, 128}, 265), w = random_cpu({96, 128}, 266);
  const Tensor bias_buffer = random_cpu({100}, 267);
  const Tensor xg = x.to(gpu()), wg = w.to(gpu()), bias_buffer_g = bias_buffer.to(gpu());
  for (int64_t offset : {int64_t{1}, int64_t{2}, int64_t{4}}) {
    CAPTURE(offset);
    const Tensor bias = bias_buffer.narrow(0, offset, 96);
    const Tensor bias_g = bias_buffer_g.narrow(0, offset, 96);
    const uint64_t fused_before = fused_calls(), fallback_before = fallback_calls();
    const Tensor out = ops::addmm(bias_g, xg, wg.t());
    const Tensor out_relu = ops::addmm_relu(bias_g, xg, wg.t());
    const bool aligned = reinterpret_cast<uintptr_t>(bias_g.data_ptr()) % 16 == 0;
    if (offset < 4) REQUIRE_FALSE(aligned);
    CHECK(fused_calls() - fused_before == (aligned ? 2u : 0u));
    CHECK(fallback_calls() - fallback_before == (aligned ? 0u : 2u));
    require_addmm_close(out, ops::addmm(bias, x, w.t()), 128);
    require_addmm_close(out_relu, ops::addmm_relu(bias, x, w.t()), 128);
  }
}

TEST_CASE("addmm captured in a CUDA graph replays on new inputs") {
  const Tensor x0 = random_cpu({33, 64}, 270), x1 = random_cpu({33, 64}, 271);
  const Tensor w = random_cpu({10, 64}, 272), b = random_cpu({10}, 273);
  Tensor xg = x0.to(gpu());
  const Tensor wg = w.to(gpu()), bg = b.to(gpu());
  // One eager call first, as for any capture: streams, handles, the stream's workspace
  // and the cached cuBLASLt plan then exist before capturing.
  require_addmm_close(ops::addmm(bg, xg, wg.t()), ops::addmm(b, x0, w.t()), 64);
  Tensor static_out = zeros({33, 10}, DType::Float32, gpu());
  cuda::synchronize(0);

  const auto stream = static_cast<cudaStream_t>(cuda::current_stream(0).handle);
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  const uint64_t fused_before = fused_calls();
  REQUIRE(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal) == cudaSuccess);
  std::string failure;
  try {
    NoGradGuard no_grad;
    static_out.copy_(ops::addmm(bg, xg, wg.t()));
  } catch (const std::exception& e) {
    failure = e.what();
  }
  const cudaError_t end = cudaStreamEndCapture(stream, &graph);
  REQUIRE(failure.empty());
  REQUIRE(end == cudaSuccess);
  CHECK(fused_calls() - fused_before == 1);
  REQUIRE(cudaGraphInstantiate(&exec, graph, 0) == cudaSuccess);

  REQUIRE(cudaGraphLaunch(exec, stream) == cudaSuccess);
  cuda::synchronize(0);
  require_addmm_close(static_out, ops::addmm(b, x0, w.t()), 64);
  // The graph reads x's memory when replayed: new values there give a new product.
  xg.copy_(x1.to(gpu()));
  REQUIRE(cudaGraphLaunch(exec, stream) == cudaSuccess);
  cuda::synchronize(0);
  require_addmm_close(static_out, ops::addmm(b, x1, w.t()), 64);

  CHECK(cudaGraphExecDestroy(exec) == cudaSuccess);
  CHECK(cudaGraphDestroy(graph) == cudaSuccess);
}

#endif  // MINIGRAD_WITH_CUDA

#if MINIGRAD_WITH_CUDA
TEST_CASE("addmm_relu and linear_relu match the CPU, through the fused epilogue and the fallback") {
  // {m, k, n}: Linear shapes; k == 1 takes the fallback (GEMM, then a ReLU kernel).
  const std::vector<std::array<int64_t, 3>> shapes = {
      {30, 5, 2}, {256, 784, 512}, {33, 17, 65}, {7, 1, 9}, {1, 64, 3}};
  uint64_t seed = 300;
  for (const auto& [m, k, n] : shapes) {
    CAPTURE(m, k, n);
    const Tensor x = random_cpu({m, k}, ++seed), w = random_cpu({n, k}, ++seed);
    const Tensor b = random_cpu({n}, ++seed), dy = random_cpu({m, n}, ++seed);
    const Tensor xg = x.to(gpu()), wg = w.to(gpu()), bg = b.to(gpu());
    const uint64_t fused_before = fused_calls();
    const Tensor yg = ops::addmm_relu(bg, xg, wg.t());
    if (k > 1) CHECK(fused_calls() - fused_before == 1);
    const Tensor y = ops::addmm_relu(b, x, w.t());
    require_addmm_close(yg, y, k);
    // Some outputs were clipped, and the clipped ones are exactly zero on the GPU too.
    const auto values = yg.to_vector<float>();
    if (values.size() > 8) CHECK(std::count(values.begin(), values.end(), 0.0f) > 0);

    // Through autograd: the node keeps the output as the ReLU mask. The expected
    // gradients use the GPU's own mask, since an output within rounding of zero may be
    // clipped on one backend and not on the other.
    Tensor xlg = xg.detach().set_requires_grad(true), wlg = wg.detach().set_requires_grad(true);
    Tensor blg = bg.detach().set_requires_grad(true);
    linear_relu(xlg, wlg, blg).backward(dy.to(gpu()));
    const Tensor dpre = ops::relu_backward(dy, yg.to(Device::cpu()));
    require_addmm_close(xlg.grad(), ops::matmul(dpre, w), n);
    require_addmm_close(wlg.grad(), ops::matmul(ops::transpose(dpre, 0, 1), x), m);
    require_addmm_close(blg.grad(), ops::sum(dpre, {0}, false), m);
  }
}
#endif  // MINIGRAD_WITH_CUDA

#if MINIGRAD_WITH_CUDA
TEST_CASE("addmm_relu and linear_relu keep NaN as the CPU and PyTorch do, fused or not") {
  // cuBLASLt's RELU epilogue is max(x, 0), which would turn these NaNs into 0; the CUDA
  // backend runs the BIAS epilogue and its own ReLU kernel instead (cuda/blas_lt.cpp).
  const std::vector<std::array<int64_t, 3>> shapes = {{30, 5, 2}, {33, 17, 65}, {7, 1, 9}};
  uint64_t seed = 400;
  for (const auto& [m, k, n] : shapes) {
    CAPTURE(m, k, n);
    std::vector<float> wv = random_cpu({n, k}, ++seed).to_vector<float>();
    wv[0] = NAN;  // output feature 0 of every row
    const Tensor x = random_cpu({m, k}, ++seed), w = from_vector(wv, {n, k});
    const Tensor b = random_cpu({n}, ++seed);
    const Tensor yg = ops::addmm_relu(b.to(gpu()), x.to(gpu()), w.to(gpu()).t());
    const Tensor y = ops::addmm_relu(b, x, w.t());
    require_addmm_close(yg, y, k);
    const auto values = yg.to_vector<float>();
    for (int64_t i = 0; i < m; ++i) CHECK(std::isnan(values[static_cast<size_t>(i * n)]));
    require_addmm_close(linear_relu(x.to(gpu()), w.to(gpu()), b.to(gpu())),
                        relu(linear(x, w, b)), k);
  }
}
#endif  // MINIGRAD_WITH_CUDA
