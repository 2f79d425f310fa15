// minigrad-run (samples/minigrad-run.cpp): environment, prefixed output (a line too long
// to hold passed on in pieces, the launcher's memory flat), failure propagation, signal
// forwarding and the bound of every stop, what it links, and a real rendezvous of this
// test binary's hidden worker case below through the environment it sets (each rank's
// result in a file of its own: rank_files.h).

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>

#include "catch_compat.h"
#include "rank_files.h"
#include "shell_run.h"
#include "temp_dir.h"

#include <minigrad/core/error.h>
#include <minigrad/parallel/c10d/store/socket.h>

#ifdef MINIGRAD_WITH_GLOO
#include <minigrad/core/generator.h>
#include <minigrad/nn/layers.h>
#include <minigrad/parallel/c10d/rendezvous.h>
#include <minigrad/parallel/ddp/distributed_data_parallel.h>
#endif

namespace {

const std::string kLauncher = std::string(MINIGRAD_BINARY_DIR) + "/bin/minigrad-run";

using mg::testing::Run;
using mg::testing::run_shell;
using mg::testing::TempDir;

// The launcher is a sample program; a build without samples has none to test.
void require_launcher() { mg::testing::require_program(kLauncher); }

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// A value in kB of a /proc/<pid>/status excerpt ("VmHWM:\t  3868 kB"), or -1.
long status_kib(const std::string& status, const std::string& field) {
  const size_t at = status.find(field + ":");
  long kib = -1;
  if (at == std::string::npos ||
      std::sscanf(status.c_str() + at + field.size() + 1, "%ld kB", &kib) != 1)
    return -1;
  return kib;
}

}  // namespace

TEST_CASE("minigrad-run: sets the torchrun environment and prefixes each line with the rank") {
  require_launcher();
  const Run r = run_shell(kLauncher +
                          " --nproc-per-node 3 /bin/sh -c 'echo \"env $RANK/$WORLD_SIZE local "
                          "$LOCAL_RANK/$LOCAL_WORLD_SIZE at $MASTER_ADDR:$MASTER_PORT\"; echo "
                          "\"to stderr $RANK\" >&2; printf \"unterminated $RANK\"'");
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  for (int rank = 0; rank < 3; ++rank) {
    const std::string prefix = "[rank " + std::to_string(rank) + "] ";
    REQUIRE_THAT(r.output, MG_CONTAINS(prefix + "env " + std::to_string(rank) + "/3 local " +
                                       std::to_string(rank) + "/3 at 127.0.0.1:"));
    REQUIRE_THAT(r.output, MG_CONTAINS(prefix + "to stderr " + std::to_string(rank) + "\n"));
    REQUIRE_THAT(r.output, MG_CONTAINS(prefix + "unterminated " + std::to_string(rank) + "\n"));
  }
}

