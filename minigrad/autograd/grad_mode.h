// Grad mode: whether ops record the graph. Thread-local, because DataParallel runs each
// replica's forward on a worker thread and must carry the caller's mode there.
#pragma once

namespace mg {

class GradMode {
 public:
  static bool is_enabled();
  static void set_enabled(bool enabled);
};

// Sets grad mode for a scope and restores the previous mode on exit.
class AutoGradMode {
 public:
  explicit AutoGradMode(bool enabled) : previous_(GradMode::is_enabled()) {
    GradMode::set_enabled(enabled);
  }
  ~AutoGradMode() { GradMode::set_enabled(previous_); }
  AutoGradMode(const AutoGradMode&) = delete;
  AutoGradMode& operator=(const AutoGradMode&) = delete;

 private:
  bool previous_;
};

// Inside its scope no graph is recorded (evaluation, optimizer updates), as torch::NoGradGuard.
class NoGradGuard : public AutoGradMode {
 public:
  NoGradGuard() : AutoGradMode(false) {}
};

}  // namespace mg
