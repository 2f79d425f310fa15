// What a trace of a DataParallel step shows: its steps by the names the docs use, each
// replica's forward on a worker thread of its own and at the same time as the others,
// each replica's backward, the reduce_add, the optimizer step; autograd nodes only when
// asked for; and no trace buffer at all while tracing is off.
#include "catch_compat.h"

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <set>

#include <minigrad/core/profiler.h>
#include <minigrad/minigrad.h>
#include <minigrad/nn/optim/sgd.h>

#include "parallel/dp_check.h"
#include "trace_check.h"

namespace profiler = mg::profiler;
using mg::Tensor;
using mg::testing::cpus;
using mg::testing::parse_trace;
using mg::testing::ParsedTrace;
using mg::testing::TraceSpan;

namespace {

// Lets `count` threads through together, or fails after a minute (a replica that never
// came would otherwise hang the test).
class Barrier {
 public:
  explicit Barrier(int count) : count_(count) {}
  void arrive_and_wait() {
    std::unique_lock<std::mutex> lock(mutex_);
    const int generation = generation_;
    if (++arrived_ == count_) {
      arrived_ = 0;
      ++generation_;
      all_here_.notify_all();
      return;
    }
    const bool released = all_here_.wait_for(lock, std::chrono::seconds(60),
                                             [&] { return generation_ != generation; });
    MG_CHECK(released, "Barrier: only {} of {} replicas arrived", arrived_, count_);
  }

 private:
  std::mutex mutex_;
  std::condition_variable all_here_;
  int count_, arrived_ = 0, generation_ = 0;
};

// A Linear layer whose forward waits for the forwards of the other replicas before it
// returns, so that the replicas' forwards overlap in time whatever the machine's load:
// each begins before the last one arrives and ends after.
class MeetingLinear : public mg::nn::Cloneable<MeetingLinear> {
 public:
  MeetingLinear(int64_t in, int64_t out, std::shared_ptr<Barrier> barrier)
      : Cloneable<MeetingLinear>("MeetingLinear"), barrier_(std::move(barrier)) {
    register_module("fc", std::make_shared<mg::nn::Linear>(in, out));
  }
  Tensor forward(const Tensor& x) override {
    Tensor y = mg::relu(child("fc")->forward(x));
    barrier_->arrive_and_wait();
    return y;
  }

 private:
  std::shared_ptr<Barrier> barrier_;  // shared by the replicas (shallow copies)
};

// One DataParallel training step over `replicas` CPU replicas, traced with `options`.
ParsedTrace traced_step(size_t replicas, const profiler::ProfilerOptions& options) {
  mg::manual_seed(3);
  auto model = std::make_shared<mg::nn::Sequential>();
  model->push_back(std::make_shared<MeetingLinear>(6, 8, std::make_shared<Barrier>(static_cast<int>(replicas))));
  model->push_back(std::make_shared<mg::nn::Linear>(8, 3));
  mg::parallel::DataParallel dp(model, cpus(replicas));
  mg::optim::SGD sgd(model->parameters(), mg::optim::SGDOptions(0.1));
  const Tensor x = mg::randn({10, 6});  // 4, 4, 2 rows on 3 replicas
  const Tensor y = mg::randint(0, 3, {10});

  profiler::start(options);
  profiler::set_thread_name("main");
  {
    sgd.zero_grad();
    const Tensor loss = mg::cross_entropy(dp.forward(x), y);
    loss.backward();
    sgd.step();
  }
  profiler::stop();
  const std::string json = profiler::chrome_trace_json();
  profiler::clear();
  return parse_trace(json);
}

bool inside(const TraceSpan& inner, const TraceSpan& outer) {
  return inner.pid == outer.pid && inner.tid == outer.tid && inner.ts >= outer.ts - 1e-3 &&
         inner.end() <= outer.end() + 1e-3;
}

TraceSpan only(const ParsedTrace& trace, const std::string& name) {
  const auto found = trace.named(name);
  INFO("spans named '" << name << "'");
  REQUIRE(found.size() == 1);
  return found[0];
}

}  // namespace

TEST_CASE("trace: a DataParallel step over 3 CPU replicas runs 3 replica forwards at once, on 3 threads") {
  const ParsedTrace trace = traced_step(3, {});
  INFO(trace.problem_list());
  REQUIRE(trace.problems.empty());

  std::vector<TraceSpan> forwards;
  std::set<int> threads;
  for (int i = 0; i < 3; ++i) {
    const TraceSpan f = only(trace, fmt::format("replica {} forward", i));
    REQUIRE(f.category == "forward");
    REQUIRE(f.args["replica"] == i);
    REQUIRE(f.args["device"] == "cpu");
    REQUIRE(trace.thread_of(f) == fmt::format("worker {}", i));
    threads.insert(f.tid);
    forwards.push_back(f);
  }
  REQUIRE(threads.size() == 3);
  // All three at once: the last to begin began before the first to end ended.
  double last_start = 0.0, first_end = 1e300;
  for (const TraceSpan& f : forwards) {
    last_start = std::max(last_start, f.ts);
    first_end = std::min(first_end, f.end());
  }
  REQUIRE(last_start < first_end);
}

