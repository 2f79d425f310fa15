// Recording: the session, the per-thread buffers and the spans. Export is in
// trace_export.cpp.
//
// Each thread appends to a buffer of its own, made the first time it records in a
// session. A buffer is a list of fixed-size chunks; the owner writes a record into the
// next free slot and then publishes it by storing the chunk's new size (release), so the
// exporter, which reads each chunk's size (acquire) and the slots below it, sees whole
// records only, without a lock on the recording side. Records never move once written.
#include <minigrad/core/profiler_internal.h>

#include <chrono>

#include <minigrad/core/backend.h>

namespace mg::profiler {

namespace detail {
std::atomic<bool> enabled{false};
std::atomic<bool> autograd_nodes{false};

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

Registry& registry() {
  // Never destroyed: threads may still end spans during static destruction.
  static Registry* r = new Registry();
  return *r;
}

ThreadBuffer::~ThreadBuffer() {
  Chunk* c = head.next.load(std::memory_order_acquire);
  while (c != nullptr) {
    Chunk* next = c->next.load(std::memory_order_acquire);
    delete c;
    c = next;
  }
}

void ThreadBuffer::push(Record&& record) {
  size_t n = tail->size.load(std::memory_order_relaxed);
  if (n == Chunk::kCapacity) {
    auto* chunk = new Chunk();
    tail->next.store(chunk, std::memory_order_release);
    tail = chunk;
    n = 0;
  }
  tail->records[n] = std::move(record);
  tail->size.store(n + 1, std::memory_order_release);
}

namespace {

thread_local std::shared_ptr<ThreadBuffer> this_thread_buffer;
thread_local std::string this_thread_name;
std::atomic<uint64_t> buffers_created{0};

}  // namespace

ThreadBuffer* current_buffer(uint64_t session) {
  ThreadBuffer* buffer = this_thread_buffer.get();
  if (buffer != nullptr && buffer->session == session) return buffer;
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  // The session may have ended (or a new one begun) since the caller looked.
  if (r.session.load(std::memory_order_relaxed) != session) return nullptr;
  auto fresh = std::make_shared<ThreadBuffer>();
  fresh->session = session;
  fresh->tid = r.next_tid++;
  fresh->name = this_thread_name;
  r.buffers.push_back(fresh);
  buffers_created.fetch_add(1, std::memory_order_relaxed);
  this_thread_buffer = std::move(fresh);
  return this_thread_buffer.get();
}

struct OpenSpan {
  std::string name;
  const char* category = "";
  int64_t start_ns = 0;
  uint64_t session = 0;
  std::vector<Arg> args;
  bool has_device = false;
  Device device;
  void* stream = nullptr;       // the device's current stream when the span began
  void* start_event = nullptr;  // recorded on it then (null: no device timing)
};

namespace {

void destroy_event(Device device, void* event) {
  if (event == nullptr) return;
  try {
    backend(device).event_destroy(event);
  } catch (...) {  // a span's end must not throw; a lost event is the lesser harm
  }
}

// A timing event recorded on `stream`, or null when the backend times nothing there.
void* record_timing_event(const Stream& stream) {
  try {
    return backend(stream.device).timing_event_record(stream);
  } catch (...) {
    return nullptr;
  }
}

void sample_memory(ThreadBuffer& buffer, Device device, int64_t at_ns) {
  int64_t bytes = 0;
  try {
    bytes = static_cast<int64_t>(backend(device).memory_allocated(device.index()));
  } catch (...) {  // a span's ends must not throw; a missing sample is the lesser harm
    return;
  }
  Record record;
  record.phase = 'C';
  record.start_ns = at_ns;
  record.device = device;
  record.value = bytes;
  buffer.push(std::move(record));
}

}  // namespace

OpenSpan* begin_span(std::string name, const char* category, const Device* device) {
  Registry& r = registry();
  auto* span = new OpenSpan();
  span->name = std::move(name);
  span->category = category != nullptr ? category : "";
  span->session = r.session.load(std::memory_order_acquire);
  if (device != nullptr) {
    span->has_device = true;
    span->device = *device;
    if (r.device_spans.load(std::memory_order_relaxed) && !device->is_cpu()) {
      const Stream stream = current_stream(*device);
      span->stream = stream.handle;
      span->start_event = record_timing_event(stream);
    }
    if (r.memory.load(std::memory_order_relaxed)) {
      if (ThreadBuffer* buffer = current_buffer(span->session))
        sample_memory(*buffer, *device, now_ns());
    }
  }
  span->start_ns = now_ns();
  return span;
}

void add_arg(OpenSpan* span, Arg arg) { span->args.push_back(std::move(arg)); }

void end_span(OpenSpan* span) {
  const int64_t end_ns = now_ns();
  Registry& r = registry();
  ThreadBuffer* buffer = nullptr;
  if (enabled.load(std::memory_order_relaxed)) buffer = current_buffer(span->session);
  if (buffer == nullptr) {  // the session ended while the span was open
    if (span->start_event != nullptr) destroy_event(span->device, span->start_event);
    delete span;
    return;
  }
  Record host;
  host.phase = 'X';
  host.name = span->name;
  host.category = span->category;
  host.start_ns = span->start_ns;
  host.end_ns = end_ns;
  host.args = span->args;
  if (span->has_device) {
    host.args.push_back(Arg{"device", Arg::Kind::Text, 0, 0.0, span->device.str()});
  }
  if (span->start_event != nullptr) {
    void* end_event = record_timing_event(Stream{span->device, span->stream});
    if (end_event == nullptr) {
      destroy_event(span->device, span->start_event);
    } else {
      Record work;
      work.phase = 'D';
      work.name = std::move(span->name);
      work.category = span->category;
      work.args = std::move(span->args);
      work.device = span->device;
      work.stream = span->stream;
      work.start_event = span->start_event;
      work.end_event = end_event;
      buffer->push(std::move(work));
    }
  }
  buffer->push(std::move(host));
  if (span->has_device && r.memory.load(std::memory_order_relaxed))
    sample_memory(*buffer, span->device, end_ns);
  delete span;
}

}  // namespace detail

using detail::Record;
using detail::registry;

Span& Span::category(const char* category) {
  if (open_ != nullptr) open_->category = category;
  return *this;
}

void instant(std::string name, const char* category, std::vector<Arg> args) {
  if (!is_enabled()) return;
  const uint64_t session = registry().session.load(std::memory_order_acquire);
  detail::ThreadBuffer* buffer = detail::current_buffer(session);
  if (buffer == nullptr) return;
  Record record;
  record.phase = 'i';
  record.name = std::move(name);
  record.category = category != nullptr ? category : "";
  record.start_ns = detail::now_ns();
  record.args = std::move(args);
  buffer->push(std::move(record));
}

void record_span(std::string name, const char* category,
                 std::chrono::steady_clock::time_point start,
                 std::chrono::steady_clock::time_point end, std::vector<Arg> args) {
  if (!is_enabled()) return;
  const uint64_t session = registry().session.load(std::memory_order_acquire);
  detail::ThreadBuffer* buffer = detail::current_buffer(session);
  if (buffer == nullptr) return;
  auto ns = [](std::chrono::steady_clock::time_point t) {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
  };
  Record record;
  record.phase = 'X';
  record.name = std::move(name);
  record.category = category != nullptr ? category : "";
  record.start_ns = ns(start);
  record.end_ns = std::max(ns(end), record.start_ns);
  record.args = std::move(args);
  buffer->push(std::move(record));
}

namespace {
thread_local std::string this_thread_label;
}  // namespace

void CollectiveLabel::set(std::string label) {
  previous_ = std::exchange(this_thread_label, std::move(label));
  set_ = true;
}

CollectiveLabel::~CollectiveLabel() {
  if (set_) this_thread_label = std::move(previous_);
}

const std::string& collective_label() { return this_thread_label; }

void start(const ProfilerOptions& options) {
  detail::Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  MG_CHECK(!detail::enabled.load(std::memory_order_relaxed),
           "profiler::start: a session is already recording; stop() it first");
  r.clear_locked();
  r.origin_ns = detail::now_ns();
  r.memory.store(options.memory, std::memory_order_relaxed);
  r.device_spans.store(options.device_spans, std::memory_order_relaxed);
  detail::autograd_nodes.store(options.autograd_nodes, std::memory_order_relaxed);
  r.session.fetch_add(1, std::memory_order_release);
  detail::enabled.store(true, std::memory_order_release);
}

void stop() {
  detail::Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  detail::enabled.store(false, std::memory_order_release);
  detail::autograd_nodes.store(false, std::memory_order_relaxed);
}

void clear() {
  detail::Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  r.clear_locked();
}

void set_thread_name(std::string name) {
  detail::this_thread_name = std::move(name);
  detail::ThreadBuffer* buffer = detail::this_thread_buffer.get();
  if (buffer == nullptr) return;
  detail::Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  buffer->name = detail::this_thread_name;
}

void set_stream_name(const Stream& stream, std::string name) {
  detail::Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  r.stream_names[{stream.device, stream.handle}] = std::move(name);
}

uint64_t thread_buffers_created() {
  return detail::buffers_created.load(std::memory_order_relaxed);
}

namespace detail {

void Registry::clear_locked() {
  for (const std::shared_ptr<ThreadBuffer>& buffer : buffers)
    buffer->for_each([](Record& record) {
      if (record.phase != 'D') return;
      destroy_event(record.device, record.start_event);
      destroy_event(record.device, record.end_event);
      record.start_event = record.end_event = nullptr;
      record.phase = '-';
    });
  buffers.clear();
  next_tid = 1;
}

}  // namespace detail

}  // namespace mg::profiler
