// The profiler on a GPU: a span given a device times the work queued meanwhile on the
// device's current stream, shown on a track of that (device, stream) in a process of
// the device, beside the host span; the device's allocated bytes are a counter; the
// streams of DataParallel's replicas are tracks of their own. (The whole binary skips,
// exit code 77, on a machine without a GPU.)
#include "catch_compat.h"

#include <set>

#include <minigrad/core/profiler.h>
#include <minigrad/core/stream.h>
#include <minigrad/cuda/cuda.h>
#include <minigrad/minigrad.h>
#include <minigrad/nn/optim/sgd.h>

#include "gpu_compare.h"
#include "trace_check.h"

namespace profiler = mg::profiler;
using mg::cuda_test::gpu;
using mg::testing::parse_trace;

TEST_CASE("profiler on a GPU: a device span is on its stream's track and inside the host's time") {
  const mg::Device device = gpu();
  const mg::Tensor a = mg::randn({512, 512}).to(device);
  profiler::start();
  profiler::set_thread_name("main");
  {
    profiler::Span span(device, "matmuls");
    span.category("forward");
    mg::Tensor c = a;
    for (int i = 0; i < 20; ++i) c = mg::ops::matmul(c, a);
    (void)mg::sum(c).item<float>();  // the host waits, so the device work ends inside the span
  }
  profiler::stop();
  const auto trace = parse_trace(profiler::chrome_trace_json());
  profiler::clear();
  INFO(trace.problem_list());
  REQUIRE(trace.problems.empty());
  const auto spans = trace.named("matmuls");
  REQUIRE(spans.size() == 2);  // the host's and the stream's
  const auto& host = spans[0].pid == 1 ? spans[0] : spans[1];
  const auto& work = spans[0].pid == 1 ? spans[1] : spans[0];
  REQUIRE(host.pid == 1);
  REQUIRE(work.pid == 1000 + device.index());
  REQUIRE(trace.process_names.at(work.pid) == fmt::format("host {}", device));
  REQUIRE(trace.thread_of(work) == "compute stream");
  REQUIRE(work.dur > 0.0);
  // The device ran the work after the host began queueing it and before it read the sum
  // (100 us of slack for the clocks' alignment).
  REQUIRE(work.ts >= host.ts - 100.0);
  REQUIRE(work.end() <= host.end() + 100.0);

  bool counter = false;
  for (const auto& e : trace.json["traceEvents"])
    if (e["ph"] == "C" && e["pid"] == work.pid) counter = e["args"]["bytes"].get<double>() > 0;
  REQUIRE(counter);
}

TEST_CASE("profiler on a GPU: DataParallel's replicas run on streams of their own") {
  const mg::Device device = gpu();
  auto model = std::make_shared<mg::nn::Sequential>();
  model->push_back(std::make_shared<mg::nn::Linear>(32, 64));
  model->push_back(std::make_shared<mg::nn::Linear>(64, 4));
  model->to(device);
  mg::parallel::DataParallel dp(model, {device, device});
  const mg::Tensor x = mg::randn({64, 32}).to(device);
  const mg::Tensor y = mg::randint(0, 4, {64}).to(device);
  mg::cross_entropy(dp.forward(x), y).backward();  // warm-up: the streams and workers
  profiler::start();
  mg::cross_entropy(dp.forward(x), y).backward();
  mg::cuda::synchronize(device.index());
  profiler::stop();
  const auto trace = parse_trace(profiler::chrome_trace_json());
  profiler::clear();
  INFO(trace.problem_list());
  REQUIRE(trace.problems.empty());
  std::set<int> stream_tracks;
  for (int i = 0; i < 2; ++i)
    for (const auto& s : trace.named(fmt::format("replica {} forward", i)))
      if (s.pid != 1) stream_tracks.insert(s.tid);
  REQUIRE(stream_tracks.size() == 2);
}
