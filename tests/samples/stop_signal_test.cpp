// samples/support/stop_signal: a second Ctrl-C in the middle of a save ends the process
// at once, as a second Ctrl-C should, and leaves no temporary file behind.
#include "catch_compat.h"

#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include <minigrad/nn/layers.h>
#include <minigrad/nn/serialize.h>

#include "../../samples/support/stop_signal.h"
#include "temp_dir.h"

namespace fs = std::filesystem;
using mg::testing::TempDir;

TEST_CASE(
    "stop signal: a second SIGINT during a save kills the process and removes its temp file") {
  TempDir dir;
  const std::string path = dir / "ck.safetensors";
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    mg::nn::Linear model(200, 200);  // 160 KB of weights
    mg::samples::install_stop_handlers();
    ::raise(SIGINT);  // the first Ctrl-C: recorded, the run would now stop and save
    // The second arrives in the middle of the save's write: the write runs into a file
    // size limit, and the handler of that limit's signal sends it.
    struct sigaction action {};
    action.sa_handler = [](int) { ::raise(SIGINT); };
    sigemptyset(&action.sa_mask);
    ::sigaction(SIGXFSZ, &action, nullptr);
    struct rlimit limit {};
    ::getrlimit(RLIMIT_FSIZE, &limit);
    limit.rlim_cur = 4096;
    ::setrlimit(RLIMIT_FSIZE, &limit);
    try {
      mg::nn::save(model, path);
    } catch (...) {
    }
    ::_exit(1);  // the second SIGINT did not end the process
  }
  int status = 0;
  REQUIRE(::waitpid(child, &status, 0) == child);
  CHECK(WIFSIGNALED(status));
  CHECK(WTERMSIG(status) == SIGINT);
  std::vector<std::string> left;
  for (const auto& e : fs::directory_iterator(dir.path())) left.push_back(e.path().filename());
  CHECK(left.empty());
}
