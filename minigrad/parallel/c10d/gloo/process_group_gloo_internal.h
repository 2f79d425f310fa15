// Internal to ProcessGroupGloo: its state, the Work of one operation, and the SIGPIPE
// guard, shared by gloo_process_group.cpp (the group, its collectives and sub-groups)
// and gloo_point_to_point.cpp (send and recv). Not part of the user API.
#pragma once

#ifdef MINIGRAD_WITH_GLOO

#include <signal.h>

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <minigrad/core/profiler.h>
#include <minigrad/parallel/c10d/gloo/process_group_gloo.h>

namespace gloo::rendezvous {
class Context;
}
namespace gloo::transport {
class Device;
class UnboundBuffer;
}  // namespace gloo::transport

namespace mg::parallel {

namespace gloo_detail {

double seconds_of(std::chrono::milliseconds ms);

// Gloo writes to its sockets without MSG_NOSIGNAL, so writing to a peer that died raises
// SIGPIPE, whose default action kills the process before Gloo can report the error.
// (Python ignores SIGPIPE at start-up, which is why PyTorch never meets this.) Rather
// than change the whole process's disposition, SIGPIPE is blocked in the threads that
// talk to Gloo: the communication thread, the point-to-point waiters, Gloo's own
// event-loop thread (which inherits the mask of the thread creating the device), and a
// caller's thread while it connects or posts a message; the write then fails with EPIPE
// and Gloo throws.
void block_sigpipe_in_this_thread(sigset_t* previous);

// Blocks SIGPIPE for a scope; one raised meanwhile is discarded before the mask returns.
class ScopedSigpipeBlock {
 public:
  ScopedSigpipeBlock();
  ~ScopedSigpipeBlock();
  ScopedSigpipeBlock(const ScopedSigpipeBlock&) = delete;
  ScopedSigpipeBlock& operator=(const ScopedSigpipeBlock&) = delete;

 private:
  sigset_t previous_;
  bool was_blocked_ = false;
};

// One operation (a queued collective, or a message): what to run, and its outcome.
class GlooWork : public Work {
 public:
  GlooWork(std::string description, std::function<void()> run)
      : description_(std::move(description)), run_(std::move(run)) {}

  void wait() override;
  bool is_completed() override;
  double duration_seconds() const override;

  const std::string& description() const { return description_; }
  // Runs the operation (on the thread that owns it), and finishes it when that returns.
  // In a trace it is a span named by the operation ("allreduce", "send").
  void run();
  void finish(std::exception_ptr error, double duration);
  // A message's tensors and coalesced copy, released by the first wait() after the work is
  // done, on the caller's thread at a point of its program (or with the work, when nobody
  // waits). Released on a waiter thread instead, they would leave the caller's memory at a
  // moment set by when the peer took the message, and a rank's peak would move from run to
  // run. Set before the work is submitted.
  void hold_until_wait(std::shared_ptr<const void> held) { held_ = std::move(held); }

 private:
  std::string description_;
  std::string label_ = profiler::collective_label();  // the caller's, at construction
  std::function<void()> run_;
  std::shared_ptr<const void> held_;
  mutable std::mutex mutex_;
  std::condition_variable cv_;
  bool done_ = false;
  double duration_ = -1.0;
  std::exception_ptr error_;
};

// Threads that wait for messages, one per message in flight: a message completes when its
// peer posts the matching half, in whatever order the program posts them, so no message
// may wait behind another. Threads are kept for reuse and joined at the end.
class WaiterThreads {
 public:
  ~WaiterThreads();
  void submit(std::function<void()> job);
  void stop();  // runs what is queued, then joins every thread

 private:
  void loop();
  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> jobs_;
  std::vector<std::thread> threads_;
  size_t idle_ = 0;  // threads not running a job: at least one for every queued job
  bool stopping_ = false;
};

}  // namespace gloo_detail

struct ProcessGroupGloo::Impl {
  int rank = 0;
  int size = 1;
  std::shared_ptr<Store> store;
  std::string prefix;      // this group's keys in the store: "gloo/0/", "gloo/0/sub1/"
  uint64_t subgroups = 0;  // new_group calls so far
  ProcessGroupOptions options;
  std::shared_ptr<gloo::transport::Device> device;  // shared with the sub-groups
  std::shared_ptr<gloo::rendezvous::Context> context;

  // The collectives' queue, run in call order by `worker`.
  std::mutex mutex;
  std::condition_variable cv;
  std::deque<std::shared_ptr<gloo_detail::GlooWork>> queue;
  bool stopping = false;
  uint32_t next_tag = 0;    // Gloo matches the messages of concurrent collectives by tag
  uint64_t sequence = 0;    // numbers operations in messages: "allreduce #12", "send #13"
  std::string first_error;  // after one failure the connections are unusable
  std::thread worker;

  // Point to point (gloo_point_to_point.cpp).
  struct RecvChannel {      // the recvs from one peer with one tag, in post order
    uint64_t posted = 0;    // tickets handed out
    uint64_t payloads = 0;  // tickets whose payload recv is posted
  };
  std::mutex p2p_mutex;  // one message's posts stay together; guards the below
  std::condition_variable p2p_cv;
  std::map<std::pair<int, int>, RecvChannel> recv_channels;   // by (src, tag)
  std::set<gloo::transport::UnboundBuffer*> pending_buffers;  // aborted at destruction
  bool p2p_stopping = false;
  gloo_detail::WaiterThreads waiters;

  // `op` and `detail` name the collective in messages: "allreduce #3 (sum of 40 bytes)".
  std::shared_ptr<Work> enqueue(const char* op, const std::string& detail,
                                std::function<void(uint32_t)> body);
  void run_worker();
  std::string next_description(const char* op, const std::string& detail);
  void record_failure(const std::string& message);
  std::string failure();  // the first error, or empty
  void stop_point_to_point();
};

}  // namespace mg::parallel

#endif  // MINIGRAD_WITH_GLOO
