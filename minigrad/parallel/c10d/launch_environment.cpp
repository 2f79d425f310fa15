#include <minigrad/parallel/c10d/launch_environment.h>

#include <algorithm>
#include <charconv>
#include <cstdlib>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <minigrad/core/error.h>
#include <minigrad/parallel/c10d/store/run_id.h>

namespace mg::parallel {

namespace {

using Getenv = std::function<const char*(const char*)>;

constexpr const char* kHint =
    "minigrad-run and torchrun set MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE and LOCAL_RANK; "
    "mpirun and srun set their own, which minigrad reads too (docs/launching.md)";
constexpr int kMaxInt = 1 << 30;

bool is_set(const Getenv& getenv, const char* name) {
  const char* value = getenv(name);
  return value != nullptr && *value != '\0';
}

int read_int(const Getenv& getenv, const char* name, const int* fallback, int low, int high) {
  const char* value = getenv(name);
  if (value == nullptr || *value == '\0') {
    MG_CHECK(fallback != nullptr, "rendezvous: environment variable {} is not set ({})", name,
             kHint);
    return *fallback;
  }
  const std::string s(value);
  int result = 0;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), result);
  MG_CHECK(ec == std::errc() && end == s.data() + s.size(),
           "rendezvous: environment variable {}='{}' is not an integer", name, s);
  MG_CHECK(result >= low && result <= high,
           "rendezvous: environment variable {}={} is outside [{}, {}]", name, result, low, high);
  return result;
}

bool read_bool(const Getenv& getenv, const char* name) {
  const char* value = getenv(name);
  if (value == nullptr) return false;
  const std::string s(value);
  if (s == "True" || s == "true" || s == "1") return true;
  if (s.empty() || s == "False" || s == "false" || s == "0") return false;
  MG_FAIL("rendezvous: environment variable {}='{}' is neither True nor False", name, s);
}

// Rank and size as each launcher would have them; they must agree where both are set.
struct LauncherRanks {
  const char* rank_var;
  const char* size_var;
  Launcher launcher;
};
constexpr LauncherRanks kOpenMPI{"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", Launcher::OpenMPI};
constexpr LauncherRanks kSlurm{"SLURM_PROCID", "SLURM_NTASKS", Launcher::Slurm};

// RANK/WORLD_SIZE beside another launcher's rank and size. A launcher per node (torchrun
// or minigrad-run under srun) gives a different world size: that nests, fine. The same
// size with another rank is a contradiction (`mpirun -x RANK=0` hands every rank RANK=0).
void check_agrees(const Getenv& getenv, const LaunchEnvironment& env, const char* rank_var,
                  const char* size_var, const LauncherRanks& other) {
  if (!is_set(getenv, other.rank_var) || !is_set(getenv, other.size_var)) return;
  const int other_rank = read_int(getenv, other.rank_var, nullptr, 0, kMaxInt);
  const int other_size = read_int(getenv, other.size_var, nullptr, 1, kMaxInt);
  MG_CHECK(other_size != env.world_size || other_rank == env.rank,
           "rendezvous: ambiguous environment: {}={} {}={} ({}) but {}={} {}={} ({}); the two "
           "launchers place this process differently. Unset one (was {} exported to every rank?)",
           rank_var, env.rank, size_var, env.world_size, launcher_name(env.launcher),
           other.rank_var, other_rank, other.size_var, other_size, launcher_name(other.launcher),
           rank_var);
}

// The run id: MINIGRAD_RUN_ID or TORCHELASTIC_RUN_ID, else the launcher's job id made into
// one by `fallback` (only then read, and checked as they are: it names the store's keys).
void read_run_id(const Getenv& getenv, LaunchEnvironment& env,
                 const std::function<std::string()>& fallback) {
  for (const char* name : {"MINIGRAD_RUN_ID", "TORCHELASTIC_RUN_ID"}) {
    const char* id = getenv(name);
    if (id == nullptr || *id == '\0') continue;
    env.run_id = id;
    check_run_id(env.run_id, fmt::format("rendezvous: environment variable {}", name));
    return;
  }
  env.run_id = fallback();
}

