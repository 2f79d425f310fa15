// train_fashion_mnist stopped by a signal and resumed: the checkpoint written at
// the interrupt continues to the very parameters of a run that was never stopped, bit for
// bit on the CPU; a diverging loss stops the run naming the step; --detect-anomaly is
// harmless on a healthy run.
#include "catch_compat.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>

#include <minigrad/nn/serialize.h>

#include "data/synthetic_fashion_mnist.h"
#include "samples/run_program.h"
#include "temp_dir.h"

using mg::testing::run_program;
using mg::testing::TempDir;

namespace {

const std::string kProgram = mg::testing::program_path("train_fashion_mnist");

// 300 training images in batches of 50: 6 steps per epoch.
std::string small_run(const std::string& data_dir) {
  return kProgram + " --data-dir " + data_dir + " --hidden 32 --batch-size 50";
}

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// The metrics CSV without its last column (seconds, which no two runs share).
std::string metrics_without_seconds(const std::string& path) {
  std::istringstream in(read_text(path));
  std::string out;
  for (std::string line; std::getline(in, line);) out += line.substr(0, line.rfind(',')) + "\n";
  return out;
}

// Every tensor of two checkpoints, compared byte for byte; `optimizer_keys` must be there.
void require_same_tensors(const std::string& a_path, const std::string& b_path,
                          const std::vector<std::string>& optimizer_keys = {
                              "optim.momentum_buffer.0"}) {
  const mg::nn::Checkpoint a = mg::nn::load_tensors(a_path);
  const mg::nn::Checkpoint b = mg::nn::load_tensors(b_path);
  REQUIRE(a.tensors.size() == b.tensors.size());
  REQUIRE(a.tensors.count("model.0.weight") == 1);
  for (const std::string& key : optimizer_keys) {
    INFO(key);
    REQUIRE(a.tensors.count(key) == 1);
  }
  for (const auto& [name, ta] : a.tensors) {
    INFO(name);
    REQUIRE(b.tensors.count(name) == 1);
    const mg::Tensor& tb = b.tensors.at(name);
    REQUIRE(ta.shape() == tb.shape());
    REQUIRE(ta.dtype() == tb.dtype());
    CHECK(std::memcmp(ta.data_ptr(), tb.data_ptr(), ta.nbytes()) == 0);
  }
}

}  // namespace

TEST_CASE("train_fashion_mnist: interrupted three times and resumed, ends bit-identical") {
  TempDir dir;
  mg::testing::write_synthetic_fashion_mnist(dir.path(), 300, 100, false);
  const std::string flags = small_run(dir.path()) + " --epochs 2";
  const std::string straight = dir / "straight.safetensors", resumed = dir / "resumed.safetensors";

  const auto reference = run_program(flags + " --save " + straight + " --metrics " +
                                     (dir / "straight.csv"));
  INFO(reference.output);
  REQUIRE(reference.exit_code == 0);

  // Stops in mid-epoch (step 4), right after an epoch's last batch but before its
  // evaluation (step 6), and in the second epoch (step 9); each run resumes the last.
  std::string resume;
  for (const auto& [stop, where] : {std::pair{4, "epoch 1, batch 4"}, std::pair{6, "epoch 1, batch 6"},
                                    std::pair{9, "epoch 2, batch 3"}}) {
    const auto run = run_program(flags + " --save " + resumed + " --metrics " +
                                 (dir / "resumed.csv") + resume + " --stop-after-steps " +
                                 std::to_string(stop));
    INFO(run.output);
    REQUIRE(run.exit_code == 130);  // 128 + SIGINT
    REQUIRE_THAT(run.output, MG_CONTAINS(fmt::format("interrupted by SIGINT after step {} ({}); "
                                                     "checkpoint written to {}",
                                                     stop, where, resumed)));
    resume = " --resume " + resumed;
  }
  const auto last = run_program(flags + " --save " + resumed + " --metrics " +
                                (dir / "resumed.csv") + resume);
  INFO(last.output);
  REQUIRE(last.exit_code == 0);
  REQUIRE_THAT(last.output, MG_CONTAINS("resumed from " + resumed + " in epoch 2 after batch 3"));

  require_same_tensors(straight, resumed);
  // The epochs' losses and accuracies too: the running loss of an interrupted epoch
  // travels in the checkpoint.
  CHECK(metrics_without_seconds(dir / "straight.csv") ==
        metrics_without_seconds(dir / "resumed.csv"));
}

