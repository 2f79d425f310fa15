#include "stop_signal.h"

#include <cerrno>
#include <csignal>
#include <cstring>

#include <minigrad/core/error.h>
#include <minigrad/core/files.h>
#include <minigrad/core/tensor.h>

namespace mg::samples {

namespace {

volatile std::sig_atomic_t stop_signal = 0;

// Whether SIGINT / SIGTERM arrived before: each signal's second coming is the one that
// ends the process, as SA_RESETHAND did before the cleanup below was needed.
volatile std::sig_atomic_t seen_sigint = 0, seen_sigterm = 0;

// The first signal is recorded; the second of the same kind ends the process by its
// default action, as a second Ctrl-C should, after removing the temporary file of a save
// that it cuts short (async-signal-safe calls only: unlink, signal, raise).
void on_stop_signal(int signo) {
  volatile std::sig_atomic_t& seen = signo == SIGINT ? seen_sigint : seen_sigterm;
  if (seen == 0) {
    seen = 1;
    stop_signal = signo;
    return;
  }
  files::remove_temp_files_in_progress();
  ::signal(signo, SIG_DFL);
  ::raise(signo);  // delivered as this handler returns: the signal is blocked inside it
}

}  // namespace

void install_stop_handlers() {
  struct sigaction action {};
  action.sa_handler = on_stop_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  for (int signo : {SIGINT, SIGTERM})
    MG_CHECK(sigaction(signo, &action, nullptr) == 0, "sigaction({}) failed: {}", signo,
             std::strerror(errno));
  // Over a file size limit (ulimit -f), write() then fails with EFBIG, which the writers
  // report and clean up after, instead of SIGXFSZ killing the process in the middle of a
  // save and leaving its temporary file (Python ignores SIGXFSZ for the same reason).
  MG_CHECK(::signal(SIGXFSZ, SIG_IGN) != SIG_ERR, "signal(SIGXFSZ) failed: {}",
           std::strerror(errno));
}

int agreed_stop_signal(const DistributedRun& dist, Device device) {
  const int local = stop_signal;
  if (!dist.active()) return local;
  Tensor flag = full({}, local != 0 ? 1.0 : 0.0, DType::Float32, device);
  sum_over_ranks(dist, {flag});
  if (flag.item<float>() == 0.0f) return 0;
  return local != 0 ? local : SIGTERM;
}

const char* signal_name(int signo) {
  return signo == SIGINT ? "SIGINT" : signo == SIGTERM ? "SIGTERM" : "a signal";
}

}  // namespace mg::samples
