// Store: the key-value store through which the ranks of a job meet, as c10d::Store.
//
// Two implementations: TCPStore (tcp_store.h; minigrad's own, rank 0 serves it, the
// default and what minigrad-run uses) and TorchStoreClient (torch_store_client.h; a
// client of the store torchrun's agent serves, in PyTorch's wire protocol). The process
// groups and the rendezvous take any Store.
//   set(key, value)        stores bytes under key (replacing them)
//   get(key)               waits until key is set, then returns its bytes
//   add(key, delta)        atomically adds to an integer counter, returns the new value
//   wait(keys)             waits until every key is set
//   check(keys)            whether every key is set, without waiting
// Every wait is bounded by a timeout; running out throws an mg::Error naming the key(s),
// the rank and the store's address.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace mg::parallel {

class Store {
 public:
  virtual ~Store() = default;

  // Values are byte strings (std::string used as a byte buffer; any bytes are fine).
  virtual void set(const std::string& key, const std::string& value) = 0;
  virtual std::string get(const std::string& key, std::chrono::milliseconds timeout) = 0;
  std::string get(const std::string& key) { return get(key, timeout()); }
  virtual int64_t add(const std::string& key, int64_t delta) = 0;
  virtual bool check(const std::vector<std::string>& keys) = 0;
  virtual void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) = 0;
  void wait(const std::vector<std::string>& keys) { wait(keys, timeout()); }

  // A second connection to the same store, as this rank of this job, connecting for at
  // most `timeout` (a waiter on it does not hold up users of this one).
  virtual std::unique_ptr<Store> connect_again(std::chrono::milliseconds timeout) const = 0;

  virtual const std::string& host() const = 0;
  virtual int port() const = 0;
  virtual int rank() const = 0;
  virtual const std::string& run_id() const = 0;
  virtual std::chrono::milliseconds timeout() const = 0;
  virtual void set_timeout(std::chrono::milliseconds timeout) = 0;
};

}  // namespace mg::parallel