// A rank that prints 50 MiB without a newline (a progress bar drawn with '\r' looks the
// same to the launcher) while another prints short lines: the long line comes out in
// pieces of 64 KiB, each prefixed, each but the last marked; every byte arrives, each
// rank's lines whole; the launcher's peak memory stays far below the line's size (it held
// the line whole, and copies of it: 226 MB -> 732 MB resident for 200 MB). The peak is the
// launcher's VmHWM, read by rank 0 once its line is out (all but the pipe's 64 KiB read).
TEST_CASE("minigrad-run: a line without a newline goes on in prefixed 64 KiB pieces, every "
          "byte of it, and the launcher's memory stays flat") {
  require_launcher();
  const TempDir dir;
  constexpr size_t kLine = size_t{50} << 20;
  constexpr size_t kPiece = 64 * 1024;
  const std::string marker = " [line continues]";
  const Run r = run_shell(fmt::format(
      "{0} --nproc-per-node 2 /bin/sh -c 'if [ \"$RANK\" = 0 ]; then head -c {1} /dev/zero | tr "
      "\"\\0\" x; echo; echo end; grep VmHWM /proc/$PPID/status >{2}/launcher; else i=0; "
      "while [ $i -lt 2000 ]; do echo \"line $i\"; i=$((i+1)); done; fi' >{2}/out",
      kLauncher, kLine, dir.path()));
  const std::string out = read_file(dir / "out");
  const long peak_kib = status_kib(read_file(dir / "launcher"), "VmHWM");
  INFO("exit " << r.exit_code << ", launcher's peak RSS " << peak_kib << " KiB, " << r.output
               << "output of " << out.size() << " bytes starting: " << out.substr(0, 300));
  REQUIRE(r.exit_code == 0);
  // Each rank's text, rebuilt from its prefixed lines: a marked piece joins the next.
  std::string got[2];
  size_t pieces = 0, odd_pieces = 0;
  for (size_t at = 0; at < out.size();) {
    const size_t nl = out.find('\n', at);
    REQUIRE(nl != std::string::npos);  // every line the launcher writes ends
    const std::string_view line(out.data() + at, nl - at);
    at = nl + 1;
    const int rank = line.substr(0, 9) == "[rank 0] " ? 0 : line.substr(0, 9) == "[rank 1] " ? 1 : -1;
    INFO("a line of " << line.size() << " bytes: " << std::string(line.substr(0, 100)));
    REQUIRE(rank >= 0);
    std::string_view body = line.substr(9);
    if (body.size() >= marker.size() && body.substr(body.size() - marker.size()) == marker) {
      body.remove_suffix(marker.size());
      ++pieces;
      if (body.size() != kPiece) ++odd_pieces;
      got[rank].append(body);
    } else {
      got[rank].append(body).append("\n");
    }
  }
  // 800 pieces of 64 KiB: 799 marked, the last ended by the rank's own newline.
  CHECK(pieces == kLine / kPiece - 1);
  CHECK(odd_pieces == 0);
  REQUIRE(got[0].size() == kLine + 5);
  CHECK(got[0].find_first_not_of('x') == kLine);
  CHECK(got[0].substr(kLine) == "\nend\n");
  std::string lines;
  for (int i = 0; i < 2000; ++i) lines += fmt::format("line {}\n", i);
  CHECK(got[1] == lines);
  CHECK(peak_kib > 0);
  CHECK(peak_kib < 24 * 1024);
}

// A cut never splits a UTF-8 character: 65535 bytes of 'x' and a 2-byte 'é' are cut before it.
TEST_CASE("minigrad-run: a too-long line is cut between UTF-8 characters") {
  require_launcher();
  const Run r = run_shell(kLauncher + " --nproc-per-node 1 /bin/sh -c 'head -c 65535 /dev/zero | "
                                      "tr \"\\0\" x; printf \"\\303\\251y\"'");
  REQUIRE(r.exit_code == 0);
  REQUIRE(r.output == "[rank 0] " + std::string(65535, 'x') + " [line continues]\n[rank 0] \xc3\xa9y\n");
}

// A process manager needs no GPU library: the launcher maps no CUDA runtime, cuBLAS, NCCL,
// libminigrad or BLAS (it was 226 MB resident at rest with them), seen from its rank.
TEST_CASE("minigrad-run: links no CUDA, cuBLAS, NCCL or libminigrad, and is small at rest") {
  require_launcher();
  const TempDir dir;
  const Run r = run_shell(kLauncher + " --nproc-per-node 1 /bin/sh -c 'cat /proc/$PPID/maps >" +
                          (dir / "maps") + "; grep VmRSS /proc/$PPID/status >" + (dir / "status") +
                          "'");
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  const std::string maps = read_file(dir / "maps");
  INFO(maps);
  REQUIRE_THAT(maps, MG_CONTAINS("/minigrad-run"));  // the launcher's own maps
  for (const char* library : {"libcudart", "libcublas", "libnccl", "libcuda.", "libminigrad",
                              "libopenblas", "libgloo"})
    CHECK_THAT(maps, !MG_CONTAINS(library));
  const std::string status = read_file(dir / "status");
  INFO(status);
  const long rss_kib = status_kib(status, "VmRSS");
  CHECK(rss_kib > 0);
  CHECK(rss_kib < 32 * 1024);
}

