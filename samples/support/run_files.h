// The files a run is given, checked before it starts: an output that cannot be written
// (a missing directory, a FIFO, /dev/null) would otherwise fail only when the first epoch
// is done, and lose it; a --resume that is a FIFO would block forever.
//
// Outputs (--save, --metrics, --plot) are written with files::write_atomically
// (minigrad/core/files.h): the path must be a regular file or nothing yet, in a directory
// where a file can be created; a symbolic link is followed and the file it points to is
// replaced. Inputs (--resume) must be regular files. A temporary file that an earlier,
// unfinished write of an output left beside it (the process was killed in the middle of a
// save) is named in a warning, and left alone: a run of another machine or container that
// shares the directory may be writing it, and its pid says nothing here.
#pragma once

#include <string>
#include <vector>

#include <minigrad/core/device.h>

#include "distributed_run.h"
#include "train_options.h"

namespace mg::samples {

struct FileFlag {
  std::string flag;  // "--save"
  std::string path;  // empty: the flag was not given
};

// Checks every output and input; the first fault is an OptionError that begins with the
// flag and names the path ("--save: cannot write 'x': ..."). Two outputs that are one file
// are a fault too. Warns on stderr ("<program>: warning: ...") of each stale temporary file
// beside an output.
void check_file_flags(const std::string& program, const std::vector<FileFlag>& outputs,
                      const std::vector<FileFlag>& inputs);

// train_fashion_mnist's files: --save, --metrics and --plot (checked by the rank that
// writes files) and --resume (by every rank, which all read it). Under --distributed the
// ranks agree on the outcome, through a sum on `device`, so that a rank whose check fails
// does not leave the others waiting for it in the first all-reduce.
void check_run_files(const TrainOptions& options, const DistributedRun& dist, Device device);

}  // namespace mg::samples
