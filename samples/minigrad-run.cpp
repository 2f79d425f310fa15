// minigrad-run: starts the processes of a DistributedDataParallel job on this machine,
// as torchrun does.
//
//   minigrad-run --nproc-per-node 2 build/bin/train_fashion_mnist --distributed
//   minigrad-run --nproc-per-node 4 --nnodes 2 --node-rank 0 --master-addr node0
//                --master-port 29500 --run-id job42 PROGRAM ARGS...  (and --node-rank 1 on node1)
//
// For each local process k it sets MASTER_ADDR, MASTER_PORT, WORLD_SIZE (nproc * nnodes),
// RANK (node_rank * nproc + k), LOCAL_RANK (k), LOCAL_WORLD_SIZE, GROUP_RANK and
// MINIGRAD_RUN_ID, then forks and execs PROGRAM ARGS. A flag given twice takes its last
// value (torchrun's users override a script's flags that way). minigrad-run exits with the
// first failure's code (128 + signal for a process killed by a signal).
//
// Output: each line a process writes comes out prefixed with "[rank R] " on the same
// stream (stdout or stderr), whole: this launcher is the one writer of its streams, so one
// rank's line is never cut by another's. A line longer than 64 KiB (a progress bar drawn
// with '\r', a dump without newlines) is passed on in pieces of 64 KiB, each prefixed and
// each but the last ended with " [line continues]", so the launcher's memory does not grow
// with what a rank prints.
//
// Stopping, in three steps, each sent to every process still running (its process group).
// Every stop is bounded, so a job nobody watches ends (torchrun sends SIGKILL 30 s after
// its stop); a person at a terminal can always cut it short by sending the signal again.
//   1. a polite stop: SIGINT or SIGTERM sent to minigrad-run is forwarded as it is; when a
//      process fails, the others get SIGTERM. train_fashion_mnist answers it by finishing
//      its step and writing its interrupt checkpoint: after a forwarded signal the
//      processes have --stop-timeout SECONDS (30 by default: a checkpoint write fits; give
//      more for a larger one); after a failure, --grace-period SECONDS (5). The bound is
//      printed when it starts. A rank that ends on a signal of its own (exit code 130 or
//      143: it stopped in order, perhaps on a Ctrl-C that reached only it) gets the others
//      SIGTERM with the forwarded stop's time, not the failure's: rank 0 may still be
//      writing the job's checkpoint.
//   2. escalation: a second SIGINT or SIGTERM to minigrad-run (or the end of the time
//      above) sends the signal of step 1 again. It is a process's second stop of that
//      kind, which the sample programs answer by removing the temporary file of a save in
//      progress and dying at once (samples/support/stop_signal.h), so escalation leaves no
//      temporary file.
//   3. SIGKILL, --grace-period seconds after the escalation (for a process that ignored
//      it), or at once on a third signal to minigrad-run.
//
// MINIGRAD_RUN_ID is the job's id (torchrun's --rdzv-id): the store refuses a rank of
// another job, so two jobs given one port fail clearly instead of mixing their keys. It is
// --run-id, else MINIGRAD_RUN_ID from our environment, else on one node a new random id,
// and on several nodes "default" (their launchers cannot agree on a random one: give
// every node the same --run-id).
//
// On one node without --master-port, a free port is chosen (torchrun --standalone).
// Unless OMP_NUM_THREADS is set, each process gets OMP_NUM_THREADS=1 when several run,
// so N processes do not each start a BLAS thread per core (torchrun does the same).
//
// A process manager needs no GPU library: this program links the store's sockets and
// run-id check alone (minigrad_launch in samples/CMakeLists.txt), not libminigrad, whose
// CUDA runtime, cuBLAS and NCCL would make it some 200 MB resident and slow every start.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <fmt/format.h>

#include <minigrad/parallel/c10d/store/run_id.h>
#include <minigrad/parallel/c10d/store/socket.h>

