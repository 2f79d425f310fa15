// build/bin/train_fashion_mnist and the files it is given, run as a user runs it: output
// paths checked before anything trains, targets that are not regular files left alone,
// a --resume of a FIFO refused at once, temporary files of an unfinished save named, a
// save cut short by a file size limit cleaned up, and damaged checkpoints named.
#include "catch_compat.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <string>
#include <vector>

#include <minigrad/nn/serialize.h>

#include "data/synthetic_fashion_mnist.h"
#include "samples/run_program.h"
#include "special_files.h"
#include "temp_dir.h"

namespace fs = std::filesystem;
using mg::testing::run_program;
using mg::testing::TempDir;

namespace {

const std::string kProgram = mg::testing::program_path("train_fashion_mnist");

// 300 training images in batches of 50: 6 steps per epoch.
std::string small_run(const std::string& data_dir, int epochs = 1) {
  return kProgram + " --data-dir " + data_dir + " --hidden 32 --batch-size 50 --epochs " +
         std::to_string(epochs);
}

// The names in `dir` that contain ".tmp.": temporary files left behind.
std::vector<std::string> temp_files(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    if (name.find(".tmp.") != std::string::npos) names.push_back(name);
  }
  return names;
}

}  // namespace

TEST_CASE(
    "train_fashion_mnist: an output path that cannot be written stops the run before "
    "training, naming the flag") {
  TempDir dir;
  mg::testing::write_synthetic_fashion_mnist(dir.path(), 300, 100, false);
  fs::create_directory(dir / "plots");
  std::ofstream(dir / "notes.txt") << "a file, not a directory";
  const std::string fifo = dir / "fifo";
  mg::testing::make_fifo(fifo);
  const std::string to_null = dir / "to-null";
  fs::create_symlink("/dev/null", to_null);

  const struct {
    std::string flags, message;
  } cases[] = {
      {"--save " + (dir / "missing/ck.safetensors"),
       "--save: cannot write '" + (dir / "missing/ck.safetensors") + "': the directory '" +
           (dir / "missing") + "' does not exist"},
      {"--metrics " + (dir / "notes.txt/m.csv"),
       "--metrics: cannot write '" + (dir / "notes.txt/m.csv") + "': '" + (dir / "notes.txt") +
           "' is a regular file, not a directory"},
      {"--plot " + (dir / "plots"),
       "--plot: cannot write '" + (dir / "plots") + "': it is a directory, not a regular file"},
      {"--save " + fifo,
       "--save: cannot write '" + fifo + "': it is a named pipe (FIFO), not a regular file"},
      {"--metrics " + to_null, "--metrics: cannot write '" + to_null +
                                   "': it is a symbolic link to '/dev/null', which "
                                   "is a character device, not a regular file"},
  };
  for (const auto& c : cases) {
    const auto run = run_program(small_run(dir.path()) + " " + c.flags);
    INFO(c.flags << "\n" << run.output);
    CHECK(run.exit_code == 2);  // a bad flag value
    CHECK_THAT(run.output, MG_CONTAINS("train_fashion_mnist: error: " + c.message));
    CHECK(run.output.find("train_loss") == std::string::npos);  // nothing trained
  }
  CHECK(mg::testing::is_fifo(fifo));
  CHECK(fs::is_symlink(fs::symlink_status(to_null)));
  CHECK(temp_files(dir.path()).empty());
}

TEST_CASE("train_fashion_mnist: --resume of a FIFO is refused at once, naming the flag") {
  TempDir dir;
  mg::testing::write_synthetic_fashion_mnist(dir.path(), 300, 100, false);
  const std::string fifo = dir / "ck.safetensors";
  mg::testing::make_fifo(fifo);
  // timeout(1): a program that blocks in open() is killed (exit 124) instead of hanging.
  const auto run = run_program("timeout 20 " + small_run(dir.path()) + " --resume " + fifo);
  INFO(run.output);
  CHECK(run.exit_code == 2);
  CHECK_THAT(run.output, MG_CONTAINS("train_fashion_mnist: error: --resume: '" + fifo +
                                     "' is not a regular file but a named pipe (FIFO)"));
}

