// Helpers for the TCPStore tests that behave as no TCPStore does: a client speaking the
// wire protocol by hand, the server's log lines caught from stderr, the process's memory.
#pragma once

#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <minigrad/core/error.h>
#include <minigrad/parallel/c10d/store/socket.h>
#include <minigrad/parallel/c10d/store/store_protocol.h>

namespace mg::test {

// A connection to a store on loopback that sends whatever it is told.
class RawStoreClient {
 public:
  explicit RawStoreClient(int port)
      : socket_(parallel::net::connect_with_retry("127.0.0.1", port,
                                                  parallel::net::Clock::now() + std::chrono::seconds(10),
                                                  "raw store client")) {}

  int fd() const { return socket_.fd(); }

  void send_bytes(const std::string& bytes) {
    parallel::net::send_all(socket_.fd(), bytes.data(), bytes.size(), "raw store client");
  }
  void send(uint8_t code, const std::vector<std::string>& args) {
    send_bytes(parallel::store::encode_message(code, args));
  }
  // The handshake a TCPStore of job `run_id` would send.
  void hello(const std::string& run_id = "default", int rank = 7) {
    send(parallel::store::kHello, {parallel::store::kMagic, parallel::store::kProtocolVersion,
                                   run_id, std::to_string(rank)});
  }

  // The next message from the server; nothing when it closed or `timeout` passed.
  std::optional<parallel::store::Message> receive(std::chrono::milliseconds timeout) {
    namespace store = parallel::store;
    const auto deadline = parallel::net::Clock::now() + timeout;
    std::string bytes(store::kHeaderBytes, '\0');
    if (parallel::net::recv_exact(fd(), bytes.data(), bytes.size(), deadline, "raw") !=
        parallel::net::RecvStatus::Ok)
      return std::nullopt;
    store::Limits limits;
    store::Parsed p = store::parse_message(bytes.data(), bytes.size(), limits);
    if (p.status == store::ParseStatus::NeedMore) {
      bytes.resize(p.size);
      if (parallel::net::recv_exact(fd(), bytes.data() + store::kHeaderBytes,
                                    bytes.size() - store::kHeaderBytes, deadline, "raw") !=
          parallel::net::RecvStatus::Ok)
        return std::nullopt;
      p = store::parse_message(bytes.data(), bytes.size(), limits);
    }
    MG_CHECK(p.status == store::ParseStatus::Complete, "raw store client: a malformed reply: {}", p.error);
    return std::move(p.message);
  }

  // Reads and discards until the server closes the connection (true), or `timeout` passes.
  bool closed_within(std::chrono::milliseconds timeout) {
    const auto deadline = parallel::net::Clock::now() + timeout;
    char chunk[65536];
    for (;;) {
      const auto status = parallel::net::recv_exact(fd(), chunk, 1, deadline, "raw");
      if (status == parallel::net::RecvStatus::Closed) return true;
      if (status == parallel::net::RecvStatus::Timeout) return false;
      while (::recv(fd(), chunk, sizeof(chunk), MSG_DONTWAIT) > 0) {
      }
    }
  }

 private:
  parallel::net::Socket socket_;
};

// Sends what this process writes to stderr (fd 2) into a memory file while it lives.
class StderrCapture {
 public:
  StderrCapture() : file_(::memfd_create("stderr-capture", MFD_CLOEXEC)), saved_(::dup(2)) {
    MG_CHECK(file_ >= 0 && saved_ >= 0, "StderrCapture: memfd_create/dup failed");
    std::fflush(stderr);
    ::dup2(file_, 2);
  }
  ~StderrCapture() {
    std::fflush(stderr);
    ::dup2(saved_, 2);
    ::close(saved_);
    ::close(file_);
  }
  StderrCapture(const StderrCapture&) = delete;
  StderrCapture& operator=(const StderrCapture&) = delete;

  std::string text() const {
    std::string out;
    char buf[4096];
    off_t offset = 0;
    for (ssize_t n; (n = ::pread(file_, buf, sizeof(buf), offset)) > 0; offset += n)
      out.append(buf, static_cast<size_t>(n));
    return out;
  }
  // Waits (at most `timeout`) until the captured text contains `needle`; the text then.
  std::string wait_for(const std::string& needle,
                       std::chrono::milliseconds timeout = std::chrono::seconds(10)) const {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    std::string t = text();
    while (t.find(needle) == std::string::npos && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      t = text();
    }
    return t;
  }

 private:
  int file_;
  int saved_;
};

// This process's resident memory now (VmRSS), in bytes.
inline long long resident_bytes() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line))
    if (line.rfind("VmRSS:", 0) == 0) return std::stoll(line.substr(6)) * 1024;
  MG_FAIL("resident_bytes: no VmRSS in /proc/self/status");
}

// CPU seconds (user + system) this process has used, all threads.
inline double process_cpu_seconds() {
  rusage usage{};
  ::getrusage(RUSAGE_SELF, &usage);
  const auto sec = [](const timeval& t) { return static_cast<double>(t.tv_sec) + t.tv_usec / 1e6; };
  return sec(usage.ru_utime) + sec(usage.ru_stime);
}

}  // namespace mg::test
