#include <minigrad/parallel/pipeline/timeline.h>

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include <minigrad/core/error.h>
#include <minigrad/core/profiler.h>

namespace mg::parallel {

double PipeTimeline::running_seconds() const {
  double total = 0.0;
  for (const auto& [start, end] : windows) total += end - start;
  return total;
}

double PipeTimeline::busy_seconds(int stage) const {
  double total = 0.0;
  for (const PipeSpan& s : spans)
    if (s.stage == stage) total += s.end - s.start;
  return total;
}

double PipeTimeline::busy_fraction(int stage) const {
  const double running = running_seconds();
  return running > 0.0 ? busy_seconds(stage) / running : 0.0;
}

double PipeTimeline::bubble_fraction() const {
  if (stages == 0) return 0.0;
  double busy = 0.0;
  for (int s = 0; s < stages; ++s) busy += busy_fraction(s);
  return 1.0 - busy / stages;
}

TimelineRecorder::TimelineRecorder(int stages)
    : epoch_(Clock::now()), per_stage_(static_cast<size_t>(stages)) {
  for (auto& spans : per_stage_) spans.reserve(64);
}

double TimelineRecorder::now() const {
  return std::chrono::duration<double>(Clock::now() - epoch_).count();
}

void TimelineRecorder::record(int stage, int64_t micro_batch, Pass pass, double start,
                              double end, int chunk) {
  per_stage_[static_cast<size_t>(stage)].push_back({stage, micro_batch, pass, start, end, chunk});
  // The same span in a trace (core/profiler.h), on the stage's thread: one mechanism
  // times the pipeline, the trace shows it beside everything else.
  if (profiler::is_enabled()) {
    const bool forward = pass == Pass::Forward;
    auto at = [&](double seconds) {
      return epoch_ + std::chrono::duration_cast<Clock::duration>(
                          std::chrono::duration<double>(seconds));
    };
    profiler::record_span(
        fmt::format("stage {} {} {}", stage, forward ? "forward" : "backward", micro_batch),
        forward ? "forward" : "backward", at(start), at(end),
        {profiler::Arg{"stage", profiler::Arg::Kind::Int, stage, 0.0, {}},
         profiler::Arg{"micro_batch", profiler::Arg::Kind::Int, micro_batch, 0.0, {}}});
  }
}

void TimelineRecorder::add_window(double start, double end) { windows_.emplace_back(start, end); }

PipeTimeline TimelineRecorder::timeline() const {
  PipeTimeline t;
  t.stages = static_cast<int>(per_stage_.size());
  for (const auto& spans : per_stage_) t.spans.insert(t.spans.end(), spans.begin(), spans.end());
  t.windows = windows_;
  return t;
}

PipeTimeline ideal_timeline(Schedule schedule, int stages, int64_t micro_batches,
                            int model_chunks, double forward_seconds, double backward_seconds) {
  const int p = stages, v = model_chunks, virtual_stages = stages * model_chunks;
  std::vector<std::vector<Action>> lists;
  for (int r = 0; r < p; ++r) lists.push_back(rank_actions(schedule, r, p, v, micro_batches));
  // finished[pass][k][j]: when virtual stage k's pass of micro-batch j ended (< 0: not yet).
  const auto m = static_cast<size_t>(micro_batches);
  std::vector<std::vector<std::vector<double>>> finished(
      2, std::vector<std::vector<double>>(static_cast<size_t>(virtual_stages), std::vector<double>(m, -1.0)));
  std::vector<double> free_at(static_cast<size_t>(p), 0.0);
  std::vector<size_t> next(static_cast<size_t>(p), 0);
  PipeTimeline t;
  t.stages = p;
  for (bool progress = true; progress;) {
    progress = false;
    for (int r = 0; r < p; ++r) {
      auto& list = lists[static_cast<size_t>(r)];
      for (size_t& i = next[static_cast<size_t>(r)]; i < list.size(); ++i) {
        const Action& a = list[i];
        const int k = a.chunk * p + r;
        const auto j = static_cast<size_t>(a.micro_batch);
        const bool forward = a.pass == Pass::Forward;
        // What the pass waits for: the previous virtual stage's forward, or this stage's
        // forward and the next one's backward.
        double ready = free_at[static_cast<size_t>(r)];
        bool waiting = false;
        auto after = [&](int pass, int stage) {
          const double when = finished[static_cast<size_t>(pass)][static_cast<size_t>(stage)][j];
          if (when < 0) waiting = true;
          ready = std::max(ready, when);
        };
        if (forward && k > 0) after(0, k - 1);
        if (!forward) {
          after(0, k);
          if (k + 1 < virtual_stages) after(1, k + 1);
        }
        if (waiting) break;
        const double end = ready + (forward ? forward_seconds : backward_seconds) / v;
        finished[forward ? 0 : 1][static_cast<size_t>(k)][j] = end;
        free_at[static_cast<size_t>(r)] = end;
        t.spans.push_back({r, a.micro_batch, a.pass, ready, end, a.chunk});
        progress = true;
      }
    }
  }
  for (int r = 0; r < p; ++r)
    MG_CHECK(next[static_cast<size_t>(r)] == lists[static_cast<size_t>(r)].size(),
             "ideal_timeline: the {} schedule deadlocks on rank {} of {} ({} chunks, {} "
             "micro-batches)",
             schedule_name(schedule), r, p, v, micro_batches);
  t.windows.emplace_back(0.0, *std::max_element(free_at.begin(), free_at.end()));
  return t;
}

std::string timeline_svg(const PipeTimeline& timeline, const std::string& title) {
  // Time runs from the first window's start to the last one's end; gaps between
  // windows (the loss, computed by the caller between forward and backward) show.
  double begin = 0.0, end = 0.0;
  if (!timeline.windows.empty()) {
    begin = timeline.windows.front().first;
    end = timeline.windows.back().second;
  }
  for (const PipeSpan& s : timeline.spans) end = std::max(end, s.end);
  const double seconds = std::max(end - begin, 1e-9);
  const double left = 80, right = 20, top = 40, row = 34, width = 960;
  const double plot = width - left - right;
  const double height = top + row * timeline.stages + 50;
  auto x_of = [&](double t) { return left + (t - begin) / seconds * plot; };

  std::string svg = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{:.0f}\" height=\"{:.0f}\" "
      "font-family=\"sans-serif\" font-size=\"12\">\n"
      "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
      "<text x=\"{:.0f}\" y=\"22\" font-size=\"14\">{}</text>\n",
      width, height, left, title);
  for (int s = 0; s < timeline.stages; ++s) {
    const double y = top + row * s;
    svg += fmt::format(
        "<text x=\"10\" y=\"{:.1f}\">stage {}</text>\n"
        "<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.1f}\" height=\"{:.1f}\" fill=\"#f2f2f2\"/>\n",
        y + row / 2 + 4, s, left, y + 3, plot, row - 6);
    svg += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" fill=\"#555\" text-anchor=\"end\" "
                       "font-size=\"10\">busy {:.0f}%</text>\n",
                       width - 2, y + row - 8, 100.0 * timeline.busy_fraction(s));
  }
  for (const PipeSpan& s : timeline.spans) {
    const double x0 = x_of(s.start), x1 = x_of(s.end);
    const double y = top + row * s.stage + 5;
    const bool forward = s.pass == Pass::Forward;
    svg += fmt::format(
        "<rect x=\"{:.2f}\" y=\"{:.1f}\" width=\"{:.2f}\" height=\"{:.1f}\" fill=\"{}\" "
        "stroke=\"white\" stroke-width=\"0.5\"><title>stage {} {} {}: {:.3f}-{:.3f} "
        "ms</title></rect>\n",
        x0, y, std::max(x1 - x0, 0.5), row - 10,
        // Odd model chunks (interleaved schedule) in lighter shades.
        forward ? (s.chunk % 2 == 0 ? "#4c78a8" : "#9ecae9")
                : (s.chunk % 2 == 0 ? "#f58518" : "#ffbf79"),
        s.stage,
        forward ? "F" : "B", s.micro_batch, 1e3 * s.start, 1e3 * s.end);
    if (x1 - x0 > 14)
      svg += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" fill=\"white\" text-anchor=\"middle\" "
                         "font-size=\"10\">{}{}</text>\n",
                         (x0 + x1) / 2, y + row / 2 - 1, forward ? 'F' : 'B', s.micro_batch);
  }
  // A time axis with about ten ticks at round milliseconds.
  const double axis_y = top + row * timeline.stages + 8;
  const double ms = seconds * 1e3;
  double tick = std::pow(10.0, std::floor(std::log10(ms / 10)));
  for (double step : {2.0, 2.5, 2.0})  // 1, 2, 5, 10 times a power of ten
    if (ms / tick > 10) tick *= step;
  svg += fmt::format("<line x1=\"{:.0f}\" y1=\"{:.1f}\" x2=\"{:.0f}\" y2=\"{:.1f}\" "
                     "stroke=\"#333\"/>\n",
                     left, axis_y, left + plot, axis_y);
  for (double t = 0; t <= ms + 1e-9; t += tick) {
    const double x = left + t / ms * plot;
    svg += fmt::format("<line x1=\"{0:.1f}\" y1=\"{1:.1f}\" x2=\"{0:.1f}\" y2=\"{2:.1f}\" "
                       "stroke=\"#333\"/><text x=\"{0:.1f}\" y=\"{3:.1f}\" text-anchor=\"middle\" "
                       "font-size=\"10\">{4:g}</text>\n",
                       x, axis_y, axis_y + 4, axis_y + 16, t);
  }
  svg += fmt::format("<text x=\"{:.0f}\" y=\"{:.1f}\" font-size=\"10\">ms</text>\n",
                     left + plot + 4, axis_y + 16);
  svg += fmt::format(
      "<rect x=\"{0:.0f}\" y=\"{1:.1f}\" width=\"12\" height=\"10\" fill=\"#4c78a8\"/>"
      "<text x=\"{2:.0f}\" y=\"{3:.1f}\">forward</text>"
      "<rect x=\"{4:.0f}\" y=\"{1:.1f}\" width=\"12\" height=\"10\" fill=\"#f58518\"/>"
      "<text x=\"{5:.0f}\" y=\"{3:.1f}\">backward</text>\n",
      left, axis_y + 24, left + 16, axis_y + 33, left + 90, left + 106);
  return svg + "</svg>\n";
}

}  // namespace mg::parallel
