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
  std::string flag;  // "--save", or what names a derived file ("--trace (rank 1's file)")
  std::string path;  // empty: the flag was not given
  // An output that another process writes (another rank's trace file): only compared with
  // the others, not checked for writing here. An input: the output flag that may name the
  // same file ("--save" for --resume: a run continues its own checkpoint).
  bool written_elsewhere = false;
  std::string may_be_replaced_by;
};

// Checks every output and input; the first fault is an OptionError that begins with the
// flag and names the path ("--save: cannot write 'x': ..."). Two outputs that are one file,
// or an output that is an input (except as that input allows), are a fault too: whether
// two paths are one file is decided by what they resolve to (files::file_identity: device
// and inode, or the directory's and the name for a file not there yet), never by their
// spelling. Warns on stderr ("<program>: warning: ...") of each stale temporary file
// beside an output.
void check_file_flags(const std::string& program, const std::vector<FileFlag>& outputs,
                      const std::vector<FileFlag>& inputs);

// train_fashion_mnist's files: --save, --metrics, --plot and --trace (checked by the rank
// that writes files, which also compares them with the trace file of every rank,
// FILE.rank<r>.json), each rank's own trace file (by that rank) and --resume (by every
// rank, which all read it). Under --distributed the
// ranks agree on the outcome, through a sum on `device`, so that a rank whose check fails
// does not leave the others waiting for it in the first all-reduce.
void check_run_files(const TrainOptions& options, const DistributedRun& dist, Device device);

}  // namespace mg::samples