#include "support/command_line.h"

namespace {

using Clock = std::chrono::steady_clock;

struct Options {
  int nproc_per_node = 0;
  int nnodes = 1;
  int node_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = -1;       // -1: choose (one node) or 29500
  double grace_seconds = 5.0;  // from a failure's SIGTERM to escalation; from escalation to SIGKILL
  double stop_timeout = 30.0;  // from a forwarded or orderly stop to escalation
  std::string run_id;         // empty: choose
  std::vector<std::string> command;
};

constexpr const char* kUsage =
    "usage: minigrad-run --nproc-per-node N [--nnodes M --node-rank R --master-addr A "
    "--master-port P] [--run-id ID] [--grace-period SECONDS] [--stop-timeout SECONDS] "
    "PROGRAM [ARGS...]\n";

constexpr const char* kStopHelp =
    "A first SIGINT/SIGTERM is forwarded and the processes have --stop-timeout (default 30 s) "
    "to stop\n(their checkpoint); a second, or the end of that time, escalates (the same "
    "signal again, then\nSIGKILL after --grace-period, default 5 s); a third sends SIGKILL. "
    "A failed process gives\nthe others --grace-period. A flag given twice takes its last "
    "value.\n";

[[noreturn]] void usage_error(const std::string& message) {
  fmt::print(stderr, "minigrad-run: {}\n{}", message, kUsage);
  std::exit(2);
}

int parse_int(const std::string& flag, const std::string& value, int low, int high) {
  try {
    return static_cast<int>(mg::samples::parse_integer(flag, value, low, high));
  } catch (const std::exception& e) {
    usage_error(e.what());
  }
}

double parse_seconds(const std::string& flag, const std::string& value) {
  try {
    return mg::samples::parse_seconds(flag, value);
  } catch (const std::exception& e) {
    usage_error(e.what());
  }
}

Options parse_args(int argc, char** argv) {
  Options o;
  int i = 1;
  for (; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--") {
      ++i;
      break;
    }
    if (arg == "-h" || arg == "--help") {
      fmt::print("{}{}", kUsage, kStopHelp);
      std::exit(0);
    }
    if (arg.rfind("--", 0) != 0) break;  // the program
    std::string value;
    const size_t eq = arg.find('=');
    if (eq != std::string::npos) {
      value = arg.substr(eq + 1);
      arg = arg.substr(0, eq);
    } else {
      if (i + 1 >= argc) usage_error(fmt::format("{} needs a value", arg));
      value = argv[++i];
    }
    for (char& c : arg)
      if (c == '_') c = '-';  // torchrun spells them both ways
    if (arg == "--nproc-per-node") {
      o.nproc_per_node = parse_int(arg, value, 1, 4096);
    } else if (arg == "--nnodes") {
      o.nnodes = parse_int(arg, value, 1, 1 << 20);
    } else if (arg == "--node-rank") {
      o.node_rank = parse_int(arg, value, 0, 1 << 20);
    } else if (arg == "--master-addr") {
      o.master_addr = value;
    } else if (arg == "--master-port") {
      o.master_port = parse_int(arg, value, 1, 65535);
    } else if (arg == "--run-id" || arg == "--rdzv-id") {
      try {
        mg::parallel::check_run_id(value, arg);
      } catch (const std::exception& e) {
        usage_error(e.what());
      }
      o.run_id = value;
    } else if (arg == "--grace-period") {
      o.grace_seconds = parse_seconds(arg, value);
    } else if (arg == "--stop-timeout") {
      o.stop_timeout = parse_seconds(arg, value);
    } else {
      usage_error(fmt::format("unknown option {}", arg));
    }
  }
  for (; i < argc; ++i) o.command.emplace_back(argv[i]);
  if (o.nproc_per_node == 0) usage_error("--nproc-per-node is required");
  if (o.command.empty()) usage_error("no program to run");
  if (o.node_rank >= o.nnodes)
    usage_error(fmt::format("--node-rank {} must be below --nnodes {}", o.node_rank, o.nnodes));
  if (o.run_id.empty()) {
    const char* inherited = std::getenv("MINIGRAD_RUN_ID");
    if (inherited != nullptr && *inherited != '\0') {
      try {
        mg::parallel::check_run_id(inherited, "MINIGRAD_RUN_ID");
      } catch (const std::exception& e) {
        usage_error(e.what());
      }
      o.run_id = inherited;
    } else if (o.nnodes == 1) {
      std::random_device random;
      o.run_id = fmt::format("minigrad-run-{:08x}{:08x}", random(), random());
    } else {
      o.run_id = "default";
    }
  }
  if (o.master_port < 0) {
    if (o.nnodes == 1) {
      // A port free now; rank 0's store binds it moments later (SO_REUSEADDR).
      mg::parallel::net::Socket probe = mg::parallel::net::listen_on(o.master_addr, 0);
      o.master_port = mg::parallel::net::local_port(probe);
    } else {
      o.master_port = 29500;
    }
  }
  return o;
}

