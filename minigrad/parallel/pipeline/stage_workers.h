// The Pipe's threads: one per stage, alive as long as the Pipe, so that what a thread
// sets up once (its current device and stream, a cuBLAS handle) stays set up.
#pragma once

#include <functional>
#include <memory>
#include <mutex>
#include <vector>

namespace mg::parallel {

class StageWorkers {
 public:
  explicit StageWorkers(int count);
  ~StageWorkers();
  StageWorkers(const StageWorkers&) = delete;
  StageWorkers& operator=(const StageWorkers&) = delete;

  // Runs task(s) on worker s for every s at once, and returns when all have returned.
  // The task must not throw. One run at a time: a second caller waits for the first.
  void run_all(const std::function<void(int)>& task);
  int size() const { return static_cast<int>(workers_.size()); }

 private:
  class Worker;
  std::vector<std::unique_ptr<Worker>> workers_;
  std::mutex run_mutex_;
};

}  // namespace mg::parallel
