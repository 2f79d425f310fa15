// The TCPStore server (tcp_store_server.h): one thread, one epoll loop over the listening
// socket, a stop eventfd and the clients' non-blocking sockets.
//
// Why no client can stall another:
//   - Nothing blocks. A reply is appended to its client's output buffer and written as far
//     as the socket takes it; the rest goes out when epoll says the socket is writable. A
//     client that does not read its replies fills only its own buffer, and once that holds
//     more than max_output_bytes the client is dropped.
//   - get/wait on a missing key park the client, indexed by the keys it lacks, and the loop
//     moves on; the set or add that completes its keys answers it. A parked client is not
//     read until answered (a TCPStore sends one request at a time), so it holds one request.
//   - Sizes are checked from a message's 9-byte header before any of its payload is kept
//     (store_protocol.h): an oversized announcement is refused at once, a message is parsed
//     once when complete, and all clients' buffers together stay under max_buffered_bytes.
//   - One client is read for at most kReadBudget bytes per turn, so a fast sender cannot
//     starve the others.
//   - At the open-file limit (EMFILE/ENFILE) accept fails while the listener stays readable,
//     so a loop that only retries spins at 100 % CPU. A spare descriptor is kept instead:
//     closed to take each waiting connection, which is told why it is refused and closed,
//     then reopened. If it cannot be reopened (another thread took the descriptor), the
//     listener is not polled for a back-off (10 ms, doubling to 1 s) or until a client leaves.
//
// Why a loop of our own rather than libuv, which PyTorch's TCPStore has used by default
// since 2.4 (to serve tens of thousands of ranks): on Linux libuv runs this same epoll loop,
// and each property above would still have to be built around it. Its write queue grows
// without bound unless every write checks uv_stream_get_write_queue_size; at EMFILE it
// closes waiting connections without a word through a reserved descriptor, and when that
// descriptor is gone it calls the connection callback again and again until the callback
// closes the listener (the spin this file must avoid). Written out, every bound is a line
// a reader finds here, and the library takes no dependency for it (nor one that the
// sanitizer and fuzz builds would see uninstrumented).
#include <minigrad/parallel/c10d/store/tcp_store_server.h>

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <optional>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include <fmt/format.h>

#include <minigrad/core/error.h>
#include <minigrad/parallel/c10d/store/socket.h>
#include <minigrad/parallel/c10d/store/store_protocol.h>

namespace mg::parallel {

namespace {

using net::Clock;
using namespace std::chrono_literals;

constexpr uint64_t kStopId = 0;      // epoll's tag of the stop eventfd
constexpr uint64_t kListenerId = 1;  // ... of the listening socket; clients count from 2
constexpr std::size_t kReadBudget = std::size_t{1} << 20;  // bytes read from one client per turn
constexpr int kAcceptBatch = 64;     // connections accepted per turn
constexpr std::size_t kKeepCapacity = std::size_t{1} << 20;
constexpr auto kMinBackoff = 10ms;
constexpr auto kMaxBackoff = 1000ms;

bool parse_int64(const std::string& s, int64_t& out) {
  const char* end = s.data() + s.size();
  auto [p, ec] = std::from_chars(s.data(), end, out);
  return ec == std::errc() && p == end && !s.empty();
}

// Client-given text in a log line or an error: printable, and short.
std::string printable(const std::string& s, std::size_t limit = 80) {
  std::string out;
  for (std::size_t i = 0; i < s.size() && i < limit; ++i) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    out += (c >= 0x20 && c < 0x7f) ? std::string(1, static_cast<char>(c)) : fmt::format("\\x{:02x}", c);
  }
  if (s.size() > limit) out += fmt::format("... ({} bytes)", s.size());
  return out;
}

std::string mib(std::size_t bytes) {
  return fmt::format("{:.1f} MiB", static_cast<double>(bytes) / (1 << 20));
}

std::string peer_name(const sockaddr_storage& addr, socklen_t len) {
  char host[NI_MAXHOST], port[NI_MAXSERV];
  if (getnameinfo(reinterpret_cast<const sockaddr*>(&addr), len, host, sizeof(host), port,
                  sizeof(port), NI_NUMERICHOST | NI_NUMERICSERV) != 0)
    return "an unknown address";
  return addr.ss_family == AF_INET6 ? fmt::format("[{}]:{}", host, port)
                                    : fmt::format("{}:{}", host, port);
}

}  // namespace

