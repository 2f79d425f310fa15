// optim::SGD's fused step on the GPU (one multi-tensor kernel launch per group of
// tensors, cuda/kernels/optim.cu) against the CPU's fused step. Both round every
// product and sum on its own (__fmul_rn / __fadd_rn on the GPU, no FMA contraction on
// the CPU) with the scalars rounded to float first, so the comparison is bit for bit.
#include "gpu_compare.h"
#include "sgd_options.h"

#include <string>
#include <vector>

#include <minigrad/nn/optim/sgd.h>

#if MINIGRAD_WITH_CUDA
#include <cuda_runtime_api.h>

#include <minigrad/cuda/kernels/launch.h>
#endif

using namespace mg;
using mg::cuda_test::gpu;
using mg::cuda_test::random_cpu;
using mg::cuda_test::require_equal;

using mg::testing::all_sgd_options;

namespace {

// The same parameters on the CPU and on the GPU.
struct Twins {
  std::vector<Tensor> cpu, gpu;
};

Twins make_twins(const std::vector<Shape>& shapes, uint64_t seed) {
  Twins t;
  for (size_t k = 0; k < shapes.size(); ++k) {
    const Tensor start = random_cpu(shapes[k], seed + k);
    t.cpu.push_back(ops::clone(start).set_requires_grad(true));
    t.gpu.push_back(start.to(gpu()).detach().set_requires_grad(true));
  }
  return t;
}

// Gradients of varied magnitude, the same values on both sides.
Tensor random_grad(const Shape& shape, uint64_t seed) {
  return ops::binary_scalar(BinaryOp::Mul, random_cpu(shape, seed), 3.7);
}

void set_grads(const Twins& t, uint64_t seed) {
  for (size_t k = 0; k < t.cpu.size(); ++k) {
    const Tensor g = random_grad(t.cpu[k].shape(), seed + k);
    t.cpu[k].set_grad(g);
    t.gpu[k].set_grad(g.to(gpu()));
  }
}

void require_twins_equal(const Twins& t, const optim::SGD& cpu_sgd, const optim::SGD& gpu_sgd) {
  for (size_t k = 0; k < t.cpu.size(); ++k) {
    INFO("parameter " << k << " of shape " << t.cpu[k].shape().str());
    REQUIRE(t.gpu[k].device() == gpu());
    require_equal(t.gpu[k], t.cpu[k]);
    REQUIRE(gpu_sgd.momentum_buffer(k).defined() == cpu_sgd.momentum_buffer(k).defined());
    if (cpu_sgd.momentum_buffer(k).defined()) {
      REQUIRE(gpu_sgd.momentum_buffer(k).device() == gpu());
      require_equal(gpu_sgd.momentum_buffer(k), cpu_sgd.momentum_buffer(k));
    }
  }
}

}  // namespace

TEST_CASE("SGD fused step on the GPU: the CPU's bits for every option, odd sizes, 4 steps") {
  // 257 x 300 spans many of the kernel's chunks; the others end mid-warp or mid-block.
  const std::vector<Shape> shapes = {{1}, {7}, {33}, {1000}, {4097}, {13, 17}, {257, 300}};
  for (const auto& options : all_sgd_options()) {
    CAPTURE(options.momentum(), options.dampening(), options.weight_decay(), options.nesterov());
    Twins t = make_twins(shapes, 10);
    // One parameter never gets a gradient: skipped on both.
    const Tensor frozen_start = random_cpu({5}, 99);
    t.cpu.push_back(ops::clone(frozen_start).set_requires_grad(true));
    t.gpu.push_back(frozen_start.to(gpu()).detach().set_requires_grad(true));
    optim::SGD cpu_sgd(t.cpu, options);
    optim::SGD gpu_sgd(t.gpu, options);
    Twins with_grads{{t.cpu.begin(), t.cpu.end() - 1}, {t.gpu.begin(), t.gpu.end() - 1}};
    for (int step = 0; step < 4; ++step) {
      INFO("step " << step + 1);
      set_grads(with_grads, 1000 + 100 * static_cast<uint64_t>(step));
      cpu_sgd.step();
      gpu_sgd.step();
      require_twins_equal(t, cpu_sgd, gpu_sgd);
      require_equal(t.gpu.back(), frozen_start);
    }
  }
}

