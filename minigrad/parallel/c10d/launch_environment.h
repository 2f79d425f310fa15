// Which launcher started this process, and what it says: the one place that reads the
// environment of a distributed job (rendezvous.h's init_process_group uses it).
//
//   torchrun, minigrad-run   RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR,
//                            MASTER_PORT; torchrun also TORCHELASTIC_RUN_ID,
//                            TORCHELASTIC_RESTART_COUNT and TORCHELASTIC_USE_AGENT_STORE
//                            (true: its agent serves the store, every rank is a client)
//   mpirun (Open MPI)        OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK, _LOCAL_SIZE
//   srun (Slurm)             SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURM_STEP_NODELIST
//                            (else SLURM_JOB_NODELIST), SLURM_JOB_ID, SLURM_STEP_ID
//
// torchrun's variables (RANK...) win when present: minigrad-run or torchrun started this
// process, perhaps one per node under srun or mpirun. Otherwise Open MPI's, then Slurm's.
// Under mpirun and srun MASTER_ADDR and MASTER_PORT are read when set; else the store is
// served on port 29500 (PyTorch's default) of the first host of the Slurm step's node list,
// or of 127.0.0.1 when every Open MPI rank is on this node (otherwise MASTER_ADDR is
// required). A rank that two launchers would place differently (RANK set for every rank
// by `mpirun -x RANK=0`, say) is an mg::Error naming both, never a guess.
#pragma once

#include <functional>
#include <string>

namespace mg::parallel {

enum class Launcher { Torchrun, MinigradRun, Environment, OpenMPI, Slurm };

// "torchrun", "minigrad-run", "environment variables", "mpirun (Open MPI)", "srun (Slurm)".
const char* launcher_name(Launcher launcher);

// PyTorch's default MASTER_PORT, used under mpirun and srun when none is set.
constexpr int kDefaultMasterPort = 29500;

struct LaunchEnvironment {
  Launcher launcher = Launcher::Environment;
  std::string master_addr;
  int master_port = 0;
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;
  // The job's id: MINIGRAD_RUN_ID, else TORCHELASTIC_RUN_ID, else Slurm's job and step or
  // Open MPI's job id, else "default". The store refuses a rank of another job.
  std::string run_id = "default";
  // torchrun's agent serves the store on MASTER_PORT: connect to it, do not serve one.
  bool use_agent_store = false;
  // TORCHELASTIC_RESTART_COUNT: the agent's store outlives a restart, so each attempt
  // keeps its keys apart.
  int restart_count = 0;

  // "rank 1 of 2 (local 1 of 2) under mpirun (Open MPI), store at 127.0.0.1:29500"
  std::string describe() const;

  // Reads the variables above; a missing, invalid or contradictory one is an mg::Error
  // naming it (and the launcher it belongs to).
  static LaunchEnvironment from_environment();
  // The same over any lookup (tests pass a map); `getenv` returns null for "unset".
  static LaunchEnvironment from(const std::function<const char*(const char*)>& getenv);
};

// Whether a launcher started this process as a rank of a job: RANK (torchrun,
// minigrad-run), OMPI_COMM_WORLD_RANK (mpirun) or SLURM_PROCID (srun) is set. Programs
// that also run alone ask this before init_process_group.
bool in_launched_job();

// The first host of a Slurm node list in its compressed form: "node[01-04],gpu7" ->
// "node01", "rack[2-3]-n[5,7]" -> "rack2-n5". The whole list is checked: a malformed one
// (a descending range "a[03-01]" among them) is an mg::Error naming it.
std::string first_host_of_nodelist(const std::string& nodelist);

}  // namespace mg::parallel
