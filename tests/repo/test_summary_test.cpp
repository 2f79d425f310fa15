// scripts/test-summary.sh, the closing summary of `make test`, on logs written here in
// CTest's formats: the skipped tests grouped by the reason each printed, with the count
// of each layer.
#include "catch_compat.h"

#include <filesystem>
#include <fstream>
#include <string>

#include "shell_run.h"
#include "temp_dir.h"

using mg::testing::run_shell;
using mg::testing::TempDir;

namespace {

void write(const std::string& path, const std::string& text) {
  std::ofstream(path) << text;
}

// One test's entry in CTest's Testing/Temporary/LastTest.log.
std::string last_test_entry(int index, const std::string& name, const std::string& output) {
  return std::to_string(index) + "/4 Testing: " + name + "\n" + std::to_string(index) +
         "/4 Test: " + name + "\nCommand: \"/b/bin/test_x\" \"...\"\nDirectory: /b/tests\n\"" +
         name + "\" start time: Dec 01 21:02 UTC\nOutput:\n" + std::string(58, '-') + "\n" +
         output + "<end of output>\nTest time =   0.04 sec\n" + std::string(58, '-') +
         "\nTest Passed.\n\n";
}

}  // namespace

TEST_CASE("test-summary.sh: each stage's count, and the skipped tests grouped by reason") {
  TempDir dir;
  const std::string build = dir / "build";
  std::filesystem::create_directories(build + "/Testing/Temporary");
  write(build + "/ctest-output.log",
        "75% tests passed, 0 tests failed out of 4\n\n"
        "The following tests did not run:\n"
        "\t 2 - cuda:addmm matches the CPU (Skipped)\n"
        "\t 3 - cuda:streams order work (Skipped)\n"
        "\t 4 - samples:launcher runs two ranks (Skipped)\n");
  write(build + "/Testing/Temporary/LastTest.log",
        last_test_entry(1, "core:shapes", "All tests passed\n") +
            last_test_entry(2, "cuda:addmm matches the CPU",
                            "no CUDA device available: skipping GPU tests\n") +
            last_test_entry(3, "cuda:streams order work",
                            "no CUDA device available: skipping GPU tests\n") +
            last_test_entry(4, "samples:launcher runs two ranks",
                            "/b/bin/minigrad-run was not built (MINIGRAD_BUILD_SAMPLES=OFF): "
                            "skipping\nmore\n"));
  const auto run = run_shell(std::string(MINIGRAD_SOURCE_DIR) + "/scripts/test-summary.sh " +
                             "'main suite:" + build + "' 'sanitizers:" + (dir / "none") + "'");
  INFO(run.output);
  REQUIRE(run.exit_code == 0);
  CHECK_THAT(run.output,
             MG_CONTAINS("   main suite  75% tests passed, 0 tests failed out of 4; 3 skipped:\n"));
  CHECK_THAT(run.output,
             MG_CONTAINS("                 2: no CUDA device available: skipping GPU tests "
                         "(cuda 2)\n"));
  CHECK_THAT(run.output,
             MG_CONTAINS("                 1: /b/bin/minigrad-run was not built "
                         "(MINIGRAD_BUILD_SAMPLES=OFF): skipping (samples 1)\n"));
  CHECK(run.output.find("more") == std::string::npos);  // the first line is the reason
  CHECK_THAT(run.output, MG_CONTAINS("   sanitizers  no results (" + (dir / "none") +
                                     "/ctest-output.log is missing)\n"));
}