TEST_CASE("SGD fused step on the GPU: 200 tensors take several launches, each tensor updated once") {
#if MINIGRAD_WITH_CUDA
  static_assert(200 > 2 * cuda::kernels::kSgdTensorsPerLaunch, "the test must need three launches");
#endif
  std::vector<Shape> shapes;
  for (int64_t k = 0; k < 200; ++k) shapes.push_back(Shape{(k * 37) % 301 + 1});
  shapes[50] = Shape{70001};  // a many-chunk tensor among small ones
  shapes[150] = Shape{3, 4097};
  const optim::SGDOptions options(0.05, 0.9, 0.0, 1e-2, true);
  Twins t = make_twins(shapes, 200);
  optim::SGD cpu_sgd(t.cpu, options);
  optim::SGD gpu_sgd(t.gpu, options);
  for (int step = 0; step < 3; ++step) {
    INFO("step " << step + 1);
    set_grads(t, 5000 + 1000 * static_cast<uint64_t>(step));
    cpu_sgd.step();
    gpu_sgd.step();
    require_twins_equal(t, cpu_sgd, gpu_sgd);
  }
}

TEST_CASE("SGD fused step on the GPU: gradients as views at an offset into a flat bucket") {
  // As DDP's gradient_as_bucket_view lays them out; offset 1 leaves every view but the
  // first off any vector alignment.
  const std::vector<Shape> shapes = {{7}, {3, 5}, {4097}};
  const int64_t total = 1 + 7 + 15 + 4097;
  const optim::SGDOptions options(0.1, 0.9, 0.1, 1e-2);
  Twins t = make_twins(shapes, 300);
  optim::SGD cpu_sgd(t.cpu, options);
  optim::SGD gpu_sgd(t.gpu, options);
  Tensor cpu_bucket = zeros({total});
  Tensor gpu_bucket = zeros({total}, DType::Float32, gpu());
  for (int step = 0; step < 3; ++step) {
    INFO("step " << step + 1);
    {
      NoGradGuard no_grad;
      const Tensor values = random_grad({total}, 6000 + static_cast<uint64_t>(step));
      cpu_bucket.copy_(values);
      gpu_bucket.copy_(values);
    }
    int64_t offset = 1;
    for (size_t k = 0; k < shapes.size(); ++k) {
      const int64_t n = shapes[k].numel();
      t.cpu[k].set_grad(cpu_bucket.narrow(0, offset, n).view(shapes[k]));
      t.gpu[k].set_grad(gpu_bucket.narrow(0, offset, n).view(shapes[k]));
      REQUIRE(t.gpu[k].grad().is_contiguous());
      REQUIRE(t.gpu[k].grad().storage_offset() == offset);
      offset += n;
    }
    const Tensor bucket_before = ops::clone(cpu_bucket);
    cpu_sgd.step();
    gpu_sgd.step();
    require_twins_equal(t, cpu_sgd, gpu_sgd);
    require_equal(gpu_bucket, bucket_before);  // gradients are read, never written
  }
}

TEST_CASE("SGD fused step: parameters on the CPU and the GPU in one optimizer, one call each") {
  const std::vector<Shape> shapes = {{33}, {4097}, {13, 17}, {1000}};
  const optim::SGDOptions options(0.05, 0.9, 0.0, 1e-2, true);
  Twins reference = make_twins(shapes, 400);
  // Model parallelism: parameters 0 and 2 on the GPU, 1 and 3 on the host.
  std::vector<Tensor> mixed;
  for (size_t k = 0; k < shapes.size(); ++k) {
    mixed.push_back(k % 2 == 0 ? reference.gpu[k]
                               : ops::clone(reference.cpu[k]).set_requires_grad(true));
  }
  optim::SGD cpu_sgd(reference.cpu, options);
  optim::SGD mixed_sgd(mixed, options);
  for (int step = 0; step < 3; ++step) {
    INFO("step " << step + 1);
    for (size_t k = 0; k < shapes.size(); ++k) {
      const Tensor g = random_grad(shapes[k], 7000 + 10 * static_cast<uint64_t>(step) + k);
      reference.cpu[k].set_grad(g);
      mixed[k].set_grad(g.to(mixed[k].device()));
    }
    cpu_sgd.step();
    mixed_sgd.step();
    for (size_t k = 0; k < shapes.size(); ++k) {
      INFO("parameter " << k);
      REQUIRE(mixed[k].device() == (k % 2 == 0 ? gpu() : Device::cpu()));
      REQUIRE(mixed_sgd.momentum_buffer(k).device() == mixed[k].device());
      require_equal(mixed[k], reference.cpu[k]);
      require_equal(mixed_sgd.momentum_buffer(k), cpu_sgd.momentum_buffer(k));
    }
  }
}

