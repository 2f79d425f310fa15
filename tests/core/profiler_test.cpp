// mg::profiler: spans per thread, counters, instants, the Chrome trace-event JSON they
// export to, merging the files of several ranks, and nothing recorded or allocated while
// it is off.
#include "catch_compat.h"

#include <atomic>
#include <fstream>
#include <sstream>
#include <thread>

#include <minigrad/core/profiler.h>
#include <minigrad/core/tensor.h>

#include "temp_dir.h"
#include "trace_check.h"

namespace profiler = mg::profiler;
using mg::testing::parse_trace;
using mg::testing::TempDir;

namespace {

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// Some work between two clock readings.
void busy(int n = 20000) {
  volatile double x = 0;
  for (int i = 0; i < n; ++i) x = x + 1e-3 * i;
}

// Ends a session the test left running (a failed REQUIRE), so the next test can start one.
struct Session {
  explicit Session(const profiler::ProfilerOptions& options = {}) { profiler::start(options); }
  ~Session() {
    profiler::stop();
    profiler::clear();
  }
};

}  // namespace

TEST_CASE("profiler: while it is off a span records nothing and no buffer is made") {
  REQUIRE_FALSE(profiler::is_enabled());
  const uint64_t before = profiler::thread_buffers_created();
  {
    profiler::Span span("step {}", 1);
    span.category("step").arg("rows", 30).arg("what", "text");
    REQUIRE_FALSE(span.active());
    profiler::Span on_device(mg::Device::cpu(), "replica {} forward", 0);
    profiler::instant("moment", "test");
  }
  std::thread other([] { profiler::Span span("on another thread"); });
  other.join();
  REQUIRE(profiler::thread_buffers_created() == before);
  // Nothing to export but the host process's name.
  for (const profiler::TraceEvent& e : profiler::collect()) REQUIRE(e.phase == 'M');
}

TEST_CASE("profiler: spans of several threads export as a Chrome trace that follows the format") {
  TempDir dir;
  const uint64_t before = profiler::thread_buffers_created();
  {
    Session session;
    profiler::set_thread_name("main");
    {
      profiler::Span outer("step {}", 7);
      outer.category("step").arg("rows", 30).arg("lr", 0.5).arg("device", mg::Device::cpu());
      busy();
      mg::Tensor kept;  // alive at the span's end, so its last sample sees it
      {
        profiler::Span inner(mg::Device::cpu(), "inner");
        kept = mg::zeros({1024}, mg::DType::Float32);
        busy();
      }
      profiler::instant("bucket 0 ready", "ddp", {profiler::Arg{"bucket", profiler::Arg::Kind::Int, 0, 0.0, {}}});
      std::thread worker([] {
        profiler::set_thread_name("worker");
        for (int i = 0; i < 3; ++i) {
          profiler::Span span("task {}", i);
          busy(5000);
        }
      });
      worker.join();
    }
    profiler::stop();
    profiler::export_chrome_trace(dir / "t.json");
  }
  REQUIRE(profiler::thread_buffers_created() == before + 2);  // main and the worker

  const auto trace = parse_trace(read_text(dir / "t.json"));
  INFO(trace.problem_list());
  REQUIRE(trace.problems.empty());
  REQUIRE(trace.process_names.at(1) == "host");
  REQUIRE(trace.json["otherData"]["minigrad"]["clock"] == "CLOCK_MONOTONIC");
  REQUIRE(trace.json["otherData"]["minigrad"]["origin_ns"].is_number_integer());

  const auto step = trace.named("step 7");
  REQUIRE(step.size() == 1);
  REQUIRE(step[0].category == "step");
  REQUIRE(trace.thread_of(step[0]) == "main");
  REQUIRE(step[0].args["rows"] == 30);
  REQUIRE(step[0].args["lr"] == 0.5);
  REQUIRE(step[0].args["device"] == "cpu");
  const auto inner = trace.named("inner");
  REQUIRE(inner.size() == 1);
  REQUIRE(inner[0].args["device"] == "cpu");  // a span given a device names it
  REQUIRE(inner[0].ts >= step[0].ts);
  REQUIRE(inner[0].end() <= step[0].end());
  const auto tasks = trace.with_prefix("task ");
  REQUIRE(tasks.size() == 3);
  for (const auto& task : tasks) {
    REQUIRE(trace.thread_of(task) == "worker");
    REQUIRE(task.tid != step[0].tid);
    REQUIRE(task.ts >= step[0].ts);  // the thread ran inside the step
  }

  // The span given a device sampled the host's allocated bytes at both of its ends: the
  // second sample sees the kilobytes allocated inside it.
  std::vector<double> samples;
  bool instant_seen = false;
  for (const auto& e : trace.json["traceEvents"]) {
    if (e["ph"] == "C" && e["name"] == "allocated bytes") samples.push_back(e["args"]["bytes"]);
    if (e["ph"] == "i" && e["name"] == "bucket 0 ready") {
      instant_seen = true;
      REQUIRE(e["args"]["bucket"] == 0);
    }
  }
  REQUIRE(instant_seen);
  REQUIRE(samples.size() == 2);
  REQUIRE(samples[1] >= samples[0] + 4096);
}

