#include <minigrad/parallel/parallel_apply.h>

#include <condition_variable>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>

#include <minigrad/autograd/grad_mode.h>
#include <minigrad/core/stream.h>

namespace mg::parallel {
namespace {

// One long-lived thread that runs one task at a time.
class Worker {
 public:
  Worker() : thread_([this] { loop(); }) {}
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

// Marks pool threads, so a replica that itself calls parallel_apply (a DataParallel
// inside a DataParallel) does not wait for the pool it is running on.
thread_local bool on_pool_thread = false;

// The pool: worker i runs replica i. One caller at a time uses it; a second concurrent
// caller (another user thread, or a nested call) gets threads of its own instead.
class WorkerPool {
 public:
  static WorkerPool& instance() {
    static WorkerPool pool;
    return pool;
  }

  // Runs every task, task i on worker i, and returns when all have finished.
  void run_all(std::vector<std::function<void()>>& tasks) {
    std::unique_lock<std::mutex> busy(busy_, std::try_to_lock);
    if (on_pool_thread || !busy.owns_lock()) {
      run_on_fresh_threads(tasks);
      return;
    }
    while (workers_.size() < tasks.size()) workers_.push_back(std::make_unique<Worker>());

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

 private:
  static void run_on_fresh_threads(std::vector<std::function<void()>>& tasks) {
    std::vector<std::thread> threads;
    threads.reserve(tasks.size());
    for (auto& task : tasks) threads.emplace_back(task);
    for (auto& t : threads) t.join();
  }

  std::mutex busy_;
  std::vector<std::unique_ptr<Worker>> workers_;
};

}  // namespace

std::vector<Tensor> parallel_apply(const std::vector<nn::ModulePtr>& replicas,
                                   const std::vector<Tensor>& inputs,
                                   const std::vector<Device>& devices) {
  MG_CHECK(replicas.size() == inputs.size() && replicas.size() == devices.size(),
           "parallel_apply: got {} replicas, {} inputs and {} devices; expected one of each "
           "per replica",
           replicas.size(), inputs.size(), devices.size());
  const size_t n = replicas.size();
  std::vector<Tensor> outputs(n);
  if (n == 0) return outputs;
  const bool grad_enabled = GradMode::is_enabled();

  // Each replica runs on the stream the caller has current on its device: the device's
  // compute stream, unless the caller chose another (as PyTorch's parallel_apply does).
  // The inputs were made on that stream and the outputs will be consumed and freed on
  // it, so no events are needed and the stream-ordered allocator's rule (freed on the
  // stream it was allocated on) holds for everything the replicas allocate.
  std::vector<Stream> streams;
  streams.reserve(n);
  for (const Device& d : devices) streams.push_back(current_stream(d));

  std::vector<std::exception_ptr> errors(n);
  auto forward_replica = [&](size_t i) {
    try {
      DeviceGuard device_guard(devices[i]);
      StreamGuard stream_guard(streams[i]);
      AutoGradMode grad_mode(grad_enabled);
      outputs[i] = replicas[i]->forward(inputs[i]);
    } catch (...) {
      errors[i] = std::current_exception();
    }
  };
  if (n == 1) {
    forward_replica(0);
  } else {
    std::vector<std::function<void()>> tasks;
    tasks.reserve(n);
    for (size_t i = 0; i < n; ++i) tasks.emplace_back([&forward_replica, i] { forward_replica(i); });
    WorkerPool::instance().run_all(tasks);
  }

  for (size_t i = 0; i < n; ++i) {
    if (!errors[i]) continue;
    try {
      std::rethrow_exception(errors[i]);
    } catch (const std::exception& e) {
      MG_FAIL("parallel_apply: replica {} on {} failed: {}", i, devices[i], e.what());
    } catch (...) {
      MG_FAIL("parallel_apply: replica {} on {} failed with an unknown exception", i, devices[i]);
    }
  }

  return outputs;
}

}  // namespace mg::parallel
