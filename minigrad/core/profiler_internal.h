// Internal to the profiler (profiler.cpp records, trace_export.cpp exports): what a
// record is, the per-thread buffers, and the session's registry. Not part of the user API.
#pragma once

#include <array>
#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include <minigrad/core/profiler.h>

namespace mg::profiler::detail {

int64_t now_ns();  // the steady clock (CLOCK_MONOTONIC: one clock for every process)

struct Record {
  // X: a span on its thread; i: an instant; C: a memory sample of `device`;
  // D: the device work of a span, between two events on (device, stream), resolved
  // into R (start_ns and end_ns in host time) when exported; -: dropped.
  char phase = 'X';
  std::string name;
  const char* category = "";
  int64_t start_ns = 0;
  int64_t end_ns = 0;
  std::vector<Arg> args;
  Device device;
  void* stream = nullptr;
  void* start_event = nullptr;
  void* end_event = nullptr;
  int64_t value = 0;  // C: bytes
};

// Written by its owner only; read by the exporter, up to each chunk's published size.
struct Chunk {
  static constexpr size_t kCapacity = 256;
  std::array<Record, kCapacity> records;
  std::atomic<size_t> size{0};
  std::atomic<Chunk*> next{nullptr};
};

struct ThreadBuffer {
  uint64_t session = 0;
  int tid = 0;
  std::string name;  // under Registry::mutex
  Chunk head;
  Chunk* tail = &head;  // the owner's

  ThreadBuffer() = default;
  ~ThreadBuffer();
  ThreadBuffer(const ThreadBuffer&) = delete;
  ThreadBuffer& operator=(const ThreadBuffer&) = delete;

  void push(Record&& record);  // the owner only
  // Every published record, in the order they were written.
  template <typename F>
  void for_each(F&& f) {
    for (Chunk* c = &head; c != nullptr; c = c->next.load(std::memory_order_acquire)) {
      const size_t n = c->size.load(std::memory_order_acquire);
      for (size_t i = 0; i < n; ++i) f(c->records[i]);
    }
  }
};

struct Registry {
  std::mutex mutex;
  std::atomic<uint64_t> session{0};  // incremented by every start()
  std::atomic<bool> memory{true};
  std::atomic<bool> device_spans{true};
  int64_t origin_ns = 0;  // when the session began
  std::vector<std::shared_ptr<ThreadBuffer>> buffers;
  int next_tid = 1;
  std::map<std::pair<Device, void*>, std::string> stream_names;

  void clear_locked();
};

Registry& registry();
// This thread's buffer for `session`, made on first use; null if that session is over.
ThreadBuffer* current_buffer(uint64_t session);

}  // namespace mg::profiler::detail
