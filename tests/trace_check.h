// Checks a Chrome trace-event JSON file as Perfetto and chrome://tracing read it, and
// finds spans in it. Shared by the tests of the profiler (tests/core), of the spans that
// DataParallel and DDP record (tests/parallel, tests/distributed), of the programs'
// --trace (tests/samples) and of the GPU's stream tracks (tests/cuda).
#pragma once

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace mg::testing {

struct TraceSpan {
  std::string name, category;
  double ts = 0.0, dur = 0.0;  // microseconds
  int pid = 0, tid = 0;
  nlohmann::json args;
  double end() const { return ts + dur; }
};

struct ParsedTrace {
  nlohmann::json json;
  std::vector<TraceSpan> spans;                     // the X events
  std::map<int, std::string> process_names;         // pid -> name
  std::map<std::pair<int, int>, std::string> thread_names;  // (pid, tid) -> name
  std::vector<std::string> problems;                // empty: the trace follows the format

  std::vector<TraceSpan> named(const std::string& name) const {
    std::vector<TraceSpan> out;
    for (const TraceSpan& s : spans)
      if (s.name == name) out.push_back(s);
    return out;
  }
  std::vector<TraceSpan> with_prefix(const std::string& prefix) const {
    std::vector<TraceSpan> out;
    for (const TraceSpan& s : spans)
      if (s.name.rfind(prefix, 0) == 0) out.push_back(s);
    return out;
  }
  std::string thread_of(const TraceSpan& s) const {
    const auto it = thread_names.find({s.pid, s.tid});
    return it == thread_names.end() ? std::string() : it->second;
  }
  std::string problem_list() const {
    std::string out;
    for (const std::string& p : problems) out += "\n  " + p;
    return out;
  }
};

// Parses `text` and checks what a reader of the format relies on: a traceEvents array;
// every event a phase, a name and an integer pid; X events ts, dur >= 0 and tid, B and
// E balanced per thread, C numeric args, M events the metadata names with their
// arguments; every process and thread that has events named; and the spans of one
// track nested, never half-overlapping (Perfetto would drop those).
inline ParsedTrace parse_trace(const std::string& text) {
  ParsedTrace t;
  t.json = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  auto problem = [&](std::string what) { t.problems.push_back(std::move(what)); };
  if (t.json.is_discarded() || !t.json.is_object()) {
    problem("not a JSON object");
    return t;
  }
  if (!t.json.contains("traceEvents") || !t.json["traceEvents"].is_array()) {
    problem("no traceEvents array");
    return t;
  }
  std::set<int> pids_used;
  std::set<std::pair<int, int>> threads_used;
  std::map<std::pair<int, int>, int> open_b;
  size_t index = 0;
  for (const nlohmann::json& e : t.json["traceEvents"]) {
    const std::string where = fmt::format("event {}", index++);
    if (!e.is_object() || !e.contains("ph") || !e["ph"].is_string() || !e.contains("name") ||
        !e["name"].is_string() || !e.contains("pid") || !e["pid"].is_number_integer()) {
      problem(where + ": needs ph, name and an integer pid: " + e.dump());
      continue;
    }
    const std::string ph = e["ph"];
    const int pid = e["pid"];
    const bool has_tid = e.contains("tid") && e["tid"].is_number_integer();
    const int tid = has_tid ? e["tid"].get<int>() : 0;
    const bool has_ts = e.contains("ts") && e["ts"].is_number();
    if (e.contains("args") && !e["args"].is_object()) problem(where + ": args is not an object");
    if (ph == "X") {
      if (!has_ts || !has_tid || !e.contains("dur") || !e["dur"].is_number() ||
          e["dur"].get<double>() < 0) {
        problem(where + ": an X event needs ts, tid and dur >= 0: " + e.dump());
        continue;
      }
      TraceSpan s;
      s.name = e["name"];
      s.category = e.value("cat", "");
      s.ts = e["ts"];
      s.dur = e["dur"];
      s.pid = pid;
      s.tid = tid;
      s.args = e.value("args", nlohmann::json::object());
      t.spans.push_back(std::move(s));
      pids_used.insert(pid);
      threads_used.insert({pid, tid});
    } else if (ph == "B" || ph == "E") {
      if (!has_ts || !has_tid) problem(where + ": B and E events need ts and tid");
      int& depth = open_b[{pid, tid}];
      depth += ph == "B" ? 1 : -1;
      if (depth < 0) problem(where + ": an E event without its B");
      threads_used.insert({pid, tid});
    } else if (ph == "C") {
      bool numeric = has_ts && e.contains("args") && e["args"].is_object() && !e["args"].empty();
      if (numeric)
        for (const auto& [key, value] : e["args"].items()) numeric = numeric && value.is_number();
      if (!numeric) problem(where + ": a C event needs ts and numeric args: " + e.dump());
      pids_used.insert(pid);
    } else if (ph == "i" || ph == "I") {
      if (!has_ts) problem(where + ": an instant event needs ts");
      if (e.contains("s") && e["s"] != "t" && e["s"] != "p" && e["s"] != "g")
        problem(where + ": an instant event's scope is t, p or g");
      if (has_tid) threads_used.insert({pid, tid});
    } else if (ph == "M") {
      const std::string name = e["name"];
      const nlohmann::json args = e.value("args", nlohmann::json::object());
      if (name == "process_name" || name == "thread_name") {
        if (!args.contains("name") || !args["name"].is_string()) {
          problem(where + ": " + name + " needs args.name");
          continue;
        }
        if (name == "process_name") t.process_names[pid] = args["name"];
        else if (!has_tid) problem(where + ": thread_name needs a tid");
        else t.thread_names[{pid, tid}] = args["name"];
      } else if (name == "process_sort_index" || name == "thread_sort_index") {
        if (!args.contains("sort_index") || !args["sort_index"].is_number_integer())
          problem(where + ": " + name + " needs an integer args.sort_index");
      } else {
        problem(where + ": unknown metadata event " + name);
      }
    } else {
      problem(where + ": phase '" + ph + "' is not one minigrad writes");
    }
  }
  for (const auto& [key, depth] : open_b)
    if (depth != 0) problem(fmt::format("pid {} tid {}: B and E do not balance", key.first, key.second));
  for (int pid : pids_used)
    if (t.process_names.count(pid) == 0) problem(fmt::format("process {} has no name", pid));
  for (const auto& key : threads_used)
    if (t.thread_names.count(key) == 0)
      problem(fmt::format("thread {} of process {} has no name", key.second, key.first));

  // Nesting: on each track, sorted by start (longer first), each span must end before the
  // span it starts inside of ends (1 ns of rounding allowed).
  std::map<std::pair<int, int>, std::vector<const TraceSpan*>> tracks;
  for (const TraceSpan& s : t.spans) tracks[{s.pid, s.tid}].push_back(&s);
  for (auto& [key, list] : tracks) {
    std::sort(list.begin(), list.end(), [](const TraceSpan* a, const TraceSpan* b) {
      return a->ts != b->ts ? a->ts < b->ts : a->dur > b->dur;
    });
    std::vector<const TraceSpan*> stack;
    for (const TraceSpan* s : list) {
      while (!stack.empty() && stack.back()->end() <= s->ts + 1e-3) stack.pop_back();
      if (!stack.empty() && s->end() > stack.back()->end() + 1e-3)
        problem(fmt::format("'{}' [{}, {}] half-overlaps '{}' [{}, {}] on pid {} tid {}", s->name,
                            s->ts, s->end(), stack.back()->name, stack.back()->ts,
                            stack.back()->end(), key.first, key.second));
      stack.push_back(s);
    }
  }
  return t;
}

}  // namespace mg::testing