TEST_CASE("train_fashion_mnist: temporary files of an unfinished save are named at the start") {
  TempDir dir;
  mg::testing::write_synthetic_fashion_mnist(dir.path(), 300, 100, false);
  const std::string ck = dir / "ck.safetensors";
  const std::string stale = ck + ".tmp.999999999";  // a pid that no process has
  const std::string stale_csv = dir / "m.csv.tmp.999999998.00beef";
  std::ofstream(stale) << "half a checkpoint";
  std::ofstream(stale_csv) << "half a csv";
  const auto run =
      run_program(small_run(dir.path()) + " --save " + ck + " --metrics " + (dir / "m.csv"));
  INFO(run.output);
  REQUIRE(run.exit_code == 0);
  CHECK_THAT(run.output, MG_CONTAINS("train_fashion_mnist: warning: " + stale +
                                     " is the temporary file of a "
                                     "write to " +
                                     ck +
                                     " that never finished (process 999999999 is not "
                                     "running); nothing uses it, remove it"));
  CHECK_THAT(run.output, MG_CONTAINS("train_fashion_mnist: warning: " + stale_csv));
  // Named, not removed: another machine sharing the directory may still be writing it.
  CHECK(fs::exists(stale));
  CHECK(fs::exists(stale_csv));
  CHECK(fs::file_size(ck) > 1000);
}

TEST_CASE(
    "train_fashion_mnist: a save cut short by a file size limit is an error and leaves "
    "no temporary file") {
  TempDir dir;
  mg::testing::write_synthetic_fashion_mnist(dir.path(), 300, 100, false);
  const std::string ck = dir / "ck.safetensors";
  // ulimit -f 64: files of at most 64 KiB. The checkpoint (about 200 KB) runs into it;
  // without a handler the kernel's SIGXFSZ would kill the process in the middle of the
  // write and leave the temporary file.
  const auto run =
      run_program("sh -c 'ulimit -f 64 && exec " + small_run(dir.path()) + " --save " + ck + "'");
  INFO(run.output);
  CHECK(run.exit_code == 1);
  CHECK_THAT(run.output, MG_CONTAINS("save_tensors: cannot write '" + ck +
                                     "': writing the "
                                     "temporary file '" +
                                     ck + ".tmp.") &&
                             MG_CONTAINS("failed: File too large ('" + ck + "' was not changed)"));
  CHECK(temp_files(dir.path()).empty());
  CHECK_FALSE(fs::exists(ck));
}

TEST_CASE(
    "train_fashion_mnist: --resume of a damaged checkpoint names the key, the tensor and "
    "the file") {
  TempDir dir;
  mg::testing::write_synthetic_fashion_mnist(dir.path(), 300, 100, false);
  const std::string ck = dir / "ck.safetensors";
  const auto first = run_program(small_run(dir.path()) + " --save " + ck);
  INFO(first.output);
  REQUIRE(first.exit_code == 0);
  const mg::nn::Checkpoint good = mg::nn::load_tensors(ck);

  const struct {
    const char* key;
    const char* value;
    const char* fault;
  } bad_metadata[] = {
      {"epoch", "abc", "'abc', not a non-negative integer"},
      {"epoch", "-1", "'-1', not a non-negative integer"},
      {"epoch_batches", "2x", "'2x', not a non-negative integer"},
      {"generator_offset", "99999999999999999999999",
       "'99999999999999999999999', larger than "
       "18446744073709551615"},
  };
  for (const auto& c : bad_metadata) {
    mg::nn::Checkpoint damaged = good;
    damaged.metadata[c.key] = c.value;
    const std::string path = dir / "damaged.safetensors";
    mg::nn::save_tensors(damaged, path);
    const auto run = run_program(small_run(dir.path(), 2) + " --resume " + path);
    INFO(c.key << "=" << c.value << "\n" << run.output);
    CHECK(run.exit_code == 1);
    CHECK_THAT(run.output, MG_CONTAINS("train_fashion_mnist: error: --resume " + path +
                                       ": metadata '" + c.key + "' is " + c.fault));
  }

  // The weights of a run that diverged: refused, naming the tensor.
  mg::nn::Checkpoint diverged = good;
  diverged.tensors.at("model.0.weight").data<float>()[5] = std::numeric_limits<float>::quiet_NaN();
  const std::string path = dir / "diverged.safetensors";
  mg::nn::save_tensors(diverged, path);
  const auto run = run_program(small_run(dir.path(), 2) + " --resume " + path);
  INFO(run.output);
  CHECK(run.exit_code == 1);
  CHECK_THAT(run.output, MG_CONTAINS("'" + path +
                                     "' holds non-finite values (NaN or infinity) in "
                                     "1 tensor") &&
                             MG_CONTAINS("'model.0.weight' (shape [32, 784]): 1 of 25088 values, "
                                         "the first nan at index 5"));
  CHECK(run.output.find("train_loss") == std::string::npos);
}

