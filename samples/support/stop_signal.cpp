#include "stop_signal.h"

#include <cerrno>
#include <csignal>
#include <cstring>

#include <minigrad/core/error.h>
#include <minigrad/core/tensor.h>

namespace mg::samples {

namespace {

volatile std::sig_atomic_t stop_signal = 0;

void record_stop_signal(int signo) { stop_signal = signo; }

}  // namespace

void install_stop_handlers() {
  struct sigaction action {};
  action.sa_handler = record_stop_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESETHAND | SA_RESTART;
  for (int signo : {SIGINT, SIGTERM})
    MG_CHECK(sigaction(signo, &action, nullptr) == 0, "sigaction({}) failed: {}", signo,
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
