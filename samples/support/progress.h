// A progress bar for one epoch, drawn in place with '\r' when stdout is a terminal;
// silent otherwise, so logs and pipes get one plain line per epoch from the caller.
//
//   epoch 3/10 [##########..........] 235/469  loss 0.4123  21034 samples/s
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace mg::samples {

// isatty(stdout), and TERM is not "dumb".
bool stdout_is_terminal();

class ProgressBar {
 public:
  ProgressBar(std::string label, int64_t total, bool enabled = stdout_is_terminal());
  ~ProgressBar() { finish(); }
  ProgressBar(const ProgressBar&) = delete;
  ProgressBar& operator=(const ProgressBar&) = delete;

  // `done` of `total` steps finished; `suffix` follows the counter. Redraws at most
  // ten times a second (and always for the last step), so it costs nothing per step.
  void update(int64_t done, const std::string& suffix);
  // Wipes the bar, leaving the cursor at the start of an empty line. Idempotent.
  void finish();
  bool enabled() const { return enabled_; }
  // Whether update(done) would redraw now: lets the caller build `suffix` (which may
  // read a value back from a device) only when it will be shown.
  bool due(int64_t done) const;

 private:
  std::string label_;
  int64_t total_;
  bool enabled_;
  bool drawn_ = false;
  std::chrono::steady_clock::time_point last_draw_;
};

}  // namespace mg::samples