// torchrun's and nanoGPT's users override a flag by giving it again.
TEST_CASE("minigrad-run: a flag given twice takes its last value") {
  require_launcher();
  const TempDir dir;
  const Run r = run_shell(kLauncher + " --nproc-per-node 3 --run-id first --nproc-per-node=2 "
                                      "--run_id last /bin/sh -c 'echo \"$WORLD_SIZE $MINIGRAD_RUN_ID\" >" +
                          dir.path() + "/rank$RANK.txt'");
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  CHECK(mg::testing::read_rank_file(dir.path(), 0) == "2 last\n");
  CHECK(mg::testing::read_rank_file(dir.path(), 1) == "2 last\n");
  CHECK(mg::testing::read_rank_file(dir.path(), 2).empty());  // no third rank
}

TEST_CASE("minigrad-run: every rank of a job gets its run id, each job a new one unless given") {
  require_launcher();
  const std::string print = " /bin/sh -c 'echo \"id=$MINIGRAD_RUN_ID.\"'";
  const auto ids = [](const std::string& output) {
    std::vector<std::string> found;
    for (size_t at = 0; (at = output.find("id=", at)) != std::string::npos; at += 3)
      found.push_back(output.substr(at + 3, output.find('.', at) - at - 3));
    return found;
  };
  const Run first = run_shell(kLauncher + " --nproc-per-node 3" + print);
  const Run second = run_shell(kLauncher + " --nproc-per-node 3" + print);
  INFO(first.output << second.output);
  const std::vector<std::string> a = ids(first.output), b = ids(second.output);
  REQUIRE(a.size() == 3);
  REQUIRE(b.size() == 3);
  REQUIRE_THAT(a[0], MG_CONTAINS("minigrad-run-"));
  REQUIRE((a[1] == a[0] && a[2] == a[0]));
  REQUIRE((b[1] == b[0] && b[2] == b[0]));
  REQUIRE(a[0] != b[0]);

  REQUIRE(ids(run_shell(kLauncher + " --nproc-per-node 2 --run-id job-42" + print).output) ==
          std::vector<std::string>{"job-42", "job-42"});
  REQUIRE(ids(run_shell("MINIGRAD_RUN_ID=from-env " + kLauncher + " --nproc-per-node 1" + print)
                  .output) == std::vector<std::string>{"from-env"});
  // Several nodes cannot agree on a random id: without --run-id they share the default.
  REQUIRE(ids(run_shell(kLauncher + " --nproc-per-node 1 --nnodes 2 --master-addr 127.0.0.1 "
                                    "--master-port 29511" + print)
                  .output) == std::vector<std::string>{"default"});
  const Run bad = run_shell(kLauncher + " --nproc-per-node 1 --run-id 'a b' /bin/true");
  REQUIRE(bad.exit_code == 2);
  REQUIRE_THAT(bad.output, MG_CONTAINS("--run-id: run id 'a b' has the character ' '"));
}

TEST_CASE("minigrad-run: ranks of node R of M nodes, and an explicit master") {
  require_launcher();
  const Run r = run_shell(kLauncher +
                          " --nproc-per-node 2 --nnodes 3 --node-rank 2 --master-addr 10.1.2.3 "
                          "--master-port 29511 /bin/sh -c 'echo \"$RANK $WORLD_SIZE $LOCAL_RANK "
                          "$GROUP_RANK $MASTER_ADDR $MASTER_PORT\"'");
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  REQUIRE_THAT(r.output, MG_CONTAINS("[rank 4] 4 6 0 2 10.1.2.3 29511"));
  REQUIRE_THAT(r.output, MG_CONTAINS("[rank 5] 5 6 1 2 10.1.2.3 29511"));
}

TEST_CASE("minigrad-run: one failing rank stops the others and its exit code is returned") {
  require_launcher();
  // Rank 1 fails; the others would sleep for a minute unless stopped.
  const Run r = run_shell(kLauncher +
                          " --nproc-per-node 3 /bin/sh -c 'if [ \"$RANK\" = 1 ]; then echo "
                          "failing; exit 3; fi; echo waiting; sleep 60'");
  INFO(r.output);
  REQUIRE(r.exit_code == 3);
  REQUIRE_THAT(r.output, MG_CONTAINS("[rank 1] failing"));
  REQUIRE_THAT(r.output, MG_CONTAINS("minigrad-run: rank 1 (pid "));
  REQUIRE_THAT(r.output, MG_CONTAINS("exited with code 3; stopping the other 2 process(es)"));
}

