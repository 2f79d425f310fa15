#include "trace.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "command_line.h"

namespace mg::samples {

void add_trace_options(CLI::App& app, TraceOptions& options, const std::string& step) {
  CLI::Option* trace = app.add_option(
      "--trace", options.path,
      fmt::format("Record a trace of a few {}s into this Chrome trace-event JSON file (open it "
                  "in ui.perfetto.dev or chrome://tracing; bench/timeline.py draws it as SVG); "
                  "under minigrad-run each rank writes FILE.rank<r>.json and rank 0 merges them "
                  "into FILE",
                  step));
  app.add_option("--trace-steps", options.steps, fmt::format("With --trace: {}s traced", step))
      ->check(positive_integer())
      ->capture_default_str()
      ->needs(trace);
  app.add_option("--trace-warmup", options.warmup,
                 fmt::format("With --trace: {}s run untraced first", step))
      ->check(non_negative_integer())
      ->capture_default_str()
      ->needs(trace);
  app.add_option("--trace-detail", options.detail,
                 "With --trace: steps (the steps of data and model parallelism) or nodes (also "
                 "every autograd node's backward)")
      ->check(CLI::IsMember({"steps", "nodes"}))
      ->capture_default_str()
      ->needs(trace);
}

std::string rank_trace_path(const std::string& path, int rank) {
  const std::string suffix = ".json";
  if (path.size() > suffix.size() && path.compare(path.size() - suffix.size(), suffix.size(), suffix) == 0)
    return fmt::format("{}.rank{}.json", path.substr(0, path.size() - suffix.size()), rank);
  return fmt::format("{}.rank{}.json", path, rank);
}

void check_trace_fits(const TraceOptions& options, int64_t steps, const std::string& unit,
                      const std::string& program) {
  if (options.path.empty()) return;
  const int64_t left = std::max<int64_t>(steps, 0);
  if (options.warmup >= left)
    throw OptionError(fmt::format(
        "--trace-warmup {}: the run has {} {}{} left, so --trace {} would record nothing; "
        "give a --trace-warmup below {}",
        options.warmup, left, unit, left == 1 ? "" : "s", options.path, left));
  if (options.warmup + options.steps > left)
    fmt::print(stderr,
               "{}: warning: --trace-warmup {} and --trace-steps {} run past the {} {}s left; "
               "the trace will hold {}\n",
               program, options.warmup, options.steps, left, unit, left - options.warmup);
}

StepTracer::StepTracer(TraceOptions options, std::shared_ptr<parallel::ProcessGroup> group)
    : options_(std::move(options)), group_(std::move(group)) {
  if (enabled()) profiler::set_thread_name("main");
}

StepTracer::~StepTracer() {
  step_span_.reset();
  if (enabled() && !written_ && profiler::is_enabled()) profiler::stop();
}

void StepTracer::begin_step(int64_t number) {
  if (!enabled() || written_) return;
  if (seen_++ == options_.warmup) {
    profiler::ProfilerOptions profiler_options;
    profiler_options.autograd_nodes = options_.detail == "nodes";
    profiler::start(profiler_options);
  }
  if (profiler::is_enabled()) {
    step_span_.emplace("step {}", number);
    step_span_->category("step");
  }
}

void StepTracer::end_step() {
  if (!enabled() || written_) return;
  step_span_.reset();
  if (seen_ == options_.warmup + options_.steps) write();
}

void StepTracer::finish() {
  if (!enabled() || written_) return;
  step_span_.reset();
  if (seen_ > options_.warmup) write();
}

void StepTracer::write() {
  profiler::stop();
  written_ = true;
  const int64_t traced = std::min<int64_t>(seen_ - options_.warmup, options_.steps);
  if (group_ == nullptr || group_->size() == 1) {
    profiler::export_chrome_trace(options_.path);
    fmt::print("trace: {} step{} written to {} (open it in ui.perfetto.dev or chrome://tracing)\n",
               traced, traced == 1 ? "" : "s", options_.path);
    std::fflush(stdout);
    profiler::clear();
    return;
  }
  const int rank = group_->rank();
  const int world = group_->size();
  profiler::TraceInfo info;
  info.rank = rank;
  info.world_size = world;
  profiler::export_chrome_trace(rank_trace_path(options_.path, rank), info);
  profiler::clear();
  group_->barrier()->wait();  // every rank's file is complete
  if (rank != 0) return;
  std::vector<std::string> inputs;
  for (int r = 0; r < world; ++r) inputs.push_back(rank_trace_path(options_.path, r));
  const char* local_world = std::getenv("LOCAL_WORLD_SIZE");
  if (local_world != nullptr && std::atoi(local_world) != world) {
    fmt::print("trace: {} step{} written to {} ... {} on each rank's machine; merge copies of "
               "them with bench/timeline.py --merge {} FILES...\n",
               traced, traced == 1 ? "" : "s", inputs.front(), inputs.back(), options_.path);
    std::fflush(stdout);
    return;
  }
  profiler::merge_chrome_traces(inputs, options_.path);
  fmt::print("trace: {} step{} of {} ranks written to {} (and one file per rank, {} ...; open "
             "it in ui.perfetto.dev or chrome://tracing)\n",
             traced, traced == 1 ? "" : "s", world, options_.path, inputs.front());
  std::fflush(stdout);
}

}  // namespace mg::samples
