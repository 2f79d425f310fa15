// The transformer's ops on CUDA against the CPU backend, in float32 and float64, on odd
// sizes and strided inputs: batched matmul (cuBLAS strided batched), embedding, layer_norm,
// gelu, tanh, softmax, masked_fill, dropout (the same mask for one seed and offset), dtype
// conversion, and fused attention (values and gradients); float64 through the elementwise
// ops, sum and the 2-D matmul and linear.
#include "gpu_compare.h"

#include <minigrad/core/generator.h>

using namespace mg;
using mg::cuda_test::gpu;
using mg::cuda_test::random_cpu;
using mg::cuda_test::require_close;
using mg::cuda_test::require_equal;

TEST_CASE("transformer ops on CUDA: conversion, gelu, tanh, masked_fill, dropout") {
  for (int64_t n : {1, 7, 33, 1001}) {
    CAPTURE(n);
    const Tensor x = random_cpu({n, 5}, 1);
    const Tensor xg = x.to(gpu());
    require_equal(xg.to(DType::Float64), x.to(DType::Float64));
    require_equal(xg.t().to(DType::Float64), x.t().to(DType::Float64));
    for (const Tensor& v : {x, x.to(DType::Float64)}) {
      const Tensor vg = v.to(gpu());
      const double tol = v.dtype() == DType::Float64 ? 1e-12 : 1e-5;
      require_close(gelu(vg), gelu(v), tol, tol);
      require_close(gelu(vg.t(), "tanh"), gelu(v.t(), "tanh"), tol, tol);
      require_close(tanh(vg), tanh(v), tol, tol);
      const Tensor mask = from_vector(std::vector<int64_t>{1, 0, 0, 1, 0}, {1, 5});
      require_equal(masked_fill(vg, mask.to(gpu()), -3.0), masked_fill(v, mask, -3.0));
      Generator a(7), b(7);
      require_equal(dropout(vg.t(), 0.3, true, &a), dropout(v.t(), 0.3, true, &b));
    }
  }
}

TEST_CASE("transformer ops on CUDA: batched matmul, softmax, layer_norm, embedding") {
  for (DType dtype : {DType::Float32, DType::Float64}) {
    const double tol = dtype == DType::Float64 ? 1e-12 : 1e-4;
    const auto r = [dtype](const Shape& s, uint64_t seed) {
      return ops::to_dtype(random_cpu(s, seed), dtype);
    };
    const Tensor a = r({2, 3, 7, 5}, 2), b = r({3, 5, 9}, 3);
    require_close(matmul(a.to(gpu()), b.to(gpu())), matmul(a, b), tol, tol);
    require_close(matmul(a.to(gpu()).transpose(-1, -2), a.to(gpu())),
                  matmul(a.transpose(-1, -2), a), tol, tol);
    const Tensor s = r({4, 33, 65}, 4);
    for (int64_t dim : {0, 1, 2}) require_close(softmax(s.to(gpu()), dim), softmax(s, dim), tol, tol);
    const Tensor w = r({65}, 5), bias = r({65}, 6);
    require_close(layer_norm(s.to(gpu()), {65}, w.to(gpu()), bias.to(gpu())),
                  layer_norm(s, {65}, w, bias), tol, tol);
    const Tensor table = r({11, 7}, 7);
    const Tensor idx = from_vector(std::vector<int64_t>{3, 0, 3, 10, 1, 3}, {2, 3});
    require_equal(embedding(table.to(gpu()), idx.to(gpu())), embedding(table, idx));
    REQUIRE_THROWS_WITH(embedding(table.to(gpu()), from_vector(std::vector<int64_t>{11}, {1}).to(gpu())),
                        MG_CONTAINS("index 11"));
  }
}

