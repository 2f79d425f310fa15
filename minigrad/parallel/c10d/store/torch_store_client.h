// TorchStoreClient: a client of a PyTorch TCPStore (the one torchrun's agent serves on
// MASTER_PORT when it sets TORCHELASTIC_USE_AGENT_STORE=True), speaking PyTorch's wire
// protocol, so that a minigrad job runs under torchrun as a PyTorch job does.
//
// The protocol (torch/csrc/distributed/c10d/TCPStore*.cpp): a request is one byte of
// query type then its arguments; a string or byte vector is a u64 length then the bytes;
// integers are native (little-endian) u64/i64; replies are the bare values. Two
// generations are spoken:
//   Legacy     PyTorch 1.x and the first 2.x releases (Debian's 1.13 among them): no
//              handshake; SET=0 COMPARE_SET=1 GET=2 ADD=3 CHECK=4 WAIT=5 GETNUMKEYS=6
//   Validated  later 2.x: the connection opens with VALIDATE=0 and the u32 magic
//              0x3C85F7CE, and every later code is one higher (SET=1 ... GETNUMKEYS=7)
// With TorchStoreProtocol::Auto the client asks GETNUMKEYS in the legacy form first: a legacy
// server answers, a validating one drops a connection whose first request is not
// VALIDATE, and the client reconnects validated. Tested against 1.13's server; the
// validated form is written from PyTorch's source.
//
// A GET of a missing key makes PyTorch's server drop the connection, so get() waits for
// the key first, as PyTorch's client does. Every read is bounded (a value longer than
// max_value_bytes is refused before it is read) and timed; after a timeout or a
// malformed reply the connection is out of step, so it is closed and later calls fail
// naming the first failure. Keys are put under key_prefix, apart from the agent's own,
// and, as PyTorch's client does, under "/": key "k" with prefix "p/" is "/p/k" on the
// wire, which a PyTorch client names "p/k".
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <minigrad/parallel/c10d/store/store.h>

namespace mg::parallel {

namespace net {
class Socket;
}

enum class TorchStoreProtocol { Auto, Legacy, Validated };

struct TorchStoreClientOptions {
  // Bound of connecting and of get and wait.
  std::chrono::milliseconds timeout = std::chrono::minutes(5);
  // This process's rank, for error messages (-1: unknown).
  int rank = -1;
  // The job's id (for messages and for a second connection); keys go under key_prefix.
  std::string run_id = "default";
  std::string key_prefix = "minigrad/";
  TorchStoreProtocol protocol = TorchStoreProtocol::Auto;
  // The longest value get() accepts from the server.
  std::size_t max_value_bytes = std::size_t{64} << 20;
};

class TorchStoreClient : public Store {
 public:
  TorchStoreClient(std::string host, int port, TorchStoreClientOptions options = {});
  ~TorchStoreClient() override;
  TorchStoreClient(const TorchStoreClient&) = delete;
  TorchStoreClient& operator=(const TorchStoreClient&) = delete;

  using Store::get;
  using Store::wait;
  void set(const std::string& key, const std::string& value) override;
  std::string get(const std::string& key, std::chrono::milliseconds timeout) override;
  int64_t add(const std::string& key, int64_t delta) override;
  bool check(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override;
  std::unique_ptr<Store> connect_again(std::chrono::milliseconds timeout) const override;

  const std::string& host() const override { return host_; }
  int port() const override { return port_; }
  int rank() const override { return options_.rank; }
  const std::string& run_id() const override { return options_.run_id; }
  std::chrono::milliseconds timeout() const override { return options_.timeout; }
  void set_timeout(std::chrono::milliseconds timeout) override { options_.timeout = timeout; }
  // Legacy or Validated: what the server turned out to speak.
  TorchStoreProtocol protocol() const { return options_.protocol; }

 private:
  struct Request;
  void connect(TorchStoreProtocol protocol);
  bool probe_legacy();
  // Sends one whole request (a partial one would stall a legacy server, which reads a
  // request to its end before serving anyone else).
  void send(const Request& request, const char* op, const std::string& what);
  // Reads exactly `size` bytes by `deadline`, else fails (closing the connection).
  void receive(void* data, std::size_t size, std::chrono::steady_clock::time_point deadline,
               std::chrono::milliseconds timeout, const char* op, const std::string& what);
  void wait_locked(const std::vector<std::string>& keys, std::chrono::milliseconds timeout,
                   const char* op, const std::string& what);
  uint8_t code(uint8_t legacy) const;
  std::string wire_key(const std::string& key) const;
  void check_usable(const char* op) const;
  [[noreturn]] void fail(const std::string& text);
  std::string where() const;

  std::string host_;
  int port_;
  TorchStoreClientOptions options_;
  std::unique_ptr<net::Socket> socket_;
  std::mutex mutex_;  // one request at a time on the connection
  std::string broken_;
};

}  // namespace mg::parallel