TEST_CASE("minigrad-run: a rank killed by a signal gives 128 + signal") {
  require_launcher();
  const Run r = run_shell(kLauncher + " --nproc-per-node 2 /bin/sh -c 'if [ \"$RANK\" = 0 ]; then "
                                      "kill -9 $$; fi; sleep 60'");
  INFO(r.output);
  REQUIRE(r.exit_code == 128 + 9);
  REQUIRE_THAT(r.output, MG_CONTAINS("rank 0 (pid "));
  REQUIRE_THAT(r.output, MG_CONTAINS("was killed by signal 9"));
}

TEST_CASE("minigrad-run: SIGTERM to the launcher is forwarded to every rank") {
  require_launcher();
  // Signal only once both ranks have spoken through the launcher, so its handlers are
  // installed: a fixed sleep loses that race on a loaded machine.
  const Run r = run_shell(
      "out=$(mktemp); " + kLauncher +
      " --nproc-per-node 2 /bin/sh -c 'echo ready; sleep 60' >$out 2>&1 & pid=$!; "
      "for i in $(seq 300); do [ $(grep -c ready $out) -ge 2 ] && break; sleep 0.1; done; "
      "kill -TERM $pid; wait $pid; code=$?; cat $out; rm -f $out; echo \"launcher exit $code\"");
  INFO(r.output);
  REQUIRE_THAT(r.output, MG_CONTAINS("received signal 15; forwarding it to 2 process(es)"));
  REQUIRE_THAT(r.output, MG_CONTAINS("launcher exit 143"));
}

// A rank that needs 7 s to stop (longer than the 5 s the launcher used to allow before its
// SIGKILL): the forwarded stop waits for it, within the default bound of 30 s, printed.
TEST_CASE("minigrad-run: a forwarded stop waits for ranks that take long to stop") {
  require_launcher();
  const Run r = run_shell(
      "out=$(mktemp); " + kLauncher +
      " --nproc-per-node 2 /bin/sh -c 'trap \"sleep 7; echo stopped cleanly; exit 143\" TERM; "
      "echo ready; while :; do sleep 1 & wait $!; done' >$out 2>&1 & pid=$!; "
      "for i in $(seq 300); do [ $(grep -c ready $out) -ge 2 ] && break; sleep 0.1; done; "
      "kill -TERM $pid; wait $pid; code=$?; cat $out; rm -f $out; echo \"launcher exit $code\"");
  INFO(r.output);
  REQUIRE_THAT(r.output, MG_CONTAINS("[rank 0] stopped cleanly"));
  REQUIRE_THAT(r.output, MG_CONTAINS("[rank 1] stopped cleanly"));
  REQUIRE_THAT(r.output, MG_CONTAINS("received signal 15; forwarding it to 2 process(es), which "
                                     "have 30.0 s (--stop-timeout) to stop (send it again to "
                                     "escalate)"));
  REQUIRE(r.output.find("escalating") == std::string::npos);
  REQUIRE(r.output.find("SIGKILL to") == std::string::npos);
  REQUIRE_THAT(r.output, MG_CONTAINS("launcher exit 143"));
}

// The second stop sent to the launcher reaches the ranks as their second stop; a third
// kills what is left.
TEST_CASE("minigrad-run: a second stop escalates, a third kills") {
  require_launcher();
  // Each rank counts the stops it gets; the second ends it (as the sample programs'
  // handlers do), except rank 1, which ignores every stop and has to be killed.
  const std::string rank_script =
      "n=0; trap \"n=\\$((n+1)); echo stop \\$n; if [ \\$n -ge 2 ] && [ \\$RANK = 0 ]; then "
      "exit 99; fi\" TERM INT; echo ready; while :; do sleep 1 & wait $!; done";
  const Run r = run_shell(
      "out=$(mktemp); " + kLauncher + " --nproc-per-node 2 --grace-period 60 /bin/sh -c '" +
      rank_script +
      "' >$out 2>&1 & pid=$!; "
      "for i in $(seq 300); do [ $(grep -c ready $out) -ge 2 ] && break; sleep 0.1; done; "
      "kill -INT $pid; "
      "for i in $(seq 300); do [ $(grep -c 'stop 1' $out) -ge 2 ] && break; sleep 0.1; done; "
      "kill -TERM $pid; "
      "for i in $(seq 300); do grep -q 'rank 1] stop 2' $out && break; sleep 0.1; done; "
      "kill -TERM $pid; wait $pid; code=$?; cat $out; rm -f $out; echo \"launcher exit $code\"");
  INFO(r.output);
  REQUIRE_THAT(r.output, MG_CONTAINS("[rank 0] stop 2"));
  REQUIRE_THAT(r.output, MG_CONTAINS("[rank 1] stop 2"));
  REQUIRE_THAT(r.output, MG_CONTAINS("a second stop signal; escalating: SIGINT again to 2 process(es)"));
  REQUIRE_THAT(r.output, MG_CONTAINS("a third stop signal; sending SIGKILL to 1 process(es)"));
  REQUIRE_THAT(r.output, MG_CONTAINS("launcher exit 130"));  // the first signal's 128 + SIGINT
}

