// What a pipeline step did when: one span per (stage, micro-batch, pass), measured on
// the host clock by the stage's own thread. The busy fractions that model_parallel
// prints, the bubble that the benchmark compares with the formula, and the SVG pictures
// of docs/pipeline-parallel.md all come from here.
//
// On CPU devices a span is the work itself. On a GPU it is the time the stage's thread
// spent queueing that work (kernels run asynchronously), which says when the host was
// the bottleneck but not when the GPU was busy.
#pragma once

#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include <minigrad/parallel/pipeline/schedule.h>

namespace mg::parallel {

struct PipeSpan {
  int stage = 0;
  int64_t micro_batch = 0;
  Pass pass = Pass::Forward;
  double start = 0.0, end = 0.0;  // seconds since the timeline began
  int chunk = 0;                  // the rank's model chunk (interleaved schedule)
};

struct PipeTimeline {
  int stages = 0;
  std::vector<PipeSpan> spans;
  // The intervals in which the pipeline ran (seconds since the timeline began): one for
  // train_step; two for forward() and the backward that follows it.
  std::vector<std::pair<double, double>> windows;

  double running_seconds() const;             // the windows' total length
  double busy_seconds(int stage) const;       // the stage's spans' total length
  double busy_fraction(int stage) const;      // busy_seconds / running_seconds
  double bubble_fraction() const;             // 1 - the mean busy fraction
};

// An SVG picture of `timeline`: a row per stage, a box per span (forward blue,
// backward orange, lighter for odd model chunks, each labelled with its micro-batch), a
// time axis in milliseconds.
std::string timeline_svg(const PipeTimeline& timeline, const std::string& title);

// The timeline of an ideal pipeline: every rank follows its list (rank_actions), a pass
// starts once its rank is free and its input has arrived (no time to send it), each
// chunk's forward takes forward_seconds / v and its backward backward_seconds / v (a
// stage's work cut into v equal chunks). Its bubble_fraction() is the schedule's own
// bubble: (p - 1) / (m + p - 1) for GPipe and 1F1B; (p - 1) / (v m + p - 1) for the
// interleaved schedule when m is a multiple of p (more otherwise). A stage of the spans is
// a rank; the spans carry their chunk.
PipeTimeline ideal_timeline(Schedule schedule, int stages, int64_t micro_batches,
                            int model_chunks = 1, double forward_seconds = 1.0,
                            double backward_seconds = 2.0);

// Collects spans from the stages' threads. Each stage writes only its own list, so
// recording takes no lock; the owner reads them after the threads have been joined.
class TimelineRecorder {
 public:
  using Clock = std::chrono::steady_clock;
  explicit TimelineRecorder(int stages);
  double now() const;  // seconds since construction
  void record(int stage, int64_t micro_batch, Pass pass, double start, double end,
              int chunk = 0);
  // Marks an interval in which the pipeline ran (called by the owner only).
  void add_window(double start, double end);
  PipeTimeline timeline() const;

 private:
  Clock::time_point epoch_;
  std::vector<std::vector<PipeSpan>> per_stage_;
  std::vector<std::pair<double, double>> windows_;
};

}  // namespace mg::parallel
