// TorchStoreClient (torch_store_client.h): PyTorch's TCPStore protocol, client side.
#include <minigrad/parallel/c10d/store/torch_store_client.h>

#include <algorithm>
#include <cstring>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <minigrad/core/error.h>
#include <minigrad/parallel/c10d/store/socket.h>

namespace mg::parallel {

namespace {

using net::Clock;

// The legacy query codes; the validated protocol's are one higher (VALIDATE took 0).
constexpr uint8_t kSet = 0, kGet = 2, kAdd = 3, kCheck = 4, kWait = 5, kGetNumKeys = 6;
constexpr uint8_t kValidate = 0;
constexpr uint32_t kValidationMagic = 0x3C85F7CE;
constexpr uint8_t kReady = 0, kNotReady = 1, kStopWaiting = 0;
// How long connecting waits for the answer to its first request (at most the timeout).
constexpr std::chrono::milliseconds kProbeTimeout{10000};

Clock::time_point deadline_after(std::chrono::milliseconds timeout) {
  return Clock::now() + std::min<std::chrono::milliseconds>(timeout, std::chrono::hours(24 * 365));
}

double seconds(std::chrono::milliseconds ms) { return static_cast<double>(ms.count()) / 1000.0; }

uint64_t load_u64(const unsigned char* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

std::string quoted_keys(const std::vector<std::string>& keys) {
  if (keys.size() == 1) return fmt::format("key '{}'", keys[0]);
  return fmt::format("keys {}", keys);
}

const char* protocol_name(TorchStoreProtocol p) {
  switch (p) {
    case TorchStoreProtocol::Legacy: return "PyTorch 1.x protocol";
    case TorchStoreProtocol::Validated: return "PyTorch 2.x, validated";
    case TorchStoreProtocol::Auto: break;
  }
  return "not yet known";
}

}  // namespace

// One request's bytes, little-endian as PyTorch's x86 and ARM builds write them.
struct TorchStoreClient::Request {
  std::string bytes;
  explicit Request(uint8_t code) { bytes.push_back(static_cast<char>(code)); }
  Request& u32(uint32_t v) {
    for (int i = 0; i < 4; ++i) bytes.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
    return *this;
  }
  Request& u64(uint64_t v) {
    for (int i = 0; i < 8; ++i) bytes.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
    return *this;
  }
  Request& str(const std::string& s) {
    u64(s.size());
    bytes += s;
    return *this;
  }
};

TorchStoreClient::TorchStoreClient(std::string host, int port, TorchStoreClientOptions options)
    : host_(std::move(host)), port_(port), options_(std::move(options)) {
  MG_CHECK(!host_.empty(), "TorchStoreClient: empty host name (rank {})", options_.rank);
  MG_CHECK(port_ >= 1 && port_ <= 65535, "TorchStoreClient: port {} is outside [1, 65535] (rank {})",
           port_, options_.rank);
  MG_CHECK(options_.max_value_bytes >= 1024, "TorchStoreClient: max_value_bytes {} is below 1024",
           options_.max_value_bytes);
  if (options_.protocol != TorchStoreProtocol::Auto) {
    connect(options_.protocol);
    return;
  }
  connect(TorchStoreProtocol::Legacy);
  if (probe_legacy()) {
    options_.protocol = TorchStoreProtocol::Legacy;
    return;
  }
  connect(TorchStoreProtocol::Validated);
  options_.protocol = TorchStoreProtocol::Validated;
  // A validated server answers GETNUMKEYS; one that speaks neither form fails here.
  std::lock_guard<std::mutex> lock(mutex_);
  send(Request(code(kGetNumKeys)), "connect", "the number of keys");
  unsigned char reply[8];
  const auto probe = std::min(options_.timeout, kProbeTimeout);
  receive(reply, sizeof(reply), deadline_after(probe), probe, "connect",
          "the answer to a validated handshake");
}

TorchStoreClient::~TorchStoreClient() = default;

std::string TorchStoreClient::where() const {
  return fmt::format("rank {}, job '{}', PyTorch store at {}:{} ({})", options_.rank,
                     options_.run_id, host_, port_, protocol_name(options_.protocol));
}

// PyTorch's client puts "/" before every key (TCPStore's keyPrefix_); so do we, so that
// a key set here is the key a PyTorch client names.
std::string TorchStoreClient::wire_key(const std::string& key) const {
  return "/" + options_.key_prefix + key;
}

uint8_t TorchStoreClient::code(uint8_t legacy) const {
  return options_.protocol == TorchStoreProtocol::Validated ? static_cast<uint8_t>(legacy + 1)
                                                            : legacy;
}

void TorchStoreClient::connect(TorchStoreProtocol protocol) {
  broken_.clear();
  socket_ = std::make_unique<net::Socket>(
      net::connect_with_retry(host_, port_, deadline_after(options_.timeout),
                              fmt::format("TorchStoreClient (rank {})", options_.rank)));
  if (protocol == TorchStoreProtocol::Validated) {
    Request hello(kValidate);
    hello.u32(kValidationMagic);
    send(hello, "connect", "the validation handshake");  // no answer comes
  }
}

// GETNUMKEYS in the legacy form: a legacy server answers with 8 bytes; a validating one
// closes the connection, its first request not being VALIDATE.
bool TorchStoreClient::probe_legacy() {
  std::lock_guard<std::mutex> lock(mutex_);
  send(Request(kGetNumKeys), "connect", "the number of keys");
  unsigned char reply[8];
  const auto probe = std::min(options_.timeout, kProbeTimeout);
  const net::RecvStatus status = net::recv_exact(socket_->fd(), reply, sizeof(reply),
                                                 deadline_after(probe), "TorchStoreClient");
  if (status == net::RecvStatus::Ok) return true;
  socket_->close();
  MG_CHECK(status == net::RecvStatus::Closed,
           "TorchStoreClient (rank {}): the store at {}:{} did not answer within {:.1f} s; is "
           "MASTER_PORT a PyTorch TCPStore (torchrun's agent)?",
           options_.rank, host_, port_, seconds(probe));
  return false;
}

void TorchStoreClient::check_usable(const char* op) const {
  MG_CHECK(broken_.empty(), "TorchStoreClient::{}: the connection is unusable after an earlier "
           "failure ({}): {}", op, where(), broken_);
}

void TorchStoreClient::fail(const std::string& text) {
  broken_ = text;
  socket_->close();
  throw Error(text);
}

void TorchStoreClient::send(const Request& request, const char* op, const std::string& what) {
  try {
    net::send_all(socket_->fd(), request.bytes.data(), request.bytes.size(), "TorchStoreClient");
  } catch (const Error& e) {
    fail(fmt::format("TorchStoreClient::{} of {}: cannot reach the store ({}): {}", op, what,
                     where(), e.what()));
  }
}

void TorchStoreClient::receive(void* data, std::size_t size, Clock::time_point deadline,
                               std::chrono::milliseconds timeout, const char* op,
                               const std::string& what) {
  const net::RecvStatus status =
      net::recv_exact(socket_->fd(), data, size, deadline, "TorchStoreClient");
  if (status == net::RecvStatus::Timeout) {
    fail(fmt::format("TorchStoreClient::{}: timed out after {:.2f} s waiting for {} ({}). A "
                     "rank that should have set it did not arrive or died.",
                     op, seconds(timeout), what, where()));
  }
  if (status == net::RecvStatus::Closed) {
    fail(fmt::format("TorchStoreClient::{} of {}: the store closed the connection ({}); did "
                     "torchrun's agent exit, or does it speak another PyTorch version's protocol?",
                     op, what, where()));
  }
}

void TorchStoreClient::set(const std::string& key, const std::string& value) {
  std::lock_guard<std::mutex> lock(mutex_);
  check_usable("set");
  Request r(code(kSet));
  r.str(wire_key(key)).str(value);
  send(r, "set", quoted_keys({key}));
}

void TorchStoreClient::wait_locked(const std::vector<std::string>& keys,
                                   std::chrono::milliseconds timeout, const char* op,
                                   const std::string& what) {
  Request r(code(kWait));
  r.u64(keys.size());
  for (const std::string& key : keys) r.str(wire_key(key));
  send(r, op, what);
  uint8_t reply = 0xff;
  receive(&reply, 1, deadline_after(timeout), timeout, op, what);
  if (reply != kStopWaiting)
    fail(fmt::format("TorchStoreClient::{}: the store answered a wait with {} ({})", op, reply,
                     where()));
}

std::string TorchStoreClient::get(const std::string& key, std::chrono::milliseconds timeout) {
  std::lock_guard<std::mutex> lock(mutex_);
  check_usable("get");
  const std::string what = quoted_keys({key});
  // A GET of a missing key makes the server drop the connection: wait for it first.
  wait_locked({key}, timeout, "get", what);
  Request r(code(kGet));
  r.str(wire_key(key));
  send(r, "get", what);
  const auto deadline = deadline_after(options_.timeout);
  unsigned char header[8];
  receive(header, sizeof(header), deadline, options_.timeout, "get", what);
  const uint64_t size = load_u64(header);
  if (size > options_.max_value_bytes)
    fail(fmt::format("TorchStoreClient::get of {}: the store announces {} bytes, over the limit "
                     "of {} (TorchStoreClientOptions::max_value_bytes; {})",
                     what, size, options_.max_value_bytes, where()));
  std::string value(static_cast<std::size_t>(size), '\0');
  receive(value.data(), value.size(), deadline, options_.timeout, "get", what);
  return value;
}

int64_t TorchStoreClient::add(const std::string& key, int64_t delta) {
  std::lock_guard<std::mutex> lock(mutex_);
  check_usable("add");
  const std::string what = quoted_keys({key});
  Request r(code(kAdd));
  r.str(wire_key(key)).u64(static_cast<uint64_t>(delta));
  send(r, "add", what);
  unsigned char reply[8];
  receive(reply, sizeof(reply), deadline_after(options_.timeout), options_.timeout, "add", what);
  return static_cast<int64_t>(load_u64(reply));
}

bool TorchStoreClient::check(const std::vector<std::string>& keys) {
  std::lock_guard<std::mutex> lock(mutex_);
  check_usable("check");
  const std::string what = quoted_keys(keys);
  Request r(code(kCheck));
  r.u64(keys.size());
  for (const std::string& key : keys) r.str(wire_key(key));
  send(r, "check", what);
  uint8_t reply = 0xff;
  receive(&reply, 1, deadline_after(options_.timeout), options_.timeout, "check", what);
  if (reply != kReady && reply != kNotReady)
    fail(fmt::format("TorchStoreClient::check: the store answered {} ({})", reply, where()));
  return reply == kReady;
}

void TorchStoreClient::wait(const std::vector<std::string>& keys,
                            std::chrono::milliseconds timeout) {
  if (keys.empty()) return;
  std::lock_guard<std::mutex> lock(mutex_);
  check_usable("wait");
  wait_locked(keys, timeout, "wait", quoted_keys(keys));
}

std::unique_ptr<Store> TorchStoreClient::connect_again(std::chrono::milliseconds timeout) const {
  TorchStoreClientOptions options = options_;
  options.timeout = timeout;
  return std::make_unique<TorchStoreClient>(host_, port_, options);
}

}  // namespace mg::parallel
