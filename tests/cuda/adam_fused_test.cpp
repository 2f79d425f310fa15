// optim::Adam/AdamW's fused step on the GPU (one multi-tensor kernel launch per group of
// tensors, cuda/kernels/optim.cu) against the CPU's fused step, and against the GPU's
// own composition of elementwise ops. All round every product, quotient, sum and root
// on its own (__fmul_rn, __fdiv_rn, __fadd_rn, __fsqrt_rn on the GPU) with the scalars
// rounded to float first, so the comparisons are bit for bit.
#include "adam_options.h"
#include "gpu_compare.h"

#include <cmath>
#include <string>
#include <vector>

#include <minigrad/nn/optim/adam.h>

#if MINIGRAD_WITH_CUDA
#include <cuda_runtime_api.h>

#include <minigrad/cuda/kernels/launch.h>
#endif

using namespace mg;
using mg::cuda_test::gpu;
using mg::cuda_test::random_cpu;
using mg::cuda_test::require_equal;
using mg::testing::adam_of;
using mg::testing::AdamCase;
using mg::testing::all_adam_cases;
using mg::testing::describe;
using mg::testing::make_adam;

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

void require_twins_equal(const Twins& t, const optim::AdamBase& cpu_adam,
                         const optim::AdamBase& gpu_adam) {
  for (size_t k = 0; k < t.cpu.size(); ++k) {
    INFO("parameter " << k << " of shape " << t.cpu[k].shape().str());
    REQUIRE(t.gpu[k].device() == gpu());
    require_equal(t.gpu[k], t.cpu[k]);
    REQUIRE(gpu_adam.step_count(k) == cpu_adam.step_count(k));
    if (cpu_adam.step_count(k) == 0) {
      REQUIRE(gpu_adam.state(k).empty());
      continue;
    }
    REQUIRE(gpu_adam.exp_avg(k).device() == gpu());
    require_equal(gpu_adam.exp_avg(k), cpu_adam.exp_avg(k));
    require_equal(gpu_adam.exp_avg_sq(k), cpu_adam.exp_avg_sq(k));
    REQUIRE(gpu_adam.max_exp_avg_sq(k).defined() == cpu_adam.max_exp_avg_sq(k).defined());
    if (cpu_adam.max_exp_avg_sq(k).defined())
      require_equal(gpu_adam.max_exp_avg_sq(k), cpu_adam.max_exp_avg_sq(k));
  }
}

}  // namespace

TEST_CASE("Adam fused step on the GPU: the CPU's bits for every option, odd sizes, 4 steps") {
  // 257 x 300 spans many of the kernel's chunks; the others end mid-warp or mid-block.
  const std::vector<Shape> shapes = {{1}, {7}, {33}, {1000}, {4097}, {13, 17}, {257, 300}};
  for (const AdamCase& c : all_adam_cases()) {
    INFO(describe(c));
    Twins t = make_twins(shapes, 10);
    auto cpu_opt = make_adam(c, t.cpu), gpu_opt = make_adam(c, t.gpu);
    for (int step = 0; step < 4; ++step) {
      INFO("step " << step + 1);
      set_grads(t, 1000 + 100 * static_cast<uint64_t>(step));
      // Parameter 2 sits out step 2: its step count lags the others' in one launch.
      if (step == 1) {
        t.cpu[2].set_grad(Tensor());
        t.gpu[2].set_grad(Tensor());
      }
      cpu_opt->step();
      gpu_opt->step();
      require_twins_equal(t, adam_of(*cpu_opt), adam_of(*gpu_opt));
    }
  }
}

