// DistributedDataParallel on CPU with Gloo: its step equals the single-process step on the
// whole batch, replicas stay identical, no_sync, unused parameters, and its errors.
#ifdef MINIGRAD_WITH_GLOO

#include <signal.h>

#include <cmath>

#include "catch_compat.h"
#include "multiprocess.h"

#include <minigrad/autograd/functions.h>
#include <minigrad/autograd/grad_mode.h>
#include <minigrad/core/generator.h>
#include <minigrad/nn/layers.h>
#include <minigrad/nn/optim/sgd.h>
#include <minigrad/parallel/c10d/gloo/process_group_gloo.h>
#include <minigrad/parallel/ddp/distributed_data_parallel.h>

using namespace mg;
using namespace mg::parallel;
using namespace mg::test;
using namespace std::chrono_literals;

namespace {

constexpr int64_t kBatch = 8;
constexpr int64_t kIn = 6;
constexpr int64_t kClasses = 3;

nn::ModulePtr make_net(uint64_t seed) {
  manual_seed(seed);
  return std::make_shared<nn::Sequential>(std::initializer_list<nn::ModulePtr>{
      std::make_shared<nn::Linear>(kIn, 16), std::make_shared<nn::ReLU>(),
      std::make_shared<nn::Linear>(16, 16), std::make_shared<nn::ReLU>(),
      std::make_shared<nn::Linear>(16, kClasses)});
}

struct Batch {
  Tensor x, y;
};

Batch make_batch(uint64_t seed, int64_t rows = kBatch) {
  manual_seed(seed);
  return {randn(Shape{rows, kIn}), randint(0, kClasses, Shape{rows})};
}

// Tiny buckets, so a model of ~500 parameters spreads over several of them.
DDPOptions tiny_buckets() {
  DDPOptions o;
  o.first_bucket_mb = 100.0 / (1 << 20);  // 100 bytes
  o.bucket_cap_mb = 400.0 / (1 << 20);
  return o;
}

std::vector<float> flat_values(const std::vector<Tensor>& tensors, bool grads) {
  std::vector<float> out;
  for (const Tensor& t : tensors) {
    const auto v = (grads ? t.grad() : t).contiguous().to_vector<float>();
    out.insert(out.end(), v.begin(), v.end());
  }
  return out;
}

void require_close(const std::vector<float>& a, const std::vector<float>& b, float tol = 1e-5f) {
  REQUIRE(a.size() == b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    INFO("element " << i);
    REQUIRE(std::abs(a[i] - b[i]) <= tol * (1.0f + std::abs(b[i])));
  }
}

// A group of one, in this process (for the single-process checks).
std::shared_ptr<ProcessGroup> single_process_group() {
  TCPStoreOptions options;
  options.is_server = true;
  options.rank = 0;
  auto store = std::make_shared<TCPStore>("127.0.0.1", 0, options);
  return std::make_shared<ProcessGroupGloo>(store, 0, 1);
}

// Two linear branches; the second joins the output only when `use_b`.
class TwoBranch : public nn::Cloneable<TwoBranch> {
 public:
  explicit TwoBranch(bool use_b) : nn::Cloneable<TwoBranch>("TwoBranch"), use_b_(use_b) {
    a_ = register_module("a", std::make_shared<nn::Linear>(4, 3));
    b_ = register_module("b", std::make_shared<nn::Linear>(4, 3));
  }
  Tensor forward(const Tensor& x) override {
    Tensor y = a_->forward(x);
    return use_b_ ? y + b_->forward(x) : y;
  }

 private:
  bool use_b_;
  nn::ModulePtr a_, b_;
};

}  // namespace

