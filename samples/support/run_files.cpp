#include "run_files.h"

#include <cstdio>
#include <exception>
#include <map>

#include <fmt/format.h>

#include <minigrad/core/files.h>
#include <minigrad/core/tensor.h>

#include "command_line.h"
#include "trace.h"

namespace mg::samples {

namespace {

void warn_of_stale_temp_files(const std::string& program, const FileFlag& output) {
  for (const files::StaleTempFile& stale : files::stale_temp_files(output.path)) {
    const std::string owner =
        stale.running
            ? fmt::format("process {} is still running: another run writing it?", stale.pid)
            : fmt::format("process {} is not running", stale.pid);
    fmt::print(stderr,
               "{}: warning: {} is the temporary file of a write to {} that never finished ({}); "
               "nothing uses it, remove it\n",
               program, stale.path, output.path, owner);
  }
}

}  // namespace

void check_file_flags(const std::string& program, const std::vector<FileFlag>& outputs,
                      const std::vector<FileFlag>& inputs) {
  try {
    std::map<files::FileIdentity, const FileFlag*> output_at;
    for (const FileFlag& output : outputs) {
      if (output.path.empty()) continue;
      if (!output.written_elsewhere) files::check_writable(output.flag.c_str(), output.path);
      const files::FileIdentity id = files::file_identity(output.flag.c_str(), output.path);
      const auto [it, inserted] = output_at.emplace(id, &output);
      if (!inserted)
        throw OptionError(fmt::format(
            "{} and {} name the same file ('{}' and '{}'); one would replace the other: give "
            "each its own",
            it->second->flag, output.flag, it->second->path, output.path));
    }
    for (const FileFlag& input : inputs) {
      if (input.path.empty()) continue;
      files::open_for_reading(input.flag.c_str(), input.path);
      const auto it = output_at.find(files::file_identity(input.flag.c_str(), input.path));
      if (it != output_at.end() && it->second->flag != input.may_be_replaced_by)
        throw OptionError(fmt::format(
            "{} '{}' is the file that {} '{}' writes; it would be replaced by what is not "
            "{}: give {} a file of its own",
            input.flag, input.path, it->second->flag, it->second->path, input.flag,
            it->second->flag));
    }
  } catch (const OptionError&) {
    throw;
  } catch (const Error& e) {
    throw OptionError(e.what());
  }
  for (const FileFlag& output : outputs)
    if (!output.path.empty() && !output.written_elsewhere) warn_of_stale_temp_files(program, output);
}

void check_run_files(const TrainOptions& options, const DistributedRun& dist, Device device) {
  std::vector<FileFlag> outputs{{"--save", options.save, false, ""},
                                {"--metrics", options.metrics, false, ""},
                                {"--plot", options.plot, false, ""},
                                {"--trace", options.trace.path, false, ""}};
  const std::vector<FileFlag> inputs{{"--resume", options.resume, false, "--save"}};
  const char* program = "train_fashion_mnist";
  if (!dist.active()) return check_file_flags(program, outputs, inputs);

  // Every rank writes a trace file of its own, which rank 0 then merges into --trace.
  if (!options.trace.path.empty()) {
    for (int r = 0; r < dist.world_size; ++r) {
      if (!dist.writes_files() && r != dist.rank) continue;
      outputs.push_back({fmt::format("--trace (rank {}'s file)", r),
                         rank_trace_path(options.trace.path, r), r != dist.rank, ""});
    }
  }
  if (!dist.writes_files())
    outputs.erase(outputs.begin(), outputs.begin() + 4);  // rank 0's alone
  std::exception_ptr fault;
  try {
    check_file_flags(program, outputs, inputs);
  } catch (const Error&) {
    fault = std::current_exception();
  }
  Tensor faults = full({}, fault ? 1.0 : 0.0, DType::Float32, device);
  sum_over_ranks(dist, {faults});
  // A rank that found a fault says why before any rank leaves: the ranks that only learned
  // of it wait in a second sum until then. Otherwise the first of them to exit makes the
  // launcher stop the job, which could cut the one message that matters.
  if (fault) {
    int exit_code = 1;
    try {
      std::rethrow_exception(fault);
    } catch (const std::exception& e) {
      exit_code = report_error(program, e);
    }
    fault = std::make_exception_ptr(ReportedError(exit_code));
  }
  if (faults.item<float>() != 0.0f) {
    Tensor said = full({}, 0.0, DType::Float32, device);
    sum_over_ranks(dist, {said});
  }
  if (fault) std::rethrow_exception(fault);
  if (faults.item<float>() != 0.0f)
    throw OptionError(
        fmt::format("rank {}: the files given to another rank cannot be used (its "
                    "message says why); stopping before the run starts",
                    dist.rank));
}

}  // namespace mg::samples
