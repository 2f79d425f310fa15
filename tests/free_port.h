// free_port(): a loopback port nothing listens on now, for a job the test starts with
// MASTER_PORT (the kernel picks it: bound to port 0, then closed). A port derived from the
// pid could be another suite's, running beside this one.
#pragma once

#include <minigrad/parallel/c10d/store/socket.h>

namespace mg::testing {

inline int free_port() {
  parallel::net::Socket probe = parallel::net::listen_on("127.0.0.1", 0);
  return parallel::net::local_port(probe);
}

}  // namespace mg::testing
