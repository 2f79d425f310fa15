// build/bin/train_fashion_mnist and the files it is given, run as a user runs it: output
// paths checked before anything trains, targets that are not regular files left alone,
// a --resume of a FIFO refused at once, temporary files of an unfinished save named, a
// save cut short by a file size limit cleaned up, and damaged checkpoints named.
#include "catch_compat.h"
#include "free_port.h"

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

// "Same file" is what the paths resolve to, not how they are spelled: a checkpoint that
// another output would replace is refused before anything trains, and left as it was.
TEST_CASE("train_fashion_mnist: two flags naming one file, however spelled, are refused") {
  TempDir dir;
  mg::testing::write_synthetic_fashion_mnist(dir.path(), 300, 100, false);
  const std::string ck = dir / "ck.safetensors";
  std::ofstream(ck) << "an earlier checkpoint";
  fs::create_directory(dir / "runs");
  fs::create_symlink(ck, dir / "soft");
  fs::create_hard_link(ck, dir / "hard");
  fs::create_directory_symlink(dir / "runs", dir / "runs-link");
  const struct {
    std::string flags, first, second;
  } cases[] = {
      {"--save " + ck + " --trace " + dir.path() + "/./ck.safetensors", "--save", "--trace"},
      {"--save " + ck + " --metrics " + (dir / "soft"), "--save", "--metrics"},
      {"--save " + ck + " --plot " + (dir / "hard"), "--save", "--plot"},
      // Not there yet: one directory reached two ways, one name.
      {"--metrics " + (dir / "runs/m.csv") + " --plot " + (dir / "runs-link/m.csv"), "--metrics",
       "--plot"},
      {"--save " + (dir / "runs/../runs/x") + " --trace " + (dir / "runs-link/x"), "--save",
       "--trace"},
  };
  for (const auto& c : cases) {
    const auto run = run_program(small_run(dir.path()) + " " + c.flags);
    INFO(c.flags << "\n" << run.output);
    CHECK(run.exit_code == 2);
    CHECK_THAT(run.output, MG_CONTAINS("train_fashion_mnist: error: " + c.first + " and " +
                                       c.second + " name the same file ('") &&
                               MG_CONTAINS("one would replace the other"));
    CHECK(run.output.find("train_loss") == std::string::npos);
  }
  // An input that an output other than --save would replace.
  const auto resume_metrics =
      run_program(small_run(dir.path()) + " --resume " + ck + " --metrics " + (dir / "hard"));
  INFO(resume_metrics.output);
  CHECK(resume_metrics.exit_code == 2);
  CHECK_THAT(resume_metrics.output,
             MG_CONTAINS("--resume '" + ck + "' is the file that --metrics '" + (dir / "hard") +
                         "' writes"));
  std::ifstream in(ck);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  CHECK(text == "an earlier checkpoint");
  CHECK(fs::is_empty(dir / "runs"));
  CHECK(temp_files(dir.path()).empty());
}

#if MINIGRAD_WITH_GLOO
// Under minigrad-run every rank writes FILE.rank<r>.json too: those names are checked
// against the other outputs before the data loads.
TEST_CASE("train_fashion_mnist --distributed: an output that is a rank's trace file is refused") {
  TempDir dir;
  mg::testing::write_synthetic_fashion_mnist(dir.path(), 300, 100, false);
  const std::string ck = dir / "t.rank1.json";
  std::ofstream(ck) << "an earlier checkpoint";
  const auto run = run_program("timeout 60 " + mg::testing::program_path("minigrad-run") +
                               " --nproc-per-node 2 " + small_run(dir.path()) +
                               " --distributed --save " + ck + " --trace " + (dir / "t.json"));
  INFO(run.output);
  CHECK(run.exit_code == 2);
  CHECK_THAT(run.output, MG_CONTAINS("[rank 0] train_fashion_mnist: error: --save and --trace "
                                     "(rank 1's file) name the same file ('" + ck + "' and '" +
                                     ck + "')"));
  CHECK(run.output.find("train_loss") == std::string::npos);
  std::ifstream in(ck);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  CHECK(text == "an earlier checkpoint");
}
#endif

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
      "MASTER_ADDR=127.0.0.1 MASTER_PORT=" + std::to_string(mg::testing::free_port()) +
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

