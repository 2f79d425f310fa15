// Elementwise ops on CUDA against the CPU backend: contiguous, broadcast (stride-0),
// transposed and narrowed inputs, float32 and int64, out of place and in place.
#include "gpu_compare.h"

using namespace mg;
using mg::cuda_test::gpu;
using mg::cuda_test::random_cpu;
using mg::cuda_test::require_close;
using mg::cuda_test::require_equal;

TEST_CASE("unary ops match the CPU on contiguous and transposed inputs") {
  for (int64_t n : cuda_test::sizes()) {
    CAPTURE(n);
    const Tensor x = random_cpu({n, 3}, 1);
    const Tensor positive = add(x * x, 0.1);  // log's domain
    const Tensor xg = x.to(gpu()), pg = positive.to(gpu());
    require_equal(neg(xg), neg(x));
    require_equal(relu(xg), relu(x));
    require_close(exp(xg), exp(x), 1e-6, 1e-7);
    require_close(log(pg), log(positive), 1e-6, 1e-6);
    // A transposed view: the kernel walks it with strides, no copy first.
    require_equal(relu(xg.t()), relu(x.t()));
    require_close(exp(xg.t()), exp(x.t()), 1e-6, 1e-7);
    REQUIRE(relu(xg).device() == gpu());
  }
}

TEST_CASE("binary ops match the CPU, with broadcasting and views") {
  for (int64_t n : cuda_test::sizes()) {
    CAPTURE(n);
    const Tensor a = random_cpu({n, 5}, 2);
    const Tensor row = random_cpu({5}, 3);
    const Tensor column = random_cpu({n, 1}, 4);
    const Tensor divisor = add(random_cpu({n, 5}, 5) * random_cpu({n, 5}, 5), 0.5);
    const Tensor ag = a.to(gpu()), rg = row.to(gpu()), cg = column.to(gpu()),
                 dg = divisor.to(gpu());
    // IEEE +, -, *, / round the same way on both: results are identical.
    require_equal(ag + rg, a + row);
    require_equal(ag - cg, a - column);
    require_equal(ag * rg, a * row);
    require_equal(ag / dg, a / divisor);
    require_equal(cg * rg, column * row);  // both broadcast: [n,1] * [5] -> [n,5]
    // Views as operands: a transposed matrix against a narrowed one.
    const Tensor wide = random_cpu({n, 9}, 6);
    const Tensor wg = wide.to(gpu());
    require_equal(ag.t() + wg.narrow(1, 2, 5).t(), a.t() + wide.narrow(1, 2, 5).t());
    require_equal(ag.narrow(0, 0, (n + 1) / 2) * rg, a.narrow(0, 0, (n + 1) / 2) * row);
  }
}

TEST_CASE("scalar ops match the CPU") {
  for (int64_t n : cuda_test::sizes()) {
    CAPTURE(n);
    const Tensor x = random_cpu({n}, 7);
    const Tensor xg = x.to(gpu());
    require_equal(xg + 2.5, x + 2.5);
    require_equal(xg - 1.25, x - 1.25);
    require_equal(xg * -3.0, x * -3.0);
    require_equal(xg / 4.0, x / 4.0);
    require_equal(2.0 - xg, 2.0 - x);
  }
}

TEST_CASE("int64 add, sub, mul, div match the CPU") {
  for (int64_t n : cuda_test::sizes()) {
    CAPTURE(n);
    const Tensor a = arange(1, n + 1);           // int64
    const Tensor b = arange(3, 3 + 2 * n, 2);    // int64, no zeros
    const Tensor ag = a.to(gpu()), bg = b.to(gpu());
    REQUIRE(ag.dtype() == DType::Int64);
    require_equal(ag + bg, a + b);
    require_equal(ag - bg, a - b);
    require_equal(ag * bg, a * b);
    require_equal(ag / bg, a / b);
    require_equal(bg / ag, b / a);
    const Tensor one = from_vector(std::vector<int64_t>{7}, {1});
    require_equal(ag * one.to(gpu()), a * one);  // broadcast int64
  }
}

TEST_CASE("in-place updates on views (out aliases the input)") {
  for (int64_t n : cuda_test::sizes()) {
    CAPTURE(n);
    Tensor p = random_cpu({n, 4}, 8);
    const Tensor g = random_cpu({n, 2}, 9);
    Tensor pg = p.to(gpu());
    const Tensor gg = g.to(gpu());
    // An SGD-like step on the middle two columns only.
    NoGradGuard no_grad;
    p.narrow(1, 1, 2).add_(g, -0.1);
    pg.narrow(1, 1, 2).add_(gg, -0.1);
    require_equal(pg, p);
    p.t().mul_(0.5);
    pg.t().mul_(0.5);
    require_equal(pg, p);
    p.mul_(g.narrow(1, 0, 1));  // broadcast [n,1] into [n,4]
    pg.mul_(gg.narrow(1, 0, 1));
    require_equal(pg, p);
  }
}

TEST_CASE("relu backward matches the CPU") {
  for (int64_t n : cuda_test::sizes()) {
    CAPTURE(n);
    const Tensor x = random_cpu({n, 3}, 10);
    const Tensor g = random_cpu({n, 3}, 11);
    require_equal(ops::relu_backward(g.to(gpu()), x.to(gpu())), ops::relu_backward(g, x));
    // Through autograd: d/dx sum(relu(x) * g).
    Tensor xc = x.detach().set_requires_grad(true);
    Tensor xg = x.to(gpu()).detach().set_requires_grad(true);
    (relu(xc) * g).sum().backward();
    (relu(xg) * g.to(gpu())).sum().backward();
    REQUIRE(xg.grad().device() == gpu());
    require_equal(xg.grad(), xc.grad());
  }
}
