#include <minigrad/parallel/distributed/tcp_store.h>

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <map>
#include <thread>
#include <unordered_map>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <minigrad/core/error.h>
#include <minigrad/parallel/distributed/socket.h>

namespace mg::parallel {

namespace {

using net::Clock;

enum Command : uint8_t { kSet = 1, kGet = 2, kAdd = 3, kCheck = 4, kWait = 5 };
enum ReplyCode : uint8_t { kOk = 100, kValue = 101, kError = 102 };

// Guards against a stray client (or a port collision with something else) sending a
// length that would make us allocate gigabytes.
constexpr uint32_t kMaxArgs = 1u << 16;
constexpr uint32_t kMaxArgBytes = 1u << 30;

void put_u32(std::string& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
uint32_t get_u32(const char* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(static_cast<unsigned char>(p[i])) << (8 * i);
  return v;
}

std::string encode(uint8_t code, const std::vector<std::string>& args) {
  std::string out;
  out.push_back(static_cast<char>(code));
  put_u32(out, static_cast<uint32_t>(args.size()));
  for (const std::string& a : args) {
    put_u32(out, static_cast<uint32_t>(a.size()));
    out += a;
  }
  return out;
}

// Takes one complete message off the front of `buffer`; false when more bytes are needed.
bool decode(std::string& buffer, uint8_t& code, std::vector<std::string>& args) {
  if (buffer.size() < 5) return false;
  const uint32_t count = get_u32(buffer.data() + 1);
  MG_CHECK(count <= kMaxArgs, "TCPStore: malformed message ({} arguments)", count);
  size_t pos = 5;
  std::vector<std::string> parsed;
  parsed.reserve(count);
  for (uint32_t i = 0; i < count; ++i) {
    if (buffer.size() < pos + 4) return false;
    const uint32_t len = get_u32(buffer.data() + pos);
    MG_CHECK(len <= kMaxArgBytes, "TCPStore: malformed message (argument of {} bytes)", len);
    pos += 4;
    if (buffer.size() < pos + len) return false;
    parsed.emplace_back(buffer, pos, len);
    pos += len;
  }
  code = static_cast<uint8_t>(buffer[0]);
  args = std::move(parsed);
  buffer.erase(0, pos);
  return true;
}

bool parse_int64(const std::string& s, int64_t& out) {
  const char* end = s.data() + s.size();
  auto [p, ec] = std::from_chars(s.data(), end, out);
  return ec == std::errc() && p == end && !s.empty();
}

// now + timeout without overflowing for "wait forever" timeouts.
Clock::time_point deadline_after(std::chrono::milliseconds timeout) {
  const auto cap = std::chrono::hours(24 * 365);
  return Clock::now() + std::min<std::chrono::milliseconds>(timeout, cap);
}

double seconds(std::chrono::milliseconds ms) { return static_cast<double>(ms.count()) / 1000.0; }

std::string quoted_keys(const std::vector<std::string>& keys) {
  if (keys.size() == 1) return fmt::format("key '{}'", keys[0]);
  return fmt::format("keys {}", keys);
}

}  // namespace

// ---------------------------------------------------------------------------------------
// The server: one thread, poll() over the listening socket, a stop pipe and the clients.
// Requests are answered in arrival order; get/wait whose keys are missing are parked as
// waiters and answered by the set/add that completes them.
class TCPStore::Server {
 public:
  Server(const std::string& host, int port) : listen_(net::listen_on(host, port)) {
    port_ = net::local_port(listen_);
    MG_CHECK(::pipe2(stop_pipe_, O_CLOEXEC) == 0, "TCPStore: pipe2 failed: {}",
             net::errno_string(errno));
    thread_ = std::thread([this] { run(); });
  }

  ~Server() {
    const char byte = 1;
    // If this write fails the pipe is broken and poll() reports it, which stops too.
    [[maybe_unused]] const ssize_t n = ::write(stop_pipe_[1], &byte, 1);
    thread_.join();
    ::close(stop_pipe_[0]);
    ::close(stop_pipe_[1]);
  }

  int port() const { return port_; }

 private:
  struct Client {
    net::Socket socket;
    std::string pending;  // bytes of a message not complete yet
  };
  struct Waiter {
    int fd;
    uint8_t command;
    std::vector<std::string> keys;
  };

  void run() {
    std::vector<pollfd> fds;
    for (;;) {
      fds.clear();
      fds.push_back({stop_pipe_[0], POLLIN, 0});
      fds.push_back({listen_.fd(), POLLIN, 0});
      for (const auto& [fd, client] : clients_) fds.push_back({fd, POLLIN, 0});
      if (::poll(fds.data(), fds.size(), -1) < 0) {
        if (errno == EINTR) continue;
        fmt::print(stderr, "minigrad TCPStore server: poll failed ({}); the store stops\n",
                   net::errno_string(errno));
        return;
      }
      if (fds[0].revents != 0) return;  // asked to stop
      if (fds[1].revents & POLLIN) accept_client();
      for (size_t i = 2; i < fds.size(); ++i) {
        if (fds[i].revents == 0) continue;
        if (!serve(fds[i].fd)) drop(fds[i].fd);
      }
    }
  }

