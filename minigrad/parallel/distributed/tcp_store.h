// TCPStore: a small key-value store over TCP through which the ranks of a job meet.
//
// Rank 0 serves it (a background thread) on MASTER_ADDR:MASTER_PORT; every rank,
// rank 0 included, is a client. The process groups exchange what they need through it:
// the NCCL unique id, the Gloo pair addresses, barrier counters. As in PyTorch's
// c10d::TCPStore:
//   set(key, value)        stores bytes under key (replacing them)
//   get(key)               waits until key is set, then returns its bytes
//   add(key, delta)        atomically adds to an integer counter, returns the new value
//   wait(keys)             waits until every key is set
//   check(keys)            whether every key is set, without waiting
// Every wait is bounded by a timeout; running out throws an mg::Error naming the key(s),
// the rank, the store's address and the time waited, so a rank that never arrives makes
// the others fail instead of hang.
//
// The protocol is length-prefixed binary: a message is one command byte, a u32 count of
// arguments, then each argument as a u32 length and its bytes (little-endian). A reply
// has the same form. get and wait are answered by the server only once their keys exist,
// so a waiting client costs nothing but an open connection.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace mg::parallel {

namespace net {
class Socket;
}

struct TCPStoreOptions {
  // Serve the store from this process (rank 0). With port 0 the server binds a free
  // port; read it back with TCPStore::port().
  bool is_server = false;
  // Default bound of connect, get and wait.
  std::chrono::milliseconds timeout = std::chrono::minutes(5);
  // This process's rank, for error messages (-1: unknown).
  int rank = -1;
};

class TCPStore {
 public:
  TCPStore(std::string host, int port, TCPStoreOptions options = {});
  ~TCPStore();
  TCPStore(const TCPStore&) = delete;
  TCPStore& operator=(const TCPStore&) = delete;

  // Values are byte strings (std::string used as a byte buffer; any bytes are fine).
  void set(const std::string& key, const std::string& value);
  std::string get(const std::string& key);
  std::string get(const std::string& key, std::chrono::milliseconds timeout);
  int64_t add(const std::string& key, int64_t delta);
  bool check(const std::vector<std::string>& keys);
  void wait(const std::vector<std::string>& keys);
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout);

  const std::string& host() const { return host_; }
  // The server's port (the one it bound when asked for port 0).
  int port() const { return port_; }
  int rank() const { return options_.rank; }
  std::chrono::milliseconds timeout() const { return options_.timeout; }
  void set_timeout(std::chrono::milliseconds timeout) { options_.timeout = timeout; }
  bool is_server() const { return server_ != nullptr; }

  class Server;  // tcp_store.cpp

 private:
  // Sends one request and reads its reply, waiting at most `timeout` for it.
  std::vector<std::string> request(uint8_t command, const std::vector<std::string>& args,
                                   std::chrono::milliseconds timeout, const char* op,
                                   const std::string& what);
  std::string where() const;  // "rank 1, store at 127.0.0.1:29500"

  std::string host_;
  int port_;
  TCPStoreOptions options_;
  std::unique_ptr<Server> server_;
  std::unique_ptr<net::Socket> socket_;
  std::mutex mutex_;  // one request at a time on the connection
  // After a timed-out request the server may still answer it later; the connection
  // would then be out of step, so it is closed and every later call fails clearly.
  std::string broken_;
};

}  // namespace mg::parallel
