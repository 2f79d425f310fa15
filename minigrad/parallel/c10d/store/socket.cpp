#include <minigrad/parallel/c10d/store/socket.h>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <memory>
#include <system_error>
#include <thread>

#include <minigrad/core/error.h>

namespace mg::parallel::net {

std::string errno_string(int error) { return std::system_category().message(error); }

void set_nonblocking(int fd, bool on) {
  const int flags = fcntl(fd, F_GETFL, 0);
  MG_CHECK(flags >= 0, "socket: fcntl(F_GETFL) failed: {}", errno_string(errno));
  const int wanted = on ? (flags | O_NONBLOCK) : (flags & ~O_NONBLOCK);
  MG_CHECK(fcntl(fd, F_SETFL, wanted) == 0, "socket: fcntl(F_SETFL) failed: {}",
           errno_string(errno));
}

Socket& Socket::operator=(Socket&& other) noexcept {
  if (this != &other) {
    close();
    fd_ = other.release();
  }
  return *this;
}

void Socket::close() {
  if (fd_ >= 0) {
    ::close(fd_);  // nothing useful to do with an error of close on a socket
    fd_ = -1;
  }
}

namespace {

struct AddrInfoDeleter {
  void operator()(addrinfo* info) const { freeaddrinfo(info); }
};
using AddrInfoPtr = std::unique_ptr<addrinfo, AddrInfoDeleter>;

// getaddrinfo, with EAI_* codes turned into text. Returns null and sets `error` instead
// of throwing, because a name that does not resolve yet is retried by connect.
AddrInfoPtr resolve(const std::string& host, int port, bool passive, std::string& error) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = passive ? AI_PASSIVE : 0;
  addrinfo* result = nullptr;
  const std::string service = std::to_string(port);
  const int rc = getaddrinfo(host.empty() ? nullptr : host.c_str(), service.c_str(), &hints,
                             &result);
  if (rc != 0) {
    error = rc == EAI_SYSTEM ? errno_string(errno) : gai_strerror(rc);
    return nullptr;
  }
  return AddrInfoPtr(result);
}

void set_nodelay(int fd) {
  // Store requests are a few small messages; Nagle's delay would add 40 ms to each.
  const int one = 1;
  MG_CHECK(setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)) == 0,
           "socket: setsockopt(TCP_NODELAY) failed: {}", errno_string(errno));
}

int remaining_ms(Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  return static_cast<int>(std::clamp<long long>(left.count(), 0, 1 << 30));
}

// One connection attempt to one resolved address, bounded by `deadline` (a SYN to a
// host that does not answer would otherwise block for minutes). Returns the socket, or
// an invalid one with `error` set.
Socket try_connect(const addrinfo& ai, Clock::time_point deadline, std::string& error) {
  Socket s(::socket(ai.ai_family, ai.ai_socktype | SOCK_CLOEXEC, ai.ai_protocol));
  if (!s.valid()) {
    error = "socket(): " + errno_string(errno);
    return Socket();
  }
  set_nonblocking(s.fd(), true);
  if (::connect(s.fd(), ai.ai_addr, ai.ai_addrlen) != 0) {
    if (errno != EINPROGRESS) {
      error = errno_string(errno);
      return Socket();
    }
    pollfd p{s.fd(), POLLOUT, 0};
    const int rc = ::poll(&p, 1, remaining_ms(deadline));
    if (rc == 0) {
      error = "connect timed out";
      return Socket();
    }
    if (rc < 0) {
      error = "poll(): " + errno_string(errno);
      return Socket();
    }
    int so_error = 0;
    socklen_t len = sizeof(so_error);
    if (getsockopt(s.fd(), SOL_SOCKET, SO_ERROR, &so_error, &len) != 0) {
      error = "getsockopt(SO_ERROR): " + errno_string(errno);
      return Socket();
    }
    if (so_error != 0) {
      error = errno_string(so_error);
      return Socket();
    }
  }
  set_nonblocking(s.fd(), false);
  set_nodelay(s.fd());
  return s;
}

}  // namespace

