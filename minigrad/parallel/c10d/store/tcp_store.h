// TCPStore: a small key-value store over TCP through which the ranks of a job meet.
//
// Rank 0 serves it (a background thread, tcp_store_server.cpp) on MASTER_ADDR:MASTER_PORT;
// every rank, rank 0 included, is a client. The process groups exchange what they need
// through it: the NCCL unique id, the Gloo pair addresses, barrier counters. As in
// PyTorch's c10d::TCPStore:
//   set(key, value)        stores bytes under key (replacing them)
//   get(key)               waits until key is set, then returns its bytes
//   add(key, delta)        atomically adds to an integer counter, returns the new value
//                          (an overflow of int64 is an error naming the key)
//   wait(keys)             waits until every key is set
//   check(keys)            whether every key is set, without waiting
// Every wait is bounded by a timeout; running out throws an mg::Error naming the key(s),
// the rank, the store's address and the time waited, so a rank that never arrives makes
// the others fail instead of hang.
//
// Each job has an id (run_id: torchrun's rendezvous id; minigrad-run makes one). A client
// opens its connection with a handshake that carries it, and every key it sends is under
// "<run_id>/", so a rank of another job that reaches this port (two jobs given one
// MASTER_PORT) is refused with an error naming both ids, instead of mixing its keys into
// this job's rendezvous.
//
// The server never lets one client stall another (see tcp_store_server.cpp): sockets are
// non-blocking, waits are parked, and every buffer is bounded (the limits below); a client
// over a limit is dropped with a line on the server's stderr saying why.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <minigrad/parallel/c10d/store/run_id.h>  // check_run_id, which the store applies
#include <minigrad/parallel/c10d/store/store.h>
#include <minigrad/parallel/c10d/store/tcp_store_options.h>

namespace mg::parallel {

namespace net {
class Socket;
}

class TCPStoreServer;

class TCPStore : public Store {
 public:
  TCPStore(std::string host, int port, TCPStoreOptions options = {});
  ~TCPStore() override;
  TCPStore(const TCPStore&) = delete;
  TCPStore& operator=(const TCPStore&) = delete;

  // Values are byte strings (std::string used as a byte buffer; any bytes are fine).
  using Store::get;
  using Store::wait;
  void set(const std::string& key, const std::string& value) override;
  std::string get(const std::string& key, std::chrono::milliseconds timeout) override;
  int64_t add(const std::string& key, int64_t delta) override;
  bool check(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override;
  // A client connection to this store's server, as this rank of this job.
  std::unique_ptr<Store> connect_again(std::chrono::milliseconds timeout) const override;

  const std::string& host() const override { return host_; }
  // The server's port (the one it bound when asked for port 0).
  int port() const override { return port_; }
  int rank() const override { return options_.rank; }
  const std::string& run_id() const override { return options_.run_id; }
  std::chrono::milliseconds timeout() const override { return options_.timeout; }
  void set_timeout(std::chrono::milliseconds timeout) override { options_.timeout = timeout; }
  bool is_server() const { return server_ != nullptr; }

 private:
  // Sends one request and reads its reply, waiting at most `timeout` for it: the reply's
  // code, its arguments in `reply`. `op` and `what` name it in errors.
  uint8_t exchange(uint8_t command, const std::vector<std::string>& args,
                   std::chrono::milliseconds timeout, const char* op, const std::string& what,
                   std::vector<std::string>& reply);
  // exchange(), with an error reply thrown as an mg::Error; the reply's arguments.
  std::vector<std::string> request(uint8_t command, const std::vector<std::string>& args,
                                   std::chrono::milliseconds timeout, const char* op,
                                   const std::string& what);
  void handshake();
  std::string key_of(const std::string& key) const { return options_.run_id + "/" + key; }
  std::string where() const;  // "rank 1, job 'x', store at 127.0.0.1:29500"

  std::string host_;
  int port_;
  TCPStoreOptions options_;
  std::unique_ptr<TCPStoreServer> server_;
  std::unique_ptr<net::Socket> socket_;
  std::mutex mutex_;  // one request at a time on the connection
  // After a timed-out request the server may still answer it later; the connection
  // would then be out of step, so it is closed and every later call fails clearly.
  std::string broken_;
};

}  // namespace mg::parallel