TEST_CASE("profiler: a span still open when the session stops is not recorded") {
  Session session;
  auto open = std::make_unique<profiler::Span>("still open");
  { profiler::Span closed("closed"); }
  profiler::stop();
  open.reset();
  int spans = 0;
  for (const profiler::TraceEvent& e : profiler::collect())
    if (e.phase == 'X') {
      ++spans;
      REQUIRE(e.name == "closed");
    }
  REQUIRE(spans == 1);
}

TEST_CASE("profiler: starting a session while one records is an error, stop without one is not") {
  profiler::stop();
  {
    Session session;
    REQUIRE_THROWS_WITH(profiler::start(), MG_CONTAINS("profiler::start: a session is already recording"));
  }
  profiler::stop();
  REQUIRE_FALSE(profiler::is_enabled());
}

TEST_CASE("profiler: a new session starts empty") {
  {
    Session first;
    profiler::Span span("from the first session");
  }
  Session second;
  { profiler::Span span("from the second"); }
  profiler::stop();
  std::vector<std::string> names;
  for (const profiler::TraceEvent& e : profiler::collect())
    if (e.phase == 'X') names.push_back(e.name);
  REQUIRE(names == std::vector<std::string>{"from the second"});
}

TEST_CASE("profiler: merge_chrome_traces puts each rank in a process of its own on one clock") {
  TempDir dir;
  for (int rank = 0; rank < 2; ++rank) {
    Session session;
    profiler::set_thread_name("main");
    { profiler::Span span("step on rank {}", rank); }
    profiler::stop();
    profiler::TraceInfo info;
    info.rank = rank;
    info.world_size = 2;
    profiler::export_chrome_trace(dir / fmt::format("t.rank{}.json", rank), info);
  }
  profiler::merge_chrome_traces({dir / "t.rank0.json", dir / "t.rank1.json"}, dir / "t.json");
  const auto merged = parse_trace(read_text(dir / "t.json"));
  INFO(merged.problem_list());
  REQUIRE(merged.problems.empty());
  REQUIRE(merged.process_names.at(1) == "rank 0");
  REQUIRE(merged.process_names.at(2) == "rank 1");
  const auto first = merged.named("step on rank 0");
  const auto second = merged.named("step on rank 1");
  REQUIRE(first.size() == 1);
  REQUIRE(second.size() == 1);
  REQUIRE(first[0].pid == 1);
  REQUIRE(second[0].pid == 2);
  // Rank 1's session began after rank 0's span ended: on the merged clock it comes later.
  REQUIRE(second[0].ts >= first[0].end());

  // The same rank twice, and a file that is not a trace, are refused by name.
  REQUIRE_THROWS_WITH(profiler::merge_chrome_traces({dir / "t.rank0.json", dir / "t.rank0.json"},
                                                    dir / "twice.json"),
                      MG_CONTAINS("both have process 1"));
  std::ofstream(dir / "not-a-trace.json") << "{\"hello\": 1}";
  REQUIRE_THROWS_WITH(
      profiler::merge_chrome_traces({dir / "t.rank0.json", dir / "not-a-trace.json"}, dir / "x.json"),
      MG_CONTAINS("not-a-trace.json is not a Chrome trace"));
  REQUIRE_THROWS_WITH(profiler::merge_chrome_traces({dir / "missing.json"}, dir / "x.json"),
                      MG_CONTAINS("cannot open") && MG_CONTAINS("missing.json"));
}

TEST_CASE("profiler: spans on many threads at once are all recorded") {
  Session session;
  constexpr int kThreads = 4, kSpans = 700;  // more than one chunk of records per thread
  std::vector<std::thread> threads;
  std::atomic<bool> go{false};
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&go, t] {
      profiler::set_thread_name(fmt::format("thread {}", t));
      while (!go.load()) std::this_thread::yield();
      for (int i = 0; i < kSpans; ++i) profiler::Span span("span {}", i);
    });
  go = true;
  // Collecting while the threads record sees whole records only.
  const auto partial = profiler::collect();
  for (auto& t : threads) t.join();
  profiler::stop();
  size_t spans = 0;
  for (const profiler::TraceEvent& e : profiler::collect()) spans += e.phase == 'X';
  REQUIRE(spans == kThreads * kSpans);
  REQUIRE(partial.size() <= spans + 2 * kThreads + 2);
}
