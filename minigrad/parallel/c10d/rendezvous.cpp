#include <minigrad/parallel/c10d/rendezvous.h>

#include <fmt/format.h>

#include <minigrad/core/error.h>
#include <minigrad/parallel/c10d/store/torch_store_client.h>

#ifdef MINIGRAD_WITH_GLOO
#include <minigrad/parallel/c10d/gloo/process_group_gloo.h>
#endif
#ifdef MINIGRAD_WITH_NCCL
#include <minigrad/parallel/c10d/nccl/process_group_nccl.h>
#endif

namespace mg::parallel {

std::shared_ptr<Store> make_store(const DistributedEnv& env, std::chrono::milliseconds timeout) {
  if (env.use_agent_store) {
    TorchStoreClientOptions options;
    options.timeout = timeout;
    options.rank = env.rank;
    options.run_id = env.run_id;
    // The agent's store outlives a restart of the workers: each attempt has keys of its own.
    options.key_prefix = fmt::format("minigrad/{}/attempt_{}/", env.run_id, env.restart_count);
    return std::make_shared<TorchStoreClient>(env.master_addr, env.master_port, options);
  }
  TCPStoreOptions options;
  options.is_server = env.rank == 0;
  options.timeout = timeout;
  options.rank = env.rank;
  options.run_id = env.run_id;
  return std::make_shared<TCPStore>(env.master_addr, env.master_port, options);
}

std::shared_ptr<ProcessGroup> new_process_group(const std::string& backend,
                                                std::shared_ptr<Store> store, int rank,
                                                int size, ProcessGroupOptions options) {
  if (backend == "gloo") {
#ifdef MINIGRAD_WITH_GLOO
    return std::make_shared<ProcessGroupGloo>(std::move(store), rank, size, options);
#else
    MG_FAIL("init_process_group: minigrad was built without Gloo, so the \"gloo\" backend is "
            "unavailable (install libgloo-dev and reconfigure with -DMINIGRAD_GLOO=ON)");
#endif
  }
  if (backend == "nccl") {
#ifdef MINIGRAD_WITH_NCCL
    return std::make_shared<ProcessGroupNccl>(std::move(store), rank, size, options);
#else
    MG_FAIL("init_process_group: minigrad was built without NCCL, so the \"nccl\" backend is "
            "unavailable (build with CUDA and NCCL, or use \"gloo\" for CPU processes)");
#endif
  }
  MG_FAIL("init_process_group: unknown backend \"{}\" (expected \"gloo\" or \"nccl\")", backend);
}

std::shared_ptr<ProcessGroup> init_process_group(const std::string& backend,
                                                 ProcessGroupOptions options) {
  MG_CHECK(backend == "gloo" || backend == "nccl",
           "init_process_group: unknown backend \"{}\" (expected \"gloo\" or \"nccl\")", backend);
  const DistributedEnv env = DistributedEnv::from_environment();
  if (backend == "nccl" && options.device_index < 0) options.device_index = env.local_rank;
  return new_process_group(backend, make_store(env, options.timeout), env.rank, env.world_size,
                           options);
}

}  // namespace mg::parallel