// ---- signals: handlers only note the signal and wake the poll loop ----
int wake_pipe[2] = {-1, -1};
volatile sig_atomic_t first_stop_signal = 0;  // the first SIGINT or SIGTERM received
volatile sig_atomic_t stop_signals = 0;       // how many were received

void on_signal(int sig) {
  const int saved = errno;
  if (sig == SIGINT || sig == SIGTERM) {
    if (stop_signals == 0) first_stop_signal = sig;
    if (stop_signals < 3) stop_signals = stop_signals + 1;
  }
  const char byte = static_cast<char>(sig);
  [[maybe_unused]] const ssize_t n = ::write(wake_pipe[1], &byte, 1);
  errno = saved;
}

void install_handlers() {
  if (::pipe2(wake_pipe, O_CLOEXEC | O_NONBLOCK) != 0) {
    fmt::print(stderr, "minigrad-run: pipe2 failed: {}\n", std::strerror(errno));
    std::exit(1);
  }
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  for (int sig : {SIGINT, SIGTERM, SIGCHLD}) {
    if (::sigaction(sig, &sa, nullptr) != 0) {
      fmt::print(stderr, "minigrad-run: sigaction failed: {}\n", std::strerror(errno));
      std::exit(1);
    }
  }
  // Our stdout may be a pipe that closes (| head); keep running to stop the children.
  ::signal(SIGPIPE, SIG_IGN);
}

void write_all(int fd, const std::string& text) {
  const char* p = text.data();
  size_t left = text.size();
  while (left > 0) {
    const ssize_t n = ::write(fd, p, left);
    if (n < 0) {
      if (errno == EINTR) continue;
      return;  // our output is gone; nothing better to do with it
    }
    p += n;
    left -= static_cast<size_t>(n);
  }
}

// One stream (stdout or stderr) of one process, re-emitted line by line with a prefix.
struct Stream {
  int fd = -1;         // read end of the pipe, -1 once at EOF
  int out_fd = 1;      // where its lines go
  std::string partial; // the start of a line not yet ended
};

struct Process {
  int rank = 0;
  pid_t pid = -1;
  bool running = false;
  int exit_code = 0;
  Stream out, err;
};

// The longest piece of a line passed on whole. A longer line (a progress bar drawn with
// '\r', a dump without newlines) goes on in pieces of this size, each but the last ended
// with kContinues, so that what we hold of a line never grows past it.
constexpr size_t kMaxLine = 64 * 1024;
constexpr const char* kContinues = " [line continues]";

