#include <minigrad/parallel/devices/worker_pool.h>

#include <condition_variable>
#include <thread>

#include <fmt/format.h>

#include <minigrad/core/profiler.h>

namespace mg::parallel {

// One long-lived thread that runs one task at a time.
class WorkerPool::Worker {
 public:
  explicit Worker(size_t index)
      : thread_([this, index] {
          profiler::set_thread_name(fmt::format("worker {}", index));
          loop();
        }) {}
  ~Worker() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    wake_.notify_one();
    thread_.join();
  }
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;

  // Hands `task` to the thread (which is idle: the pool gives each worker one task per
  // run). The task catches its own exceptions.
  void post(std::function<void()> task) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      task_ = std::move(task);
    }
    wake_.notify_one();
  }

 private:
  void loop() {
    for (;;) {
      std::function<void()> task;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        wake_.wait(lock, [this] { return stopping_ || task_ != nullptr; });
        if (stopping_ && task_ == nullptr) return;
        task = std::move(task_);
        task_ = nullptr;
      }
      task();
    }
  }

  std::mutex mutex_;
  std::condition_variable wake_;
  std::function<void()> task_;
  bool stopping_ = false;
  std::thread thread_;  // last: starts after the members it uses exist
};

namespace {

// Marks pool threads, so a task that itself calls run_all does not wait for the pool
// it is running on.
thread_local bool on_pool_thread = false;

void run_on_fresh_threads(std::vector<std::function<void()>>& tasks) {
  std::vector<std::thread> threads;
  threads.reserve(tasks.size());
  for (size_t i = 0; i < tasks.size(); ++i)
    threads.emplace_back([&task = tasks[i], i] {
      profiler::set_thread_name(fmt::format("worker thread {}", i));
      task();
    });
  for (auto& t : threads) t.join();
}

}  // namespace

WorkerPool::WorkerPool() = default;
WorkerPool::~WorkerPool() = default;

WorkerPool& WorkerPool::instance() {
  static WorkerPool pool;
  return pool;
}

void WorkerPool::run_all(std::vector<std::function<void()>>& tasks) {
  std::unique_lock<std::mutex> busy(busy_, std::try_to_lock);
  if (on_pool_thread || !busy.owns_lock()) {
    run_on_fresh_threads(tasks);
    return;
  }
  while (workers_.size() < tasks.size())
    workers_.push_back(std::make_unique<Worker>(workers_.size()));

  std::mutex done_mutex;
  std::condition_variable all_done;
  size_t remaining = tasks.size();
  for (size_t i = 0; i < tasks.size(); ++i) {
    workers_[i]->post([&, i] {
      on_pool_thread = true;
      tasks[i]();
      std::lock_guard<std::mutex> lock(done_mutex);
      if (--remaining == 0) all_done.notify_one();
    });
  }
  std::unique_lock<std::mutex> lock(done_mutex);
  all_done.wait(lock, [&] { return remaining == 0; });
}

}  // namespace mg::parallel