// A rank that ends on its own stop (exit code 130: its interrupt handled) is no failure
// whose grace period runs: rank 0 may still be writing the job's checkpoint. (Rank 1
// waits a second first, so that rank 0's trap is set when the launcher's SIGTERM comes.)
TEST_CASE("minigrad-run: a rank that stopped on a signal leaves the others time to finish") {
  require_launcher();
  const Run r = run_shell(
      kLauncher + " --nproc-per-node 2 --grace-period 1 /bin/sh -c 'if [ \"$RANK\" = 1 ]; then "
      "sleep 1; exit 130; fi; trap \"sleep 3; echo checkpoint written; exit 130\" TERM; "
      "while :; do sleep 1 & wait $!; done'");
  INFO(r.output);
  REQUIRE(r.exit_code == 130);
  REQUIRE_THAT(r.output, MG_CONTAINS("rank 1 (pid ") &&
                             MG_CONTAINS("exited with code 130; stopping the other 1 process(es), "
                                         "which have 30.0 s (--stop-timeout) to stop"));
  REQUIRE_THAT(r.output, MG_CONTAINS("[rank 0] checkpoint written"));
  REQUIRE(r.output.find("escalating") == std::string::npos);
}

// The stop of the test above, but rank 0 ignores SIGTERM (a rank hung outside a collective
// is the same to the launcher): nobody at a terminal escalates, and the job still ends,
// --stop-timeout after the stop began and --grace-period after the escalation.
TEST_CASE("minigrad-run: a stop nobody escalates is bounded: a rank that ignores it is killed") {
  require_launcher();
  const auto start = std::chrono::steady_clock::now();
  const Run r = run_shell(
      kLauncher + " --nproc-per-node 2 --stop-timeout 1 --grace-period 1 /bin/sh -c 'if [ "
                  "\"$RANK\" = 1 ]; then sleep 1; exit 130; fi; trap \"\" TERM INT; while :; "
                  "do sleep 1; done'");
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  INFO(r.output << "(" << seconds << " s)");
  REQUIRE(r.exit_code == 130);  // the first rank's own stop
  REQUIRE_THAT(r.output, MG_CONTAINS("exited with code 130; stopping the other 1 process(es), "
                                     "which have 1.0 s (--stop-timeout) to stop"));
  REQUIRE_THAT(r.output, MG_CONTAINS("minigrad-run: 1 process(es) did not stop within "
                                     "--stop-timeout (1.0 s); escalating: SIGTERM again to 1 "
                                     "process(es)"));
  REQUIRE_THAT(r.output, MG_CONTAINS("minigrad-run: 1 process(es) still running 1.0 s after the "
                                     "escalation; sending SIGKILL to 1 process(es)"));
  REQUIRE(seconds < 30);  // about 3 s; unbounded before
}