TEST_CASE("DistributedDataParallel: one step equals the single-process step on the whole batch") {
  // The reference: one process, the whole batch, rank 0's initial parameters.
  auto reference = make_net(1000);
  const Batch batch = make_batch(7);
  optim::SGD ref_sgd(reference->parameters(), 0.1);
  nn::CrossEntropyLoss()(reference->forward(batch.x), batch.y).backward();
  const auto ref_grads = flat_values(reference->parameters(), true);
  ref_sgd.step();
  const auto ref_params = flat_values(reference->parameters(), false);

  for (int world : {1, 2, 4}) {
    for (bool tiny : {false, true}) {
      DYNAMIC_SECTION("world size " << world << (tiny ? ", tiny buckets" : ", default buckets")) {
        auto results = run_ranks(world, [tiny](RankContext& ctx) {
          // Each rank starts from different weights: DDP's broadcast must make them rank 0's.
          auto net = make_net(1000 + static_cast<uint64_t>(ctx.rank));
          auto ddp = std::make_shared<DistributedDataParallel>(net, ctx.gloo(),
                                                               tiny ? tiny_buckets() : DDPOptions{});
          ctx.report("buckets", std::vector<float>{
                                    static_cast<float>(ddp->reducer().bucket_indices().size())});
          const Batch all = make_batch(7);
          const int64_t per = kBatch / ctx.world_size;
          const Tensor x = all.x.narrow(0, ctx.rank * per, per);
          const Tensor y = all.y.narrow(0, ctx.rank * per, per);
          optim::SGD sgd(ddp->parameters(), 0.1);
          sgd.zero_grad();
          nn::CrossEntropyLoss()(ddp->forward(x), y).backward();
          ctx.report("grads", flat_values(net->parameters(), true));
          sgd.step();
          ctx.report("params", flat_values(net->parameters(), false));
        });
        INFO(describe(results));
        for (const RankResult& r : results) {
          REQUIRE(r.ok());
          if (tiny) REQUIRE(r.floats("buckets")[0] == 3);  // [w2 b2], [w1 b1], [w0 b0]
          require_close(r.floats("grads"), ref_grads);
          require_close(r.floats("params"), ref_params);
        }
      }
    }
  }
}

TEST_CASE("DistributedDataParallel: several steps keep every rank's parameters identical") {
  auto results = run_ranks(2, [](RankContext& ctx) {
    auto net = make_net(2000 + static_cast<uint64_t>(ctx.rank));
    auto ddp = std::make_shared<DistributedDataParallel>(net, ctx.gloo(), tiny_buckets());
    const auto initial = flat_values(net->parameters(), false);
    optim::SGD sgd(ddp->parameters(), optim::SGDOptions(0.05).momentum(0.9));
    for (int step = 0; step < 5; ++step) {
      // Every rank sees different data each step.
      const Batch b = make_batch(static_cast<uint64_t>(100 * step + ctx.rank), 5);
      sgd.zero_grad();
      nn::CrossEntropyLoss()(ddp->forward(b.x), b.y).backward();
      sgd.step();
    }
    ctx.report("initial", initial);
    ctx.report("params", flat_values(net->parameters(), false));
  });
  INFO(describe(results));
  REQUIRE(results[0].ok());
  REQUIRE(results[1].ok());
  // Bit for bit: every rank applies the same averaged gradient.
  REQUIRE(results[0].floats("params") == results[1].floats("params"));
  REQUIRE(results[0].floats("initial") == results[1].floats("initial"));
  REQUIRE(results[0].floats("params") != results[0].floats("initial"));
}

TEST_CASE("DistributedDataParallel: no_sync accumulates locally, the next backward reduces the sum") {
  const int world = 2;
  // Reference: rank r's accumulated gradient is g(x_r1) + g(x_r2); DDP averages over r.
  auto reference = make_net(3000);
  for (int r = 0; r < world; ++r) {
    for (int micro = 0; micro < 2; ++micro) {
      const Batch b = make_batch(static_cast<uint64_t>(10 * r + micro), 4);
      // Scaled by 1/world so the sum over ranks is the average.
      (nn::CrossEntropyLoss()(reference->forward(b.x), b.y) * (1.0 / world)).backward();
    }
  }
  const auto expected = flat_values(reference->parameters(), true);

  auto results = run_ranks(world, [](RankContext& ctx) {
    auto net = make_net(3000);
    auto ddp = std::make_shared<DistributedDataParallel>(net, ctx.gloo(), tiny_buckets());
    const Batch b1 = make_batch(static_cast<uint64_t>(10 * ctx.rank), 4);
    const Batch b2 = make_batch(static_cast<uint64_t>(10 * ctx.rank + 1), 4);
    {
      auto guard = ddp->no_sync();
      nn::CrossEntropyLoss()(ddp->forward(b1.x), b1.y).backward();
    }
    ctx.report("local", flat_values(net->parameters(), true));
    nn::CrossEntropyLoss()(ddp->forward(b2.x), b2.y).backward();
    ctx.report("reduced", flat_values(net->parameters(), true));
  });
  INFO(describe(results));
  REQUIRE(results[0].ok());
  REQUIRE(results[1].ok());
  // Inside no_sync each rank kept its own gradient.
  REQUIRE(results[0].floats("local") != results[1].floats("local"));
  for (const RankResult& r : results) require_close(r.floats("reduced"), expected);
}

