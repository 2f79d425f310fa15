// What a trace of a DistributedDataParallel step shows on 2 Gloo ranks: each bucket
// launched as its gradients are ready, its all-reduce on the group's communication thread
// beginning while backward still computes the gradients of the layers below, and the wait
// for the all-reduces at the end of backward.
#ifdef MINIGRAD_WITH_GLOO

#include <chrono>
#include <mutex>
#include <thread>

#include "catch_compat.h"
#include "multiprocess.h"
#include "trace_check.h"

#include <minigrad/autograd/functions.h>
#include <minigrad/autograd/node.h>
#include <minigrad/core/generator.h>
#include <minigrad/core/ops.h>
#include <minigrad/core/profiler.h>
#include <minigrad/nn/layers.h>
#include <minigrad/nn/optim/sgd.h>
#include <minigrad/parallel/ddp/distributed_data_parallel.h>

using namespace mg;
using namespace mg::parallel;
using namespace mg::test;
using mg::testing::parse_trace;
using mg::testing::ParsedTrace;
using mg::testing::TraceSpan;

namespace {

// A Gloo group that keeps the Work of every all-reduce launched through it after
// watch(), so that a layer's backward can wait for the first one to finish (everything
// else is passed on). DDP's constructor has all-reduces of its own, before watch().
class WatchedGroup final : public ProcessGroup {
 public:
  explicit WatchedGroup(std::shared_ptr<ProcessGroup> inner)
      : ProcessGroup(inner->rank(), inner->size()), inner_(std::move(inner)) {}

  std::string backend_name() const override { return inner_->backend_name(); }
  Device device() const override { return inner_->device(); }
  std::chrono::milliseconds timeout() const override { return inner_->timeout(); }
  std::shared_ptr<Work> allreduce(std::vector<Tensor> tensors, ReduceOp op) override {
    auto work = inner_->allreduce(std::move(tensors), op);
    std::lock_guard<std::mutex> lock(mutex_);
    if (watching_) allreduces_.push_back(work);
    return work;
  }
  std::shared_ptr<Work> broadcast(std::vector<Tensor> tensors, int root) override {
    return inner_->broadcast(std::move(tensors), root);
  }
  std::shared_ptr<Work> barrier() override { return inner_->barrier(); }
  std::shared_ptr<Work> reduce_scatter(Tensor output, Tensor input, ReduceOp op) override {
    return inner_->reduce_scatter(std::move(output), std::move(input), op);
  }
  std::shared_ptr<Work> all_gather(Tensor output, Tensor input) override {
    return inner_->all_gather(std::move(output), std::move(input));
  }
  std::shared_ptr<Work> send(std::vector<Tensor> tensors, int dst, int tag) override {
    return inner_->send(std::move(tensors), dst, tag);
  }
  std::shared_ptr<Work> recv(std::vector<Tensor> tensors, int src, int tag) override {
    return inner_->recv(std::move(tensors), src, tag);
  }
  std::shared_ptr<ProcessGroup> new_group(const std::vector<int>& ranks) override {
    return inner_->new_group(ranks);
  }

  void watch() {
    std::lock_guard<std::mutex> lock(mutex_);
    watching_ = true;
  }
  // Blocks until the first all-reduce launched since watch() has finished.
  void wait_for_first_allreduce() {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    for (;;) {
      {
        std::lock_guard<std::mutex> lock(mutex_);
        if (!allreduces_.empty() && allreduces_[0]->is_completed()) return;
      }
      MG_CHECK(std::chrono::steady_clock::now() < deadline,
               "WatchedGroup: the first all-reduce did not finish within a minute");
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }

 private:
  std::shared_ptr<ProcessGroup> inner_;
  std::mutex mutex_;
  bool watching_ = false;
  std::vector<std::shared_ptr<Work>> allreduces_;
};

// The identity, whose backward waits until the first bucket's all-reduce has finished:
// placed between two layers, it makes the all-reduce of the layers above run while the
// layers below have their gradients still to compute, however loaded the machine.
class WaitForFirstAllReduce : public nn::Cloneable<WaitForFirstAllReduce> {
 public:
  explicit WaitForFirstAllReduce(WatchedGroup* group)
      : nn::Cloneable<WaitForFirstAllReduce>("WaitForFirstAllReduce"), group_(group) {}
  Tensor forward(const Tensor& x) override {
    Tensor out = ops::clone(x);
    record_function("WaitForFirstAllReduceBackward", {x}, {out},
                    [group = group_](const BackwardArgs& g) {
                      group->wait_for_first_allreduce();
                      return std::vector<Tensor>{g.grad()};
                    });
    return out;
  }