// `prefix` and the values of the `names` that are set, joined by '.' ("slurm-77.3"), each
// checked as a run id is, naming its variable; "default" when the first is unset.
std::string job_run_id(const Getenv& getenv, const std::string& prefix,
                       std::initializer_list<const char*> names) {
  std::string id = prefix;
  for (const char* name : names) {
    if (!is_set(getenv, name)) {
      if (id == prefix) return "default";
      continue;
    }
    const std::string value = getenv(name);
    check_run_id(value, fmt::format("rendezvous: environment variable {} (which makes the run "
                                    "id unless MINIGRAD_RUN_ID is set)",
                                    name));
    id += (id == prefix ? "" : ".") + value;
  }
  check_run_id(id, fmt::format("rendezvous: the run id made of {}", fmt::join(names, " and ")));
  return id;
}

void read_master(const Getenv& getenv, LaunchEnvironment& env, const std::string& default_addr,
                 const std::string& why_no_default) {
  if (is_set(getenv, "MASTER_ADDR")) {
    env.master_addr = getenv("MASTER_ADDR");
  } else {
    MG_CHECK(!default_addr.empty(), "rendezvous: environment variable MASTER_ADDR is not set "
             "under {}, and {} (set MASTER_ADDR to rank 0's host)",
             launcher_name(env.launcher), why_no_default);
    env.master_addr = default_addr;
  }
  const int default_port = kDefaultMasterPort;
  env.master_port = read_int(getenv, "MASTER_PORT", &default_port, 1, 65535);
}

void check_ranks(const LaunchEnvironment& env, const char* rank_var, const char* size_var,
                 const char* local_var, const char* local_size_var) {
  MG_CHECK(env.rank < env.world_size,
           "rendezvous: {}={} must be below {}={} (ranks are 0 .. {}-1)", rank_var, env.rank,
           size_var, env.world_size, size_var);
  MG_CHECK(env.local_rank <= env.rank, "rendezvous: {}={} cannot exceed {}={}", local_var,
           env.local_rank, rank_var, env.rank);
  MG_CHECK(env.local_rank < env.local_world_size, "rendezvous: {}={} must be below {}={}",
           local_var, env.local_rank, local_size_var, env.local_world_size);
}

LaunchEnvironment from_torchrun_variables(const Getenv& getenv) {
  LaunchEnvironment env;
  if (is_set(getenv, "TORCHELASTIC_RUN_ID") || is_set(getenv, "TORCHELASTIC_USE_AGENT_STORE"))
    env.launcher = Launcher::Torchrun;
  else if (is_set(getenv, "MINIGRAD_RUN_ID"))
    env.launcher = Launcher::MinigradRun;
  const char* addr = getenv("MASTER_ADDR");
  MG_CHECK(addr != nullptr && *addr != '\0',
           "rendezvous: environment variable MASTER_ADDR is not set ({})", kHint);
  env.master_addr = addr;
  env.master_port = read_int(getenv, "MASTER_PORT", nullptr, 1, 65535);
  env.world_size = read_int(getenv, "WORLD_SIZE", nullptr, 1, kMaxInt);
  env.rank = read_int(getenv, "RANK", nullptr, 0, kMaxInt);
  MG_CHECK(env.rank < env.world_size,
           "rendezvous: RANK={} must be below WORLD_SIZE={} (ranks are 0 .. WORLD_SIZE-1)",
           env.rank, env.world_size);
  env.local_rank = read_int(getenv, "LOCAL_RANK", nullptr, 0, kMaxInt);
  const int default_local = env.world_size;
  env.local_world_size = read_int(getenv, "LOCAL_WORLD_SIZE", &default_local, 1, env.world_size);
  check_ranks(env, "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE");
  env.use_agent_store = read_bool(getenv, "TORCHELASTIC_USE_AGENT_STORE");
  const int no_restart = 0;
  env.restart_count = read_int(getenv, "TORCHELASTIC_RESTART_COUNT", &no_restart, 0, kMaxInt);
  read_run_id(getenv, env, [] { return std::string("default"); });
  // torchrun keeps its own variables apart from an outer launcher's (one agent per node).
  if (env.launcher != Launcher::Torchrun) {
    check_agrees(getenv, env, "RANK", "WORLD_SIZE", kOpenMPI);
    check_agrees(getenv, env, "RANK", "WORLD_SIZE", kSlurm);
  }
  return env;
}

