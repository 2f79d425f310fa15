// mg::profiler: spans of what ran when, per thread and per stream, exported as the Chrome
// trace-event JSON that Perfetto (ui.perfetto.dev) and chrome://tracing open.
//
//   profiler::start();                       // or start({.autograd_nodes = true})
//   { profiler::Span span("step {}", k); ... }
//   profiler::stop();
//   profiler::export_chrome_trace("trace.json");
//
// A Span is PyTorch's record_function: it times its scope on the calling thread. Given a
// device, it also samples that device's allocated bytes (a counter track) and, on a GPU,
// times the work queued meanwhile on the device's current stream with a pair of events,
// shown on a track of that (device, stream). While the profiler is off a Span costs one
// relaxed atomic load and allocates nothing; while it is on, each thread appends to a
// buffer of its own (no lock), and the buffers are merged when the trace is exported.
//
// The spans minigrad records (docs/design.md, "The trace", names each with its place):
//   scatter, replicate, broadcast, replica <i> forward, gather              DataParallel
//   backward, replica <i> backward, reduce_add                               its backward
//   <Node name> (AddBackward, LinearBackward, ...)      with ProfilerOptions::autograd_nodes
//   <optimizer>.step (SGD.step, AdamW.step)                                   optimizers
//   bucket <b> ready, wait for all-reduce                   DistributedDataParallel's reducer
//   allreduce, broadcast, reduce_scatter, all_gather, barrier, send, recv     process groups
// and a program adds its own (step <k> in the sample programs).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include <minigrad/core/device.h>
#include <minigrad/core/stream.h>

namespace mg::profiler {

struct ProfilerOptions {
  // The detail level: also one span per autograd node's backward, named by its op.
  bool autograd_nodes = false;
  // Counters of each device's allocated bytes, sampled where a span names a device.
  bool memory = true;
  // On a GPU: the device work of spans that name a device, timed with events on its stream.
  bool device_spans = true;
};

namespace detail {
extern std::atomic<bool> enabled;
extern std::atomic<bool> autograd_nodes;
}  // namespace detail

// Whether spans are being recorded now: one relaxed load, the whole cost of a Span when off.
inline bool is_enabled() { return detail::enabled.load(std::memory_order_relaxed); }
inline bool records_autograd_nodes() {
  return detail::autograd_nodes.load(std::memory_order_relaxed);
}

// Starts a session: what an earlier one recorded is dropped. mg::Error if one is running.
void start(const ProfilerOptions& options = {});
// Ends the session; what it recorded stays until the next start() or clear(). Spans still
// open are not recorded. Does nothing when no session runs.
void stop();
// Drops what was recorded (and the events of device spans).
void clear();

// The name of this thread's track ("main", "worker 1", "gloo comm thread"), set by
// whoever starts the thread; a thread that sets none is "thread <n>".
void set_thread_name(std::string name);
// The name of a stream's track, for streams other than a device's compute and copy
// streams (those are named "compute stream" and "copy stream"): NCCL's, a pipeline's.
void set_stream_name(const Stream& stream, std::string name);

// An argument shown with a span (Perfetto's details pane): an integer, a number or text.
struct Arg {
  const char* key;
  enum class Kind : uint8_t { Int, Double, Text } kind;
  int64_t int_value = 0;
  double double_value = 0.0;
  std::string text;
};

namespace detail {
struct OpenSpan;
OpenSpan* begin_span(std::string name, const char* category, const Device* device);
void end_span(OpenSpan* span);
void add_arg(OpenSpan* span, Arg arg);
}  // namespace detail

// Times its scope. The name is a fmt format string, formatted only while recording:
//   profiler::Span span("replica {} forward", i);   profiler::Span span(device, "gather");
class Span {
 public:
  template <typename... T>
  explicit Span(fmt::format_string<T...> name, T&&... args)
      : open_(is_enabled() ? detail::begin_span(fmt::format(name, std::forward<T>(args)...),
                                                 nullptr, nullptr)
                           : nullptr) {}
  // Also samples `device`'s memory at both ends and, on a GPU, times the work queued on
  // its current stream meanwhile.
  template <typename... T>
  Span(Device device, fmt::format_string<T...> name, T&&... args)
      : open_(is_enabled() ? detail::begin_span(fmt::format(name, std::forward<T>(args)...),
                                                 nullptr, &device)
                           : nullptr) {}
  ~Span() {
    if (open_ != nullptr) detail::end_span(open_);
  }
  Span(const Span&) = delete;
  Span& operator=(const Span&) = delete;

