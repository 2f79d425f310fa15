// Reading torchrun's environment variables, and choosing a backend.
#include <map>

#include "catch_compat.h"

#include <minigrad/parallel/c10d/rendezvous.h>

using namespace mg;
using namespace mg::parallel;

namespace {

DistributedEnv parse(const std::map<std::string, std::string>& vars) {
  return DistributedEnv::from([&](const char* name) -> const char* {
    auto it = vars.find(name);
    return it == vars.end() ? nullptr : it->second.c_str();
  });
}

std::map<std::string, std::string> full_env() {
  return {{"MASTER_ADDR", "10.0.0.7"}, {"MASTER_PORT", "29500"}, {"RANK", "5"},
          {"WORLD_SIZE", "8"},         {"LOCAL_RANK", "1"},      {"LOCAL_WORLD_SIZE", "4"}};
}

}  // namespace

TEST_CASE("rendezvous: the torchrun variables are read") {
  const DistributedEnv env = parse(full_env());
  REQUIRE(env.master_addr == "10.0.0.7");
  REQUIRE(env.master_port == 29500);
  REQUIRE(env.rank == 5);
  REQUIRE(env.world_size == 8);
  REQUIRE(env.local_rank == 1);
  REQUIRE(env.local_world_size == 4);

  auto vars = full_env();
  vars.erase("LOCAL_WORLD_SIZE");  // optional: defaults to the world size
  REQUIRE(parse(vars).local_world_size == 8);
}

TEST_CASE("rendezvous: a missing variable is named in the error") {
  for (const char* name : {"MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK"}) {
    auto vars = full_env();
    vars.erase(name);
    REQUIRE_THROWS_WITH(parse(vars), MG_CONTAINS(fmt::format("{} is not set", name)));
  }
}

TEST_CASE("rendezvous: an invalid variable is named with its value") {
  auto vars = full_env();
  vars["RANK"] = "two";
  REQUIRE_THROWS_WITH(parse(vars), MG_CONTAINS("RANK='two' is not an integer"));
  vars = full_env();
  vars["MASTER_PORT"] = "70000";
  REQUIRE_THROWS_WITH(parse(vars), MG_CONTAINS("MASTER_PORT=70000 is outside [1, 65535]"));
  vars = full_env();
  vars["RANK"] = "8";
  REQUIRE_THROWS_WITH(parse(vars), MG_CONTAINS("RANK=8 must be below WORLD_SIZE=8"));
  vars = full_env();
  vars["LOCAL_RANK"] = "4";
  REQUIRE_THROWS_WITH(parse(vars), MG_CONTAINS("LOCAL_RANK=4 must be below LOCAL_WORLD_SIZE=4"));
  vars = full_env();
  vars["WORLD_SIZE"] = "0";
  REQUIRE_THROWS_WITH(parse(vars), MG_CONTAINS("WORLD_SIZE=0 is outside"));
}

TEST_CASE("rendezvous: the job's id comes from MINIGRAD_RUN_ID, else TORCHELASTIC_RUN_ID") {
  auto vars = full_env();
  REQUIRE(parse(vars).run_id == "default");
  vars["TORCHELASTIC_RUN_ID"] = "torch-7f3a";
  REQUIRE(parse(vars).run_id == "torch-7f3a");
  vars["MINIGRAD_RUN_ID"] = "minigrad-run-0123abcd";
  REQUIRE(parse(vars).run_id == "minigrad-run-0123abcd");
  vars["MINIGRAD_RUN_ID"] = "no/slashes";
  REQUIRE_THROWS_WITH(parse(vars), MG_CONTAINS("environment variable MINIGRAD_RUN_ID: run id "
                                               "'no/slashes' has the character '/'"));
}

TEST_CASE("rendezvous: make_store gives the store the job's id") {
  DistributedEnv env;
  env.master_addr = "127.0.0.1";
  env.master_port = 0;
  env.run_id = "env-job";
  auto store = make_store(env, std::chrono::seconds(10));
  REQUIRE(store->run_id() == "env-job");
  store->set("k", "v");
  REQUIRE(store->get("k") == "v");
}

TEST_CASE("rendezvous: an unknown or missing backend is a clear error") {
  REQUIRE_THROWS_WITH(init_process_group("mpi"), MG_CONTAINS("unknown backend \"mpi\""));
#ifndef MINIGRAD_WITH_NCCL
  TCPStoreOptions options;
  options.is_server = true;
  auto store = std::make_shared<TCPStore>("127.0.0.1", 0, options);
  REQUIRE_THROWS_WITH(new_process_group("nccl", store, 0, 1),
                      MG_CONTAINS("minigrad was built without NCCL"));
#endif
}