#if MINIGRAD_WITH_GLOO
TEST_CASE(
    "train_fashion_mnist --distributed: an unusable --save stops every rank before "
    "training") {
  TempDir dir;
  mg::testing::write_synthetic_fashion_mnist(dir.path(), 300, 100, false);
  const std::string ck = dir / "missing/ck.safetensors";
  // Rank 0 alone writes files, so it alone checks --save; rank 1 learns of the fault from
  // it (unless minigrad-run, seeing rank 0 fail, stops it first) instead of waiting in the
  // first all-reduce for a rank that has stopped.
  const auto run =
      run_program("timeout 60 " + mg::testing::program_path("minigrad-run") +
                  " --nproc-per-node 2 " + small_run(dir.path()) + " --distributed --save " + ck);
  INFO(run.output);
  CHECK(run.exit_code == 2);
  CHECK_THAT(run.output,
             MG_CONTAINS("[rank 0] train_fashion_mnist: error: --save: cannot write '" + ck +
                         "': the directory '" + (dir / "missing") + "' does not exist"));
  const bool rank_1_stopped =
      run.output.find(
          "[rank 1] train_fashion_mnist: error: rank 1: the files given to another "
          "rank cannot be used") != std::string::npos ||
      run.output.find("stopping the other 1 process") != std::string::npos;
  CHECK(rank_1_stopped);
  CHECK(run.output.find("train_loss") == std::string::npos);

  // Ranks started by hand, which no launcher stops: rank 1 stops by itself, told by rank 0.
  const std::string env =
      "MASTER_ADDR=127.0.0.1 MASTER_PORT=" + std::to_string(20000 + ::getpid() % 20000) +
      " WORLD_SIZE=2 LOCAL_RANK=0";
  const std::string rank_1_log = dir / "rank1.log";
  const auto by_hand =
      run_program("sh -c '" + env + " RANK=1 timeout 60 " + small_run(dir.path()) +
                  " --distributed > " + rank_1_log + " 2>&1 & " + env + " RANK=0 timeout 60 " +
                  small_run(dir.path()) + " --distributed --save " + ck + "; wait'");
  INFO(by_hand.output);
  std::ifstream log(rank_1_log);
  const std::string rank_1(std::istreambuf_iterator<char>(log), {});
  INFO(rank_1);
  CHECK_THAT(by_hand.output, MG_CONTAINS("train_fashion_mnist: error: --save: cannot write"));
  CHECK_THAT(rank_1, MG_CONTAINS("train_fashion_mnist: error: rank 1: the files given to another "
                                 "rank cannot be used (its message says why); stopping before "
                                 "the run starts"));
  CHECK(rank_1.find("train_loss") == std::string::npos);
}
#endif