TEST_CASE("trace: a DataParallel step's spans are named as the docs name its steps") {
  const ParsedTrace trace = traced_step(3, {});
  INFO(trace.problem_list());
  REQUIRE(trace.problems.empty());

  // Forward, on the caller's thread: scatter, replicate (with its broadcast), gather.
  // The first scatter is forward's (the spans come in time order); the second is
  // GatherBackward's, checked below.
  const auto scatters = trace.named("scatter");
  REQUIRE(scatters.size() == 2);
  const TraceSpan scatter = scatters[0];
  const TraceSpan replicate = only(trace, "replicate");
  const TraceSpan broadcast = only(trace, "broadcast");
  REQUIRE(scatter.args["rows"] == "4, 4, 2");
  REQUIRE(replicate.args["replicas"] == 3);
  REQUIRE(inside(broadcast, replicate));
  // Backward: the GatherBackward node scatters the gradient (a second "scatter"), each
  // replica's nodes run, and BroadcastBackward's reduce_add sums their gradients.
  const auto gathers = trace.named("gather");
  REQUIRE(gathers.size() == 1);
  const TraceSpan backward = only(trace, "backward");
  REQUIRE(inside(scatters[1], backward));
  REQUIRE(scatters[1].args["rows"] == "4, 4, 2");
  REQUIRE(trace.thread_of(backward) == "main");
  for (const TraceSpan& s : {scatter, replicate, gathers[0]}) {
    REQUIRE(trace.thread_of(s) == "main");
    REQUIRE(s.category == "data_parallel");
    REQUIRE(s.end() <= backward.ts);
  }
  for (int i = 0; i < 3; ++i) {
    const auto runs = trace.named(fmt::format("replica {} backward", i));
    REQUIRE_FALSE(runs.empty());
    for (const TraceSpan& run : runs) {
      REQUIRE(inside(run, backward));
      REQUIRE(run.args["replica"] == i);
    }
  }
  const TraceSpan reduce_add = only(trace, "reduce_add");
  REQUIRE(inside(reduce_add, backward));
  REQUIRE(reduce_add.args["devices"] == 3);
  const TraceSpan step = only(trace, "SGD.step");
  REQUIRE(step.category == "optimizer");
  REQUIRE(step.ts >= backward.end());
  // The default level has no span per autograd node.
  REQUIRE(trace.named("LinearBackward").empty());
  REQUIRE(trace.named("AccumulateGrad").empty());
}

TEST_CASE("trace: with autograd_nodes, every node's backward is a span named by its op") {
  profiler::ProfilerOptions options;
  options.autograd_nodes = true;
  const ParsedTrace trace = traced_step(3, options);
  INFO(trace.problem_list());
  REQUIRE(trace.problems.empty());
  const TraceSpan backward = only(trace, "backward");
  for (const char* name : {"CrossEntropyBackward", "GatherBackward", "BroadcastBackward"})
    REQUIRE(inside(only(trace, name), backward));
  REQUIRE(trace.named("LinearBackward").size() == 6);  // two layers, three replicas
  // The steps of DataParallel's backward sit inside the nodes that run them.
  REQUIRE(inside(only(trace, "reduce_add"), only(trace, "BroadcastBackward")));
  const auto scatters = trace.named("scatter");
  REQUIRE(scatters.size() == 2);
  REQUIRE(inside(scatters[1], only(trace, "GatherBackward")));
  for (const TraceSpan& node : trace.named("LinearBackward")) REQUIRE(node.category == "autograd");
}

TEST_CASE("trace: while tracing is off, a DataParallel training step makes no trace buffer") {
  REQUIRE_FALSE(profiler::is_enabled());
  const uint64_t before = profiler::thread_buffers_created();
  auto model = mg::testing::make_mlp({6, 8, 3});
  mg::parallel::DataParallel dp(model, cpus(3));
  mg::optim::SGD sgd(model->parameters(), mg::optim::SGDOptions(0.1));
  for (int step = 0; step < 2; ++step) {
    sgd.zero_grad();
    mg::cross_entropy(dp.forward(mg::randn({10, 6})), mg::randint(0, 3, {10})).backward();
    sgd.step();
  }
  REQUIRE(profiler::thread_buffers_created() == before);
}
