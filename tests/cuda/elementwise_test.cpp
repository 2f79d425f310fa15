// Elementwise ops on CUDA against the CPU backend: contiguous, broadcast (stride-0),
// transposed and narrowed inputs, float32 and int64, out of place and in place; the
// vectorized path at its size boundaries and on misaligned views.
#include <limits>

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

TEST_CASE("sqrt, abs and maximum (the optimizers' ops) match the CPU bit for bit") {
  for (int64_t n : cuda_test::sizes()) {
    CAPTURE(n);
    const Tensor x = random_cpu({n, 3}, 12);
    const Tensor y = random_cpu({n, 3}, 13);
    const Tensor squares = x * x;  // sqrt's domain, values of every magnitude
    const Tensor xg = x.to(gpu()), yg = y.to(gpu()), sg = squares.to(gpu());
    require_equal(ops::unary(UnaryOp::Sqrt, sg), ops::unary(UnaryOp::Sqrt, squares));
    require_equal(ops::unary(UnaryOp::Abs, xg), ops::unary(UnaryOp::Abs, x));
    require_equal(ops::binary(BinaryOp::Maximum, xg, yg), ops::binary(BinaryOp::Maximum, x, y));
    require_equal(ops::binary(BinaryOp::Maximum, xg.t(), yg.narrow(1, 0, 1).t()),
                  ops::binary(BinaryOp::Maximum, x.t(), y.narrow(1, 0, 1).t()));
    require_equal(ops::binary_scalar(BinaryOp::Maximum, xg, 0.25),
                  ops::binary_scalar(BinaryOp::Maximum, x, 0.25));
    std::vector<int64_t> va, vb;
    for (int64_t i = 0; i < n; ++i) {
      va.push_back(i - 3);
      vb.push_back((i * 7) % 5);
    }
    const Tensor ia = from_vector(va, {n}), ib = from_vector(vb, {n});
    require_equal(ops::binary(BinaryOp::Maximum, ia.to(gpu()), ib.to(gpu())),
                  ops::binary(BinaryOp::Maximum, ia, ib));
  }
  // NaN wins on either side, as torch.maximum; sqrt of a negative is NaN.
  const float nan = std::nanf("");
  const Tensor a = from_vector(std::vector<float>{nan, 1.0f, -1.0f}, {3});
  const Tensor b = from_vector(std::vector<float>{2.0f, nan, -3.0f}, {3});
  require_equal(ops::binary(BinaryOp::Maximum, a.to(gpu()), b.to(gpu())),
                ops::binary(BinaryOp::Maximum, a, b));
  require_equal(ops::unary(UnaryOp::Sqrt, a.to(gpu())), ops::unary(UnaryOp::Sqrt, a));
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

// ---- the vectorized path (contiguous operands, 16-byte aligned) ----

namespace {
// Sizes around the vector width (4 floats, 2 int64s), the vector kernel's tile (256
// threads x 2 vectors x 4 floats = 2048 elements), and a large odd size.
const std::vector<int64_t>& vector_sizes() {
  static const std::vector<int64_t> values = {1,    3,    4,    5,    7,    8,    9,   1023,
                                              1024, 1025, 2047, 2048, 2049, 4097, (1 << 20) + 3};
  return values;
}
}  // namespace

TEST_CASE("vectorized ops match the CPU at vector and tile boundaries") {
  for (int64_t n : vector_sizes()) {
    CAPTURE(n);
    const Tensor a = random_cpu({n}, 40);
    const Tensor b = random_cpu({n}, 41);
    const Tensor positive = add(a * a, 0.1);
    const Tensor divisor = add(b * b, 0.5);
    const Tensor ag = a.to(gpu()), bg = b.to(gpu()), pg = positive.to(gpu()),
                 dg = divisor.to(gpu());
    require_equal(neg(ag), neg(a));
    require_equal(relu(ag), relu(a));
    require_close(exp(ag), exp(a), 1e-6, 1e-7);
    require_close(log(pg), log(positive), 1e-6, 1e-6);
    require_equal(ag + bg, a + b);
    require_equal(ag - bg, a - b);
    require_equal(ag * bg, a * b);
    require_equal(ag / dg, a / divisor);
    require_equal(ag + 2.5, a + 2.5);
    require_equal(ag - 1.25, a - 1.25);
    require_equal(ag * -3.0, a * -3.0);
    require_equal(ag / 4.0, a / 4.0);
    require_equal(ops::relu_backward(bg, ag), ops::relu_backward(b, a));
    require_equal(full({n}, 3.5, DType::Float32, gpu()), full({n}, 3.5));
    // int64 (2 per vector).
    const Tensor labels = arange(-n, n);
    const Tensor odd = arange(1, 4 * n + 1, 2);  // no zeros
    const Tensor lg = labels.to(gpu()), og = odd.to(gpu());
    require_equal(lg + og, labels + odd);
    require_equal(lg * og, labels * odd);
    require_equal(lg / og, labels / odd);
    require_equal(lg * 3.0, labels * 3.0);
    require_equal(full({n}, -7, DType::Int64, gpu()), full({n}, -7, DType::Int64));
  }
}

TEST_CASE("contiguous views that are not 16-byte aligned match the CPU") {
  // Offsets of 1-3 floats leave the data misaligned for 16-byte loads (the strided
  // path must run); 4 floats is aligned again (the vector path on a view).
  for (int64_t n : {int64_t{1}, int64_t{5}, int64_t{1025}, int64_t{4097}}) {
    for (int64_t offset : {int64_t{1}, int64_t{2}, int64_t{3}, int64_t{4}}) {
      CAPTURE(n, offset);
      const Tensor a = random_cpu({n + 4}, 42);
      const Tensor b = random_cpu({n + 4}, 43);
      const Tensor ag = a.to(gpu()), bg = b.to(gpu());
      const Tensor av = a.narrow(0, offset, n), bv = b.narrow(0, 0, n);
      const Tensor agv = ag.narrow(0, offset, n), bgv = bg.narrow(0, 0, n);
      REQUIRE(agv.is_contiguous());
      require_equal(relu(agv), relu(av));
      require_close(exp(agv), exp(av), 1e-6, 1e-7);
      require_equal(agv * 0.5, av * 0.5);
      require_equal(agv + bgv, av + bv);  // one operand aligned, one not
      require_equal(bgv - agv, bv - av);
      require_equal(agv * agv, av * av);
      require_equal(ops::relu_backward(bgv, agv), ops::relu_backward(bv, av));
      // A misaligned output: fill and an in-place update write through the view, and
      // the elements around it stay as they were.
      Tensor c = random_cpu({n + 4}, 42);  // a fresh copy of a
      Tensor cg = c.to(gpu());
      NoGradGuard no_grad;
      c.narrow(0, offset, n).fill_(2.5);
      cg.narrow(0, offset, n).fill_(2.5);
      require_equal(cg, c);
      c.narrow(0, offset, n).add_(bv, -0.125);
      cg.narrow(0, offset, n).add_(bgv, -0.125);
      require_equal(cg, c);
    }
  }
}

TEST_CASE("in-place add_ with alpha (the SGD step) and mul_ on whole tensors") {
  for (int64_t n : vector_sizes()) {
    CAPTURE(n);
    Tensor p = random_cpu({n}, 44);
    const Tensor g = random_cpu({n}, 45);
    Tensor pg = p.to(gpu());
    const Tensor gg = g.to(gpu());
    NoGradGuard no_grad;
    p.add_(g, -0.01);
    pg.add_(gg, -0.01);
    require_equal(pg, p);
    p.add_(g);  // gradient accumulation: alpha 1
    pg.add_(gg);
    require_equal(pg, p);
    p.add_(p, 0.5);  // both inputs are the output
    pg.add_(pg, 0.5);
    require_equal(pg, p);
    p.mul_(g);
    pg.mul_(gg);
    require_equal(pg, p);
    p.mul_(0.9);
    pg.mul_(0.9);
    require_equal(pg, p);
  }
}

TEST_CASE("relu and its backward treat NaN as the CPU and PyTorch do") {
  for (int64_t n : cuda_test::sizes()) {
    CAPTURE(n);
    std::vector<float> v = random_cpu({n, 3}, 71).to_vector<float>();
    for (size_t i = 0; i < v.size(); i += 5) v[i] = NAN;
    const Tensor x = from_vector(v, {n, 3});
    const Tensor g = random_cpu({n, 3}, 72);
    require_equal(relu(x.to(gpu())), relu(x));
    require_equal(relu(x.to(gpu()).t()), relu(x.t()));
    const Tensor y = relu(x);
    require_equal(ops::relu_backward(g.to(gpu()), y.to(gpu())), ops::relu_backward(g, y));
    const auto out = relu(x.to(gpu())).to_vector<float>();
    CHECK(std::isnan(out[0]));
  }
}

TEST_CASE("int64 division by zero and INT64_MIN / -1 are errors on CUDA too") {
  const Tensor a = from_vector(std::vector<int64_t>{7, std::numeric_limits<int64_t>::min()}, {2},
                               gpu());
  const Tensor zero = from_vector(std::vector<int64_t>{1, 0}, {2}, gpu());
  const Tensor minus_one = from_vector(std::vector<int64_t>{1, -1}, {2}, gpu());
  REQUIRE_THROWS_WITH(a / zero, MG_CONTAINS("ZeroDivisionError") && MG_CONTAINS("cuda:0"));
  REQUIRE_THROWS_WITH(a / minus_one, MG_CONTAINS("integer overflow"));
  REQUIRE_THROWS_WITH(a / 0.0, MG_CONTAINS("ZeroDivisionError"));
  REQUIRE_THROWS_WITH(ops::binary_scalar(BinaryOp::Div, a, -1.0), MG_CONTAINS("integer overflow"));
  require_equal(a / from_vector(std::vector<int64_t>{2, 2}, {2}, gpu()),
                a.to(Device::cpu()) / from_vector(std::vector<int64_t>{2, 2}, {2}));
  // int64 sums and products wrap around as on the CPU.
  const Tensor top = from_vector(std::vector<int64_t>{std::numeric_limits<int64_t>::max(), 3}, {2});
  require_equal(top.to(gpu()) * 2, top * 2);  // an integer scalar keeps int64 (2.0 would not)
  require_equal(top.to(gpu()) + top.to(gpu()), top + top);
}

TEST_CASE("int64 neg, relu and abs stay int64 and wrap at INT64_MIN as on the CPU") {
  const Tensor x = from_vector(
      std::vector<int64_t>{std::numeric_limits<int64_t>::min(), -7, 0, 5, std::numeric_limits<int64_t>::max()}, {5});
  const Tensor xg = x.to(gpu());
  for (const UnaryOp op : {UnaryOp::Neg, UnaryOp::Relu, UnaryOp::Abs}) {
    CAPTURE(op_name(op));
    require_equal(ops::unary(op, xg), ops::unary(op, x));
    CHECK(ops::unary(op, xg).dtype() == DType::Int64);
  }
  // exp of int64 is float32 on both.
  require_equal(ops::unary(UnaryOp::Exp, from_vector(std::vector<int64_t>{-2, 0, 3}, {3}).to(gpu())),
                ops::unary(UnaryOp::Exp, from_vector(std::vector<int64_t>{-2, 0, 3}, {3})));
}
