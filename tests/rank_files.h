// Per-rank result files of a multi-process test. A stream that several processes write at
// once (mpirun's or torchrun's output, a shell's background jobs sharing a pipe)
// interleaves their bytes: one rank's line can be cut by another's, and what a test parses
// there is not a result. So a rank writes its results into a file of its own,
// <dir>/rank<R>.txt, in the directory the test names in MINIGRAD_TEST_RANK_DIR, and the
// test reads each rank's file.
//
// (minigrad-run's own output is one writer's: the launcher passes each rank's line on
// whole with its "[rank R] " prefix, so a test may look for one rank's short line there;
// results still come from files.)
#pragma once

#include <cstdlib>
#include <fstream>
#include <iterator>
#include <string>

#include <fmt/format.h>

#include <minigrad/core/error.h>

namespace mg::testing {

inline constexpr const char* kRankDirVariable = "MINIGRAD_TEST_RANK_DIR";

// In a rank: appends `line` and a newline to <MINIGRAD_TEST_RANK_DIR>/rank<rank>.txt; does
// nothing where the test named no directory (the worker run by hand).
inline void write_rank_line(int rank, const std::string& line) {
  const char* dir = std::getenv(kRankDirVariable);
  if (dir == nullptr || *dir == '\0') return;
  const std::string path = fmt::format("{}/rank{}.txt", dir, rank);
  std::ofstream out(path, std::ios::app | std::ios::binary);
  out << line << '\n';
  out.close();
  MG_CHECK(!out.fail(), "write_rank_line: cannot write '{}'", path);
}

// In the test: what `rank` wrote into `dir` ("" when it wrote nothing).
inline std::string read_rank_file(const std::string& dir, int rank) {
  std::ifstream in(fmt::format("{}/rank{}.txt", dir, rank), std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// "MINIGRAD_TEST_RANK_DIR=<dir> ": the assignment a command line puts before the job.
inline std::string rank_dir_assignment(const std::string& dir) {
  return fmt::format("{}={} ", kRankDirVariable, dir);
}

}  // namespace mg::testing
