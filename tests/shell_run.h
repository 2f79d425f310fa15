// Running a command line from a test: its exit code and its output (stdout and stderr
// together), and skipping a test whose program was not built. Used by the tests of the
// minigrad-run launcher and of the multi-process NCCL jobs.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <string>

#include <sys/stat.h>
#include <sys/wait.h>

#include <minigrad/core/error.h>

namespace mg::testing {

struct Run {
  int exit_code = -1;
  std::string output;  // stdout and stderr together
};

inline Run run_shell(const std::string& command) {
  Run run;
  FILE* pipe = ::popen(("exec 2>&1; " + command).c_str(), "r");
  MG_CHECK(pipe != nullptr, "popen failed for: {}", command);
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), pipe)) > 0) run.output.append(buf, n);
  const int status = ::pclose(pipe);
  run.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return run;
}

// Samples are optional in a build: a test of one that was not built skips (exit code 77,
// CTest's SKIP_RETURN_CODE for these tests) and says why.
inline void require_program(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    std::printf("%s was not built (MINIGRAD_BUILD_SAMPLES=OFF): skipping\n", path.c_str());
    std::exit(77);
  }
}

}  // namespace mg::testing
