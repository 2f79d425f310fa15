// log_softmax and the fused cross-entropy on CUDA against the CPU backend: forward,
// backward through autograd, large logits, and invalid targets.
#include "gpu_compare.h"

using namespace mg;
using mg::cuda_test::gpu;
using mg::cuda_test::random_cpu;
using mg::cuda_test::require_close;

namespace {
Tensor random_targets(int64_t rows, int64_t classes, uint64_t seed) {
  manual_seed(seed);
  return randint(0, classes, {rows});
}
}  // namespace

TEST_CASE("log_softmax matches the CPU, over the last and the first dim") {
  for (int64_t rows : cuda_test::sizes()) {
    for (int64_t classes : {int64_t{1}, int64_t{10}, int64_t{33}, int64_t{1000}, int64_t{4097}}) {
      if (rows * classes > (1 << 22)) continue;
      CAPTURE(rows, classes);
      const Tensor x = random_cpu({rows, classes}, 50);
      const Tensor xg = x.to(gpu());
      require_close(log_softmax(xg), log_softmax(x), 1e-5, 1e-5);
      require_close(log_softmax(xg, 0), log_softmax(x, 0), 1e-5, 1e-5);
      require_close(log_softmax(xg.t()), log_softmax(x.t()), 1e-5, 1e-5);
    }
  }
}

TEST_CASE("log_softmax stays finite for logits of 1000") {
  const Tensor x = random_cpu({33, 10}, 51) * 1000.0;
  const Tensor on_gpu = log_softmax(x.to(gpu()));
  for (float v : on_gpu.to_vector<float>()) REQUIRE(std::isfinite(v));
  require_close(on_gpu, log_softmax(x), 1e-5, 1e-3);
}

TEST_CASE("log_softmax backward matches the CPU") {
  for (int64_t rows : {int64_t{1}, int64_t{7}, int64_t{1000}}) {
    for (int64_t classes : {int64_t{10}, int64_t{4097}}) {
      CAPTURE(rows, classes);
      const Tensor x = random_cpu({rows, classes}, 52);
      const Tensor w = random_cpu({rows, classes}, 53);
      Tensor xc = x.detach().set_requires_grad(true);
      Tensor xg = x.to(gpu()).detach().set_requires_grad(true);
      (log_softmax(xc) * w).sum().backward();
      (log_softmax(xg) * w.to(gpu())).sum().backward();
      require_close(xg.grad(), xc.grad(), 1e-4, 1e-5);
    }
  }
}

TEST_CASE("cross_entropy forward and backward match the CPU") {
  for (int64_t rows : cuda_test::sizes()) {
    for (int64_t classes : {int64_t{1}, int64_t{10}, int64_t{33}, int64_t{1000}, int64_t{4097}}) {
      if (rows * classes > (1 << 22)) continue;
      CAPTURE(rows, classes);
      const Tensor x = random_cpu({rows, classes}, 54);
      const Tensor t = random_targets(rows, classes, 55);
      Tensor xc = x.detach().set_requires_grad(true);
      Tensor xg = x.to(gpu()).detach().set_requires_grad(true);
      const Tensor loss_cpu = cross_entropy(xc, t);
      const Tensor loss_gpu = cross_entropy(xg, t.to(gpu()));
      REQUIRE(loss_gpu.device() == gpu());
      require_close(loss_gpu, loss_cpu, 1e-5, 1e-6);
      loss_cpu.backward();
      loss_gpu.backward();
      require_close(xg.grad(), xc.grad(), 1e-4, 1e-7);
    }
  }
}

TEST_CASE("cross_entropy of large logits and of strided logits") {
  const Tensor x = random_cpu({7, 10}, 56) * 1000.0;
  const Tensor t = random_targets(7, 10, 57);
  const float loss = cross_entropy(x.to(gpu()), t.to(gpu())).item<float>();
  REQUIRE(std::isfinite(loss));
  REQUIRE(loss == Approx(cross_entropy(x, t).item<float>()).epsilon(1e-5));
  // Transposed logits and a narrowed target vector.
  const Tensor xt = random_cpu({10, 7}, 58);
  const Tensor many = random_targets(14, 10, 59);
  const Tensor every_other = ops::as_strided(many, {7}, {2}, 0);
  require_close(cross_entropy(xt.to(gpu()).t(), ops::as_strided(many.to(gpu()), {7}, {2}, 0)),
                cross_entropy(xt.t(), every_other), 1e-5, 1e-6);
}

