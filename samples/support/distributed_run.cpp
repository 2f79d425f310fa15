#include "distributed_run.h"

#include <chrono>

#include <fmt/format.h>

#include <minigrad/parallel/distributed/rendezvous.h>

#include "command_line.h"

namespace mg::samples {

DistributedRun join_distributed_run(double timeout_seconds, int64_t global_batch,
                                    std::vector<Device>& devices) {
  const parallel::DistributedEnv env = parallel::DistributedEnv::from_environment();
  const Device device = devices[static_cast<size_t>(env.local_rank) % devices.size()];
  devices = {device};
  parallel::ProcessGroupOptions pg_options;
  pg_options.timeout = std::chrono::milliseconds(static_cast<int64_t>(timeout_seconds * 1000));
  pg_options.device_index = device.is_cuda() ? device.index() : -1;
  DistributedRun run;
  run.group = parallel::init_process_group(device.is_cuda() ? "nccl" : "gloo", pg_options);
  run.rank = run.group->rank();
  run.world_size = run.group->size();
  if (global_batch % run.world_size != 0)
    throw OptionError(fmt::format(
        "--distributed: --batch-size {} (the global batch) must divide evenly over the {} ranks",
        global_batch, run.world_size));
  return run;
}

void sum_over_ranks(const DistributedRun& dist, const std::vector<Tensor>& tensors) {
  if (dist.active()) dist.group->allreduce(tensors)->wait();
}

}  // namespace mg::samples
