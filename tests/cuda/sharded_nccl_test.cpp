// ZeRO-1, ZeRO-2 and FSDP over real NCCL: 2 and 4 processes started by minigrad-run on
// one GPU (each its own NCCL "host", NCCL_HOSTID, sockets on loopback, as in
// distributed_nccl_test.cpp). Each rank trains an MLP whose shards split tensors (and,
// on 4 ranks, leave a rank a shard of padding alone) for three SGD-momentum steps on its
// slice of each batch; the parameters must equal the whole batch's steps on the CPU. A
// module left on the CPU is refused by fully_shard, naming both devices.
// In test_cuda, so skipped (exit 77, by test_main) without a GPU; compiled only when
// minigrad was built with NCCL. The ranks are this binary's hidden worker case below.
#ifdef MINIGRAD_WITH_NCCL

#include <chrono>
#include <cmath>
#include <cstdlib>

#include "catch_compat.h"
#include "shell_run.h"

#include <minigrad/autograd/functions.h>
#include <minigrad/core/backend.h>
#include <minigrad/core/generator.h>
#include <minigrad/nn/layers.h>
#include <minigrad/nn/optim/sgd.h>
#include <minigrad/parallel/c10d/rendezvous.h>
#include <minigrad/parallel/ddp/distributed_data_parallel.h>
#include <minigrad/parallel/sharded/fully_sharded_data_parallel.h>
#include <minigrad/parallel/sharded/zero_redundancy_optimizer.h>

using namespace mg;
using namespace mg::parallel;

namespace {

const std::string kLauncher = std::string(MINIGRAD_BINARY_DIR) + "/bin/minigrad-run";
const std::string kSelf = std::string(MINIGRAD_BINARY_DIR) + "/bin/test_cuda";
constexpr int kSteps = 3;
constexpr int64_t kRows = 8;  // the global batch: divides over 2 and 4 ranks

std::shared_ptr<ProcessGroup> join_nccl_group() {
  const DistributedEnv env = DistributedEnv::from_environment();
  ::setenv("NCCL_HOSTID", fmt::format("minigrad-test-rank-{}", env.rank).c_str(), 1);
  ::setenv("NCCL_SOCKET_IFNAME", "lo", 0);
  ProcessGroupOptions options;
  options.timeout = std::chrono::seconds(120);
  options.device_index = env.local_rank % backend(DeviceType::CUDA).device_count();
  return init_process_group("nccl", options);
}

// Units of 42, 16, 3 and 6 elements (see tests/distributed/sharding_helpers.h).
std::shared_ptr<nn::Sequential> make_net(uint64_t seed) {
  manual_seed(seed);
  return std::make_shared<nn::Sequential>(std::initializer_list<nn::ModulePtr>{
      std::make_shared<nn::Linear>(5, 7), std::make_shared<nn::ReLU>(),
      std::make_shared<nn::Linear>(7, 2), std::make_shared<nn::ReLU>(),
      std::make_shared<nn::Linear>(2, 1), std::make_shared<nn::Linear>(1, 3)});
}

struct Batch {
  Tensor x, y;
};

Batch batch_of_step(int step) {
  manual_seed(static_cast<uint64_t>(50 + step));
  return {randn(Shape{kRows, 5}), randint(0, 3, Shape{kRows})};
}

std::vector<float> values_of(const std::vector<Tensor>& tensors) {
  std::vector<float> out;
  for (const Tensor& t : tensors) {
    const auto v = t.to(Device::cpu()).contiguous().to_vector<float>();
    out.insert(out.end(), v.begin(), v.end());
  }
  return out;
}

float max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  MG_CHECK(a.size() == b.size(), "sizes {} and {}", a.size(), b.size());
  float m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::abs(a[i] - b[i]));
  return m;
}

std::unique_ptr<optim::Optimizer> sgd(std::vector<Tensor> params) {
  return std::make_unique<optim::SGD>(std::move(params), optim::SGDOptions(0.1).momentum(0.9));
}

}  // namespace

