// The server side of TCPStore (tcp_store.h): one thread serving one job's ranks. A
// TCPStore made with is_server owns one. Internal to parallel/c10d/store.
#pragma once

#include <memory>
#include <string>
#include <thread>

#include <minigrad/parallel/c10d/store/tcp_store_options.h>

namespace mg::parallel {

class TCPStoreServer {
 public:
  // Binds host:port (port 0: a free one) and starts serving the job options.run_id under
  // the bounds of `options`. An mg::Error when the port cannot be bound.
  TCPStoreServer(const std::string& host, int port, const TCPStoreOptions& options);
  // Stops serving; the clients' connections close.
  ~TCPStoreServer();
  TCPStoreServer(const TCPStoreServer&) = delete;
  TCPStoreServer& operator=(const TCPStoreServer&) = delete;

  int port() const { return port_; }

  class Loop;  // tcp_store_server.cpp

 private:
  std::unique_ptr<Loop> loop_;
  int port_ = 0;
  std::thread thread_;
};

}  // namespace mg::parallel