  // The kind of span, for colours and filters (Chrome's "cat"): "data_parallel",
  // "forward", "backward", "comm", "optimizer", "autograd", "step". Set before it ends.
  Span& category(const char* category);
  template <typename V>
  Span& arg(const char* key, V&& value) {
    if (open_ == nullptr) return *this;
    using D = std::decay_t<V>;
    Arg a{key, Arg::Kind::Int, 0, 0.0, {}};
    if constexpr (std::is_integral_v<D>) {
      a.int_value = static_cast<int64_t>(value);
    } else if constexpr (std::is_floating_point_v<D>) {
      a.kind = Arg::Kind::Double;
      a.double_value = static_cast<double>(value);
    } else if constexpr (std::is_same_v<D, Device>) {
      a.kind = Arg::Kind::Text;
      a.text = value.str();
    } else {
      a.kind = Arg::Kind::Text;
      a.text = std::string(std::string_view(value));
    }
    detail::add_arg(open_, std::move(a));
    return *this;
  }
  bool active() const { return open_ != nullptr; }

 private:
  detail::OpenSpan* open_;
};

// A moment rather than a span (Chrome's instant event, "i"), on this thread's track.
void instant(std::string name, const char* category, std::vector<Arg> args = {});

// A span that its caller timed itself, on the steady clock, recorded on this thread's
// track: for code that keeps a timeline of its own (the pipeline's TimelineRecorder), so
// that its spans are in the trace too. Does nothing while the profiler is off.
void record_span(std::string name, const char* category,
                 std::chrono::steady_clock::time_point start,
                 std::chrono::steady_clock::time_point end, std::vector<Arg> args = {});

// Says what the collectives this thread launches meanwhile are for ("DDP bucket 2"): a
// process group keeps it with the collective, whose span (on its communication thread
// or stream) shows it as the argument "for". Set only while recording.
class CollectiveLabel {
 public:
  template <typename... T>
  explicit CollectiveLabel(fmt::format_string<T...> label, T&&... args) {
    if (is_enabled()) set(fmt::format(label, std::forward<T>(args)...));
  }
  ~CollectiveLabel();
  CollectiveLabel(const CollectiveLabel&) = delete;
  CollectiveLabel& operator=(const CollectiveLabel&) = delete;

 private:
  void set(std::string label);
  bool set_ = false;
  std::string previous_;
};
// This thread's label (empty when none is set).
const std::string& collective_label();

// ---- what a session recorded ----

// One recorded event, as export writes it: times in microseconds since the session began.
struct TraceEvent {
  char phase = 'X';          // X: a span, i: an instant, C: a counter
  std::string name;
  std::string category;
  double ts_us = 0.0;
  double dur_us = 0.0;       // X only
  int pid = 0;               // host (1 + rank), or a device of the host (see TraceInfo)
  int tid = 0;               // a thread, or a stream of a device
  std::vector<Arg> args;     // a counter's value is its one Int argument
};

// How a trace names its processes: the host process is pid 1 + rank, named
// process_name (default "rank <rank>" in a job of several ranks, else "host"); a GPU's
// tracks are pid 1000 * (1 + rank) + device index, named "<process name> cuda:<i>".
struct TraceInfo {
  int rank = 0;
  int world_size = 1;
  std::string process_name;
};

// Everything recorded, in time order per track, with the metadata events (M: process
// and thread names) first; the device spans resolved to host time.
std::vector<TraceEvent> collect(const TraceInfo& info = {});
// The Chrome trace-event JSON of collect(): {"traceEvents": [...], "otherData": {...}}.
std::string chrome_trace_json(const TraceInfo& info = {});
// Writes chrome_trace_json to `path`; mg::Error naming the path when it cannot.
void export_chrome_trace(const std::string& path, const TraceInfo& info = {});

// Merges traces exported by several processes (one per rank) into one file with a
// process per rank, their clocks aligned (the ranks of one machine share its monotonic
// clock). mg::Error naming the file that is missing or is not such a trace.
void merge_chrome_traces(const std::vector<std::string>& inputs, const std::string& output);

// How many thread buffers have been made since the process started: none while the
// profiler is off (the tests check that tracing off allocates nothing).
uint64_t thread_buffers_created();

}  // namespace mg::profiler
