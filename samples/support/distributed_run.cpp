#include "distributed_run.h"

#include <chrono>

#include <fmt/format.h>

#include <minigrad/parallel/c10d/device_mesh.h>
#include <minigrad/parallel/c10d/rendezvous.h>

#include "command_line.h"

namespace mg::samples {

DistributedRun join_job(double timeout_seconds, std::vector<Device>& devices) {
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
  return run;
}

DistributedRun join_distributed_run(double timeout_seconds, int64_t global_batch,
                                    int tensor_parallel, std::vector<Device>& devices) {
  DistributedRun run = join_job(timeout_seconds, devices);
  run.data_group = run.group;
  run.data_rank = run.rank;
  run.data_ranks = run.world_size;
  if (tensor_parallel > 1) {
    if (run.world_size % tensor_parallel != 0)
      throw OptionError(fmt::format("--tensor-parallel {} does not divide the {} ranks of the job",
                                    tensor_parallel, run.world_size));
    if (tensor_parallel == run.world_size) {  // one model over every rank: no data parallelism
      run.tensor_group = run.group;
      run.data_group = nullptr;
      run.data_rank = 0;
      run.data_ranks = 1;
    } else {
      const parallel::DeviceMesh mesh(run.group, run.world_size / tensor_parallel, tensor_parallel);
      run.tensor_group = mesh.tp_group();
      run.data_group = mesh.dp_group();
      run.data_rank = mesh.dp_rank();
      run.data_ranks = mesh.dp_size();
    }
  }
  if (global_batch % run.data_ranks != 0)
    throw OptionError(fmt::format(
        "--distributed: --batch-size {} (the global batch) must divide evenly over the {} "
        "data-parallel ranks",
        global_batch, run.data_ranks));
  return run;
}

void sum_over_ranks(const DistributedRun& dist, const std::vector<Tensor>& tensors) {
  if (dist.active()) dist.group->allreduce(tensors)->wait();
}

void sum_over_data_ranks(const DistributedRun& dist, const std::vector<Tensor>& tensors) {
  if (dist.data_group) dist.data_group->allreduce(tensors)->wait();
}

}  // namespace mg::samples