TEST_CASE("transformer ops on CUDA: gradients of layer_norm, embedding and fused attention") {
  for (DType dtype : {DType::Float32, DType::Float64}) {
    const double tol = dtype == DType::Float64 ? 1e-10 : 2e-4;
    for (bool causal : {false, true}) {
      CAPTURE(causal);
      const auto grads = [&](Device device) {
        std::vector<Tensor> leaves;
        for (uint64_t seed : {11, 12, 13}) {
          Tensor t = ops::to_dtype(random_cpu({2, 3, 37, 16}, seed), dtype).to(device);
          t.set_requires_grad(true);
          leaves.push_back(t);
        }
        Generator gen(3);
        Tensor out = scaled_dot_product_attention_fused(leaves[0], leaves[1], leaves[2], causal,
                                                        0.2, &gen);
        out.backward(ops::to_dtype(random_cpu(out.shape(), 14), dtype).to(device));
        return std::vector<Tensor>{out, leaves[0].grad(), leaves[1].grad(), leaves[2].grad()};
      };
      const auto on_gpu = grads(gpu()), on_cpu = grads(Device::cpu());
      for (size_t i = 0; i < on_gpu.size(); ++i) require_close(on_gpu[i].to(Device::cpu()), on_cpu[i], tol, tol);
    }
  }
}

TEST_CASE("float64 on CUDA: elementwise ops, sums, matmul and linear match the CPU") {
  for (int64_t n : {1, 7, 33, 1001}) {
    CAPTURE(n);
    const Tensor a = ops::to_dtype(random_cpu({n, 5}, 21), DType::Float64);
    const Tensor b = ops::to_dtype(random_cpu({5}, 22), DType::Float64);
    const Tensor ag = a.to(gpu()), bg = b.to(gpu());
    require_equal(ag + bg, a + b);
    require_equal(ag * bg - ag / 3.0, a * b - a / 3.0);
    require_close(exp(ag), exp(a), 1e-14, 1e-14);
    require_close(ag.sum({0}), a.sum({0}), 1e-12, 1e-12);
    require_close(ag.sum(), a.sum(), 1e-12, 1e-12);
    const Tensor w = ops::to_dtype(random_cpu({3, 5}, 23), DType::Float64);
    const Tensor bias = ops::to_dtype(random_cpu({3}, 24), DType::Float64);
    require_close(linear(ag, w.to(gpu()), bias.to(gpu())), linear(a, w, bias), 1e-12, 1e-12);
    require_close(matmul(ag.t(), ag), matmul(a.t(), a), 1e-12, 1e-12);
    require_equal(zeros({n}, DType::Float64, gpu()).fill_(0.25), full({n}, 0.25, DType::Float64));
  }
}

TEST_CASE("transformer ops on CUDA: the Llama's rms_norm silu and rotary_embedding with gradients") {
  for (DType dtype : {DType::Float32, DType::Float64}) {
    CAPTURE(dtype);
    // float32: sums of up to 65 terms in another order (the GPU's block sum); 1e-4 as above.
    const double tol = dtype == DType::Float64 ? 1e-10 : 1e-4;
    const auto r = [dtype](const Shape& s, uint64_t seed) { return ops::to_dtype(random_cpu(s, seed), dtype); };
    const auto run = [&](Device device) {
      Tensor x = r({4, 33, 65}, 21).to(device), w = r({65}, 22).to(device);
      Tensor q = r({2, 3, 7, 10}, 23).to(device), a = r({5, 301}, 24).to(device);  // q as [B, H, T, d]
      const Tensor cos = r({7, 5}, 25).to(device), sin = r({7, 5}, 26).to(device);
      for (Tensor* t : {&x, &w, &q, &a}) t->set_requires_grad(true);
      const Tensor y = rms_norm(x, {65}, w), z = rotary_embedding(q.transpose(1, 2), cos, sin),
                   s = silu(a.t());
      (sum(mul(y, r(y.shape(), 27).to(device))) + sum(mul(z, r(z.shape(), 28).to(device))) +
       sum(mul(s, r(s.shape(), 29).to(device))))
          .backward();
      return std::vector<Tensor>{y, z, s, x.grad(), w.grad(), q.grad(), a.grad()};
    };
    const auto on_gpu = run(gpu()), on_cpu = run(Device::cpu());
    for (size_t i = 0; i < on_gpu.size(); ++i) {
      CAPTURE(i);
      require_close(on_gpu[i].to(Device::cpu()), on_cpu[i], tol, tol);
    }
  }
}
