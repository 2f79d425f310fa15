#include "run_files.h"

#include <cstdio>
#include <exception>
#include <map>

#include <fmt/format.h>

#include <minigrad/core/files.h>
#include <minigrad/core/tensor.h>

#include "command_line.h"

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
    std::map<std::string, std::string> flag_of_target;
    for (const FileFlag& output : outputs) {
      if (output.path.empty()) continue;
      files::check_writable(output.flag.c_str(), output.path);
      const std::string target = files::write_target(output.flag.c_str(), output.path);
      const auto [it, inserted] = flag_of_target.emplace(target, output.flag);
      if (!inserted)
        throw OptionError(fmt::format("{} and {} name the same file, '{}'; give each its own",
                                      it->second, output.flag, target));
    }
    for (const FileFlag& input : inputs)
      if (!input.path.empty()) files::open_for_reading(input.flag.c_str(), input.path);
  } catch (const OptionError&) {
    throw;
  } catch (const Error& e) {
    throw OptionError(e.what());
  }
  for (const FileFlag& output : outputs)
    if (!output.path.empty()) warn_of_stale_temp_files(program, output);
}

void check_run_files(const TrainOptions& options, const DistributedRun& dist, Device device) {
  const std::vector<FileFlag> outputs{
      {"--save", options.save},
      {"--metrics", options.metrics},
      {"--plot", options.plot},
      {"--trace", options.trace.path}};
  const std::vector<FileFlag> inputs{{"--resume", options.resume}};
  const char* program = "train_fashion_mnist";
  if (!dist.active()) return check_file_flags(program, outputs, inputs);

  std::exception_ptr fault;
  try {
    check_file_flags(program, dist.writes_files() ? outputs : std::vector<FileFlag>{}, inputs);
  } catch (const Error&) {
    fault = std::current_exception();
  }
  Tensor faults = full({}, fault ? 1.0 : 0.0, DType::Float32, device);
  sum_over_ranks(dist, {faults});
  if (fault) std::rethrow_exception(fault);
  if (faults.item<float>() != 0.0f)
    throw OptionError(
        fmt::format("rank {}: the files given to another rank cannot be used (its "
                    "message says why); stopping before the run starts",
                    dist.rank));
}

}  // namespace mg::samples
