// How the in-process Pipe hands tensors from one stage's thread to the next: a queue of
// hand-offs per direction between neighbouring stages. A hand-off carries the stream
// that produced the tensor, so the receiver can order its copy after that work (see
// ordered_copy_ in transfer.h); the receiver makes the copy, on its own stream.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <mutex>

#include <minigrad/core/stream.h>
#include <minigrad/core/tensor.h>

namespace mg::parallel {

struct Handoff {
  int64_t micro_batch = 0;
  Tensor tensor;
  Stream stream;  // where `tensor` was made (and will be freed)
};

// Thrown in a stage waiting for a hand-off that will never come, because another
// stage failed; the Pipe reports that stage's error instead.
struct PipeAborted : std::exception {
  const char* what() const noexcept override { return "pipeline aborted by another stage"; }
};

class Channel {
 public:
  void push(Handoff handoff) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      queue_.push_back(std::move(handoff));
    }
    ready_.notify_one();
  }
  // Waits for the next hand-off; PipeAborted once abort() was called.
  Handoff pop() {
    std::unique_lock<std::mutex> lock(mutex_);
    ready_.wait(lock, [this] { return aborted_ || !queue_.empty(); });
    if (aborted_) throw PipeAborted();
    Handoff next = std::move(queue_.front());
    queue_.pop_front();
    return next;
  }
  void abort() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      aborted_ = true;
    }
    ready_.notify_all();
  }

 private:
  std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<Handoff> queue_;
  bool aborted_ = false;
};

}  // namespace mg::parallel