TEST_CASE("train_fashion_mnist: checkpoint metadata out of range is named, a NaN right after "
          "--resume blames the checkpoint, not the learning rate") {
  TempDir dir;
  mg::testing::write_synthetic_fashion_mnist(dir.path(), 300, 100, false);
  const std::string ck = dir / "ck.safetensors";
  // Stopped after step 2 of 6: a mid-epoch checkpoint, with epoch_batches and epoch_seen.
  const auto first = run_program(small_run(dir.path(), 2) + " --save " + ck + " --stop-after-steps 2");
  INFO(first.output);
  REQUIRE(first.exit_code == 130);
  const mg::nn::Checkpoint good = mg::nn::load_tensors(ck);
  REQUIRE(good.metadata.at("epoch_batches") == "2");

  const struct {
    const char* key;
    std::string value;
    std::string fault;
  } cases[] = {
      // An epoch has 6 batches: a checkpoint stands at most after the last.
      {"epoch_batches", "7", "metadata 'epoch_batches' is 7, outside [0, 6]"},
      {"epoch_batches", "4611686018427387904", "metadata 'epoch_batches' is 4611686018427387904, "
                                               "outside [0, 6]"},
      // 2 batches of 50 rows: between 2 and 100 examples seen.
      {"epoch_seen", "101", "metadata 'epoch_seen' is 101, outside [2, 100]"},
      {"epoch_seen", "1", "metadata 'epoch_seen' is 1, outside [2, 100]"},
      {"epoch", "2147483648", "metadata 'epoch' is '2147483648', larger than 2147483647"},
      {"epoch", std::string(400, '7'), "metadata 'epoch' is '7777777777777777777777777777777777777777"
                                       "... (400 characters)', larger than"},
  };
  for (const auto& c : cases) {
    mg::nn::Checkpoint damaged = good;
    damaged.metadata[c.key] = c.value;
    const std::string path = dir / "damaged.safetensors";
    mg::nn::save_tensors(damaged, path);
    const auto run = run_program(small_run(dir.path(), 2) + " --resume " + path);
    INFO(c.key << "=" << c.value.substr(0, 50) << "\n" << run.output);
    CHECK(run.exit_code == 1);
    CHECK_THAT(run.output, MG_CONTAINS("train_fashion_mnist: error: --resume " + path + ": " + c.fault));
    CHECK(run.output.size() < 1000);
    CHECK(run.output.find("train_loss") == std::string::npos);
  }

  // Parameters of 1e30 are finite, so the file loads; the first forward overflows (every
  // hidden unit 1e30, every logit 32e60 = inf, and the loss NaN).
  mg::nn::Checkpoint huge = good;
  const auto fill = [&](const char* name, float value) {
    mg::Tensor& t = huge.tensors.at(name);
    for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = value;
  };
  fill("model.0.weight", 0.0f);
  fill("model.0.bias", 1e30f);
  fill("model.2.weight", 1e30f);
  const std::string path = dir / "huge.safetensors";
  mg::nn::save_tensors(huge, path);
  const auto run = run_program(small_run(dir.path(), 2) + " --resume " + path);
  INFO(run.output);
  CHECK(run.exit_code == 1);
  CHECK_THAT(run.output, MG_CONTAINS("step 3 (epoch 1, batch 3 of 6): the loss is") &&
                             MG_CONTAINS("It is the first step after --resume " + path +
                                         ", before any update"));
  CHECK(run.output.find("Lower the learning rate") == std::string::npos);
}

#if MINIGRAD_WITH_GLOO
// Every ZeRO stage names the optimizer state that does not fit, by key and file, before
// anything changes; ranks that resume different files (each its own disk) stop before
// the first step.
TEST_CASE("train_fashion_mnist --distributed: a bad optimizer state is named under every "
          "--zero stage, and ranks resuming different files are stopped") {
  TempDir dir;
  mg::testing::write_synthetic_fashion_mnist(dir.path(), 300, 100, false);
  const std::string ck = dir / "ck.safetensors";
  const auto first = run_program(small_run(dir.path()) + " --save " + ck);
  INFO(first.output);
  REQUIRE(first.exit_code == 0);
  const mg::nn::Checkpoint good = mg::nn::load_tensors(ck);

  mg::nn::Checkpoint wrong_shape = good;
  wrong_shape.tensors.at("optim.momentum_buffer.1") = mg::zeros({7});
  const std::string bad = dir / "bad.safetensors";
  mg::nn::save_tensors(wrong_shape, bad);
  for (int zero : {0, 1, 2, 3}) {
    const auto run = run_program("timeout 120 " + mg::testing::program_path("minigrad-run") +
                                 " --nproc-per-node 2 " + small_run(dir.path(), 2) +
                                 " --distributed --zero " + std::to_string(zero) + " --resume " +
                                 bad);
    INFO("--zero " << zero << "\n" << run.output);
    CHECK(run.exit_code == 1);
    CHECK_THAT(run.output, MG_CONTAINS(bad) && MG_CONTAINS("'momentum_buffer.1'") &&
                               MG_CONTAINS("[7]"));
    CHECK(run.output.find("train_loss") == std::string::npos);
  }

  // Two ranks started by hand, each in a directory of its own holding its own
  // "ck.safetensors": rank 1's has one weight changed.
  fs::create_directory(dir / "node0");
  fs::create_directory(dir / "node1");
  mg::nn::save_tensors(good, dir / "node0/ck.safetensors");
  mg::nn::Checkpoint other = good;
  other.tensors.at("model.0.weight").data<float>()[3] += 1.0f;
  mg::nn::save_tensors(other, dir / "node1/ck.safetensors");
  const std::string env =
      "MASTER_ADDR=127.0.0.1 MASTER_PORT=" + std::to_string(mg::testing::free_port()) +
      " WORLD_SIZE=2 LOCAL_RANK=0";
  const std::string flags = small_run(dir.path(), 2) + " --distributed --resume ck.safetensors";
  const auto by_hand = run_program(
      "sh -c '(cd " + (dir / "node1") + " && " + env + " RANK=1 timeout 60 " + flags + " > " +
      (dir / "rank1.log") + " 2>&1) & cd " + (dir / "node0") + " && " + env +
      " RANK=0 timeout 60 " + flags + "; wait'");
  INFO(by_hand.output);
  std::ifstream log(dir / "rank1.log");
  const std::string rank_1(std::istreambuf_iterator<char>(log), {});
  INFO(rank_1);
  CHECK_THAT(by_hand.output, MG_CONTAINS("--resume ck.safetensors: 1 rank loaded a checkpoint "
                                         "whose contents differ from rank 0's"));
  CHECK_THAT(rank_1, MG_CONTAINS("this rank (1) among them"));
  CHECK(by_hand.output.find("train_loss") == std::string::npos);
  CHECK(rank_1.find("train_loss") == std::string::npos);
}
#endif