LaunchEnvironment from_open_mpi(const Getenv& getenv) {
  LaunchEnvironment env;
  env.launcher = Launcher::OpenMPI;
  env.rank = read_int(getenv, "OMPI_COMM_WORLD_RANK", nullptr, 0, kMaxInt);
  env.world_size = read_int(getenv, "OMPI_COMM_WORLD_SIZE", nullptr, 1, kMaxInt);
  env.local_rank = read_int(getenv, "OMPI_COMM_WORLD_LOCAL_RANK", nullptr, 0, kMaxInt);
  env.local_world_size =
      read_int(getenv, "OMPI_COMM_WORLD_LOCAL_SIZE", &env.world_size, 1, env.world_size);
  check_ranks(env, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
              "OMPI_COMM_WORLD_LOCAL_SIZE");
  check_agrees(getenv, env, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", kSlurm);
  // Open MPI does not say where rank 0 runs; on one node it is here.
  const bool one_node = env.local_world_size == env.world_size;
  read_master(getenv, env, one_node ? "127.0.0.1" : "",
              fmt::format("its {} ranks span several nodes", env.world_size));
  read_run_id(getenv, env,
              [&] { return job_run_id(getenv, "ompi-", {"OMPI_MCA_ess_base_jobid"}); });
  return env;
}

LaunchEnvironment from_slurm(const Getenv& getenv) {
  LaunchEnvironment env;
  env.launcher = Launcher::Slurm;
  env.rank = read_int(getenv, "SLURM_PROCID", nullptr, 0, kMaxInt);
  env.world_size = read_int(getenv, "SLURM_NTASKS", nullptr, 1, kMaxInt);
  env.local_rank = read_int(getenv, "SLURM_LOCALID", nullptr, 0, kMaxInt);
  // SLURM_NTASKS_PER_NODE is set only when asked for (--ntasks-per-node); otherwise the
  // count per node may differ from node to node and is not needed here.
  env.local_world_size =
      read_int(getenv, "SLURM_NTASKS_PER_NODE", &env.world_size, 1, env.world_size);
  if (env.local_rank >= env.local_world_size) env.local_world_size = env.world_size;
  check_ranks(env, "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE");
  std::string first_host;
  for (const char* name : {"SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"}) {
    if (!is_set(getenv, name)) continue;
    try {
      first_host = first_host_of_nodelist(getenv(name));
    } catch (const Error& e) {
      MG_FAIL("rendezvous: environment variable {}: {}", name, e.what());
    }
    break;
  }
  read_master(getenv, env, first_host, "neither SLURM_STEP_NODELIST nor SLURM_JOB_NODELIST is set");
  read_run_id(getenv, env,
              [&] { return job_run_id(getenv, "slurm-", {"SLURM_JOB_ID", "SLURM_STEP_ID"}); });
  return env;
}

}  // namespace

const char* launcher_name(Launcher launcher) {
  switch (launcher) {
    case Launcher::Torchrun: return "torchrun";
    case Launcher::MinigradRun: return "minigrad-run";
    case Launcher::Environment: return "environment variables";
    case Launcher::OpenMPI: return "mpirun (Open MPI)";
    case Launcher::Slurm: return "srun (Slurm)";
  }
  return "an unknown launcher";
}

std::string LaunchEnvironment::describe() const {
  return fmt::format("rank {} of {} (local {} of {}) under {}, store at {}:{}{}", rank,
                     world_size, local_rank, local_world_size, launcher_name(launcher),
                     master_addr, master_port, use_agent_store ? " (torchrun's agent)" : "");
}