TEST_CASE("minigrad-run: --stop-timeout escalates a stop that takes too long") {
  require_launcher();
  const Run r = run_shell(
      "out=$(mktemp); " + kLauncher +
      " --nproc-per-node 1 --stop-timeout 100 --stop-timeout 0.5 --grace-period 30 /bin/sh -c "
      "'n=0; trap \"n=\\$((n+1)); "
      "echo stop \\$n; [ \\$n -ge 2 ] && exit 98\" TERM; echo ready; while :; do sleep 1 & wait "
      "$!; done' >$out 2>&1 & pid=$!; "
      "for i in $(seq 300); do grep -q ready $out && break; sleep 0.1; done; "
      "kill -TERM $pid; wait $pid; code=$?; cat $out; rm -f $out; echo \"launcher exit $code\"");
  INFO(r.output);
  REQUIRE_THAT(r.output, MG_CONTAINS("which have 0.5 s (--stop-timeout) to stop"));
  REQUIRE_THAT(r.output, MG_CONTAINS("1 process(es) did not stop within --stop-timeout (0.5 s); "
                                     "escalating"));
  REQUIRE_THAT(r.output, MG_CONTAINS("[rank 0] stop 2"));
  REQUIRE_THAT(r.output, MG_CONTAINS("launcher exit 143"));
}

TEST_CASE("minigrad-run: usage errors, and --help names every stop's bound") {
  require_launcher();
  Run r = run_shell(kLauncher + " --help");
  REQUIRE(r.exit_code == 0);
  REQUIRE_THAT(r.output, MG_CONTAINS("the processes have --stop-timeout (default 30 s) to stop"));
  REQUIRE_THAT(r.output, MG_CONTAINS("SIGKILL after --grace-period, default 5 s"));
  r = run_shell(kLauncher + " /bin/true");
  REQUIRE(r.exit_code == 2);
  REQUIRE_THAT(r.output, MG_CONTAINS("--nproc-per-node is required"));
  r = run_shell(kLauncher + " --nproc-per-node 2");
  REQUIRE(r.exit_code == 2);
  REQUIRE_THAT(r.output, MG_CONTAINS("no program to run"));
  r = run_shell(kLauncher + " --nproc-per-node 2 --nnodes 2 --node-rank 2 /bin/true");
  REQUIRE(r.exit_code == 2);
  REQUIRE_THAT(r.output, MG_CONTAINS("--node-rank 2 must be below --nnodes 2"));
  r = run_shell(kLauncher + " --nproc-per-node 1 /nonexistent/program");
  REQUIRE(r.exit_code == 127);
  REQUIRE_THAT(r.output, MG_CONTAINS("cannot run '/nonexistent/program'"));
  for (const char* bad : {"nan", "inf", "-1", "5s", "1e400"}) {
    INFO(bad);
    r = run_shell(kLauncher + " --nproc-per-node 1 --stop-timeout " + bad + " /bin/true");
    REQUIRE(r.exit_code == 2);
    REQUIRE_THAT(r.output, MG_CONTAINS(std::string("--stop-timeout expects a number in [0, "
                                                   "3.1536e+07], got '") + bad + "'"));
  }
  r = run_shell(kLauncher + " --nproc-per-node " + std::string(400, '9') + " /bin/true");
  REQUIRE(r.exit_code == 2);
  REQUIRE_THAT(r.output, MG_CONTAINS("--nproc-per-node expects an integer in [1, 4096], got '9999"));
  REQUIRE(r.output.size() < 400);
}

#ifdef MINIGRAD_WITH_GLOO

// Run by the next test through minigrad-run: a process of a real job, rendezvous from the
// environment. Hidden ("[.]"): it makes sense only inside minigrad-run.
TEST_CASE("worker process of a minigrad-run job: init_process_group from the environment",
          "[.][launcher-worker]") {
  using namespace mg;
  using namespace mg::parallel;
  ProcessGroupOptions options;
  options.timeout = std::chrono::seconds(30);
  std::shared_ptr<ProcessGroup> pg;
  try {
    pg = init_process_group("gloo", options);
  } catch (const std::exception& e) {
    const char* rank = std::getenv("RANK");  // minigrad-run sets it
    mg::testing::write_rank_line(rank != nullptr ? std::atoi(rank) : -1,
                                 fmt::format("worker could not join: {}", e.what()));
    throw;
  }
  Tensor t = full(Shape{4}, pg->rank() + 1.0);
  pg->allreduce(t)->wait();
  const float sum = t.to_vector<float>()[0];
  manual_seed(static_cast<uint64_t>(pg->rank()));
  auto net = std::make_shared<nn::Linear>(3, 2);
  DistributedDataParallel ddp(net, pg);
  Tensor x = full(Shape{2, 3}, static_cast<double>(pg->rank()));
  ddp.forward(x).sum().backward();
  // Rank r's bias gradient is 2 (two rows); averaged it stays 2; weight's is 2r per entry,
  // averaged over n ranks n - 1 (1 with two ranks).
  mg::testing::write_rank_line(
      pg->rank(), fmt::format("worker {} of {}: sum {} bias grad {} weight grad {}", pg->rank(),
                              pg->size(), sum, net->bias().grad().to_vector<float>()[0],
                              net->weight().grad().to_vector<float>()[0]));
  REQUIRE(sum == static_cast<float>(pg->size() * (pg->size() + 1) / 2));
}

