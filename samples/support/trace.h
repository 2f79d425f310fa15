// --trace FILE.json: a trace of a few training steps, for Perfetto (ui.perfetto.dev) or
// chrome://tracing, and for bench/timeline.py, which draws it as an SVG timeline.
//
//   build/bin/train_fashion_mnist --devices cpu,cpu --epochs 1 --trace t.json
//   build/bin/minigrad-run --nproc-per-node 2 build/bin/train_fashion_mnist --distributed
//       --trace t.json        # t.rank0.json, t.rank1.json, and t.json with both ranks
//
// The first --trace-warmup steps run untraced (the first step allocates and starts the
// worker threads); the next --trace-steps are recorded, each as a span "step <n>", and
// the file is written as soon as the last of them ends, so a long run's trace stays
// small. --trace-detail nodes adds a span for every autograd node's backward.
//
// In a job of several processes each rank writes FILE.rank<r>.json; after a barrier, rank
// 0 merges them into FILE, one process per rank on one clock. (A job over several
// machines leaves the rank files on their machines; bench/timeline.py merges copies.)
#pragma once

#include <memory>
#include <optional>
#include <string>

#include <minigrad/core/profiler.h>
#include <minigrad/parallel/c10d/process_group.h>

namespace CLI {
class App;
}

namespace mg::samples {

struct TraceOptions {
  std::string path;  // empty: no trace
  int steps = 3;
  int warmup = 1;
  std::string detail = "steps";  // or "nodes"
};

// --trace, --trace-steps, --trace-warmup, --trace-detail. `step` says what a step is in
// this program ("training step", "batch"), for --help.
void add_trace_options(CLI::App& app, TraceOptions& options, const std::string& step);

// "t.json", rank 1 -> "t.rank1.json"; a path without ".json" gets ".rank1.json" appended.
std::string rank_trace_path(const std::string& path, int rank);

// A trace whose warm-up outlasts the `steps` (of `unit`s, "training step") that the run
// has left would record nothing: an OptionError saying so ("--trace-warmup 50: the run
// has 12 training steps left, ..."), before any work. One that only runs past the end
// is a warning on stderr ("<program>: warning: ..."): the trace holds fewer steps.
void check_trace_fits(const TraceOptions& options, int64_t steps, const std::string& unit,
                      const std::string& program);

class StepTracer {
 public:
  // `group`: the job's process group when this process is one rank of several, else null.
  explicit StepTracer(TraceOptions options,
                      std::shared_ptr<parallel::ProcessGroup> group = nullptr);
  ~StepTracer();
  StepTracer(const StepTracer&) = delete;
  StepTracer& operator=(const StepTracer&) = delete;

  // Around each step: the first traced step starts the profiler; each traced step is a
  // span "step <number>"; after the last, the profiler stops and the trace is written.
  void begin_step(int64_t number);
  void end_step();
  // At the end of a run that stopped within the traced steps: writes what was recorded.
  void finish();

  bool enabled() const { return !options_.path.empty(); }

 private:
  void write();

  TraceOptions options_;
  std::shared_ptr<parallel::ProcessGroup> group_;
  int64_t seen_ = 0;  // steps begun
  bool written_ = false;
  std::optional<profiler::Span> step_span_;
};

}  // namespace mg::samples