TEST_CASE("train_fashion_mnist --optimizer adamw: interrupted and resumed, ends bit-identical") {
  TempDir dir;
  mg::testing::write_synthetic_fashion_mnist(dir.path(), 300, 100, false);
  const std::string flags = small_run(dir.path()) + " --epochs 2 --optimizer adamw";
  const std::string straight = dir / "straight.safetensors", resumed = dir / "resumed.safetensors";
  const auto reference = run_program(flags + " --save " + straight + " --metrics " +
                                     (dir / "straight.csv"));
  INFO(reference.output);
  REQUIRE(reference.exit_code == 0);
  REQUIRE_THAT(reference.output, MG_CONTAINS("AdamW lr 0.001 (cosine) weight_decay 0.01"));

  // Stopped in mid-epoch: AdamW's moments and step counts travel in the checkpoint.
  const auto stopped = run_program(flags + " --save " + resumed + " --stop-after-steps 4");
  INFO(stopped.output);
  REQUIRE(stopped.exit_code == 130);
  const mg::nn::Checkpoint at_stop = mg::nn::load_tensors(resumed);
  REQUIRE(at_stop.metadata.at("optimizer") == "adamw");
  REQUIRE(at_stop.tensors.at("optim.step.0").item<int64_t>() == 4);
  const auto rest = run_program(flags + " --resume " + resumed + " --save " + resumed +
                                " --metrics " + (dir / "resumed.csv"));
  INFO(rest.output);
  REQUIRE(rest.exit_code == 0);
  REQUIRE_THAT(rest.output, MG_CONTAINS("resumed from " + resumed + " in epoch 1 after batch 4"));

  require_same_tensors(straight, resumed,
                       {"optim.step.0", "optim.exp_avg.0", "optim.exp_avg_sq.0",
                        "optim.exp_avg_sq.3"});
  CHECK(mg::nn::load_tensors(resumed).tensors.at("optim.step.3").item<int64_t>() == 12);
  CHECK(metrics_without_seconds(dir / "straight.csv") ==
        metrics_without_seconds(dir / "resumed.csv"));

  // The SGD run cannot continue from AdamW's state, and says which flag to pass.
  const auto wrong = run_program(small_run(dir.path()) + " --epochs 3 --resume " + resumed);
  INFO(wrong.output);
  REQUIRE(wrong.exit_code != 0);
  REQUIRE_THAT(wrong.output, MG_CONTAINS("--resume " + resumed + ": the checkpoint holds the "
                                         "state of --optimizer adamw, but --optimizer is sgd; "
                                         "pass --optimizer adamw"));
}