Socket listen_on(const std::string& host, int port, int backlog) {
  MG_CHECK(port >= 0 && port <= 65535, "socket: port {} is outside [0, 65535]", port);
  std::string error;
  AddrInfoPtr info = resolve(host, port, /*passive=*/true, error);
  MG_CHECK(info != nullptr, "socket: cannot resolve '{}' to listen on port {}: {}", host, port,
           error);
  for (addrinfo* ai = info.get(); ai != nullptr; ai = ai->ai_next) {
    Socket s(::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol));
    if (!s.valid()) {
      error = "socket(): " + errno_string(errno);
      continue;
    }
    // A restarted job may find its port in TIME_WAIT from the previous run.
    const int one = 1;
    MG_CHECK(setsockopt(s.fd(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) == 0,
             "socket: setsockopt(SO_REUSEADDR) failed: {}", errno_string(errno));
    if (::bind(s.fd(), ai->ai_addr, ai->ai_addrlen) != 0) {
      error = "bind(): " + errno_string(errno);
      continue;
    }
    if (::listen(s.fd(), backlog) != 0) {
      error = "listen(): " + errno_string(errno);
      continue;
    }
    return s;
  }
  MG_FAIL("socket: cannot listen on {}:{}: {}", host, port, error);
}

int local_port(const Socket& socket) {
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  MG_CHECK(getsockname(socket.fd(), reinterpret_cast<sockaddr*>(&addr), &len) == 0,
           "socket: getsockname failed: {}", errno_string(errno));
  if (addr.ss_family == AF_INET) return ntohs(reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
  if (addr.ss_family == AF_INET6)
    return ntohs(reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port);
  MG_FAIL("socket: getsockname returned address family {}", addr.ss_family);
}

Socket connect_with_retry(const std::string& host, int port, Clock::time_point deadline,
                          const std::string& who) {
  const auto start = Clock::now();
  auto backoff = std::chrono::milliseconds(10);
  std::string error = "no attempt made";
  int attempts = 0;
  do {
    ++attempts;
    AddrInfoPtr info = resolve(host, port, /*passive=*/false, error);
    for (addrinfo* ai = info.get(); ai != nullptr; ai = ai->ai_next) {
      Socket s = try_connect(*ai, deadline, error);
      if (s.valid()) return s;
    }
    // Nobody listens yet (the server rank starts later) or the name does not resolve
    // yet: wait a little and try again, more slowly each time.
    const auto now = Clock::now();
    if (now >= deadline) break;
    std::this_thread::sleep_for(std::min<Clock::duration>(backoff, deadline - now));
    backoff = std::min(backoff * 2, std::chrono::milliseconds(500));
  } while (Clock::now() < deadline);
  const double elapsed = std::chrono::duration<double>(Clock::now() - start).count();
  MG_FAIL("{}: could not connect to {}:{} within {:.1f} s ({} attempts; last error: {}). Is "
          "the rank serving it (rank 0) running, and are MASTER_ADDR/MASTER_PORT the same on "
          "every rank?",
          who, host, port, elapsed, attempts, error);
}

void send_all(int fd, const void* data, std::size_t size, const char* what) {
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    const ssize_t n = ::send(fd, p, size, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      MG_FAIL("{}: send failed: {}", what, errno_string(errno));
    }
    p += n;
    size -= static_cast<std::size_t>(n);
  }
}

RecvStatus recv_exact(int fd, void* data, std::size_t size, Clock::time_point deadline,
                      const char* what) {
  char* p = static_cast<char*>(data);
  while (size > 0) {
    pollfd pfd{fd, POLLIN, 0};
    const int rc = ::poll(&pfd, 1, remaining_ms(deadline));
    if (rc < 0) {
      if (errno == EINTR) continue;
      MG_FAIL("{}: poll failed: {}", what, errno_string(errno));
    }
    if (rc == 0) return RecvStatus::Timeout;
    const ssize_t n = ::recv(fd, p, size, 0);
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      if (errno == ECONNRESET) return RecvStatus::Closed;
      MG_FAIL("{}: recv failed: {}", what, errno_string(errno));
    }
    if (n == 0) return RecvStatus::Closed;
    p += n;
    size -= static_cast<std::size_t>(n);
  }
  return RecvStatus::Ok;
}

bool is_loopback(const std::string& host) {
  if (host == "localhost" || host == "::1") return true;
  in_addr addr{};
  if (inet_pton(AF_INET, host.c_str(), &addr) == 1) return (ntohl(addr.s_addr) >> 24) == 127;
  return false;
}

}  // namespace mg::parallel::net
