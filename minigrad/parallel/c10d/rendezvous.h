// Rendezvous: how the processes of a job find each other, from the environment their
// launcher sets (launch_environment.h reads it: torchrun, minigrad-run, mpirun, srun):
//   MASTER_ADDR, MASTER_PORT   where the store is served: by rank 0 (a TCPStore), or
//                              under torchrun by its agent (TORCHELASTIC_USE_AGENT_STORE;
//                              every rank a TorchStoreClient)
//   RANK, WORLD_SIZE           this process's rank among all processes of the job
//   LOCAL_RANK                 its rank on this machine (which GPU it takes)
//   LOCAL_WORLD_SIZE           processes on this machine (optional)
//   MINIGRAD_RUN_ID            the job's id (minigrad-run sets it; else torchrun's
//                              TORCHELASTIC_RUN_ID; else "default"): the store refuses
//                              a rank whose id differs, naming both
//
//   auto pg = parallel::init_process_group("gloo");      // or "nccl"
//   auto model = std::make_shared<parallel::DistributedDataParallel>(net, pg);
#pragma once

#include <functional>
#include <memory>
#include <string>

#include <minigrad/parallel/c10d/launch_environment.h>
#include <minigrad/parallel/c10d/process_group.h>
#include <minigrad/parallel/c10d/store/tcp_store.h>

namespace mg::parallel {

// The environment of this process's job (kept under its older name).
using DistributedEnv = LaunchEnvironment;

// The store of this job: served by rank 0, joined by every rank (connecting with retry
// until `timeout`, since rank 0 may start last); under torchrun with its agent's store
// (env.use_agent_store), a client of that store for every rank, rank 0 included.
std::shared_ptr<Store> make_store(const DistributedEnv& env, std::chrono::milliseconds timeout);

// A process group of the backend "gloo" or "nccl" over `store`. An unknown backend, or one
// minigrad was built without, is an mg::Error that says so.
std::shared_ptr<ProcessGroup> new_process_group(const std::string& backend,
                                                std::shared_ptr<Store> store, int rank,
                                                int size, ProcessGroupOptions options = {});

// The whole rendezvous from the environment: reads DistributedEnv, makes the store and
// the group. For "nccl", options.device_index defaults to LOCAL_RANK.
std::shared_ptr<ProcessGroup> init_process_group(const std::string& backend,
                                                 ProcessGroupOptions options = {});

}  // namespace mg::parallel
