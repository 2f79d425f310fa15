// The options of a TCPStore, its client and its server alike (tcp_store.h,
// tcp_store_server.h): who serves, how long a wait may take, the job's id, and the bounds
// that keep one client from exhausting the server.
#pragma once

#include <chrono>
#include <cstddef>
#include <string>

namespace mg::parallel {

struct TCPStoreOptions {
  // Serve the store from this process (rank 0). With port 0 the server binds a free
  // port; read it back with TCPStore::port().
  bool is_server = false;
  // Default bound of connect, get and wait.
  std::chrono::milliseconds timeout = std::chrono::minutes(5);
  // This process's rank, for error messages (-1: unknown).
  int rank = -1;
  // The job's id; the server and its clients must agree (see check_run_id for the form).
  // make_store reads it from MINIGRAD_RUN_ID or TORCHELASTIC_RUN_ID. A further connection
  // to a store (another TCPStore to its host and port) takes store.run_id().
  std::string run_id = "default";

  // Bounds. One message (a request, or a reply such as a get's value), header included;
  // the client checks its own requests against it too, so a value too large for the
  // store is an error naming its key.
  std::size_t max_message_bytes = std::size_t{64} << 20;
  // Server only. Replies queued for one client that does not read them: past this, the
  // client is dropped (one reply always fits, whatever its size).
  std::size_t max_output_bytes = std::size_t{64} << 20;
  // Server only. All clients' partial requests and unsent replies together.
  std::size_t max_buffered_bytes = std::size_t{512} << 20;
  // Server only. The keys and values the store holds; a set past it is refused.
  std::size_t max_data_bytes = std::size_t{1} << 30;
};

}  // namespace mg::parallel