class TCPStoreServer::Loop {
 public:
  Loop(const std::string& host, int port, const TCPStoreOptions& options)
      : options_(options), prefix_(options.run_id + "/"),
        listener_(net::listen_on(host, port, /*backlog=*/1024)) {
    limits_.max_message_bytes = options.max_message_bytes;
    port_ = net::local_port(listener_);
    net::set_nonblocking(listener_.fd(), true);
    epoll_ = net::Socket(::epoll_create1(EPOLL_CLOEXEC));
    MG_CHECK(epoll_.valid(), "TCPStore server: epoll_create1 failed: {}", net::errno_string(errno));
    stop_ = net::Socket(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
    MG_CHECK(stop_.valid(), "TCPStore server: eventfd failed: {}", net::errno_string(errno));
    watch(stop_.fd(), EPOLLIN, kStopId);
    watch(listener_.fd(), EPOLLIN, kListenerId);
    // Fails only at the open-file limit already; then the back-off alone handles it.
    spare_fd_ = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  }

  ~Loop() {
    if (spare_fd_ >= 0) ::close(spare_fd_);
  }

  int port() const { return port_; }

  void stop() {
    const uint64_t one = 1;
    // If this write fails the eventfd is broken and epoll reports it, which stops too.
    [[maybe_unused]] const ssize_t n = ::write(stop_.fd(), &one, sizeof(one));
  }

  void run() {
    epoll_event events[64];
    for (;;) {
      const int timeout_ms = listener_polled_ ? -1 : ms_until(listener_resume_);
      const int n = ::epoll_wait(epoll_.fd(), events, 64, timeout_ms);
      if (n < 0) {
        if (errno == EINTR) continue;
        log(fmt::format("epoll_wait failed ({}); the store stops", net::errno_string(errno)));
        return;
      }
      if (!listener_polled_ && Clock::now() >= listener_resume_) poll_listener();
      for (int i = 0; i < n; ++i) {
        const uint64_t id = events[i].data.u64;
        if (id == kStopId) return;
        if (id == kListenerId) {
          accept_clients();
          continue;
        }
        Client* c = find(id);
        if (c == nullptr) continue;
        const uint32_t ev = events[i].events;
        if (ev & EPOLLOUT) flush(*c);
        if (!c->dead && (c->events & EPOLLIN) && (ev & (EPOLLIN | EPOLLHUP | EPOLLERR))) read_from(*c);
        // Hung up while not being read (parked): nothing more can come from it.
        if (!c->dead && !(c->events & EPOLLIN) && (ev & (EPOLLRDHUP | EPOLLHUP | EPOLLERR)))
          drop(*c, "");
        run_woken();
      }
      for (uint64_t id : dead_) clients_.erase(id);
      dead_.clear();
    }
  }

 private:
  struct Waiter {
    uint8_t command = 0;
    std::vector<std::string> keys;  // as sent: under the run id's prefix
    std::size_t missing = 0;        // distinct keys not set yet
  };

  struct Client {
    explicit Client(store::Limits limits) : input(limits) {}
    uint64_t id = 0;
    net::Socket socket;
    std::string peer;  // "127.0.0.1:51234"
    int rank = -1;     // from its handshake
    bool greeted = false;
    bool dead = false;
    store::MessageBuffer input;
    std::string output;  // replies; output_sent bytes of it are written
    std::size_t output_sent = 0;
    std::optional<Waiter> waiter;
    uint32_t events = 0;         // what epoll watches for on it now
    std::size_t accounted = 0;   // its bytes in buffered_

    std::size_t pending_output() const { return output.size() - output_sent; }
    std::string name() const {
      return rank >= 0 ? fmt::format("client {} (rank {})", peer, rank) : fmt::format("client {}", peer);
    }
  };

  // ---- the loop's plumbing ----

  void watch(int fd, uint32_t events, uint64_t id) {
    epoll_event ev{};
    ev.events = events;
    ev.data.u64 = id;
    MG_CHECK(::epoll_ctl(epoll_.fd(), EPOLL_CTL_ADD, fd, &ev) == 0,
             "TCPStore server: epoll_ctl(ADD) failed: {}", net::errno_string(errno));
  }

  static int ms_until(Clock::time_point t) {
    const auto left = std::chrono::ceil<std::chrono::milliseconds>(t - Clock::now()).count();
    return static_cast<int>(std::clamp<long long>(left, 0, 60000));
  }

  // One line on stderr, written at once so lines of several threads do not interleave.
  void log(const std::string& text) const {
    const std::string line =
        fmt::format("minigrad TCPStore server (job '{}', port {}): {}\n", options_.run_id, port_, text);
    [[maybe_unused]] const ssize_t n = ::write(2, line.data(), line.size());
  }

  Client* find(uint64_t id) {
    auto it = clients_.find(id);
    return it == clients_.end() || it->second->dead ? nullptr : it->second.get();
  }

  // The events a client is watched for: its requests unless it is parked, always its
  // hang-up, and writability while replies wait.
  void update_events(Client& c) {
    if (c.dead) return;
    const uint32_t want = EPOLLRDHUP | (c.waiter ? 0u : uint32_t{EPOLLIN}) |
                          (c.pending_output() > 0 ? uint32_t{EPOLLOUT} : 0u);
    if (want == c.events) return;
    epoll_event ev{};
    ev.events = want;
    ev.data.u64 = c.id;
    if (::epoll_ctl(epoll_.fd(), EPOLL_CTL_MOD, c.socket.fd(), &ev) != 0) {
      drop(c, fmt::format("epoll_ctl(MOD) failed: {}", net::errno_string(errno)));
      return;
    }
    c.events = want;
  }

  // Keeps buffered_ equal to what all clients hold.
  void recount(Client& c) {
    const std::size_t now = c.input.buffered() + c.pending_output();
    buffered_ = buffered_ - c.accounted + now;
    c.accounted = now;
  }

  // After a client's buffers grew: false, and the client dropped, when they took the
  // total past max_buffered_bytes.
  bool within_budget(Client& c) {
    recount(c);
    if (buffered_ <= options_.max_buffered_bytes) return true;
    drop(c, fmt::format("the store's buffers would hold {} ({} of them this client's), over the "
                        "limit of {} (TCPStoreOptions::max_buffered_bytes)",
                        mib(buffered_), mib(c.accounted), mib(options_.max_buffered_bytes)));
    return false;
  }

  // ---- connections ----

  void accept_clients() {
    for (int i = 0; i < kAcceptBatch; ++i) {
      sockaddr_storage addr{};
      socklen_t len = sizeof(addr);
      const int fd = ::accept4(listener_.fd(), reinterpret_cast<sockaddr*>(&addr), &len,
                               SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd >= 0) {
        at_fd_limit_ = false;
        backoff_ = kMinBackoff;
        add_client(fd, peer_name(addr, len));
        continue;
      }
      const int error = errno;
      if (error == EINTR || error == ECONNABORTED) continue;
      if (error == EAGAIN || error == EWOULDBLOCK) return;
      if (error == EMFILE || error == ENFILE) {
        at_fd_limit(error);
        return;
      }
      // ENOBUFS, ENOMEM, EPERM (a firewall rule): nothing to do now but try later.
      log(fmt::format("accept failed ({}); not accepting for {} ms", net::errno_string(error),
                      backoff_.count()));
      pause_listener();
      return;
    }
  }

  void add_client(int fd, std::string peer) {
    auto c = std::make_unique<Client>(limits_);
    c->socket = net::Socket(fd);
    c->id = next_id_++;
    c->peer = std::move(peer);
    // Requests and replies are small; Nagle's delay would add 40 ms to each.
    const int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    c->events = EPOLLIN | EPOLLRDHUP;
    epoll_event ev{};
    ev.events = c->events;
    ev.data.u64 = c->id;
    if (::epoll_ctl(epoll_.fd(), EPOLL_CTL_ADD, fd, &ev) != 0) {
      log(fmt::format("cannot watch {}: epoll_ctl(ADD) failed: {}", c->name(),
                      net::errno_string(errno)));
      return;  // c's socket closes here
    }
    clients_.emplace(c->id, std::move(c));
  }

  void at_fd_limit(int error) {
    rlimit limit{};
    ::getrlimit(RLIMIT_NOFILE, &limit);
    const std::string why = fmt::format(
        "the store server (rank 0, job '{}') is at its limit of open files ({}; RLIMIT_NOFILE {}, "
        "{} clients connected): a client must leave before another can join; raise the limit "
        "(ulimit -n) where rank 0 runs",
        options_.run_id, net::errno_string(error), limit.rlim_cur, clients_.size());
    if (!at_fd_limit_) {
      at_fd_limit_ = true;
      log(fmt::format("{}; refusing new connections with that message until one leaves", why));
    }
    if (spare_fd_ >= 0) {
      ::close(spare_fd_);
      spare_fd_ = -1;
      const std::string reply = store::encode_message(store::kError, {why});
      for (int i = 0; i < kAcceptBatch; ++i) {
        const int fd = ::accept4(listener_.fd(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) break;
        refuse_connection(fd, reply);
      }
      spare_fd_ = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
    }
    if (spare_fd_ < 0) pause_listener();
  }

  // Reads (and forgets) what a client about to be closed has sent, so that the close is a
  // FIN, not a reset that could discard our reason before the client reads it. Bounded: a
  // client that keeps sending must not keep the loop here.
  static void drain(int fd) {
    char bytes[4096];
    for (int i = 0; i < 16 && ::recv(fd, bytes, sizeof(bytes), MSG_DONTWAIT) > 0; ++i) {
    }
  }

  // Tells a connection the server cannot keep why, as far as its socket takes it at once,
  // and closes it.
  static void refuse_connection(int fd, const std::string& reply) {
    drain(fd);
    [[maybe_unused]] const ssize_t n = ::send(fd, reply.data(), reply.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    ::close(fd);
  }

  void pause_listener() {
    if (listener_polled_) {
      ::epoll_ctl(epoll_.fd(), EPOLL_CTL_DEL, listener_.fd(), nullptr);
      listener_polled_ = false;
    }
    listener_resume_ = Clock::now() + backoff_;
    backoff_ = std::min<std::chrono::milliseconds>(backoff_ * 2, kMaxBackoff);
  }

  void poll_listener() {
    if (listener_polled_) return;
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u64 = kListenerId;
    if (::epoll_ctl(epoll_.fd(), EPOLL_CTL_ADD, listener_.fd(), &ev) == 0) {
      listener_polled_ = true;
    } else {
      log(fmt::format("cannot watch the listening socket ({}); retrying in {} ms",
                      net::errno_string(errno), backoff_.count()));
      listener_resume_ = Clock::now() + backoff_;
    }
  }

  // Closes a client; `why` (when not empty) goes to the log. The Client object lives on
  // until the end of this turn of the loop, so references to it stay valid meanwhile.
  void drop(Client& c, const std::string& why) {
    if (c.dead) return;
    if (!why.empty()) log(fmt::format("dropping {}: {}", c.name(), why));
    if (c.waiter) unregister(c);
    ::epoll_ctl(epoll_.fd(), EPOLL_CTL_DEL, c.socket.fd(), nullptr);
    c.socket.close();
    // Without a spare (none could be opened), the descriptor just freed becomes it.
    if (spare_fd_ < 0) spare_fd_ = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
    c.dead = true;
    buffered_ -= c.accounted;
    c.accounted = 0;
    dead_.push_back(c.id);
    poll_listener();  // a descriptor is free again
  }

  // Refuses a client for what it sent: the reason to the log and, best effort, to it.
  void refuse(Client& c, const std::string& why) {
    log(fmt::format("refusing {}: {}", c.name(), why));
    store::append_message(c.output, store::kError, {why});
    flush(c);
    if (!c.dead) drain(c.socket.fd());
    drop(c, "");
  }

  // ---- reading and writing ----

  void read_from(Client& c) {
    char chunk[64 * 1024];
    std::size_t taken = 0;
    while (!c.dead && !c.waiter && taken < kReadBudget) {
      const ssize_t n = ::recv(c.socket.fd(), chunk, sizeof(chunk), 0);
      if (n > 0) {
        c.input.append(chunk, static_cast<std::size_t>(n));
        taken += static_cast<std::size_t>(n);
        if (!within_budget(c)) return;
        process_input(c);
        continue;
      }
      if (n == 0) {
        drop(c, "");  // it closed: a rank finished, gave up, or died
        return;
      }
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) break;
      drop(c, errno == ECONNRESET ? "" : fmt::format("recv failed: {}", net::errno_string(errno)));
      return;
    }
    update_events(c);
  }

  // Answers the complete requests in the client's input, in order, until one parks.
  void process_input(Client& c) {
    while (!c.dead && !c.waiter) {
      store::Message message;
      std::string error;
      const store::ParseStatus status = c.input.next(message, error);
      if (status == store::ParseStatus::NeedMore) break;
      if (status == store::ParseStatus::Malformed) {
        refuse(c, "a malformed message: " + error);
        return;
      }
      handle(c, message);
    }
    if (c.dead) return;
    recount(c);
    update_events(c);
  }

  void reply(Client& c, uint8_t code, const std::vector<std::string>& args) {
    if (c.dead) return;
    const std::size_t size = store::message_size(args);
    if (c.pending_output() > 0 && c.pending_output() + size > options_.max_output_bytes) {
      drop(c, fmt::format("it does not read its replies: {} of them wait, and {} more would pass "
                          "the limit of {} (TCPStoreOptions::max_output_bytes)",
                          mib(c.pending_output()), mib(size), mib(options_.max_output_bytes)));
      return;
    }
    store::append_message(c.output, code, args);
    flush(c);
    if (!c.dead) within_budget(c);
  }

  void flush(Client& c) {
    while (c.pending_output() > 0) {
      const ssize_t n = ::send(c.socket.fd(), c.output.data() + c.output_sent, c.pending_output(),
                               MSG_NOSIGNAL);
      if (n > 0) {
        c.output_sent += static_cast<std::size_t>(n);
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
      drop(c, n < 0 && errno != EPIPE && errno != ECONNRESET
                  ? fmt::format("send failed: {}", net::errno_string(errno))
                  : "");
      return;
    }
    if (c.pending_output() == 0) {
      c.output.clear();
      c.output_sent = 0;
      if (c.output.capacity() > kKeepCapacity) c.output.shrink_to_fit();
    } else if (c.output_sent > c.output.size() / 2) {
      c.output.erase(0, c.output_sent);
      c.output_sent = 0;
    }
    recount(c);
    update_events(c);
  }

  // ---- the store ----

  std::string user_key(const std::string& key) const {
    return printable(key.compare(0, prefix_.size(), prefix_) == 0 ? key.substr(prefix_.size()) : key);
  }

  bool all_set(const std::vector<std::string>& keys) const {
    return std::all_of(keys.begin(), keys.end(), [&](const std::string& k) { return data_.count(k) != 0; });
  }

  void greet(Client& c, const store::Message& m) {
    if (m.code != store::kHello || !store::check_request(m).empty() || m.args[0] != store::kMagic) {
      refuse(c, "not a minigrad TCPStore client (the first message must be its handshake)");
      return;
    }
    if (m.args[1] != store::kProtocolVersion) {
      refuse(c, fmt::format("a client of protocol version '{}' (this store speaks {}): are all "
                            "ranks running the same minigrad?",
                            printable(m.args[1]), store::kProtocolVersion));
      return;
    }
    int64_t rank = -1;
    if (parse_int64(m.args[3], rank) && rank >= -1 && rank <= (int64_t{1} << 30))
      c.rank = static_cast<int>(rank);
    if (m.args[2] != options_.run_id) {
      refuse(c, fmt::format("rank {} of job '{}' reached the store of job '{}' on port {}: two jobs "
                            "were given one MASTER_PORT (give each job a port of its own, and "
                            "every rank of one job the same MINIGRAD_RUN_ID)",
                            c.rank, printable(m.args[2]), options_.run_id, port_));
      return;
    }
    c.greeted = true;
    reply(c, store::kOk, {options_.run_id});
  }

  void handle(Client& c, store::Message& m) {
    if (!c.greeted) {
      greet(c, m);
      return;
    }
    const std::string problem = store::check_request(m);
    if (!problem.empty() || m.code == store::kHello) {
      refuse(c, problem.empty() ? "a second handshake" : problem);
      return;
    }
    // Every key of a request is under this job's id (set/add: the first argument only).
    const std::size_t keys = (m.code == store::kSet || m.code == store::kAdd) ? 1 : m.args.size();
    for (std::size_t i = 0; i < keys; ++i) {
      if (m.args[i].compare(0, prefix_.size(), prefix_) != 0) {
        refuse(c, fmt::format("{} of key '{}', which is not under this job's id '{}'",
                              store::command_name(m.code), printable(m.args[i]), options_.run_id));
        return;
      }
    }
    switch (m.code) {
      case store::kSet: return set(c, m.args[0], std::move(m.args[1]));
      case store::kAdd: return add(c, m.args[0], m.args[1]);
      case store::kCheck: return reply(c, store::kValue, {all_set(m.args) ? "1" : "0"});
      case store::kGet:
      case store::kWait:
        if (all_set(m.args)) {
          answer(c, m.code, m.args);
        } else {
          park(c, m.code, std::move(m.args));
        }
        return;
    }
  }

  // Stores `value` under `key` when the store's data stays within max_data_bytes;
  // otherwise the error, naming the key, goes to the client. False when refused.
  bool store_value(Client& c, const std::string& key, std::string value) {
    auto it = data_.find(key);
    const std::size_t before = it == data_.end() ? 0 : key.size() + it->second.size();
    const std::size_t after = data_bytes_ - before + key.size() + value.size();
    if (after > options_.max_data_bytes) {
      reply(c, store::kError,
            {fmt::format("key '{}' ({} bytes) would make the store hold {} bytes, over its limit "
                         "of {} (TCPStoreOptions::max_data_bytes)",
                         user_key(key), value.size(), after, options_.max_data_bytes)});
      return false;
    }
    data_bytes_ = after;
    if (it != data_.end()) {
      it->second = std::move(value);
    } else {
      data_.emplace(key, std::move(value));
      // Waiters first: once the setter hears back it may exit (taking the server with it,
      // on rank 0), and the waiters should have their answers by then.
      wake(key);
    }
    return true;
  }

  void set(Client& c, const std::string& key, std::string value) {
    if (store_value(c, key, std::move(value))) reply(c, store::kOk, {});
  }

  void add(Client& c, const std::string& key, const std::string& delta_text) {
    int64_t delta = 0, current = 0, sum = 0;
    if (!parse_int64(delta_text, delta)) {
      reply(c, store::kError, {fmt::format("add to key '{}' of '{}', which is not an integer",
                                           user_key(key), printable(delta_text))});
      return;
    }
    auto it = data_.find(key);
    if (it != data_.end() && !parse_int64(it->second, current)) {
      reply(c, store::kError,
            {fmt::format("key '{}' holds a value that is not an integer counter", user_key(key))});
      return;
    }
    if (__builtin_add_overflow(current, delta, &sum)) {
      reply(c, store::kError,
            {fmt::format("key '{}' holds {}; adding {} would overflow int64, so it is left unchanged",
                         user_key(key), current, delta)});
      return;
    }
    std::string value = std::to_string(sum);
    if (store_value(c, key, value)) reply(c, store::kValue, {std::move(value)});
  }

  void answer(Client& c, uint8_t command, const std::vector<std::string>& keys) {
    if (command == store::kGet) {
      reply(c, store::kValue, {data_.at(keys[0])});
    } else {
      reply(c, store::kOk, {});
    }
  }

  // Each distinct key of `keys` that is not set yet, once.
  std::vector<const std::string*> missing_keys(const std::vector<std::string>& keys) const {
    std::vector<const std::string*> missing;
    std::unordered_set<std::string_view> seen;
    for (const std::string& k : keys)
      if (data_.count(k) == 0 && seen.insert(k).second) missing.push_back(&k);
    return missing;
  }

  void park(Client& c, uint8_t command, std::vector<std::string> keys) {
    Waiter w;
    w.command = command;
    w.keys = std::move(keys);
    for (const std::string* k : missing_keys(w.keys)) {
      waiting_on_[*k].push_back(c.id);
      ++w.missing;
    }
    c.waiter = std::move(w);
  }

  void unregister(Client& c) {
    for (const std::string* k : missing_keys(c.waiter->keys)) {
      auto it = waiting_on_.find(*k);
      if (it == waiting_on_.end()) continue;
      auto& ids = it->second;
      ids.erase(std::remove(ids.begin(), ids.end(), c.id), ids.end());
      if (ids.empty()) waiting_on_.erase(it);
    }
    c.waiter.reset();
  }

  // `key` was just set: answers the parked clients it completes. Their next requests are
  // read after the current one is done (run_woken), not from inside it.
  void wake(const std::string& key) {
    auto it = waiting_on_.find(key);
    if (it == waiting_on_.end()) return;
    const std::vector<uint64_t> ids = std::move(it->second);
    waiting_on_.erase(it);
    for (uint64_t id : ids) {
      Client* w = find(id);
      if (w == nullptr || !w->waiter || --w->waiter->missing > 0) continue;
      const Waiter waiter = std::move(*w->waiter);
      w->waiter.reset();
      answer(*w, waiter.command, waiter.keys);
      runnable_.push_back(id);
    }
  }

  void run_woken() {
    while (!runnable_.empty()) {
      const std::vector<uint64_t> ids = std::move(runnable_);
      runnable_.clear();
      for (uint64_t id : ids) {
        Client* c = find(id);
        if (c != nullptr && !c->waiter) process_input(*c);
      }
    }
  }

  TCPStoreOptions options_;
  store::Limits limits_;
  std::string prefix_;  // "<run id>/"
  net::Socket listener_;
  int port_ = 0;
  net::Socket epoll_;  // (owned descriptors, closed last)
  net::Socket stop_;   // an eventfd: written to stop the loop
  int spare_fd_ = -1;  // kept for the open-file limit (at_fd_limit)
  bool at_fd_limit_ = false;
  bool listener_polled_ = true;
  Clock::time_point listener_resume_{};
  std::chrono::milliseconds backoff_ = kMinBackoff;

  uint64_t next_id_ = 2;
  std::unordered_map<uint64_t, std::unique_ptr<Client>> clients_;
  std::vector<uint64_t> dead_;      // dropped this turn; erased at its end
  std::vector<uint64_t> runnable_;  // answered waiters whose further input is to be read
  std::size_t buffered_ = 0;        // all clients' input and output bytes

  std::unordered_map<std::string, std::string> data_;
  std::size_t data_bytes_ = 0;  // keys and values
  std::unordered_map<std::string, std::vector<uint64_t>> waiting_on_;  // missing key -> parked clients
};

TCPStoreServer::TCPStoreServer(const std::string& host, int port, const TCPStoreOptions& options)
    : loop_(std::make_unique<Loop>(host, port, options)), port_(loop_->port()) {
  thread_ = std::thread([loop = loop_.get()] { loop->run(); });
}

TCPStoreServer::~TCPStoreServer() {
  loop_->stop();
  thread_.join();
}

}  // namespace mg::parallel
