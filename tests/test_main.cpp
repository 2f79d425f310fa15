// The one main() of every test binary. GPU test binaries (test_cuda, and tests tagged
// [gpu]) are skipped with exit code 77 when no GPU is present, which CTest reports as
// "Skipped" rather than "Passed".
#define CATCH_CONFIG_RUNNER
#include "catch_compat.h"

#include <cstring>
#include <string>

#include <fmt/core.h>

#include <minigrad/core/backend.h>

int main(int argc, char* argv[]) {
  bool listing = false;
  bool wants_gpu = std::strstr(argv[0], "test_cuda") != nullptr;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg.rfind("--list", 0) == 0) listing = true;
    if (arg.find("[gpu]") != std::string::npos) wants_gpu = true;
  }
  if (wants_gpu && !listing && mg::backend(mg::DeviceType::CUDA).device_count() == 0) {
    fmt::print("no CUDA device available: skipping GPU tests\n");
    return 77;
  }
  return Catch::Session().run(argc, argv);
}