TEST_CASE("DistributedDataParallel: gradient_as_bucket_view trains exactly as the copying default") {
  auto results = run_ranks(2, [](RankContext& ctx) {
    auto pg = ctx.gloo();
    std::vector<std::vector<float>> finals;
    for (bool as_view : {false, true}) {
      auto net = make_net(6000);
      DDPOptions options = tiny_buckets();
      options.gradient_as_bucket_view = as_view;
      auto ddp = std::make_shared<DistributedDataParallel>(net, pg, options);
      optim::SGD sgd(ddp->parameters(), optim::SGDOptions(0.05).momentum(0.9));
      for (int step = 0; step < 3; ++step) {
        const Batch b1 = make_batch(static_cast<uint64_t>(20 * step + ctx.rank), 4);
        const Batch b2 = make_batch(static_cast<uint64_t>(20 * step + 10 + ctx.rank), 4);
        net->zero_grad(/*set_to_none=*/step == 0);  // zeros in place later: into the views
        {
          auto guard = ddp->no_sync();
          nn::CrossEntropyLoss()(ddp->forward(b1.x), b1.y).backward();
        }
        nn::CrossEntropyLoss()(ddp->forward(b2.x), b2.y).backward();
        sgd.step();
      }
      finals.push_back(flat_values(net->parameters(), false));
    }
    ctx.report("copying", finals[0]);
    ctx.report("as view", finals[1]);
  });
  INFO(describe(results));
  for (const RankResult& r : results) {
    REQUIRE(r.ok());
    REQUIRE(r.floats("as view") == r.floats("copying"));
  }
  REQUIRE(results[0].floats("as view") == results[1].floats("as view"));
}

TEST_CASE("DistributedDataParallel: find_unused_parameters averages over the ranks that used them") {
  auto results = run_ranks(2, [](RankContext& ctx) {
    manual_seed(4000);
    auto net = std::make_shared<TwoBranch>(/*use_b=*/ctx.rank == 1);
    DDPOptions options;
    options.find_unused_parameters = true;
    auto ddp = std::make_shared<DistributedDataParallel>(net, ctx.gloo(), options);
    manual_seed(5);
    const Tensor x = randn(Shape{2, 4});
    for (int step = 0; step < 2; ++step) {  // twice: the second forward must be accepted
      net->zero_grad();
      ddp->forward(x).sum().backward();
    }
    ctx.report("b.weight", net->parameter("b.weight").grad());
    ctx.report("a.weight", net->parameter("a.weight").grad());
  });
  INFO(describe(results));
  REQUIRE(results[0].ok());
  REQUIRE(results[1].ok());
  // d(sum(x W^T + b))/dW = column sums of x for every row of W; rank 1 alone used b.
  manual_seed(5);
  const auto x = randn(Shape{2, 4}).to_vector<float>();
  std::vector<float> local(12);
  for (int o = 0; o < 3; ++o)
    for (int i = 0; i < 4; ++i) local[static_cast<size_t>(o * 4 + i)] = x[static_cast<size_t>(i)] + x[static_cast<size_t>(4 + i)];
  std::vector<float> half(local);
  for (float& v : half) v /= 2;
  for (const RankResult& r : results) {
    require_close(r.floats("a.weight"), local);
    require_close(r.floats("b.weight"), half);
  }
}

TEST_CASE("DistributedDataParallel: a rank that dies makes backward fail on the others") {
  auto results = run_ranks(2, [](RankContext& ctx) {
    auto net = make_net(9);
    auto ddp = std::make_shared<DistributedDataParallel>(net, ctx.gloo(5s), tiny_buckets());
    const Batch b = make_batch(static_cast<uint64_t>(ctx.rank));
    nn::CrossEntropyLoss()(ddp->forward(b.x), b.y).backward();  // a good step
    if (ctx.rank == 1) ::raise(SIGKILL);
    try {
      nn::CrossEntropyLoss()(ddp->forward(b.x), b.y).backward();
      ctx.report("backward", std::string("returned"));
    } catch (const Error& e) {
      ctx.report("backward", std::string(e.what()));
    }
    try {
      ddp->forward(b.x);
      ctx.report("forward", std::string("returned"));
    } catch (const Error& e) {
      ctx.report("forward", std::string(e.what()));
    }
  });
  INFO(describe(results));
  REQUIRE(results[1].signal == SIGKILL);
  REQUIRE(results[0].ok());
  REQUIRE_THAT(results[0].text("backward"), MG_CONTAINS("ProcessGroupGloo: allreduce"));
  REQUIRE_THAT(results[0].text("backward"), MG_CONTAINS("failed on rank 0 of 2"));
  REQUIRE_THAT(results[0].text("forward"),
               MG_CONTAINS("the gradient reduction of an earlier iteration failed"));
}

