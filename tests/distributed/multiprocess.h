// Runs a test body in several forked processes, one per rank, on loopback, and brings
// back what each rank reported. Rank 0 serves the TCPStore on a free port (bound to port
// 0) and passes the port to the others through a pipe, so tests never collide on ports.
//
// Inside a rank, Catch2 assertions would be recorded in the child's copy of the test
// state and lost: a body throws (MG_CHECK) or reports values, and the parent asserts.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <minigrad/core/tensor.h>
#include <minigrad/parallel/c10d/process_group.h>
#include <minigrad/parallel/c10d/store/tcp_store.h>

namespace mg::test {

class RankContext {
 public:
  int rank = 0;
  int world_size = 1;
  std::shared_ptr<parallel::TCPStore> store;

  // A Gloo group over the store (timeout: how long a collective may wait for a peer).
  std::shared_ptr<parallel::ProcessGroup> gloo(std::chrono::milliseconds timeout =
                                                   std::chrono::seconds(30)) const;

  // Returns once every rank is running (through the store): a group with a short timeout
  // joined after this does not take a slow start on a loaded machine for a missing peer.
  void start_together() const;

  // Sends named values back to the parent (values of tensors are flattened to floats).
  void report(const std::string& name, const std::vector<float>& values);
  void report(const std::string& name, const Tensor& tensor);
  void report(const std::string& name, const std::string& text);

  int result_fd = -1;  // the pipe to the parent
};

struct RankResult {
  int rank = 0;
  int exit_code = -1;       // -1 when killed by a signal
  int signal = 0;           // the signal that ended it, or 0
  std::string error;        // what the body threw, if anything
  std::vector<std::pair<std::string, std::string>> reports;  // name -> encoded value

  std::vector<float> floats(const std::string& name) const;
  std::string text(const std::string& name) const;
  bool ok() const { return exit_code == 0; }
};

// Forks `world_size` ranks running `body`; waits for all (at most `hang_guard`, after
// which they are killed and reported as hung). A body that throws exits with code 1.
std::vector<RankResult> run_ranks(int world_size, const std::function<void(RankContext&)>& body,
                                  std::chrono::seconds hang_guard = std::chrono::seconds(120));

// "rank 1: exit 1, error: ..." for every rank, for failure messages.
std::string describe(const std::vector<RankResult>& results);

}  // namespace mg::test