TEST_CASE("Adam fused step on the GPU: the bits of the GPU's own per-op composition") {
  Backend& cuda = backend(DeviceType::CUDA);
  const std::vector<Shape> shapes = {{7}, {4097}, {13, 17}};
  for (const AdamCase& c : all_adam_cases()) {
    INFO(describe(c));
    std::vector<Tensor> fused[4], composed[4];  // p, m, v, vmax
    for (size_t k = 0; k < shapes.size(); ++k) {
      const Tensor start = random_cpu(shapes[k], 20 + k).to(gpu());
      for (auto* side : {&fused, &composed}) {
        (*side)[0].push_back(ops::clone(start));
        (*side)[1].push_back(zeros(shapes[k], DType::Float32, gpu()));
        (*side)[2].push_back(zeros(shapes[k], DType::Float32, gpu()));
        (*side)[3].push_back(c.amsgrad ? zeros(shapes[k], DType::Float32, gpu()) : Tensor());
      }
    }
    for (int step = 1; step <= 3; ++step) {
      INFO("step " << step);
      AdamStep a = c.step(), b = c.step();
      for (size_t k = 0; k < shapes.size(); ++k) {
        const Tensor g = random_grad(shapes[k], 2000 + 10 * step + k).to(gpu());
        const double t = step;
        const double step_size = c.lr / (1.0 - std::pow(c.beta1, t));
        const double bc2_sqrt = std::sqrt(1.0 - std::pow(c.beta2, t));
        a.tensors.push_back({fused[0][k], g, fused[1][k], fused[2][k], fused[3][k], step_size,
                             bc2_sqrt});
        b.tensors.push_back({composed[0][k], g, composed[1][k], composed[2][k], composed[3][k],
                             step_size, bc2_sqrt});
      }
      cuda.adam_step(a);
      cuda.Backend::adam_step(b);
      for (size_t k = 0; k < shapes.size(); ++k)
        for (int s = 0; s < (c.amsgrad ? 4 : 3); ++s) {
          INFO("tensor " << k << " operand " << s);
          require_equal(fused[s][k], composed[s][k]);
        }
    }
  }
}

TEST_CASE("Adam fused step on the GPU: 150 tensors take several launches, each updated once") {
#if MINIGRAD_WITH_CUDA
  static_assert(150 > 2 * cuda::kernels::kAdamTensorsPerLaunch, "the test must need three launches");
#endif
  std::vector<Shape> shapes;
  for (int64_t k = 0; k < 150; ++k) shapes.push_back(Shape{(k * 37) % 301 + 1});
  shapes[50] = Shape{70001};  // a many-chunk tensor among small ones
  shapes[120] = Shape{3, 4097};
  AdamCase c;
  c.decoupled = true;
  c.weight_decay = 0.1;
  c.amsgrad = true;
  Twins t = make_twins(shapes, 200);
  auto cpu_opt = make_adam(c, t.cpu), gpu_opt = make_adam(c, t.gpu);
  for (int step = 0; step < 3; ++step) {
    INFO("step " << step + 1);
    set_grads(t, 5000 + 1000 * static_cast<uint64_t>(step));
    cpu_opt->step();
    gpu_opt->step();
    require_twins_equal(t, adam_of(*cpu_opt), adam_of(*gpu_opt));
  }
}

TEST_CASE("Adam fused step on the GPU: shards as views at an offset into one flat buffer") {
  // As ZeRO lays them out: parameters and gradients are 1-D views into flat buffers; an
  // offset of 1 leaves every view off any vector alignment.
  const int64_t total = 1 + 7 + 4097;
  AdamCase c;
  c.weight_decay = 0.1;
  Tensor cpu_flat = random_cpu({total}, 300);
  Tensor gpu_flat = cpu_flat.to(gpu());
  Tensor cpu_grads = zeros({total}), gpu_grads = zeros({total}, DType::Float32, gpu());
  const auto shards = [](const Tensor& flat) {
    return std::vector<Tensor>{flat.narrow(0, 1, 7), flat.narrow(0, 8, 4097)};
  };
  Twins t{shards(cpu_flat), shards(gpu_flat)};
  auto cpu_opt = make_adam(c, t.cpu), gpu_opt = make_adam(c, t.gpu);
  for (int step = 0; step < 3; ++step) {
    INFO("step " << step + 1);
    {
      NoGradGuard no_grad;
      const Tensor values = random_grad({total}, 6000 + static_cast<uint64_t>(step));
      cpu_grads.copy_(values);
      gpu_grads.copy_(values);
    }
    const auto cpu_g = shards(cpu_grads), gpu_g = shards(gpu_grads);
    for (size_t k = 0; k < 2; ++k) {
      t.cpu[k].set_grad(cpu_g[k]);
      t.gpu[k].set_grad(gpu_g[k]);
    }
    REQUIRE(t.gpu[1].storage_offset() == 8);
    const Tensor grads_before = ops::clone(cpu_grads);
    cpu_opt->step();
    gpu_opt->step();
    require_twins_equal(t, adam_of(*cpu_opt), adam_of(*gpu_opt));
    require_equal(gpu_flat, cpu_flat);
    require_equal(gpu_grads, grads_before);  // gradients are read, never written
  }
}

