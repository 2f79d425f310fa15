// Ctrl-C (SIGINT) and SIGTERM as a request to stop: the handler only records the signal;
// the training loop asks after every step (and after each epoch's evaluation), writes a
// checkpoint of exactly where the run stands and exits with 128 + the signal number (130
// for Ctrl-C, 143 for SIGTERM), as a shell reports a process that a signal killed.
#pragma once

#include <minigrad/core/device.h>

#include "distributed_run.h"

namespace mg::samples {

// Installs the handlers for SIGINT and SIGTERM. The first signal is recorded; a second of
// the same kind kills the process at once by the default action (a launcher's escalation
// sends the kind it forwarded again; a SIGTERM after a Ctrl-C is not a second stop, so a
// launcher that asks the other ranks to stop does not cut rank 0's checkpoint short), for
// when the step in progress is itself stuck, after removing the temporary file of a save that it cuts short
// (files::remove_temp_files_in_progress). A system call the signal lands in (a Gloo
// socket read, say) resumes instead of failing (SA_RESTART). SIGXFSZ is ignored, so that
// a file over `ulimit -f` is an error of the write that the writer cleans up after.
void install_stop_handlers();

// The signal that stops the run, or 0 to go on. The ranks of a --distributed run agree on
// it (a sum over the ranks, through a tensor on `device`): one rank stopping alone would
// leave the others waiting in the next all-reduce until --dist-timeout.
int agreed_stop_signal(const DistributedRun& dist, Device device);

// "SIGINT", "SIGTERM", or "a signal".
const char* signal_name(int signo);

}  // namespace mg::samples