TEST_CASE("minigrad-run: a job of this binary's worker meets through the environment") {
  require_launcher();
  const TempDir dir;
  const Run r = run_shell(mg::testing::rank_dir_assignment(dir.path()) + kLauncher +
                          " --nproc-per-node 2 " + MINIGRAD_BINARY_DIR +
                          "/bin/test_distributed '[launcher-worker]'");
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  CHECK(mg::testing::read_rank_file(dir.path(), 0) ==
        "worker 0 of 2: sum 3 bias grad 2 weight grad 1\n");
  CHECK(mg::testing::read_rank_file(dir.path(), 1) ==
        "worker 1 of 2: sum 3 bias grad 2 weight grad 1\n");
}

// Two jobs given one MASTER_PORT at the same moment: one rank 0 binds it; the other job's
// rank 0 cannot, and its other ranks reach the first job's store. They must be refused
// there (their run id differs), so that one job fails clearly and the other succeeds.
// Before jobs had ids, the intruders' keys replaced the first job's and both died.
TEST_CASE("minigrad-run: two jobs started at once on one port never kill each other") {
  require_launcher();
  int port = 0;
  {
    mg::parallel::net::Socket probe = mg::parallel::net::listen_on("127.0.0.1", 0);
    port = mg::parallel::net::local_port(probe);
  }
  const std::string job = kLauncher + " --nproc-per-node 3 --master-port " + std::to_string(port) +
                          " " + MINIGRAD_BINARY_DIR + "/bin/test_distributed '[launcher-worker]'";
  for (int trial = 0; trial < 3; ++trial) {
    const TempDir a, b;  // each job's rank files
    const Run r = run_shell(fmt::format(
        "({0}{2}) >{1}/out 2>&1 & pa=$!; ({3}{2}) >{4}/out 2>&1 & pb=$!; wait $pa; ca=$?; "
        "wait $pb; cb=$?; echo \"A $ca B $cb\"; cat {1}/out {4}/out",
        mg::testing::rank_dir_assignment(a.path()), a.path(), job,
        mg::testing::rank_dir_assignment(b.path()), b.path()));
    INFO("trial " << trial << ":\n" << r.output);
    int codes[2] = {-1, -1};
    REQUIRE(std::sscanf(r.output.c_str(), "A %d B %d", &codes[0], &codes[1]) == 2);
    int succeeded = 0;
    for (int j = 0; j < 2; ++j) {
      const std::string& dir = (j == 0 ? a : b).path();
      std::string files;
      for (int rank = 0; rank < 3; ++rank) files += mg::testing::read_rank_file(dir, rank);
      files += mg::testing::read_rank_file(dir, -1);
      INFO("job " << "AB"[j] << " exit " << codes[j] << ", its ranks wrote:\n" << files);
      if (codes[j] == 0) {
        ++succeeded;
        for (int rank = 0; rank < 3; ++rank)
          REQUIRE_THAT(mg::testing::read_rank_file(dir, rank),
                       MG_CONTAINS(fmt::format("worker {} of 3: sum 6", rank)));
      } else {
        // Failed, and a rank says why: its rank 0 found the port taken, or a rank was
        // refused by the other job's store.
        const bool port_taken = files.find("give each job a MASTER_PORT of its own") != std::string::npos;
        const bool refused = files.find("reached the store of job 'minigrad-run-") != std::string::npos;
        REQUIRE((port_taken || refused));
      }
    }
    REQUIRE(succeeded >= 1);
  }
}

#endif  // MINIGRAD_WITH_GLOO
