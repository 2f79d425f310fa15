// Export: the recorded buffers as Chrome trace-event JSON (the "JSON Object Format" of
// the Trace Event Format document, which Perfetto and chrome://tracing read):
//
//   {"traceEvents": [
//      {"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "rank 0"}},
//      {"ph": "M", "name": "thread_name", "pid": 1, "tid": 1, "args": {"name": "main"}},
//      {"ph": "X", "name": "replica 0 forward", "cat": "forward", "ts": 12.5, "dur": 80.25,
//       "pid": 1, "tid": 2, "args": {"replica": 0, "device": "cpu"}},
//      {"ph": "C", "name": "allocated bytes", "ts": 12.4, "pid": 1, "args": {"cpu": 81920}},
//      {"ph": "i", "name": "...", "s": "t", "ts": 13.0, "pid": 1, "tid": 1}, ...],
//    "displayTimeUnit": "ms",
//    "otherData": {"minigrad": {"clock": "CLOCK_MONOTONIC", "origin_ns": ..., "rank": 0,
//                               "world_size": 1}}}
//
// ts and dur are microseconds since the session began (origin_ns on the monotonic clock,
// which merge_chrome_traces uses to align the files of several ranks).
#include <minigrad/core/profiler_internal.h>

#include <algorithm>
#include <cmath>
#include <iterator>
#include <set>

#include <nlohmann/json.hpp>

#include <minigrad/core/backend.h>
#include <minigrad/core/files.h>

