// The few TCP socket operations the store and the launcher need, each system call
// checked: an error becomes an mg::Error naming the call, the address and errno's text.
// Internal to parallel/c10d/store (not part of the user API).
#pragma once

#include <chrono>
#include <cstddef>
#include <string>

namespace mg::parallel::net {

using Clock = std::chrono::steady_clock;

// An owned file descriptor, closed on destruction; movable, not copyable.
class Socket {
 public:
  Socket() = default;
  explicit Socket(int fd) : fd_(fd) {}
  ~Socket() { close(); }
  Socket(Socket&& other) noexcept : fd_(other.release()) {}
  Socket& operator=(Socket&& other) noexcept;
  Socket(const Socket&) = delete;
  Socket& operator=(const Socket&) = delete;

  int fd() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int release() {
    const int fd = fd_;
    fd_ = -1;
    return fd;
  }
  void close();

 private:
  int fd_ = -1;
};

// A listening socket bound to `host`:`port` (port 0: the kernel picks a free one; read
// it back with local_port).
Socket listen_on(const std::string& host, int port, int backlog = 128);
int local_port(const Socket& socket);

// Connects to `host`:`port`, retrying while nobody listens yet (the server may start
// after us) until `deadline`. `who` names the caller in the error ("TCPStore (rank 1)").
Socket connect_with_retry(const std::string& host, int port, Clock::time_point deadline,
                          const std::string& who);

// Writes all `size` bytes (no SIGPIPE: a closed peer is an mg::Error).
void send_all(int fd, const void* data, std::size_t size, const char* what);

enum class RecvStatus { Ok, Timeout, Closed };
// Reads exactly `size` bytes, waiting at most until `deadline`. Closed: the peer closed
// the connection before all bytes came.
RecvStatus recv_exact(int fd, void* data, std::size_t size, Clock::time_point deadline,
                      const char* what);

// Sets or clears O_NONBLOCK.
void set_nonblocking(int fd, bool on);

// errno's message, thread-safe.
std::string errno_string(int error);

// True when `host` is a loopback name or address (localhost, 127.x.x.x, ::1).
bool is_loopback(const std::string& host);

}  // namespace mg::parallel::net
