// Runs a program built in this tree as a user would, and captures what it prints.
#pragma once

#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <stdexcept>
#include <string>

namespace mg::testing {

struct ProgramResult {
  int exit_code = -1;
  std::string output;  // stdout and stderr together
};

// build/bin/<name>
inline std::string program_path(const std::string& name) {
  return std::string(MINIGRAD_BINARY_DIR) + "/bin/" + name;
}

// Runs `command_line` through the shell (stderr joined to stdout, stdin empty).
inline ProgramResult run_program(const std::string& command_line) {
  ProgramResult result;
  std::FILE* pipe = ::popen((command_line + " 2>&1 </dev/null").c_str(), "r");
  if (pipe == nullptr) throw std::runtime_error("popen failed: " + command_line);
  std::array<char, 4096> buffer{};
  size_t got = 0;
  while ((got = std::fread(buffer.data(), 1, buffer.size(), pipe)) > 0)
    result.output.append(buffer.data(), got);
  const int status = ::pclose(pipe);
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return result;
}

}  // namespace mg::testing
