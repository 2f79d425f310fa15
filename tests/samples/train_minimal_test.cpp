// build/bin/train_minimal run as a user runs it, briefly, on a small synthetic dataset
// (the real one reaches about 87% test accuracy in its default 5 epochs).
#include "catch_compat.h"

#include <cstdio>
#include <string>

#include <minigrad/cuda/cuda.h>

#include "data/synthetic_fashion_mnist.h"
#include "samples/run_program.h"
#include "temp_dir.h"

using mg::testing::run_program;
using mg::testing::TempDir;

namespace {
const std::string kProgram = mg::testing::program_path("train_minimal");
}  // namespace

TEST_CASE("train_minimal: trains with DataParallel over every device and prints the test accuracy") {
  TempDir dir;
  mg::testing::write_synthetic_fashion_mnist(dir.path(), 640, 100, true);
  const auto run = run_program(kProgram + " " + dir.path() + " 2");
  INFO(run.output);
  REQUIRE(run.exit_code == 0);
  const int gpus = mg::cuda::device_count();
  const int devices = gpus > 0 ? gpus : 2;  // two CPU replicas without a GPU
  REQUIRE_THAT(run.output, MG_CONTAINS("train_minimal: 640 training images, DataParallel over " +
                                       std::to_string(devices) + " device" +
                                       (devices == 1 ? "" : "s") + "\n"));
  REQUIRE_THAT(run.output, MG_CONTAINS("epoch 1/2: train loss ") &&
                               MG_CONTAINS("epoch 2/2: train loss "));
  const size_t at = run.output.find("test accuracy ");
  REQUIRE(at != std::string::npos);
  double accuracy = 0;
  REQUIRE(std::sscanf(run.output.c_str() + at, "test accuracy %lf%%", &accuracy) == 1);
  REQUIRE(accuracy > 50.0);  // the synthetic classes are easy; chance is 10%
}

TEST_CASE("train_minimal: a bad command line is refused with the usage and exit code 2") {
  for (const char* args : {" /nowhere 0", " /nowhere x", " /nowhere 3x", " /nowhere -1", " /nowhere 1 extra"}) {
    const auto run = run_program(kProgram + args);
    INFO(args << "\n" << run.output);
    REQUIRE(run.exit_code == 2);
    REQUIRE_THAT(run.output, MG_CONTAINS("train_minimal: error: usage: train_minimal [data-dir] "
                                         "[epochs > 0]"));
  }
  TempDir dir;
  const auto missing = run_program(kProgram + " " + (dir / "nowhere") + " 1");
  REQUIRE(missing.exit_code == 1);
  REQUIRE_THAT(missing.output, MG_CONTAINS("train_minimal: error: FashionMNIST: cannot find "
                                           "train-images-idx3-ubyte"));
}
