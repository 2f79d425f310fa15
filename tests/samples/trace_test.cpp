// --trace on build/bin/train_fashion_mnist, run as a user runs it: the file it writes is a
// Chrome trace that Perfetto and chrome://tracing open (tests/trace_check.h), of the steps
// asked for, with the spans the docs name; under minigrad-run one file per rank and their
// merge; the flags' errors.
#include "catch_compat.h"

#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "data/synthetic_fashion_mnist.h"
#include "samples/run_program.h"
#include "temp_dir.h"
#include "trace_check.h"

using mg::testing::parse_trace;
using mg::testing::ParsedTrace;
using mg::testing::run_program;
using mg::testing::TempDir;

namespace {

const std::string kProgram = mg::testing::program_path("train_fashion_mnist");

ParsedTrace read_trace(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return parse_trace(s.str());
}

// 300 training images in batches of 50: 6 steps an epoch.
std::string small_run(const std::string& data_dir) {
  return kProgram + " --data-dir " + data_dir + " --hidden 32 --batch-size 50 --epochs 1";
}

std::set<std::string> step_names(const ParsedTrace& trace) {
  std::set<std::string> out;
  for (const auto& s : trace.with_prefix("step ")) out.insert(s.name);
  return out;
}

}  // namespace

TEST_CASE("train_fashion_mnist --devices cpu,cpu --trace: a trace of 3 steps after a warm-up") {
  TempDir dir;
  mg::testing::write_synthetic_fashion_mnist(dir.path(), 300, 100, true);
  const std::string path = dir / "t.json";
  const auto run = run_program(small_run(dir.path()) + " --devices cpu,cpu --trace " + path);
  INFO(run.output);
  REQUIRE(run.exit_code == 0);
  REQUIRE_THAT(run.output, MG_CONTAINS("trace: 3 steps written to " + path));

  const ParsedTrace trace = read_trace(path);
  INFO(trace.problem_list());
  REQUIRE(trace.problems.empty());
  REQUIRE(step_names(trace) == std::set<std::string>{"step 2", "step 3", "step 4"});
  for (const char* name : {"scatter", "replicate", "broadcast", "gather", "backward",
                           "reduce_add", "SGD.step", "replica 0 forward", "replica 1 forward",
                           "replica 0 backward", "replica 1 backward"})
    REQUIRE(trace.named(name).size() >= 3);
  REQUIRE(trace.thread_of(trace.named("step 2")[0]) == "main");
  REQUIRE(trace.thread_of(trace.named("replica 1 forward")[0]) == "worker 1");
  // No autograd node at the default detail level.
  REQUIRE(trace.named("LinearBackward").empty());
}

TEST_CASE("train_fashion_mnist --trace-steps, --trace-warmup, --trace-detail nodes") {
  TempDir dir;
  mg::testing::write_synthetic_fashion_mnist(dir.path(), 300, 100, true);
  const std::string path = dir / "t.json";
  const auto run = run_program(small_run(dir.path()) + " --trace " + path +
                               " --trace-steps 2 --trace-warmup 0 --trace-detail nodes");
  INFO(run.output);
  REQUIRE(run.exit_code == 0);
  REQUIRE_THAT(run.output, MG_CONTAINS("trace: 2 steps written to"));
  const ParsedTrace trace = read_trace(path);
  INFO(trace.problem_list());
  REQUIRE(trace.problems.empty());
  REQUIRE(step_names(trace) == std::set<std::string>{"step 1", "step 2"});
  REQUIRE(trace.named("LinearBackward").size() == 2 * 2);  // two layers, two steps
  REQUIRE(trace.named("scatter").empty());                 // one device: no DataParallel

  // More steps asked for than the run has: what ran is written at its end.
  const auto longer = run_program(small_run(dir.path()) + " --trace " + path + " --trace-steps 50");
  INFO(longer.output);
  REQUIRE(longer.exit_code == 0);
  REQUIRE_THAT(longer.output, MG_CONTAINS("trace: 5 steps written to"));
  REQUIRE(step_names(read_trace(path)).size() == 5);
}

TEST_CASE("train_fashion_mnist: the --trace flags refuse what they cannot take") {
  auto run = run_program(kProgram + " --trace-steps 2");
  REQUIRE(run.exit_code == 2);
  REQUIRE_THAT(run.output, MG_CONTAINS("--trace-steps requires --trace"));
  run = run_program(kProgram + " --trace t.json --trace-steps 0");
  REQUIRE(run.exit_code == 2);
  REQUIRE_THAT(run.output, MG_CONTAINS("--trace-steps"));
  run = run_program(kProgram + " --trace t.json --trace-detail everything");
  REQUIRE(run.exit_code == 2);
  REQUIRE_THAT(run.output, MG_CONTAINS("--trace-detail"));
  run = run_program(kProgram + " --data-dir /nonexistent --trace /nonexistent/dir/t.json");
  REQUIRE(run.exit_code != 0);
  // Checked before the data loads, as --save is, and never written over a device.
  run = run_program(kProgram + " --data-dir /nonexistent --trace /dev/null");
  REQUIRE(run.exit_code == 2);
  REQUIRE_THAT(run.output, MG_CONTAINS("--trace: cannot write '/dev/null': it is a character "
                                       "device, not a regular file"));
}

#if MINIGRAD_WITH_GLOO
TEST_CASE("train_fashion_mnist --distributed --trace: a file per rank and their merge") {
  TempDir dir;
  mg::testing::write_synthetic_fashion_mnist(dir.path(), 300, 100, false);
  const std::string path = dir / "t.json";
  const auto run = run_program(mg::testing::program_path("minigrad-run") + " --nproc-per-node 2 " +
                               small_run(dir.path()) + " --distributed --trace " + path);
  INFO(run.output);
  REQUIRE(run.exit_code == 0);
  REQUIRE_THAT(run.output, MG_CONTAINS("trace: 3 steps of 2 ranks written to " + path));
  for (int rank = 0; rank < 2; ++rank) {
    const ParsedTrace one = read_trace(dir / ("t.rank" + std::to_string(rank) + ".json"));
    INFO(one.problem_list());
    REQUIRE(one.problems.empty());
    REQUIRE(one.process_names.at(1 + rank) == "rank " + std::to_string(rank));
  }
  const ParsedTrace merged = read_trace(path);
  INFO(merged.problem_list());
  REQUIRE(merged.problems.empty());
  REQUIRE(merged.process_names.at(1) == "rank 0");
  REQUIRE(merged.process_names.at(2) == "rank 1");
  std::set<int> step_pids, allreduce_pids;
  for (const auto& s : merged.with_prefix("step ")) step_pids.insert(s.pid);
  REQUIRE(step_pids == std::set<int>{1, 2});
  // DDP's buckets, and their all-reduces on each rank's Gloo thread.
  REQUIRE_FALSE(merged.with_prefix("bucket ").empty());
  for (const auto& s : merged.named("allreduce"))
    if (s.args.value("for", "").rfind("DDP bucket ", 0) == 0) allreduce_pids.insert(s.pid);
  REQUIRE(allreduce_pids == std::set<int>{1, 2});
}
#endif
