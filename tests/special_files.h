// Files that are not regular files, for the tests of the readers and writers that must
// refuse them without blocking or replacing them.
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <stdexcept>
#include <string>
#include <thread>

namespace mg::testing {

inline void make_fifo(const std::string& path) {
  if (::mkfifo(path.c_str(), 0644) != 0) throw std::runtime_error("mkfifo failed: " + path);
}

// Whether `path` is (still) a FIFO, without following a symbolic link.
inline bool is_fifo(const std::string& path) {
  struct stat st {};
  return ::lstat(path.c_str(), &st) == 0 && S_ISFIFO(st.st_mode);
}

// A reader that blocks in open() on a FIFO would hang the test forever; after `seconds`
// this opens the FIFO's write end (and closes it at once), again and again until the test
// is over, which lets such an open return, so a test of that reader fails on its time
// limit instead of hanging.
class FifoWatchdog {
 public:
  FifoWatchdog(std::string fifo, double seconds)
      : fifo_(std::move(fifo)), thread_([this, seconds] {
          const auto until =
              std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
          while (!done_) {
            std::this_thread::sleep_for(std::chrono::milliseconds(20));
            if (std::chrono::steady_clock::now() < until) continue;
            // O_NONBLOCK: fails at once (ENXIO) while nobody has the read end open.
            const int fd = ::open(fifo_.c_str(), O_WRONLY | O_NONBLOCK);
            if (fd >= 0) ::close(fd);
          }
        }) {}
  ~FifoWatchdog() {
    done_ = true;
    thread_.join();
  }
  FifoWatchdog(const FifoWatchdog&) = delete;
  FifoWatchdog& operator=(const FifoWatchdog&) = delete;

 private:
  std::string fifo_;
  std::atomic<bool> done_{false};
  std::thread thread_;
};

// Seconds that `f()` takes.
template <typename F>
double seconds_taken(F&& f) {
  const auto start = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace mg::testing
