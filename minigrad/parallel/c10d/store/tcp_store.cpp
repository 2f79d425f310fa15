// TCPStore's client side (tcp_store.h): one blocking connection per TCPStore, one request
// at a time. The server is tcp_store_server.cpp; the bytes between them, store_protocol.h.
#include <minigrad/parallel/c10d/store/tcp_store.h>

#include <algorithm>
#include <cerrno>
#include <charconv>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <minigrad/core/error.h>
#include <minigrad/parallel/c10d/store/socket.h>
#include <minigrad/parallel/c10d/store/store_protocol.h>
#include <minigrad/parallel/c10d/store/tcp_store_server.h>

namespace mg::parallel {

namespace {

using net::Clock;

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

// "key 'a'", "keys ['a', 'b']"; a long list is cut short.
std::string quoted_keys(const std::vector<std::string>& keys) {
  if (keys.size() == 1) return fmt::format("key '{}'", keys[0]);
  constexpr std::size_t kShown = 8;
  if (keys.size() <= kShown) return fmt::format("keys {}", keys);
  const std::vector<std::string> first(keys.begin(), keys.begin() + kShown);
  return fmt::format("{} keys ({}, ...)", keys.size(), fmt::join(first, ", "));
}

std::string mib(std::size_t bytes) {
  return fmt::format("{:.1f} MiB", static_cast<double>(bytes) / (1 << 20));
}

}  // namespace

TCPStore::TCPStore(std::string host, int port, TCPStoreOptions options)
    : host_(std::move(host)), port_(port), options_(std::move(options)) {
  MG_CHECK(!host_.empty(), "TCPStore: empty host name (rank {})", options_.rank);
  MG_CHECK(port_ >= 0 && port_ <= 65535, "TCPStore: port {} is outside [0, 65535] (rank {})",
           port_, options_.rank);
  check_run_id(options_.run_id, fmt::format("TCPStore (rank {})", options_.rank));
  // The payload's length is a u32; below a few KiB not even a handshake's error fits.
  MG_CHECK(options_.max_message_bytes >= 4096 &&
               options_.max_message_bytes <= store::kHeaderBytes + uint64_t{0xffffffff},
           "TCPStore: max_message_bytes {} is outside [4096, 2^32 + 8] (rank {})",
           options_.max_message_bytes, options_.rank);
  if (options_.is_server) {
    try {
      server_ = std::make_unique<TCPStoreServer>(host_, port_, options_);
    } catch (const Error& e) {
      const std::string text = e.what();
      const bool in_use = text.find(net::errno_string(EADDRINUSE)) != std::string::npos;
      MG_FAIL("TCPStore (rank {}, job '{}'): cannot serve the store on {}:{}: {}{}", options_.rank,
              options_.run_id, host_, port_, text,
              in_use ? ". Another job, or a process of an earlier run, holds this port: give each "
                       "job a MASTER_PORT of its own"
                     : "");
    }
    port_ = server_->port();
  } else {
    MG_CHECK(port_ != 0, "TCPStore: a client needs the server's port, got 0 (rank {})",
             options_.rank);
  }
  socket_ = std::make_unique<net::Socket>(
      net::connect_with_retry(host_, port_, deadline_after(options_.timeout),
                              fmt::format("TCPStore (rank {})", options_.rank)));
  handshake();
}

// The client connection closes before the server stops, so the server never waits on it.
TCPStore::~TCPStore() {
  socket_.reset();
  server_.reset();
}

std::string TCPStore::where() const {
  return fmt::format("rank {}, job '{}', store at {}:{}", options_.rank, options_.run_id, host_,
                     port_);
}

// The first message of the connection: who we are. A store of another job (or a server
// at its open-file limit) answers with an error, which becomes this rank's error.
void TCPStore::handshake() {
  const std::vector<std::string> hello = {store::kMagic, store::kProtocolVersion, options_.run_id,
                                          std::to_string(options_.rank)};
  std::vector<std::string> reply;
  const uint8_t code = exchange(store::kHello, hello, options_.timeout, "handshake",
                                "the store's answer to this rank's handshake", reply);
  MG_CHECK(code != store::kError, "TCPStore (rank {}): the store at {}:{} refused this rank: {}",
           options_.rank, host_, port_, reply.empty() ? "no reason given" : reply[0]);
}

std::vector<std::string> TCPStore::request(uint8_t command, const std::vector<std::string>& args,
                                           std::chrono::milliseconds timeout, const char* op,
                                           const std::string& what) {
  std::vector<std::string> reply;
  if (exchange(command, args, timeout, op, what, reply) == store::kError) {
    MG_FAIL("TCPStore::{} of {}: {} ({})", op, what,
            reply.empty() ? "an error without a message" : reply[0], where());
  }
  return reply;
}

uint8_t TCPStore::exchange(uint8_t command, const std::vector<std::string>& args,
                           std::chrono::milliseconds timeout, const char* op,
                           const std::string& what, std::vector<std::string>& reply_args) {
  std::lock_guard<std::mutex> lock(mutex_);
  MG_CHECK(broken_.empty(), "TCPStore::{}: the connection is unusable after an earlier "
           "failure ({}): {}", op, where(), broken_);
  const std::size_t size = store::message_size(args);
  MG_CHECK(size <= options_.max_message_bytes,
           "TCPStore::{} of {}: the request takes {} ({} bytes), over the store's limit of {} for "
           "one message (TCPStoreOptions::max_message_bytes; {})",
           op, what, mib(size), size, mib(options_.max_message_bytes), where());
  const auto start = Clock::now();
  const Clock::time_point deadline = deadline_after(timeout);
  const std::string message = store::encode_message(command, args);
  try {
    net::send_all(socket_->fd(), message.data(), message.size(), "TCPStore");
  } catch (const Error& e) {
    broken_ = e.what();
    socket_->close();
    MG_FAIL("TCPStore::{} of {}: cannot reach the store ({}): {}", op, what, where(), e.what());
  }

  auto fail = [&](net::RecvStatus status) {
    const double elapsed = std::chrono::duration<double>(Clock::now() - start).count();
    std::string text;
    if (status == net::RecvStatus::Timeout) {
      text = fmt::format(
          "TCPStore::{}: timed out after {:.2f} s waiting for {} (timeout {:.2f} s; {}). A rank "
          "that should have set it did not arrive or died.",
          op, elapsed, what, seconds(timeout), where());
    } else {
      text = fmt::format(
          "TCPStore::{} of {}: the store server closed the connection after {:.2f} s ({}); did "
          "rank 0 exit or crash?",
          op, what, elapsed, where());
    }
    broken_ = text;
    socket_->close();
    throw Error(text);
  };
  auto malformed = [&](const std::string& error) {
    broken_ = fmt::format("a malformed reply to {}: {}", op, error);
    socket_->close();
    MG_FAIL("TCPStore::{}: the store sent a malformed reply ({}; {}). Is MASTER_PORT served by "
            "a minigrad store of the same version?",
            op, error, where());
  };

  // The header says how long the reply is; the rest is read in one go, then parsed by the
  // same function as the server's.
  store::Limits limits;
  limits.max_message_bytes = options_.max_message_bytes;
  std::string bytes(store::kHeaderBytes, '\0');
  net::RecvStatus status = net::recv_exact(socket_->fd(), bytes.data(), bytes.size(), deadline, "TCPStore");
  if (status != net::RecvStatus::Ok) fail(status);
  store::Parsed parsed = store::parse_message(bytes.data(), bytes.size(), limits);
  if (parsed.status == store::ParseStatus::NeedMore) {
    bytes.resize(parsed.size);
    status = net::recv_exact(socket_->fd(), bytes.data() + store::kHeaderBytes,
                             bytes.size() - store::kHeaderBytes, deadline, "TCPStore");
    if (status != net::RecvStatus::Ok) fail(status);
    parsed = store::parse_message(bytes.data(), bytes.size(), limits);
  }
  if (parsed.status != store::ParseStatus::Complete) malformed(parsed.error);
  store::Message& reply = parsed.message;
  if (reply.code != store::kOk && reply.code != store::kValue && reply.code != store::kError)
    malformed(fmt::format("reply code {}", reply.code));
  reply_args = std::move(reply.args);
  return reply.code;
}

void TCPStore::set(const std::string& key, const std::string& value) {
  request(store::kSet, {key_of(key), value}, options_.timeout, "set", quoted_keys({key}));
}

std::string TCPStore::get(const std::string& key, std::chrono::milliseconds timeout) {
  std::vector<std::string> reply = request(store::kGet, {key_of(key)}, timeout, "get", quoted_keys({key}));
  MG_CHECK(reply.size() == 1, "TCPStore::get: malformed reply ({})", where());
  return std::move(reply[0]);
}

int64_t TCPStore::add(const std::string& key, int64_t delta) {
  std::vector<std::string> reply = request(store::kAdd, {key_of(key), std::to_string(delta)},
                                           options_.timeout, "add", quoted_keys({key}));
  int64_t value = 0;
  MG_CHECK(reply.size() == 1 && parse_int64(reply[0], value),
           "TCPStore::add: malformed reply ({})", where());
  return value;
}

bool TCPStore::check(const std::vector<std::string>& keys) {
  std::vector<std::string> wire;
  wire.reserve(keys.size());
  for (const std::string& k : keys) wire.push_back(key_of(k));
  std::vector<std::string> reply = request(store::kCheck, wire, options_.timeout, "check", quoted_keys(keys));
  MG_CHECK(reply.size() == 1, "TCPStore::check: malformed reply ({})", where());
  return reply[0] == "1";
}

void TCPStore::wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  if (keys.empty()) return;
  std::vector<std::string> wire;
  wire.reserve(keys.size());
  for (const std::string& k : keys) wire.push_back(key_of(k));
  request(store::kWait, wire, timeout, "wait", quoted_keys(keys));
}

std::unique_ptr<Store> TCPStore::connect_again(std::chrono::milliseconds timeout) const {
  TCPStoreOptions options = options_;
  options.is_server = false;
  options.timeout = timeout;
  return std::make_unique<TCPStore>(host_, port_, options);
}

}  // namespace mg::parallel
