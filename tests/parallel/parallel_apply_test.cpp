// parallel_apply: every replica's forward on a worker thread, grad mode carried over,
// and failures re-thrown in the caller with the replica's index and device.
#include "catch_compat.h"

#include "parallel/dp_check.h"

#include <atomic>
#include <set>
#include <thread>

#include <minigrad/minigrad.h>

using mg::Device;
using mg::Tensor;

using mg::testing::cpus;

namespace {

// Throws when its input has `bad_rows` rows.
class FailsOnRows : public mg::nn::Cloneable<FailsOnRows> {
 public:
  explicit FailsOnRows(int64_t bad_rows) : Cloneable<FailsOnRows>("FailsOnRows"), bad_rows_(bad_rows) {}
  Tensor forward(const Tensor& x) override {
    MG_CHECK(x.size(0) != bad_rows_, "FailsOnRows: got {} rows", x.size(0));
    return x * 2.0;
  }

 private:
  int64_t bad_rows_;
};

// Records the thread and grad mode each forward ran with.
struct Seen {
  std::mutex mutex;
  std::set<std::thread::id> threads;
  std::vector<bool> grad_modes;
};
class Recorder : public mg::nn::Cloneable<Recorder> {
 public:
  explicit Recorder(std::shared_ptr<Seen> seen) : Cloneable<Recorder>("Recorder"), seen_(std::move(seen)) {
    register_parameter("weight", mg::ones({1}));
  }
  Tensor forward(const Tensor& x) override {
    {
      std::lock_guard<std::mutex> lock(seen_->mutex);
      seen_->threads.insert(std::this_thread::get_id());
      seen_->grad_modes.push_back(mg::GradMode::is_enabled());
    }
    return x * parameter("weight");
  }

 private:
  std::shared_ptr<Seen> seen_;
};

std::vector<mg::nn::ModulePtr> copies(const mg::nn::ModulePtr& m, size_t n) {
  return std::vector<mg::nn::ModulePtr>(n, m);
}
}  // namespace

TEST_CASE("parallel_apply returns each replica's output in order") {
  auto m = std::make_shared<FailsOnRows>(-1);
  std::vector<Tensor> inputs;
  for (int i = 0; i < 4; ++i) inputs.push_back(mg::full({i + 1, 2}, double(i)));
  const auto outputs = mg::parallel::parallel_apply(copies(m, 4), inputs, cpus(4));
  REQUIRE(outputs.size() == 4);
  for (int i = 0; i < 4; ++i) {
    REQUIRE(outputs[i].size(0) == i + 1);
    REQUIRE(outputs[i].to_vector<float>() == std::vector<float>(size_t(2 * (i + 1)), 2.f * i));
  }
}

TEST_CASE("an exception in a replica is re-thrown with the replica's index and device") {
  auto m = std::make_shared<FailsOnRows>(3);
  const std::vector<Tensor> inputs{mg::zeros({1, 2}), mg::zeros({2, 2}), mg::zeros({3, 2})};
  REQUIRE_THROWS_WITH(mg::parallel::parallel_apply(copies(m, 3), inputs, cpus(3)),
                      MG_CONTAINS("parallel_apply: replica 2 on cpu failed: FailsOnRows: got 3 rows"));
  // Inline path (one replica) reports the same way.
  REQUIRE_THROWS_WITH(mg::parallel::parallel_apply({m}, {mg::zeros({3, 2})}, cpus(1)),
                      MG_CONTAINS("parallel_apply: replica 0 on cpu failed: FailsOnRows: got 3 rows"));
  // Through DataParallel: 30 rows on 4 replicas -> 8 8 8 6; the last one fails.
  mg::parallel::DataParallel dp(std::make_shared<FailsOnRows>(6), cpus(4));
  REQUIRE_THROWS_WITH(dp.forward(mg::zeros({30, 2})),
                      MG_CONTAINS("parallel_apply: replica 3 on cpu failed: FailsOnRows: got 6 rows"));
  // The pool is still usable afterwards.
  REQUIRE(dp.forward(mg::zeros({8, 2})).size(0) == 8);
}

TEST_CASE("parallel_apply runs the replicas on worker threads and one replica inline") {
  auto seen = std::make_shared<Seen>();
  auto m = std::make_shared<Recorder>(seen);
  const std::vector<Tensor> inputs(4, mg::ones({2, 1}));
  mg::parallel::parallel_apply(copies(m, 4), inputs, cpus(4));
  REQUIRE(seen->threads.size() == 4);
  REQUIRE(seen->threads.count(std::this_thread::get_id()) == 0);
  // The pool is persistent: the same threads serve the next call.
  const auto first_threads = seen->threads;
  mg::parallel::parallel_apply(copies(m, 4), inputs, cpus(4));
  REQUIRE(seen->threads == first_threads);

  seen->threads.clear();
  mg::parallel::parallel_apply({m}, {mg::ones({2, 1})}, cpus(1));
  REQUIRE(seen->threads == std::set<std::thread::id>{std::this_thread::get_id()});
}

TEST_CASE("the caller's grad mode is carried into the workers") {
  auto seen = std::make_shared<Seen>();
  auto m = std::make_shared<Recorder>(seen);
  const std::vector<Tensor> inputs(3, mg::ones({2, 1}));
  {
    mg::NoGradGuard no_grad;
    const auto outputs = mg::parallel::parallel_apply(copies(m, 3), inputs, cpus(3));
    for (const Tensor& out : outputs) REQUIRE_FALSE(out.requires_grad());
    mg::parallel::DataParallel dp(m, cpus(3));
    REQUIRE_FALSE(dp.forward(mg::ones({6, 1})).requires_grad());
  }
  REQUIRE(seen->grad_modes == std::vector<bool>(6, false));
  // And back on: the pool's threads must not keep the previous call's mode.
  seen->grad_modes.clear();
  const auto outputs = mg::parallel::parallel_apply(copies(m, 3), inputs, cpus(3));
  for (const Tensor& out : outputs) REQUIRE(out.requires_grad());
  REQUIRE(seen->grad_modes == std::vector<bool>(3, true));
}

TEST_CASE("parallel_apply checks its arguments") {
  auto m = std::make_shared<FailsOnRows>(-1);
  REQUIRE_THROWS_WITH(mg::parallel::parallel_apply(copies(m, 2), {mg::zeros({1})}, cpus(2)),
                      MG_CONTAINS("parallel_apply: got 2 replicas, 1 inputs and 2 devices"));
  REQUIRE(mg::parallel::parallel_apply({}, {}, {}).empty());
}
