#include "progress.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include <fmt/format.h>

namespace mg::samples {

bool stdout_is_terminal() {
  const char* term = std::getenv("TERM");
  return ::isatty(STDOUT_FILENO) != 0 && !(term != nullptr && std::strcmp(term, "dumb") == 0);
}

ProgressBar::ProgressBar(std::string label, int64_t total, bool enabled)
    : label_(std::move(label)), total_(total), enabled_(enabled) {}

bool ProgressBar::due(int64_t done) const {
  if (!enabled_) return false;
  if (!drawn_ || done >= total_) return true;
  return std::chrono::steady_clock::now() - last_draw_ >= std::chrono::milliseconds(100);
}

void ProgressBar::update(int64_t done, const std::string& suffix) {
  if (!due(done)) return;
  constexpr int64_t width = 30;
  const int64_t filled = total_ > 0 ? std::min(width, done * width / total_) : width;
  // \x1b[K clears what a longer previous line left behind.
  fmt::print("\r{} [{}{}] {}/{}  {}\x1b[K", label_, std::string(static_cast<size_t>(filled), '#'),
             std::string(static_cast<size_t>(width - filled), '.'), done, total_, suffix);
  std::fflush(stdout);
  drawn_ = true;
  last_draw_ = std::chrono::steady_clock::now();
}

void ProgressBar::finish() {
  if (!drawn_) return;
  fmt::print("\r\x1b[K");
  std::fflush(stdout);
  drawn_ = false;
}

}  // namespace mg::samples
