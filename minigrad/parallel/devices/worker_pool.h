// WorkerPool: the threads that parallel_apply runs its replicas on.
//
// One long-lived thread per replica slot, made the first time that many replicas run and
// kept for the life of the process: a thread's per-device state (its current device and
// stream, a cuBLAS handle per device, allocator caches) is set up once, not at every
// step, and no thread is started in the hot path. PyTorch's parallel_apply starts fresh
// threads per call; this pool is the one thing minigrad adds to its shape, for speed.
#pragma once

#include <functional>
#include <memory>
#include <mutex>
#include <vector>

namespace mg::parallel {

class WorkerPool {
 public:
  // The process's pool.
  static WorkerPool& instance();

  // Runs every task, task i on worker i, and returns when all have finished. The tasks
  // must catch their own exceptions. One caller at a time uses the pool's threads; a
  // second concurrent caller (another user thread, or a task that itself calls run_all:
  // a DataParallel inside a DataParallel) runs its tasks on threads of its own instead of
  // waiting for the pool it may be running on.
  void run_all(std::vector<std::function<void()>>& tasks);

  ~WorkerPool();
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

 private:
  class Worker;
  WorkerPool();

  std::mutex busy_;
  std::vector<std::unique_ptr<Worker>> workers_;
};

}  // namespace mg::parallel
