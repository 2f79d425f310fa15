#include <minigrad/parallel/c10d/rendezvous.h>

#include <charconv>
#include <cstdlib>

#include <minigrad/core/error.h>

#ifdef MINIGRAD_WITH_GLOO
#include <minigrad/parallel/c10d/gloo/process_group_gloo.h>
#endif
#ifdef MINIGRAD_WITH_NCCL
#include <minigrad/parallel/c10d/nccl/process_group_nccl.h>
#endif

namespace mg::parallel {

namespace {

constexpr const char* kHint =
    "minigrad-run and torchrun set MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE and LOCAL_RANK";

int read_int(const std::function<const char*(const char*)>& getenv, const char* name,
             const int* fallback, int low, int high) {
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

}  // namespace

DistributedEnv DistributedEnv::from(const std::function<const char*(const char*)>& getenv) {
  DistributedEnv env;
  const char* addr = getenv("MASTER_ADDR");
  MG_CHECK(addr != nullptr && *addr != '\0',
           "rendezvous: environment variable MASTER_ADDR is not set ({})", kHint);
  env.master_addr = addr;
  constexpr int kMaxInt = 1 << 30;
  env.master_port = read_int(getenv, "MASTER_PORT", nullptr, 1, 65535);
  env.world_size = read_int(getenv, "WORLD_SIZE", nullptr, 1, kMaxInt);
  env.rank = read_int(getenv, "RANK", nullptr, 0, kMaxInt);
  MG_CHECK(env.rank < env.world_size,
           "rendezvous: RANK={} must be below WORLD_SIZE={} (ranks are 0 .. WORLD_SIZE-1)",
           env.rank, env.world_size);
  env.local_rank = read_int(getenv, "LOCAL_RANK", nullptr, 0, kMaxInt);
  MG_CHECK(env.local_rank <= env.rank,
           "rendezvous: LOCAL_RANK={} cannot exceed RANK={}", env.local_rank, env.rank);
  const int default_local = env.world_size;
  env.local_world_size = read_int(getenv, "LOCAL_WORLD_SIZE", &default_local, 1, env.world_size);
  MG_CHECK(env.local_rank < env.local_world_size,
           "rendezvous: LOCAL_RANK={} must be below LOCAL_WORLD_SIZE={}", env.local_rank,
           env.local_world_size);
  for (const char* name : {"MINIGRAD_RUN_ID", "TORCHELASTIC_RUN_ID"}) {
    const char* id = getenv(name);
    if (id == nullptr || *id == '\0') continue;
    env.run_id = id;
    check_run_id(env.run_id, fmt::format("rendezvous: environment variable {}", name));
    break;
  }
  return env;
}

DistributedEnv DistributedEnv::from_environment() {
  return from([](const char* name) { return std::getenv(name); });
}

std::shared_ptr<TCPStore> make_store(const DistributedEnv& env, std::chrono::milliseconds timeout) {
  TCPStoreOptions options;
  options.is_server = env.rank == 0;
  options.timeout = timeout;
  options.rank = env.rank;
  options.run_id = env.run_id;
  return std::make_shared<TCPStore>(env.master_addr, env.master_port, options);
}

std::shared_ptr<ProcessGroup> new_process_group(const std::string& backend,
                                                std::shared_ptr<TCPStore> store, int rank,
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