  void accept_client() {
    const int fd = ::accept4(listen_.fd(), nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) {
      // The client may have given up between poll and accept; nothing to do.
      return;
    }
    clients_[fd].socket = net::Socket(fd);
  }

  // Reads what `fd` sent and answers every complete request. False: drop the client.
  bool serve(int fd) {
    char chunk[65536];
    const ssize_t n = ::recv(fd, chunk, sizeof(chunk), 0);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) return true;
    if (n <= 0) return false;  // closed (a rank finished or died) or failed
    Client& client = clients_.at(fd);
    client.pending.append(chunk, static_cast<size_t>(n));
    try {
      uint8_t command = 0;
      std::vector<std::string> args;
      while (decode(client.pending, command, args)) handle(fd, command, std::move(args));
    } catch (const std::exception& e) {
      fmt::print(stderr, "minigrad TCPStore server: dropping a client: {}\n", e.what());
      return false;
    }
    return true;
  }

  void handle(int fd, uint8_t command, std::vector<std::string> args) {
    switch (command) {
      case kSet:
        MG_CHECK(args.size() == 2, "TCPStore: set with {} arguments", args.size());
        data_[args[0]] = std::move(args[1]);
        // Waiters first: once the setter hears back it may exit, and the waiters must
        // already have their answers by then.
        wake_waiters();
        reply(fd, kOk, {});
        return;
      case kAdd: {
        MG_CHECK(args.size() == 2, "TCPStore: add with {} arguments", args.size());
        int64_t delta = 0, current = 0;
        MG_CHECK(parse_int64(args[1], delta), "TCPStore: add of a non-integer '{}'", args[1]);
        auto it = data_.find(args[0]);
        if (it != data_.end() && !parse_int64(it->second, current)) {
          reply(fd, kError, {fmt::format("key '{}' holds a value that is not an integer counter",
                                         args[0])});
          return;
        }
        const std::string value = std::to_string(current + delta);
        data_[args[0]] = value;
        wake_waiters();
        reply(fd, kValue, {value});
        return;
      }
      case kCheck:
        reply(fd, kValue, {all_set(args) ? "1" : "0"});
        return;
      case kGet:
        MG_CHECK(args.size() == 1, "TCPStore: get with {} arguments", args.size());
        [[fallthrough]];
      case kWait:
        if (all_set(args)) {
          answer(Waiter{fd, command, std::move(args)});
        } else {
          waiters_.push_back(Waiter{fd, command, std::move(args)});
        }
        return;
      default:
        MG_FAIL("TCPStore: unknown command {}", command);
    }
  }

  bool all_set(const std::vector<std::string>& keys) const {
    return std::all_of(keys.begin(), keys.end(),
                       [&](const std::string& k) { return data_.count(k) != 0; });
  }

  void answer(const Waiter& w) {
    if (w.command == kGet) {
      reply(w.fd, kValue, {data_.at(w.keys[0])});
    } else {
      reply(w.fd, kOk, {});
    }
  }

  void wake_waiters() {
    std::vector<Waiter> still;
    std::vector<Waiter> ready;
    for (Waiter& w : waiters_) (all_set(w.keys) ? ready : still).push_back(std::move(w));
    waiters_ = std::move(still);
    for (const Waiter& w : ready) {
      if (clients_.count(w.fd) == 0) continue;
      try {
        answer(w);
      } catch (const std::exception&) {
        // The waiter's connection broke; its client is dropped at its next poll event.
      }
    }
  }

  void reply(int fd, uint8_t code, const std::vector<std::string>& args) {
    const std::string message = encode(code, args);
    net::send_all(fd, message.data(), message.size(), "TCPStore server");
  }

  void drop(int fd) {
    waiters_.erase(std::remove_if(waiters_.begin(), waiters_.end(),
                                  [fd](const Waiter& w) { return w.fd == fd; }),
                   waiters_.end());
    clients_.erase(fd);
  }