TEST_CASE("an invalid cross_entropy target is reported at the next read") {
  const Tensor x = random_cpu({4, 10}, 60).to(gpu());
  const Tensor bad = from_vector(std::vector<int64_t>{1, 2, 10, 3}, {4}, gpu());
  // The kernel cannot throw; the loss is NaN and the error surfaces when the host reads.
  const Tensor loss = cross_entropy(x, bad);
  REQUIRE_THROWS_WITH(loss.item<float>(), MG_CONTAINS("target 10 at row 2 is out of range"));
  // Reported once, then cleared: the NaN itself is still there to see.
  REQUIRE(std::isnan(loss.item<float>()));
  const Tensor negative = from_vector(std::vector<int64_t>{0, -1, 0, 0}, {4}, gpu());
  (void)cross_entropy(x, negative);
  REQUIRE_THROWS_WITH(cuda::synchronize(0), MG_CONTAINS("target -1 at row 1"));
  cuda::synchronize(0);  // the flag is clear again
}

TEST_CASE("cross_entropy options (ignore_index, label_smoothing, reduction) match the CPU") {
  const std::vector<CrossEntropyOptions> options = {
      CrossEntropyOptions(),
      CrossEntropyOptions().label_smoothing(0.1),
      CrossEntropyOptions().ignore_index(3).label_smoothing(0.25).reduction(Reduction::Sum),
      CrossEntropyOptions().label_smoothing(0.2).reduction(Reduction::None),
  };
  for (int64_t rows : cuda_test::sizes()) {
    for (int64_t classes : {int64_t{10}, int64_t{1000}, int64_t{4097}}) {
      if (rows * classes > (1 << 22)) continue;
      for (const CrossEntropyOptions& o : options) {
        CAPTURE(rows, classes, o.ignore_index(), o.label_smoothing(), reduction_name(o.reduction()));
        const Tensor x = random_cpu({rows, classes}, 61);
        std::vector<int64_t> t = random_targets(rows, classes, 62).to_vector<int64_t>();
        for (size_t i = 1; i < t.size(); i += 3) t[i] = o.ignore_index();  // every third row
        const Tensor targets = from_vector(t, {rows});
        Tensor xc = x.detach().set_requires_grad(true);
        Tensor xg = x.to(gpu()).detach().set_requires_grad(true);
        const Tensor loss_cpu = cross_entropy(xc, targets, o);
        const Tensor loss_gpu = cross_entropy(xg, targets.to(gpu()), o);
        require_close(loss_gpu, loss_cpu, 1e-5, 1e-5);
        const Tensor seed = o.reduction() == Reduction::None ? random_cpu({rows}, 63) : Tensor();
        loss_cpu.backward(seed);
        loss_gpu.backward(seed.defined() ? seed.to(gpu()) : Tensor());
        require_close(xg.grad(), xc.grad(), 1e-4, 1e-7);
      }
    }
  }
  // Every row ignored: a NaN mean and a zero gradient, as on the CPU.
  Tensor xg = random_cpu({5, 10}, 64).to(gpu()).detach().set_requires_grad(true);
  const Tensor none_kept = full({5}, -100.0, DType::Int64, gpu());
  const Tensor loss = cross_entropy(xg, none_kept);
  REQUIRE(std::isnan(loss.item<float>()));
  loss.backward();
  require_close(xg.grad(), zeros({5, 10}));
  // A target that is neither a class nor ignore_index is still reported.
  const Tensor bad = from_vector(std::vector<int64_t>{-100, 10, 0, -100, 1}, {5}, gpu());
  const Tensor bad_loss = cross_entropy(xg, bad);
  REQUIRE_THROWS_WITH(bad_loss.item<float>(), MG_CONTAINS("target 10 at row 1"));
}
