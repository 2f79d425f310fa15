#include <minigrad/parallel/pipeline/stage_workers.h>

#include <condition_variable>
#include <thread>

namespace mg::parallel {

class StageWorkers::Worker {
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
        if (task_ == nullptr) return;  // stopping, and nothing left to run
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

StageWorkers::StageWorkers(int count) {
  for (int i = 0; i < count; ++i) workers_.push_back(std::make_unique<Worker>());
}

StageWorkers::~StageWorkers() = default;

void StageWorkers::run_all(const std::function<void(int)>& task) {
  std::lock_guard<std::mutex> one_run(run_mutex_);
  std::mutex done_mutex;
  std::condition_variable all_done;
  size_t remaining = workers_.size();
  for (size_t s = 0; s < workers_.size(); ++s) {
    workers_[s]->post([&, s] {
      task(static_cast<int>(s));
      std::lock_guard<std::mutex> lock(done_mutex);
      if (--remaining == 0) all_done.notify_one();
    });
  }
  std::unique_lock<std::mutex> lock(done_mutex);
  all_done.wait(lock, [&] { return remaining == 0; });
}

}  // namespace mg::parallel