TEST_CASE("Adam fused step: parameters on the CPU and the GPU in one optimizer, one call each") {
  const std::vector<Shape> shapes = {{33}, {4097}, {13, 17}, {1000}};
  AdamCase c;
  c.decoupled = true;
  c.weight_decay = 1e-2;
  Twins reference = make_twins(shapes, 400);
  std::vector<Tensor> mixed;
  for (size_t k = 0; k < shapes.size(); ++k)
    mixed.push_back(k % 2 == 0 ? reference.gpu[k]
                               : ops::clone(reference.cpu[k]).set_requires_grad(true));
  auto cpu_opt = make_adam(c, reference.cpu), mixed_opt = make_adam(c, mixed);
  for (int step = 0; step < 3; ++step) {
    INFO("step " << step + 1);
    for (size_t k = 0; k < shapes.size(); ++k) {
      const Tensor g = random_grad(shapes[k], 7000 + 10 * static_cast<uint64_t>(step) + k);
      reference.cpu[k].set_grad(g);
      mixed[k].set_grad(g.to(mixed[k].device()));
    }
    cpu_opt->step();
    mixed_opt->step();
    for (size_t k = 0; k < shapes.size(); ++k) {
      INFO("parameter " << k);
      REQUIRE(mixed[k].device() == (k % 2 == 0 ? gpu() : Device::cpu()));
      REQUIRE(adam_of(*mixed_opt).exp_avg(k).device() == mixed[k].device());
      REQUIRE(adam_of(*mixed_opt).state(k).at("step").device() == Device::cpu());
      require_equal(mixed[k], reference.cpu[k]);
      require_equal(adam_of(*mixed_opt).exp_avg_sq(k), adam_of(*cpu_opt).exp_avg_sq(k));
    }
  }
}

TEST_CASE("AdamW state saved from the GPU resumes on the CPU and back, bit for bit") {
  const std::vector<Shape> shapes = {{33}, {13, 17}};
  AdamCase c;
  c.decoupled = true;
  c.weight_decay = 0.1;
  c.amsgrad = true;
  Twins t = make_twins(shapes, 500);
  auto cpu_opt = make_adam(c, t.cpu), gpu_opt = make_adam(c, t.gpu);
  for (int step = 0; step < 2; ++step) {
    set_grads(t, 8000 + 100 * static_cast<uint64_t>(step));
    cpu_opt->step();
    gpu_opt->step();
  }
  // Swap the states: each optimizer continues from the other's (copied across devices).
  const optim::TensorDict from_gpu = gpu_opt->state_dict(), from_cpu = cpu_opt->state_dict();
  cpu_opt->load_state_dict(from_gpu);
  gpu_opt->load_state_dict(from_cpu);
  REQUIRE(adam_of(*gpu_opt).exp_avg(0).device() == gpu());
  for (int step = 2; step < 4; ++step) {
    set_grads(t, 8000 + 100 * static_cast<uint64_t>(step));
    cpu_opt->step();
    gpu_opt->step();
    require_twins_equal(t, adam_of(*cpu_opt), adam_of(*gpu_opt));
  }
}

#if MINIGRAD_WITH_CUDA
TEST_CASE("Adam's step inside a CUDA graph capture is an error that says why") {
  const std::vector<Shape> shapes = {{33}, {4097}};
  AdamCase c;
  Twins t = make_twins(shapes, 600);
  auto cpu_opt = make_adam(c, t.cpu), gpu_opt = make_adam(c, t.gpu);
  // One eager step first, as a captured training step would have; the capture still fails.
  set_grads(t, 9000);
  cpu_opt->step();
  gpu_opt->step();
  set_grads(t, 9100);
  cuda::synchronize(0);
  const auto stream = static_cast<cudaStream_t>(cuda::current_stream(0).handle);
  REQUIRE(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal) == cudaSuccess);
  std::string failure;
  try {
    gpu_opt->step();
  } catch (const std::exception& e) {
    failure = e.what();
  }
  cudaGraph_t graph = nullptr;
  const cudaError_t end = cudaStreamEndCapture(stream, &graph);
  if (graph != nullptr) CHECK(cudaGraphDestroy(graph) == cudaSuccess);
  REQUIRE(end == cudaSuccess);
  CHECK_THAT(failure, MG_CONTAINS("Adam's step cannot be captured in a CUDA graph"));
  // Nothing moved: the step counts are as before, and the step runs eagerly afterwards.
  for (size_t k = 0; k < shapes.size(); ++k) CHECK(adam_of(*gpu_opt).step_count(k) == 1);
  cpu_opt->step();
  gpu_opt->step();
  require_twins_equal(t, adam_of(*cpu_opt), adam_of(*gpu_opt));
}
#endif