// Where to cut a line of `text` that starts at `start` and is too long: after kMaxLine
// bytes, moved back to the start of a UTF-8 character cut in two (at most 3 bytes back).
size_t cut_point(const std::string& text, size_t start) {
  size_t cut = start + kMaxLine;
  for (int back = 0; back < 3 && cut > start + 1 &&
                     (static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80;
       ++back)
    --cut;
  return cut;
}

// Passes on every whole line of what the stream holds and `data`, and every kMaxLine
// piece of a line too long; keeps the rest (under kMaxLine bytes) for the next read.
void emit_lines(const std::string& prefix, Stream& s, const char* data, size_t n) {
  s.partial.append(data, n);
  std::string text;
  size_t start = 0;
  for (;;) {
    const size_t nl = s.partial.find('\n', start);
    const size_t line_end = nl == std::string::npos ? s.partial.size() : nl;
    if (line_end - start > kMaxLine) {
      const size_t cut = cut_point(s.partial, start);
      text.append(prefix).append(s.partial, start, cut - start).append(kContinues).append("\n");
      start = cut;
      continue;
    }
    if (nl == std::string::npos) break;
    text.append(prefix).append(s.partial, start, nl + 1 - start);
    start = nl + 1;
  }
  s.partial.erase(0, start);
  if (!text.empty()) write_all(s.out_fd, text);
}

void close_stream(const std::string& prefix, Stream& s) {
  if (!s.partial.empty()) write_all(s.out_fd, prefix + s.partial + "\n");
  s.partial.clear();
  ::close(s.fd);
  s.fd = -1;
}

std::string describe_status(int status) {
  if (WIFSIGNALED(status)) {
    const char* name = ::strsignal(WTERMSIG(status));
    return fmt::format("was killed by signal {} ({})", WTERMSIG(status), name ? name : "?");
  }
  return fmt::format("exited with code {}", WEXITSTATUS(status));
}

[[noreturn]] void exec_child(const Options& o, int local_rank, int rank, int out_fd, int err_fd) {
  // Its own process group, so stopping it reaches whatever it started (a shell's children).
  ::setpgid(0, 0);
  ::signal(SIGPIPE, SIG_DFL);  // ignored dispositions would survive exec
  ::signal(SIGINT, SIG_DFL);
  ::signal(SIGTERM, SIG_DFL);
  ::signal(SIGCHLD, SIG_DFL);
  if (::dup2(out_fd, 1) < 0 || ::dup2(err_fd, 2) < 0) _exit(127);
  const int world_size = o.nproc_per_node * o.nnodes;
  ::setenv("MASTER_ADDR", o.master_addr.c_str(), 1);
  ::setenv("MASTER_PORT", std::to_string(o.master_port).c_str(), 1);
  ::setenv("WORLD_SIZE", std::to_string(world_size).c_str(), 1);
  ::setenv("RANK", std::to_string(rank).c_str(), 1);
  ::setenv("LOCAL_RANK", std::to_string(local_rank).c_str(), 1);
  ::setenv("LOCAL_WORLD_SIZE", std::to_string(o.nproc_per_node).c_str(), 1);
  ::setenv("GROUP_RANK", std::to_string(o.node_rank).c_str(), 1);
  ::setenv("MINIGRAD_RUN_ID", o.run_id.c_str(), 1);
  if (o.nproc_per_node > 1) ::setenv("OMP_NUM_THREADS", "1", /*overwrite=*/0);
  std::vector<char*> args;
  for (const std::string& a : o.command) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  ::execvp(args[0], args.data());
  const std::string message =
      fmt::format("minigrad-run: cannot run '{}': {}\n", o.command[0], std::strerror(errno));
  write_all(2, message);
  _exit(127);
}

void signal_all(std::vector<Process>& procs, int sig) {
  for (Process& p : procs)
    if (p.running) ::kill(-p.pid, sig);  // the process group: the process and its children
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  try {
    o = parse_args(argc, argv);
  } catch (const std::exception& e) {
    fmt::print(stderr, "minigrad-run: {}\n", e.what());
    return 2;
  }
  install_handlers();

  std::vector<Process> procs(static_cast<size_t>(o.nproc_per_node));
  for (int k = 0; k < o.nproc_per_node; ++k) {
    Process& p = procs[static_cast<size_t>(k)];
    p.rank = o.node_rank * o.nproc_per_node + k;
    int out[2], err[2];
    if (::pipe2(out, O_CLOEXEC) != 0 || ::pipe2(err, O_CLOEXEC) != 0) {
      fmt::print(stderr, "minigrad-run: pipe2 failed: {}\n", std::strerror(errno));
      signal_all(procs, SIGKILL);
      return 1;
    }
    std::fflush(stdout);
    std::fflush(stderr);
    const pid_t pid = ::fork();
    if (pid < 0) {
      fmt::print(stderr, "minigrad-run: fork failed: {}\n", std::strerror(errno));
      signal_all(procs, SIGKILL);
      return 1;
    }
    if (pid == 0) exec_child(o, k, p.rank, out[1], err[1]);
    ::setpgid(pid, pid);  // also here, so it holds before we might signal the group
    ::close(out[1]);
    ::close(err[1]);
    p.pid = pid;
    p.running = true;
    p.out = Stream{out[0], 1, {}};
    p.err = Stream{err[0], 2, {}};
  }

  int first_failure_code = 0;
  // 0 running; 1 asked to stop (forwarded signal or SIGTERM); 2 escalated (the same signal
  // again); 3 killed (SIGKILL).
  int stop_level = 0;
  int stop_sent = SIGTERM;  // what level 1 sent, which escalation sends again
  const char* stop_bound = "--stop-timeout";  // the flag that bounds level 1
  double stop_bound_seconds = 0;
  Clock::time_point next_step_at = Clock::time_point::max();
  int signals_handled = 0;
  int running = o.nproc_per_node;
  Clock::time_point all_exited_at{};

  auto after = [](double seconds) {
    return Clock::now() + std::chrono::duration_cast<Clock::duration>(
                              std::chrono::duration<double>(seconds));
  };
  // Level 1: `sig` to every process, which have `seconds` (the value of `flag`) to stop.
  auto ask_to_stop = [&](int sig, double seconds, const char* flag) {
    stop_level = 1;
    stop_sent = sig;
    stop_bound = flag;
    stop_bound_seconds = seconds;
    signal_all(procs, sig);
    next_step_at = after(seconds);
  };
  auto escalate = [&](const std::string& why) {
    if (stop_level >= 2) return;
    stop_level = 2;
    // The signal the processes were asked to stop with, again: their second of that kind,
    // on which the sample programs remove the temporary file of a save and end.
    fmt::print(stderr,
               "minigrad-run: {}; escalating: {} again to {} process(es) (a second stop: they "
               "remove their temporary files and end), SIGKILL in {:.1f} s\n",
               why, stop_sent == SIGINT ? "SIGINT" : "SIGTERM", running, o.grace_seconds);
    signal_all(procs, stop_sent);
    next_step_at = after(o.grace_seconds);
  };
  auto kill_all = [&](const std::string& why) {
    if (stop_level >= 3) return;
    stop_level = 3;
    fmt::print(stderr, "minigrad-run: {}; sending SIGKILL to {} process(es)\n", why, running);
    signal_all(procs, SIGKILL);
  };

  for (;;) {
    // Reap the processes that ended.
    for (Process& p : procs) {
      if (!p.running) continue;
      int status = 0;
      const pid_t r = ::waitpid(p.pid, &status, WNOHANG);
      if (r != p.pid) continue;
      p.running = false;
      --running;
      p.exit_code = WIFSIGNALED(status) ? 128 + WTERMSIG(status) : WEXITSTATUS(status);
      if (running == 0) all_exited_at = Clock::now();
      if (p.exit_code != 0 && stop_level == 0) {
        first_failure_code = p.exit_code;
        // A rank that ended on its own Ctrl-C or SIGTERM (128 + the signal) stopped in order,
        // its interrupt checkpoint written; the others are most likely stopping too, and
        // one of them may still be writing the checkpoint (rank 0): they are asked to stop
        // and given the time of a forwarded stop, not a failure's grace period.
        const bool orderly = p.exit_code == 128 + SIGINT || p.exit_code == 128 + SIGTERM;
        const double seconds = orderly ? o.stop_timeout : o.grace_seconds;
        const char* flag = orderly ? "--stop-timeout" : "--grace-period";
        fmt::print(stderr,
                   "minigrad-run: rank {} (pid {}) {}; stopping the other {} process(es), which "
                   "have {:.1f} s ({}) to stop\n",
                   p.rank, p.pid, describe_status(status), running, seconds, flag);
        ask_to_stop(SIGTERM, seconds, flag);
      }
    }
    const int received = stop_signals;
    for (; signals_handled < received; ++signals_handled) {
      if (signals_handled == 0 && stop_level == 0) {
        const int sig = first_stop_signal;
        first_failure_code = 128 + sig;
        fmt::print(stderr,
                   "minigrad-run: received signal {}; forwarding it to {} process(es), which "
                   "have {:.1f} s (--stop-timeout) to stop (send it again to escalate)\n",
                   sig, running, o.stop_timeout);
        ask_to_stop(sig, o.stop_timeout, "--stop-timeout");
      } else if (stop_level < 2) {
        if (first_failure_code == 0) first_failure_code = 128 + first_stop_signal;
        escalate("a second stop signal");
      } else {
        kill_all("a third stop signal");
      }
    }
    if (running > 0 && stop_level > 0 && stop_level < 3 && Clock::now() >= next_step_at) {
      if (stop_level == 1)
        escalate(fmt::format("{} process(es) did not stop within {} ({:.1f} s)", running,
                             stop_bound, stop_bound_seconds));
      else
        kill_all(fmt::format("{} process(es) still running {:.1f} s after the escalation",
                             running, o.grace_seconds));
    }

    // Everything read and everyone gone: done. (A pipe held open by a process that
    // outlived its parent is given a second, then abandoned.)
    bool pipes_open = false;
    for (const Process& p : procs) pipes_open = pipes_open || p.out.fd >= 0 || p.err.fd >= 0;
    if (running == 0 && (!pipes_open || Clock::now() - all_exited_at > std::chrono::seconds(1)))
      break;

    std::vector<pollfd> fds{{wake_pipe[0], POLLIN, 0}};
    std::vector<Stream*> streams{nullptr};
    std::vector<const Process*> owners{nullptr};
    for (Process& p : procs) {
      for (Stream* s : {&p.out, &p.err}) {
        if (s->fd < 0) continue;
        fds.push_back({s->fd, POLLIN, 0});
        streams.push_back(s);
        owners.push_back(&p);
      }
    }
    if (::poll(fds.data(), fds.size(), 100) < 0 && errno != EINTR) {
      fmt::print(stderr, "minigrad-run: poll failed: {}\n", std::strerror(errno));
      signal_all(procs, SIGKILL);
      return 1;
    }
    if (fds[0].revents & POLLIN) {
      char drain[64];
      while (::read(wake_pipe[0], drain, sizeof(drain)) > 0) {
      }
    }
    for (size_t i = 1; i < fds.size(); ++i) {
      if (fds[i].revents == 0) continue;
      const std::string prefix = fmt::format("[rank {}] ", owners[i]->rank);
      char buf[65536];
      const ssize_t n = ::read(fds[i].fd, buf, sizeof(buf));
      if (n > 0) {
        emit_lines(prefix, *streams[i], buf, static_cast<size_t>(n));
      } else if (n == 0 || (errno != EINTR && errno != EAGAIN)) {
        close_stream(prefix, *streams[i]);
      }
    }
  }
  return first_failure_code;
}