 private:
  WatchedGroup* group_;
};

bool inside(const TraceSpan& inner, const TraceSpan& outer) {
  return inner.ts >= outer.ts - 1e-3 && inner.end() <= outer.end() + 1e-3;
}

}  // namespace

TEST_CASE("trace: DDP over 2 Gloo ranks all-reduces a bucket while backward still computes") {
  const auto results = run_ranks(2, [](RankContext& ctx) {
    auto group = std::make_shared<WatchedGroup>(ctx.gloo());
    manual_seed(5);
    // Buckets in reverse order of the parameters: [fc2] first, then [fc1], [fc0].
    auto net = std::make_shared<nn::Sequential>(std::initializer_list<nn::ModulePtr>{
        std::make_shared<nn::Linear>(6, 16), std::make_shared<nn::ReLU>(),
        std::make_shared<nn::Linear>(16, 16), std::make_shared<WaitForFirstAllReduce>(group.get()),
        std::make_shared<nn::ReLU>(), std::make_shared<nn::Linear>(16, 3)});
    DDPOptions options;
    options.first_bucket_mb = 100.0 / (1 << 20);  // 100 bytes: fc2 alone
    options.bucket_cap_mb = 400.0 / (1 << 20);
    DistributedDataParallel ddp(net, group, options);
    optim::SGD sgd(ddp.parameters(), 0.1);
    manual_seed(10 + static_cast<uint64_t>(ctx.rank));
    const Tensor x = randn(Shape{4, 6});
    const Tensor y = randint(0, 3, Shape{4});

    group->watch();
    profiler::start();
    profiler::set_thread_name("main");
    sgd.zero_grad();
    nn::CrossEntropyLoss()(ddp.forward(x), y).backward();
    sgd.step();
    profiler::stop();
    profiler::TraceInfo info;
    info.rank = ctx.rank;
    info.world_size = ctx.world_size;
    ctx.report("trace", profiler::chrome_trace_json(info));
    ctx.report("buckets", std::vector<float>{static_cast<float>(ddp.reducer().bucket_indices().size())});
  });
  INFO(describe(results));
  for (const RankResult& r : results) {
    REQUIRE(r.ok());
    REQUIRE(r.floats("buckets")[0] == 3);
    const ParsedTrace trace = parse_trace(r.text("trace"));
    INFO("rank " << r.rank << trace.problem_list());
    REQUIRE(trace.problems.empty());
    REQUIRE(trace.process_names.at(1 + r.rank) == "rank " + std::to_string(r.rank));

    const auto backwards = trace.named("backward");
    REQUIRE(backwards.size() == 1);
    const TraceSpan backward = backwards[0];
    // Each bucket is launched inside backward, on the main thread, in order.
    std::vector<TraceSpan> ready;
    for (int b = 0; b < 3; ++b) {
      const auto found = trace.named(fmt::format("bucket {} ready", b));
      REQUIRE(found.size() == 1);
      REQUIRE(trace.thread_of(found[0]) == "main");
      REQUIRE(inside(found[0], backward));
      REQUIRE(found[0].args["bucket"] == b);
      ready.push_back(found[0]);
    }
    REQUIRE(ready[0].end() <= ready[1].ts);
    REQUIRE(ready[1].end() <= ready[2].ts);
    // Each bucket's all-reduce runs on the Gloo thread and names its bucket.
    std::vector<TraceSpan> allreduces(3);
    for (const TraceSpan& s : trace.named("allreduce")) {
      const std::string label = s.args.value("for", "");
      for (int b = 0; b < 3; ++b)
        if (label == fmt::format("DDP bucket {}", b)) allreduces[b] = s;
    }
    for (int b = 0; b < 3; ++b) {
      INFO("bucket " << b);
      REQUIRE(allreduces[b].name == "allreduce");
      REQUIRE(allreduces[b].category == "comm");
      REQUIRE_THAT(trace.thread_of(allreduces[b]), MG_CONTAINS("gloo comm thread"));
      REQUIRE(allreduces[b].tid != backward.tid);
      // Launched before backward ended, and never before its bucket was ready.
      REQUIRE(allreduces[b].ts < backward.end());
      REQUIRE(allreduces[b].ts >= ready[b].ts);
    }
    // The first bucket's all-reduce began, and here even ended, before the last bucket's
    // gradients were ready: communication overlapped backward's compute.
    REQUIRE(allreduces[0].end() <= ready[2].ts);
    // Backward ends by waiting for the all-reduces still in flight.
    const auto waits = trace.named("wait for all-reduce");
    REQUIRE(waits.size() == 1);
    REQUIRE(inside(waits[0], backward));
    REQUIRE(waits[0].ts >= ready[2].end());
  }
}

#endif