  net::Socket listen_;
  int port_ = 0;
  int stop_pipe_[2] = {-1, -1};
  std::thread thread_;
  std::map<int, Client> clients_;
  std::unordered_map<std::string, std::string> data_;
  std::vector<Waiter> waiters_;
};

// ---------------------------------------------------------------------------------------
// The client.

TCPStore::TCPStore(std::string host, int port, TCPStoreOptions options)
    : host_(std::move(host)), port_(port), options_(options) {
  MG_CHECK(!host_.empty(), "TCPStore: empty host name (rank {})", options_.rank);
  MG_CHECK(port_ >= 0 && port_ <= 65535, "TCPStore: port {} is outside [0, 65535] (rank {})",
           port_, options_.rank);
  if (options_.is_server) {
    server_ = std::make_unique<Server>(host_, port_);
    port_ = server_->port();
  } else {
    MG_CHECK(port_ != 0, "TCPStore: a client needs the server's port, got 0 (rank {})",
             options_.rank);
  }
  socket_ = std::make_unique<net::Socket>(
      net::connect_with_retry(host_, port_, deadline_after(options_.timeout),
                              fmt::format("TCPStore (rank {})", options_.rank)));
}

// The client connection closes before the server stops, so the server never waits on it.
TCPStore::~TCPStore() {
  socket_.reset();
  server_.reset();
}

std::string TCPStore::where() const {
  return fmt::format("rank {}, store at {}:{}", options_.rank, host_, port_);
}

std::vector<std::string> TCPStore::request(uint8_t command, const std::vector<std::string>& args,
                                           std::chrono::milliseconds timeout, const char* op,
                                           const std::string& what) {
  std::lock_guard<std::mutex> lock(mutex_);
  MG_CHECK(broken_.empty(), "TCPStore::{}: the connection is unusable after an earlier "
           "failure ({}): {}", op, where(), broken_);
  const auto start = Clock::now();
  const Clock::time_point deadline = deadline_after(timeout);
  const std::string message = encode(command, args);
  try {
    net::send_all(socket_->fd(), message.data(), message.size(), "TCPStore");
  } catch (const Error& e) {
    broken_ = e.what();
    socket_->close();
    MG_FAIL("TCPStore::{} of {}: cannot reach the store ({}): {}", op, what, where(), e.what());
  }

  auto fail = [&](net::RecvStatus status) {
    const double elapsed = std::chrono::duration<double>(Clock::now() - start).count();
    std::string message_text;
    if (status == net::RecvStatus::Timeout) {
      message_text = fmt::format(
          "TCPStore::{}: timed out after {:.2f} s waiting for {} (timeout {:.2f} s; {}). A rank "
          "that should have set it did not arrive or died.",
          op, elapsed, what, seconds(timeout), where());
    } else {
      message_text = fmt::format(
          "TCPStore::{} of {}: the store server closed the connection after {:.2f} s ({}); did "
          "rank 0 exit or crash?",
          op, what, elapsed, where());
    }
    broken_ = message_text;
    socket_->close();
    throw Error(message_text);
  };

  char header[5];
  net::RecvStatus status = net::recv_exact(socket_->fd(), header, 5, deadline, "TCPStore");
  if (status != net::RecvStatus::Ok) fail(status);
  const uint8_t code = static_cast<uint8_t>(header[0]);
  const uint32_t count = get_u32(header + 1);
  MG_CHECK(count <= kMaxArgs, "TCPStore::{}: malformed reply ({} arguments; {})", op, count,
           where());
  std::vector<std::string> reply(count);
  for (std::string& arg : reply) {
    char len_bytes[4];
    status = net::recv_exact(socket_->fd(), len_bytes, 4, deadline, "TCPStore");
    if (status != net::RecvStatus::Ok) fail(status);
    const uint32_t len = get_u32(len_bytes);
    MG_CHECK(len <= kMaxArgBytes, "TCPStore::{}: malformed reply ({} bytes; {})", op, len,
             where());
    arg.resize(len);
    status = net::recv_exact(socket_->fd(), arg.data(), len, deadline, "TCPStore");
    if (status != net::RecvStatus::Ok) fail(status);
  }
  if (code == kError) MG_FAIL("TCPStore::{} of {}: {} ({})", op, what, reply.at(0), where());
  MG_CHECK(code == kOk || code == kValue, "TCPStore::{}: unexpected reply code {} ({})", op,
           code, where());
  return reply;
}

void TCPStore::set(const std::string& key, const std::string& value) {
  request(kSet, {key, value}, options_.timeout, "set", quoted_keys({key}));
}

std::string TCPStore::get(const std::string& key) { return get(key, options_.timeout); }

std::string TCPStore::get(const std::string& key, std::chrono::milliseconds timeout) {
  std::vector<std::string> reply = request(kGet, {key}, timeout, "get", quoted_keys({key}));
  MG_CHECK(reply.size() == 1, "TCPStore::get: malformed reply ({})", where());
  return std::move(reply[0]);
}

int64_t TCPStore::add(const std::string& key, int64_t delta) {
  std::vector<std::string> reply =
      request(kAdd, {key, std::to_string(delta)}, options_.timeout, "add", quoted_keys({key}));
  int64_t value = 0;
  MG_CHECK(reply.size() == 1 && parse_int64(reply[0], value),
           "TCPStore::add: malformed reply ({})", where());
  return value;
}

bool TCPStore::check(const std::vector<std::string>& keys) {
  std::vector<std::string> reply = request(kCheck, keys, options_.timeout, "check", quoted_keys(keys));
  MG_CHECK(reply.size() == 1, "TCPStore::check: malformed reply ({})", where());
  return reply[0] == "1";
}

void TCPStore::wait(const std::vector<std::string>& keys) { wait(keys, options_.timeout); }

void TCPStore::wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  if (keys.empty()) return;
  request(kWait, keys, timeout, "wait", quoted_keys(keys));
}

}  // namespace mg::parallel