#if MINIGRAD_WITH_CUDA
TEST_CASE("SGD step captured in a CUDA graph: replays equal eager steps, nothing allocated") {
  const std::vector<Shape> shapes = {{1}, {33}, {4097}, {128, 784}, {128}, {10, 128}, {10}};
  const optim::SGDOptions options(0.05, 0.9, 0.0, 1e-2, true);
  // Two copies of the same GPU parameters: `eager` steps as usual, `graphed` replays.
  Twins eager = make_twins(shapes, 500), graphed = make_twins(shapes, 500);
  optim::SGD eager_sgd(eager.gpu, options);
  optim::SGD graphed_sgd(graphed.gpu, options);
  // Gradients at fixed addresses, refilled in place before every replay; the first
  // step runs eagerly on both, so the momentum buffers exist before the capture.
  std::vector<Tensor> eager_grads, graphed_grads;
  for (const Shape& s : shapes) {
    eager_grads.push_back(zeros(s, DType::Float32, gpu()));
    graphed_grads.push_back(zeros(s, DType::Float32, gpu()));
  }
  for (size_t k = 0; k < shapes.size(); ++k) {
    eager.gpu[k].set_grad(eager_grads[k]);
    graphed.gpu[k].set_grad(graphed_grads[k]);
  }
  const auto fill_grads = [&](uint64_t seed) {
    NoGradGuard no_grad;
    for (size_t k = 0; k < shapes.size(); ++k) {
      const Tensor g = random_grad(shapes[k], seed + k).to(gpu());
      eager_grads[k].copy_(g);
      graphed_grads[k].copy_(g);
    }
  };
  fill_grads(8000);
  eager_sgd.step();
  graphed_sgd.step();

  cuda::synchronize(0);
  const auto stream = static_cast<cudaStream_t>(cuda::current_stream(0).handle);
  const std::size_t allocated_before = cuda::memory_allocated(0);
  cudaGraph_t graph = nullptr;
  REQUIRE(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal) == cudaSuccess);
  std::string failure;
  try {
    graphed_sgd.step();
  } catch (const std::exception& e) {
    failure = e.what();
  }
  const cudaError_t end = cudaStreamEndCapture(stream, &graph);
  REQUIRE(failure.empty());
  REQUIRE(end == cudaSuccess);
  REQUIRE(cuda::memory_allocated(0) == allocated_before);
  size_t nodes = 0;
  REQUIRE(cudaGraphGetNodes(graph, nullptr, &nodes) == cudaSuccess);
  CHECK(nodes == 1);  // seven tensors: one launch
  cudaGraphExec_t exec = nullptr;
  REQUIRE(cudaGraphInstantiate(&exec, graph, 0) == cudaSuccess);

  for (int step = 1; step < 6; ++step) {
    INFO("step " << step + 1);
    fill_grads(8000 + 100 * static_cast<uint64_t>(step));
    eager_sgd.step();
    REQUIRE(cudaGraphLaunch(exec, stream) == cudaSuccess);
    for (size_t k = 0; k < shapes.size(); ++k) {
      INFO("parameter " << k);
      require_equal(graphed.gpu[k], eager.gpu[k]);
      require_equal(graphed_sgd.momentum_buffer(k), eager_sgd.momentum_buffer(k));
    }
  }
  REQUIRE(cudaGraphExecDestroy(exec) == cudaSuccess);
  REQUIRE(cudaGraphDestroy(graph) == cudaSuccess);
}
#endif

#if MINIGRAD_WITH_CUDA
TEST_CASE("SGD's first momentum step inside a CUDA graph capture is an error that says why") {
  const std::vector<Shape> shapes = {{33}, {4097}};
  const optim::SGDOptions options(0.05, 0.9);
  Twins t = make_twins(shapes, 600);
  optim::SGD cpu_sgd(t.cpu, options);
  optim::SGD gpu_sgd(t.gpu, options);
  set_grads(t, 9000);
  cuda::synchronize(0);
  const auto stream = static_cast<cudaStream_t>(cuda::current_stream(0).handle);
  REQUIRE(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal) == cudaSuccess);
  std::string failure;
  try {
    gpu_sgd.step();
  } catch (const std::exception& e) {
    failure = e.what();
  }
  cudaGraph_t graph = nullptr;
  const cudaError_t end = cudaStreamEndCapture(stream, &graph);
  if (graph != nullptr) CHECK(cudaGraphDestroy(graph) == cudaSuccess);
  REQUIRE(end == cudaSuccess);
  CHECK_THAT(failure, MG_CONTAINS("run one step before the capture"));
  // Nothing was half made: no buffer, and the step runs eagerly afterwards.
  for (size_t k = 0; k < shapes.size(); ++k) CHECK_FALSE(gpu_sgd.momentum_buffer(k).defined());
  cpu_sgd.step();
  gpu_sgd.step();
  require_twins_equal(t, cpu_sgd, gpu_sgd);
}
#endif
