// Rendezvous: how the processes of a job find each other, from the environment
// variables that torchrun (and minigrad-run) set:
//   MASTER_ADDR, MASTER_PORT   where rank 0 serves the TCPStore
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

#include <minigrad/parallel/c10d/process_group.h>
#include <minigrad/parallel/c10d/store/tcp_store.h>

namespace mg::parallel {

struct DistributedEnv {
  std::string master_addr;
  int master_port = 0;
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;
  std::string run_id = "default";

  // Reads the variables above; a missing or invalid one is an mg::Error naming it.
  static DistributedEnv from_environment();
  // The same over any lookup (tests pass a map); `getenv` returns null for "unset".
  static DistributedEnv from(const std::function<const char*(const char*)>& getenv);
};

// The store of this job: served by rank 0, joined by every rank (connecting with retry
// until `timeout`, since rank 0 may start last).
std::shared_ptr<TCPStore> make_store(const DistributedEnv& env, std::chrono::milliseconds timeout);

// A process group of the backend "gloo" or "nccl" over `store`. An unknown backend, or one
// minigrad was built without, is an mg::Error that says so.
std::shared_ptr<ProcessGroup> new_process_group(const std::string& backend,
                                                std::shared_ptr<TCPStore> store, int rank,
                                                int size, ProcessGroupOptions options = {});

// The whole rendezvous from the environment: reads DistributedEnv, makes the store and
// the group. For "nccl", options.device_index defaults to LOCAL_RANK.
std::shared_ptr<ProcessGroup> init_process_group(const std::string& backend,
                                                 ProcessGroupOptions options = {});

}  // namespace mg::parallel