LaunchEnvironment LaunchEnvironment::from(const Getenv& getenv) {
  if (is_set(getenv, "RANK") || is_set(getenv, "WORLD_SIZE") || is_set(getenv, "LOCAL_RANK"))
    return from_torchrun_variables(getenv);
  if (is_set(getenv, "OMPI_COMM_WORLD_RANK")) return from_open_mpi(getenv);
  if (is_set(getenv, "SLURM_PROCID")) return from_slurm(getenv);
  // None: name what torchrun sets first (the usual launcher), then the others.
  return from_torchrun_variables(getenv);
}

LaunchEnvironment LaunchEnvironment::from_environment() {
  return from([](const char* name) { return std::getenv(name); });
}

bool in_launched_job() {
  for (const char* name : {"RANK", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID"}) {
    const char* value = std::getenv(name);
    if (value != nullptr && *value != '\0') return true;
  }
  return false;
}

namespace {

// Whether the decimal digits `a` stand for a larger number than `b` (leading zeros aside).
bool greater_number(const std::string& a, const std::string& b) {
  const std::string x = a.substr(std::min(a.find_first_not_of('0'), a.size()));
  const std::string y = b.substr(std::min(b.find_first_not_of('0'), b.size()));
  return x.size() != y.size() ? x.size() > y.size() : x > y;
}

}  // namespace

std::string first_host_of_nodelist(const std::string& nodelist) {
  MG_CHECK(!nodelist.empty() && nodelist.size() <= 65536,
           "node list of {} characters: expected 1 to 65536", nodelist.size());
  std::string host;          // the first host, built while the first entry is read
  bool in_first = true;      // before the first ',' outside brackets
  bool in_brackets = false, skipping = false;
  std::string entry_start, entry_end;  // the bracket entry being read: "07" or "07-09"
  bool in_range = false;
  // A bracket entry ends at ',' or ']': it must have a start, and a range an end above it.
  const auto end_entry = [&](char c) {
    MG_CHECK(!entry_start.empty() || c != ']' || skipping, "node list '{}' has an empty bracket",
             nodelist);
    MG_CHECK(!entry_start.empty(), "node list '{}' has an empty entry in brackets", nodelist);
    if (in_range) {
      MG_CHECK(!entry_end.empty(), "node list '{}' has a range without an end", nodelist);
      MG_CHECK(!greater_number(entry_start, entry_end),
               "node list '{}' has the descending range {}-{}; a Slurm range goes up ({}-{})",
               nodelist, entry_start, entry_end, entry_end, entry_start);
    }
    entry_start.clear();
    entry_end.clear();
    in_range = false;
  };
  for (const char c : nodelist) {
    const bool digit = c >= '0' && c <= '9';
    if (in_brackets) {
      if (digit) {
        if (in_range) {
          entry_end += c;
        } else {
          entry_start += c;
          if (in_first && !skipping) host += c;
        }
      } else if (c == '-') {
        MG_CHECK(!entry_start.empty(), "node list '{}' has a range without a start", nodelist);
        MG_CHECK(!in_range, "node list '{}' has a range with two '-'", nodelist);
        in_range = true;
        skipping = true;  // the rest of the bracket: other hosts
      } else if (c == ',') {
        end_entry(c);
        skipping = true;
      } else if (c == ']') {
        end_entry(c);
        in_brackets = false;
      } else {
        MG_FAIL("node list '{}' has '{}' inside brackets, where only numbers and ranges go",
                nodelist, c);
      }
    } else if (c == '[') {
      in_brackets = true;
      skipping = false;
    } else if (c == ',') {
      MG_CHECK(!host.empty() || !in_first, "node list '{}' names no host", nodelist);
      in_first = false;  // the end of the first host's entry; the others are only checked
    } else if (digit || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '-' ||
               c == '.' || c == '_') {
      if (in_first) host += c;
    } else {
      MG_FAIL("node list '{}' has the character '{}'", nodelist, c);
    }
  }
  MG_CHECK(!in_brackets, "node list '{}' has an unclosed bracket", nodelist);
  MG_CHECK(!host.empty(), "node list '{}' names no host", nodelist);
  return host;
}

}  // namespace mg::parallel