TEST_CASE("train_fashion_mnist: SIGTERM from outside writes a checkpoint that resumes") {
  TempDir dir;
  mg::testing::write_synthetic_fashion_mnist(dir.path(), 300, 100, false);
  const std::string checkpoint = dir / "ck.safetensors";
  // A run far longer than the test: it can only end through the signal.
  const std::string command = small_run(dir.path()) + " --epochs 100000 --save " + checkpoint;

  int out[2];
  REQUIRE(::pipe(out) == 0);
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    ::dup2(out[1], STDOUT_FILENO);
    ::dup2(out[1], STDERR_FILENO);
    ::close(out[0]);
    ::execl("/bin/sh", "sh", "-c", ("exec " + command).c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  ::close(out[1]);
  // Signal once the first epoch has been reported: training is under way.
  std::string output;
  char buffer[4096];
  bool signalled = false;
  for (ssize_t got; (got = ::read(out[0], buffer, sizeof buffer)) > 0;) {
    output.append(buffer, static_cast<size_t>(got));
    if (!signalled && output.find("epoch  1/100000") != std::string::npos) {
      ::kill(pid, SIGTERM);
      signalled = true;
    }
  }
  ::close(out[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  INFO(output);
  REQUIRE(signalled);
  REQUIRE(WIFEXITED(status));
  REQUIRE(WEXITSTATUS(status) == 143);  // 128 + SIGTERM
  REQUIRE_THAT(output, MG_CONTAINS("interrupted by SIGTERM after step ") &&
                           MG_CONTAINS("checkpoint written to " + checkpoint));

  // Wherever it stopped, the checkpoint resumes and trains on to the next epoch's end.
  const mg::nn::Checkpoint ck = mg::nn::load_tensors(checkpoint);
  const int done = std::stoi(ck.metadata.at("epoch"));
  const auto resumed = run_program(small_run(dir.path()) + " --epochs " + std::to_string(done + 1) +
                                   " --resume " + checkpoint);
  INFO(resumed.output);
  REQUIRE(resumed.exit_code == 0);
  REQUIRE_THAT(resumed.output, MG_CONTAINS("resumed from " + checkpoint));
  REQUIRE_THAT(resumed.output, MG_CONTAINS(fmt::format("epoch {:>2}/{}  train_loss", done + 1, done + 1)));
}

TEST_CASE("train_fashion_mnist: a diverging loss stops the run, naming the step") {
  TempDir dir;
  mg::testing::write_synthetic_fashion_mnist(dir.path(), 300, 100, false);
  // lr 1e30: the first update makes the weights ~1e29, and the second forward overflows.
  const auto run = run_program(small_run(dir.path()) + " --epochs 1 --lr 1e30");
  INFO(run.output);
  REQUIRE(run.exit_code == 1);
  REQUIRE_THAT(run.output, MG_CONTAINS("train_fashion_mnist: error: step 2 (epoch 1, batch 2 of "
                                       "6): the loss is ") &&
                               MG_CONTAINS("stopping before this step's update"));
  REQUIRE(run.output.find("train_loss") == std::string::npos);  // no epoch was reported
}

TEST_CASE("train_fashion_mnist: --detect-anomaly trains a healthy run to the same numbers") {
  TempDir dir;
  mg::testing::write_synthetic_fashion_mnist(dir.path(), 300, 100, false);
  const std::string flags = small_run(dir.path()) + " --epochs 1 --metrics ";
  const auto plain = run_program(flags + (dir / "plain.csv"));
  REQUIRE(plain.exit_code == 0);
  const auto checked = run_program(flags + (dir / "checked.csv") + " --detect-anomaly");
  INFO(checked.output);
  REQUIRE(checked.exit_code == 0);
  REQUIRE_THAT(checked.output, MG_CONTAINS("anomaly detection on"));
  CHECK(metrics_without_seconds(dir / "plain.csv") == metrics_without_seconds(dir / "checked.csv"));
}

#if MINIGRAD_WITH_GLOO
TEST_CASE("train_fashion_mnist --distributed: two ranks interrupted and resumed end bit-identical") {
  TempDir dir;
  mg::testing::write_synthetic_fashion_mnist(dir.path(), 300, 100, false);
  // Each rank takes 25 of every global batch of 50: still 6 steps per epoch.
  const std::string flags = mg::testing::program_path("minigrad-run") + " --nproc-per-node 2 " +
                            small_run(dir.path()) + " --distributed --epochs 2";
  const std::string straight = dir / "straight.safetensors", resumed = dir / "resumed.safetensors";
  const auto reference = run_program(flags + " --save " + straight + " --metrics " +
                                     (dir / "straight.csv"));
  INFO(reference.output);
  REQUIRE(reference.exit_code == 0);

  const auto stopped = run_program(flags + " --save " + resumed + " --stop-after-steps 4");
  INFO(stopped.output);
  REQUIRE(stopped.exit_code == 130);  // minigrad-run passes on the ranks' 128 + SIGINT
  REQUIRE_THAT(stopped.output, MG_CONTAINS("[rank 0] train_fashion_mnist: interrupted by SIGINT "
                                           "after step 4 (epoch 1, batch 4)"));
  const auto rest = run_program(flags + " --resume " + resumed + " --save " + resumed +
                                " --metrics " + (dir / "resumed.csv"));
  INFO(rest.output);
  REQUIRE(rest.exit_code == 0);

  require_same_tensors(straight, resumed);
  CHECK(metrics_without_seconds(dir / "straight.csv") ==
        metrics_without_seconds(dir / "resumed.csv"));
}
#endif

#if MINIGRAD_WITH_GLOO
TEST_CASE("train_fashion_mnist --distributed --zero: every stage trains as DDP does, and their "
          "checkpoints resume one another bit-identical") {
  TempDir dir;
  mg::testing::write_synthetic_fashion_mnist(dir.path(), 300, 100, false);
  const std::string flags = mg::testing::program_path("minigrad-run") + " --nproc-per-node 2 " +
                            small_run(dir.path()) + " --distributed --epochs 2";
  const std::string straight = dir / "straight.safetensors";
  const auto reference = run_program(flags + " --zero 0 --save " + straight + " --metrics " +
                                     (dir / "zero0.csv"));
  INFO(reference.output);
  REQUIRE(reference.exit_code == 0);

  // On two ranks a reduce-scatter adds the same two numbers as the all-reduce does, so every
  // stage takes DDP's steps bit for bit: the same metrics, and checkpoints (gathered in full
  // on rank 0) of the same tensors.
  for (int zero : {1, 2, 3}) {  // a loop, not sections: the runs around it run once
    INFO("--zero " << zero);
    const std::string csv = dir / fmt::format("zero{}.csv", zero);
    const std::string ck = dir / fmt::format("zero{}.safetensors", zero);
    const auto run =
        run_program(flags + fmt::format(" --zero {} --save {} --metrics {}", zero, ck, csv));
    INFO(run.output);
    REQUIRE(run.exit_code == 0);
    REQUIRE_THAT(run.output,
                 MG_CONTAINS(fmt::format("[rank 0] sharded over the ranks: ZeRO-{}", zero)));
    CHECK(metrics_without_seconds(csv) == metrics_without_seconds(dir / "zero0.csv"));
    require_same_tensors(straight, ck);
  }

  // AdamW too (its step count and two moments sharded, gathered into the checkpoint).
  const auto adamw0 = run_program(flags + " --zero 0 --optimizer adamw --metrics " +
                                  (dir / "adamw0.csv") + " --save " + (dir / "adamw0.safetensors"));
  INFO(adamw0.output);
  REQUIRE(adamw0.exit_code == 0);
  REQUIRE_THAT(adamw0.output, MG_CONTAINS("AdamW lr 0.001 (cosine) weight_decay 0.01"));
  const auto adamw3 = run_program(flags + " --zero 3 --optimizer adamw --metrics " +
                                  (dir / "adamw3.csv") + " --save " + (dir / "adamw3.safetensors"));
  INFO(adamw3.output);
  REQUIRE(adamw3.exit_code == 0);
  CHECK(metrics_without_seconds(dir / "adamw0.csv") == metrics_without_seconds(dir / "adamw3.csv"));
  require_same_tensors(dir / "adamw0.safetensors", dir / "adamw3.safetensors",
                       {"optim.exp_avg.0", "optim.exp_avg_sq.0", "optim.step.0"});

  // Interrupted under ZeRO-3 in mid-epoch, resumed under ZeRO-2: DDP's end, bit for bit.
  const std::string resumed = dir / "resumed.safetensors";
  const auto stopped = run_program(flags + " --zero 3 --save " + resumed + " --stop-after-steps 4");
  INFO(stopped.output);
  REQUIRE(stopped.exit_code == 130);
  const auto rest = run_program(flags + " --zero 2 --resume " + resumed + " --save " + resumed);
  INFO(rest.output);
  REQUIRE(rest.exit_code == 0);
  require_same_tensors(straight, resumed);
}

TEST_CASE("train_fashion_mnist: --zero without --distributed is a usage error") {
  const auto run = run_program(kProgram + " --zero 2 --epochs 1");
  REQUIRE(run.exit_code != 0);
  REQUIRE_THAT(run.output, MG_CONTAINS("--zero 2 shards the training over the ranks of a "
                                       "--distributed run"));
}
#endif

// ---- under minigrad-run: a stop lets the rank finish its checkpoint, however long it takes ----

namespace {

// The names of the files in `dir` that are temporary files of a write.
std::vector<std::string> temp_files_in(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    if (name.find(".tmp.") != std::string::npos) out.push_back(name);
  }
  return out;
}

// The shell lines that start the run in `dir` under the launcher, its output in dir/out,
// and wait until its first epoch has been reported.
std::string start_under_launcher(const std::string& dir, double save_pause_seconds) {
  return fmt::format(
      "cd {} && MINIGRAD_TEST_SAVE_PAUSE_SECONDS={} {} --nproc-per-node 1 {} --epochs 100000 "
      ">out 2>&1 & pid=$!; "
      "for i in $(seq 600); do grep -q 'epoch  1/100000' {}/out && break; sleep 0.1; done; ",
      dir, save_pause_seconds, mg::testing::program_path("minigrad-run"), small_run(dir), dir);
}

}  // namespace

// The launcher used to SIGKILL its ranks 5 s after forwarding a stop: a checkpoint that took
// longer was lost. Here the save takes 7 s.
TEST_CASE("minigrad-run: a forwarded Ctrl-C waits for a checkpoint slower than the old grace "
          "period") {
  TempDir dir;
  mg::testing::write_synthetic_fashion_mnist(dir.path(), 300, 100, false);
  const auto run = run_program(start_under_launcher(dir.path(), 7) +
                               "kill -INT $pid; wait $pid; code=$?; cat " + (dir / "out") +
                               "; echo \"launcher exit $code\"");
  INFO(run.output);
  REQUIRE_THAT(run.output, MG_CONTAINS("launcher exit 130"));
  REQUIRE_THAT(run.output, MG_CONTAINS("[rank 0] train_fashion_mnist: interrupted by SIGINT") &&
                               MG_CONTAINS("checkpoint written to "
                                           "train_fashion_mnist.interrupted.safetensors"));
  REQUIRE(run.output.find("SIGKILL") == std::string::npos);
  const mg::nn::Checkpoint ck = mg::nn::load_tensors(dir / "train_fashion_mnist.interrupted.safetensors");
  CHECK(ck.tensors.count("model.0.weight") == 1);
  CHECK(temp_files_in(dir.path()).empty());
}

// A second Ctrl-C in the middle of that save escalates: the rank removes its temporary
// file and ends; what was on disk before stays as it was.
TEST_CASE("minigrad-run: a second Ctrl-C during the slow save leaves no temporary file and "
          "the old file intact") {
  TempDir dir;
  mg::testing::write_synthetic_fashion_mnist(dir.path(), 300, 100, false);
  const std::string target = dir / "train_fashion_mnist.interrupted.safetensors";
  {
    std::ofstream old(target);
    old << "the previous checkpoint";
  }
  const auto run = run_program(
      start_under_launcher(dir.path(), 60) + "kill -INT $pid; " +
      "for i in $(seq 600); do ls " + dir.path() +
      " | grep -q '[.]tmp[.]' && break; sleep 0.1; done; kill -INT $pid; wait $pid; code=$?; cat " +
      (dir / "out") + "; echo \"launcher exit $code\"");
  INFO(run.output);
  REQUIRE_THAT(run.output, MG_CONTAINS("launcher exit 130"));
  REQUIRE_THAT(run.output, MG_CONTAINS("a second stop signal; escalating: SIGINT again to 1 process(es)"));
  REQUIRE(run.output.find("checkpoint written") == std::string::npos);
  CHECK(temp_files_in(dir.path()).empty());
  CHECK(read_text(target) == "the previous checkpoint");
}