namespace mg::profiler {

using detail::Record;
using json = nlohmann::json;

namespace {

constexpr int kDevicePidBase = 1000;

int host_pid(const TraceInfo& info) { return 1 + info.rank; }
int device_pid(const TraceInfo& info, Device device) {
  return kDevicePidBase * (1 + info.rank) + device.index();
}

std::string process_name(const TraceInfo& info) {
  if (!info.process_name.empty()) return info.process_name;
  return info.world_size > 1 ? fmt::format("rank {}", info.rank) : std::string("host");
}

double us_since(int64_t origin_ns, int64_t ns) {
  // Rounded to the nanosecond, so that the JSON shows 12.345 rather than 12.345000000001.
  return std::round(static_cast<double>(ns - origin_ns)) / 1000.0;
}

Arg text_arg(const char* key, std::string value) {
  return Arg{key, Arg::Kind::Text, 0, 0.0, std::move(value)};
}
Arg int_arg(const char* key, int64_t value) { return Arg{key, Arg::Kind::Int, value, 0.0, {}}; }

TraceEvent metadata(const char* what, int pid, int tid, Arg arg) {
  TraceEvent e;
  e.phase = 'M';
  e.name = what;
  e.pid = pid;
  e.tid = tid;
  e.args.push_back(std::move(arg));
  return e;
}

// Puts the device work of the spans on the host clock. For each device: wait for every
// span's end event, then record a reference event on the compute stream, wait for it and
// read the host clock; an event `elapsed` ms before the reference happened that long
// before the host time read.
void resolve_device_spans(detail::Registry& r) {
  std::map<Device, std::vector<Record*>> by_device;
  for (const auto& buffer : r.buffers)
    buffer->for_each([&](Record& record) {
      if (record.phase == 'D') by_device[record.device].push_back(&record);
    });
  for (auto& [device, records] : by_device) {
    Backend& b = backend(device);
    for (Record* record : records) b.event_synchronize(record->end_event);
    void* reference = b.timing_event_record(compute_stream(device));
    MG_CHECK(reference != nullptr,
             "profiler: cannot time the device spans of {}: its backend records no timing "
             "event on the compute stream",
             device);
    b.event_synchronize(reference);
    const int64_t host_ns = detail::now_ns();
    for (Record* record : records) {
      const double start_ms = b.event_elapsed_ms(record->start_event, reference);
      const double end_ms = b.event_elapsed_ms(record->end_event, reference);
      record->start_ns = host_ns - static_cast<int64_t>(std::llround(start_ms * 1e6));
      record->end_ns = host_ns - static_cast<int64_t>(std::llround(end_ms * 1e6));
      b.event_destroy(record->start_event);
      b.event_destroy(record->end_event);
      record->start_event = record->end_event = nullptr;
      record->phase = 'R';
    }
    b.event_destroy(reference);
  }
}

std::string stream_track_name(const detail::Registry& r, Device device, void* stream) {
  const auto named = r.stream_names.find({device, stream});
  if (named != r.stream_names.end()) return named->second;
  if (compute_stream(device).handle == stream) return "compute stream";
  if (copy_stream(device).handle == stream) return "copy stream";
  return fmt::format("stream {}", fmt::ptr(stream));
}

json args_json(const std::vector<Arg>& args) {
  json out = json::object();
  for (const Arg& a : args) {
    switch (a.kind) {
      case Arg::Kind::Int: out[a.key] = a.int_value; break;
      case Arg::Kind::Double: out[a.key] = a.double_value; break;
      case Arg::Kind::Text: out[a.key] = a.text; break;
    }
  }
  return out;
}

json event_json(const TraceEvent& e) {
  json j;
  j["ph"] = std::string(1, e.phase);
  j["name"] = e.name;
  if (!e.category.empty()) j["cat"] = e.category;
  if (e.phase != 'M') j["ts"] = e.ts_us;
  if (e.phase == 'X') j["dur"] = e.dur_us;
  if (e.phase == 'i') j["s"] = "t";  // an instant on its thread's track
  j["pid"] = e.pid;
  if (e.phase != 'C') j["tid"] = e.tid;
  if (!e.args.empty()) j["args"] = args_json(e.args);
  return j;
}

int64_t origin_of(const json& trace, const std::string& path) {
  const auto other = trace.find("otherData");
  MG_CHECK(other != trace.end() && other->is_object() && other->contains("minigrad") &&
               (*other)["minigrad"].contains("origin_ns") &&
               (*other)["minigrad"]["origin_ns"].is_number_integer(),
           "merge_chrome_traces: {} is not a trace exported by minigrad (no "
           "otherData.minigrad.origin_ns to align its clock by)",
           path);
  return (*other)["minigrad"]["origin_ns"].get<int64_t>();
}

}  // namespace

std::vector<TraceEvent> collect(const TraceInfo& info) {
  MG_CHECK(info.rank >= 0 && info.world_size > info.rank,
           "profiler: rank {} is not in a world of {} process(es)", info.rank, info.world_size);
  detail::Registry& r = detail::registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  resolve_device_spans(r);

  std::vector<TraceEvent> meta, events;
  const int host = host_pid(info);
  const std::string process = process_name(info);
  meta.push_back(metadata("process_name", host, 0, text_arg("name", process)));
  meta.push_back(metadata("process_sort_index", host, 0, int_arg("sort_index", host)));

  std::set<Device> device_processes;
  std::map<std::pair<Device, void*>, int> stream_tracks;
  auto device_process = [&](Device device) {
    if (!device_processes.insert(device).second) return;
    const int pid = device_pid(info, device);
    meta.push_back(metadata("process_name", pid, 0,
                            text_arg("name", fmt::format("{} {}", process, device))));
    meta.push_back(metadata("process_sort_index", pid, 0, int_arg("sort_index", pid)));
  };
  auto stream_track = [&](Device device, void* stream) {
    device_process(device);
    auto [it, inserted] = stream_tracks.try_emplace({device, stream}, 0);
    if (inserted) {
      int n = 0;
      for (const auto& [key, tid] : stream_tracks)
        if (key.first == device && tid != 0) ++n;
      it->second = n + 1;
      const int pid = device_pid(info, device);
      meta.push_back(metadata("thread_name", pid, it->second,
                              text_arg("name", stream_track_name(r, device, stream))));
      meta.push_back(metadata("thread_sort_index", pid, it->second,
                              int_arg("sort_index", it->second)));
    }
    return it->second;
  };

  for (const auto& buffer : r.buffers) {
    bool named = false;
    buffer->for_each([&](Record& record) {
      if (record.phase == '-' || record.phase == 'D') return;
      TraceEvent e;
      e.name = record.name;
      e.category = record.category;
      e.ts_us = us_since(r.origin_ns, record.start_ns);
      e.args = record.args;
      if (record.phase == 'C') {
        const bool on_host = record.device.is_cpu();
        if (!on_host) device_process(record.device);
        e.phase = 'C';
        e.name = "allocated bytes";
        e.pid = on_host ? host : device_pid(info, record.device);
        e.args = {int_arg("bytes", record.value)};
        events.push_back(std::move(e));
        return;
      }
      if (!named) {
        named = true;
        meta.push_back(metadata(
            "thread_name", host, buffer->tid,
            text_arg("name", buffer->name.empty() ? fmt::format("thread {}", buffer->tid)
                                                  : buffer->name)));
        meta.push_back(metadata("thread_sort_index", host, buffer->tid,
                                int_arg("sort_index", buffer->tid)));
      }
      e.phase = record.phase == 'R' ? 'X' : record.phase;
      if (e.phase == 'X') e.dur_us = us_since(record.start_ns, record.end_ns);
      if (record.phase == 'R') {
        e.pid = device_pid(info, record.device);
        e.tid = stream_track(record.device, record.stream);
        e.args.push_back(text_arg("device", record.device.str()));
      } else {
        e.pid = host;
        e.tid = buffer->tid;
      }
      events.push_back(std::move(e));
    });
  }
  // Time order; of two spans that start together the longer (the parent) first.
  std::stable_sort(events.begin(), events.end(), [](const TraceEvent& a, const TraceEvent& b) {
    if (a.ts_us != b.ts_us) return a.ts_us < b.ts_us;
    return a.dur_us > b.dur_us;
  });
  meta.insert(meta.end(), std::make_move_iterator(events.begin()),
              std::make_move_iterator(events.end()));
  return meta;
}

std::string chrome_trace_json(const TraceInfo& info) {
  const std::vector<TraceEvent> events = collect(info);
  json trace_events = json::array();
  for (const TraceEvent& e : events) trace_events.push_back(event_json(e));
  int64_t origin_ns = 0;
  {
    detail::Registry& r = detail::registry();
    std::lock_guard<std::mutex> lock(r.mutex);
    origin_ns = r.origin_ns;
  }
  json trace;
  trace["traceEvents"] = std::move(trace_events);
  trace["displayTimeUnit"] = "ms";
  trace["otherData"]["minigrad"] = {{"clock", "CLOCK_MONOTONIC"},
                                    {"origin_ns", origin_ns},
                                    {"rank", info.rank},
                                    {"world_size", info.world_size}};
  return trace.dump() + "\n";
}

void export_chrome_trace(const std::string& path, const TraceInfo& info) {
  files::write_atomically("export_chrome_trace", path, chrome_trace_json(info));
}

void merge_chrome_traces(const std::vector<std::string>& inputs, const std::string& output) {
  MG_CHECK(!inputs.empty(), "merge_chrome_traces: no traces to merge into '{}'", output);
  std::vector<json> traces;
  std::vector<int64_t> origins;
  for (const std::string& path : inputs) {
    const files::OpenedFile file = files::open_for_reading("merge_chrome_traces", path);
    std::string text(static_cast<std::size_t>(file.size), '\0');
    files::read_exactly("merge_chrome_traces", path, file.fd.get(), 0, text.data(), text.size());
    json trace = json::parse(text, nullptr, /*allow_exceptions=*/false);
    MG_CHECK(!trace.is_discarded() && trace.is_object() && trace.contains("traceEvents") &&
                 trace["traceEvents"].is_array(),
             "merge_chrome_traces: {} is not a Chrome trace (a JSON object with a "
             "traceEvents array)",
             path);
    origins.push_back(origin_of(trace, path));
    traces.push_back(std::move(trace));
  }
  const int64_t origin = *std::min_element(origins.begin(), origins.end());

  json merged_events = json::array();
  std::map<int, std::string> pid_owner;
  for (size_t i = 0; i < traces.size(); ++i) {
    const double shift_us = static_cast<double>(origins[i] - origin) / 1000.0;
    std::set<int> pids;
    for (json& e : traces[i]["traceEvents"]) {
      if (e.contains("pid") && e["pid"].is_number_integer()) pids.insert(e["pid"].get<int>());
      if (e.contains("ts") && e["ts"].is_number())
        e["ts"] = std::round((e["ts"].get<double>() + shift_us) * 1000.0) / 1000.0;
      merged_events.push_back(std::move(e));
    }
    for (int pid : pids) {
      const auto [it, fresh] = pid_owner.emplace(pid, inputs[i]);
      MG_CHECK(fresh,
               "merge_chrome_traces: {} and {} both have process {}: were they written by "
               "the same rank? (each rank's trace names its processes by its rank)",
               it->second, inputs[i], pid);
    }
  }
  json merged;
  merged["traceEvents"] = std::move(merged_events);
  merged["displayTimeUnit"] = "ms";
  merged["otherData"]["minigrad"] = {{"clock", "CLOCK_MONOTONIC"},
                                     {"origin_ns", origin},
                                     {"merged_from", inputs}};
  files::write_atomically("merge_chrome_traces", output, merged.dump() + "\n");
}

}  // namespace mg::profiler