TEST_CASE("worker process of an NCCL job: ZeRO-1, ZeRO-2, FSDP", "[.][sharded-nccl-worker]") {
  auto pg = join_nccl_group();
  const int rank = pg->rank(), world = pg->size();
  const Device gpu = pg->device();
  const int64_t per = kRows / world;

  // The reference: one process on the CPU, the whole batch.
  auto reference = make_net(77);
  auto ref_opt = sgd(reference->parameters());
  for (int step = 0; step < kSteps; ++step) {
    const Batch b = batch_of_step(step);
    ref_opt->zero_grad();
    cross_entropy(reference->forward(b.x), b.y).backward();
    ref_opt->step();
  }
  const std::vector<float> expected = values_of(reference->parameters());

  // A module left on the CPU is refused before any collective, on every rank alike.
  try {
    fully_shard(make_net(1), pg);
    MG_FAIL("fully_shard took a module on the CPU over an NCCL group");
  } catch (const Error& e) {
    MG_CHECK(std::string(e.what()).find("is on cpu, but the process group (nccl) works on cuda") != std::string::npos,
             "fully_shard's message for a module on the CPU: {}", e.what());
  }

  std::string line;
  for (int stage : {1, 2, 3}) {
    auto net = make_net(77 + static_cast<uint64_t>(rank));  // rank 0's weights win
    net->to(gpu);
    nn::ModulePtr forward = net;
    std::shared_ptr<FullyShardedDataParallel> fsdp;
    std::unique_ptr<optim::Optimizer> opt;
    if (stage == 1) forward = std::make_shared<DistributedDataParallel>(net, pg);
    if (stage == 3) {
      fsdp = std::make_shared<FullyShardedDataParallel>(net, pg);
      forward = fsdp;
      opt = sgd(fsdp->parameters());
    } else {
      ZeroOptions options;
      options.stage = stage;
      options.bucket_cap_mb = 4.0 / (1 << 20);  // a bucket per tensor
      opt = std::make_unique<ZeroRedundancyOptimizer>(net->parameters(), pg, sgd, options);
    }
    for (int step = 0; step < kSteps; ++step) {
      const Batch b = batch_of_step(step);
      opt->zero_grad();
      cross_entropy(forward->forward(b.x.narrow(0, rank * per, per).to(gpu)),
                    b.y.narrow(0, rank * per, per).to(gpu))
          .backward();
      opt->step();
    }
    std::vector<float> got;
    if (fsdp) {
      const nn::TensorDict full = fsdp->full_state_dict();  // on rank 0
      if (rank != 0) continue;
      for (const auto& [name, p] : net->named_parameters()) {
        const auto v = full.at(name).to(Device::cpu()).to_vector<float>();
        got.insert(got.end(), v.begin(), v.end());
      }
    } else {
      got = values_of(net->parameters());
    }
    const float diff = max_abs_diff(got, expected);
    MG_CHECK(diff < 1e-4f, "ZeRO-{}: parameters differ from the whole batch's by {}", stage, diff);
    line += fmt::format(" ZeRO-{} max |diff| {:.3g};", stage, diff);
  }
  fmt::print("sharded nccl worker {} of {} on {}:{}\n", rank, world, gpu, line);
}

TEST_CASE(
    "NCCL: ZeRO-1, ZeRO-2 and FSDP on 2 and 4 ranks of one GPU equal the whole batch's steps") {
  mg::testing::require_program(kLauncher);
  for (int world : {2, 4}) {
    const mg::testing::Run r = mg::testing::run_shell(
        fmt::format("{} --nproc-per-node {} {} '[sharded-nccl-worker]'", kLauncher, world, kSelf));
    INFO(r.output);
    REQUIRE(r.exit_code == 0);
    for (int rank = 0; rank < world; ++rank)
      REQUIRE_THAT(r.output, MG_CONTAINS(fmt::format("[rank {}] sharded nccl worker {} of {}",
                                                     rank, rank, world)));
    REQUIRE_THAT(r.output, MG_CONTAINS("ZeRO-3 max |diff|"));
  }
}

#endif  // MINIGRAD_WITH_NCCL