TEST_CASE("DistributedDataParallel: different models on different ranks fail on every rank") {
  auto results = run_ranks(2, [](RankContext& ctx) {
    auto net = std::make_shared<nn::Linear>(4, ctx.rank == 0 ? 2 : 3);
    DistributedDataParallel ddp(net, ctx.gloo());
  });
  INFO(describe(results));
  REQUIRE(results[0].exit_code == 1);
  REQUIRE(results[1].exit_code == 1);
  REQUIRE_THAT(results[1].error,
               MG_CONTAINS("rank 1's 'weight' is float32 [3, 4] but rank 0's is float32 [2, 4]"));
  REQUIRE_THAT(results[0].error, MG_CONTAINS("1 rank(s) have parameters or buffers whose shapes"));
}

TEST_CASE("DistributedDataParallel: a parameter that gets no gradient is named at the next forward") {
  auto net = std::make_shared<TwoBranch>(/*use_b=*/false);
  auto ddp = std::make_shared<DistributedDataParallel>(net, single_process_group());
  const Tensor x = randn(Shape{2, 4});
  ddp->forward(x).sum().backward();
  REQUIRE_THROWS_WITH(ddp->forward(x), MG_CONTAINS("parameter(s) 'b.weight', 'b.bias' received no gradient"));
  REQUIRE_THROWS_WITH(ddp->forward(x), MG_CONTAINS("find_unused_parameters = true"));
}

TEST_CASE("DistributedDataParallel: backward twice for one forward is an error") {
  auto net = make_net(1);
  auto ddp = std::make_shared<DistributedDataParallel>(net, single_process_group());
  const Batch b = make_batch(2);
  Tensor loss = nn::CrossEntropyLoss()(ddp->forward(b.x), b.y);
  loss.backward(Tensor(), /*retain_graph=*/true);
  REQUIRE_THROWS_WITH(loss.backward(), MG_CONTAINS("backward ran twice for one forward"));
}

TEST_CASE("DistributedDataParallel: buckets hold parameters in reverse order, the first one small") {
  manual_seed(3);
  auto net = std::make_shared<nn::Sequential>(std::initializer_list<nn::ModulePtr>{
      std::make_shared<nn::Linear>(256, 256), std::make_shared<nn::Linear>(256, 256),
      std::make_shared<nn::Linear>(256, 256)});
  DDPOptions options;
  options.first_bucket_mb = 0.25;  // 256 KiB: one weight and a bias
  options.bucket_cap_mb = 0.5;
  DistributedDataParallel ddp(net, single_process_group(), options);
  // Parameters: 0 w0, 1 b0, 2 w1, 3 b1, 4 w2, 5 b2 (each weight 256 KiB, each bias 1 KiB).
  const auto& buckets = ddp.reducer().bucket_indices();
  REQUIRE(buckets.size() == 2);
  REQUIRE(buckets[0] == std::vector<size_t>{5, 4});
  REQUIRE(buckets[1] == std::vector<size_t>{3, 2, 1, 0});
  REQUIRE(ddp.reducer().bucket_bytes() == std::vector<size_t>{257 * 1024, 514 * 1024});
  REQUIRE(ddp.named_parameters()[0].first == "module.0.weight");
}

TEST_CASE("DistributedDataParallel: no_sync and eval forwards leave gradients local") {
  auto net = make_net(11);
  auto ddp = std::make_shared<DistributedDataParallel>(net, single_process_group());
  const Batch b = make_batch(12);
  {
    NoGradGuard no_grad;
    ddp->forward(b.x);  // evaluation: nothing armed
  }
  nn::CrossEntropyLoss()(ddp->forward(b.x), b.y).backward();
  const auto once = flat_values(net->parameters(), true);
  {
    auto guard = ddp->no_sync();
    nn::CrossEntropyLoss()(ddp->forward(b.x), b.y).backward();
  }
  // With one rank the average is the gradient itself: the no_sync backward doubled it.
  const auto twice = flat_values(net->parameters(), true);
  for (size_t i = 0; i < once.size(); ++i) REQUIRE(twice[i] == Approx(2 * once[i]).margin(1e-7));
  REQUIRE_THROWS_WITH(ddp->clone(), MG_CONTAINS("DistributedDataParallel cannot be copied"));
}

#endif  // MINIGRAD_WITH_GLOO
