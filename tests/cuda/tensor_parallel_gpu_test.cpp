// Tensor parallelism on the GPU: in one process over cuda:0 named 2 and 4 times (the host
// communicator's copies on one device) and over distinct GPUs (NCCL) where there are
// several; across processes with NCCL ranks on the one GPU (NCCL_HOSTID, as
// distributed_nccl_test.cpp), tensor parallelism over all ranks and, with 4, the 2 x 2
// mesh with DDP over the data-parallel groups. Each equals the plain model on the whole
// batch (parallel/tp_check.h); a column layer without the backward all-reduce does not.
// Skipped (exit 77) without a GPU.
#include <cstdlib>

#include "catch_compat.h"
#include "parallel/tp_check.h"
#include "shell_run.h"

#include <minigrad/core/backend.h>
#include <minigrad/core/ops.h>
#include <minigrad/parallel/c10d/device_mesh.h>
#include <minigrad/parallel/c10d/rendezvous.h>
#include <minigrad/parallel/ddp/distributed_data_parallel.h>
#include <minigrad/parallel/devices/device_list.h>

using namespace mg;

namespace {

std::vector<Device> gpu0_times(size_t n) { return std::vector<Device>(n, Device::cuda(0)); }

// GPU matmuls of different shapes may pick different kernels: a little looser than CPU.
constexpr double kRtol = 1e-4, kAtol = 1e-5;

void require_matches(const std::vector<Device>& devices) {
  for (const std::vector<int64_t>& widths :
       {std::vector<int64_t>{7, 12, 5, 8, 3}, std::vector<int64_t>{33, 64, 17, 64, 10}}) {
    for (int64_t batch : {5, 67}) {
      INFO(fmt::format("widths {}, batch {}, devices {}", fmt::join(widths, "-"), batch,
                       parallel::device_list_str(devices)));
      const auto m = mg::testing::tensor_parallel_against_plain(
          widths, batch, devices, 3, mg::testing::default_shard, kRtol, kAtol);
      INFO(m.where);
      REQUIRE(m.ok());
    }
  }
  const auto wrong = mg::testing::tensor_parallel_against_plain(
      {7, 12, 5, 8, 3}, 5, devices, 3, mg::testing::shard_without_backward_all_reduce, kRtol, kAtol);
  REQUIRE_FALSE(wrong.ok());
}

}  // namespace

TEST_CASE("TensorParallel on cuda:0 twice and four times matches the plain model [gpu]") {
  require_matches(gpu0_times(2));
  require_matches(gpu0_times(4));
}

TEST_CASE("TensorParallel over distinct GPUs uses NCCL and matches the plain model [gpu]") {
  const int count = mg::cuda::device_count();
  if (count < 2) return;  // one GPU: the repeated-device test above covers this machine
  std::vector<Device> gpus;
  for (int i = 0; i < std::min(count, 4); ++i) gpus.push_back(Device::cuda(i));
  if (gpus.size() == 3) gpus.pop_back();  // the test widths split over 2 or 4
#ifdef MINIGRAD_WITH_NCCL
  REQUIRE(parallel::InProcessGroup(gpus).communicator_name() == "nccl");
#endif
  require_matches(gpus);
}

#ifdef MINIGRAD_WITH_NCCL

namespace {

const std::string kLauncher = std::string(MINIGRAD_BINARY_DIR) + "/bin/minigrad-run";
const std::string kSelf = std::string(MINIGRAD_BINARY_DIR) + "/bin/test_cuda";

// A rank of the job on the one GPU, its own NCCL "host", sockets on loopback.
std::shared_ptr<parallel::ProcessGroup> join_nccl_group() {
  const parallel::DistributedEnv env = parallel::DistributedEnv::from_environment();
  ::setenv("NCCL_HOSTID", fmt::format("minigrad-tp-rank-{}", env.rank).c_str(), 1);
  ::setenv("NCCL_SOCKET_IFNAME", "lo", 0);
  parallel::ProcessGroupOptions options;
  options.timeout = std::chrono::seconds(120);
  options.device_index = env.local_rank % backend(DeviceType::CUDA).device_count();
  return parallel::init_process_group("nccl", options);
}

mg::testing::ShardedModel rank_shard(const nn::Sequential& plain,
                                     const parallel::TensorParallelGroupPtr& group,
                                     const mg::testing::MakeShard& make_shard) {
  mg::testing::ShardedModel sharded;
  sharded.model = make_shard(plain, group);
  sharded.shards = {{group->rank(), sharded.model}};
  sharded.ranks = group->size();
  return sharded;
}

}  // namespace

TEST_CASE("worker process of an NCCL tensor-parallel job", "[.][tp-nccl-worker]") {
  auto world = join_nccl_group();
  const Device gpu = world->device();
  auto tp = parallel::tensor_parallel_group(world);
  const auto right = mg::testing::sharded_against_plain(
      {7, 12, 5, 8, 3}, 5, gpu, 3,
      [&](const nn::Sequential& plain) { return rank_shard(plain, tp, mg::testing::default_shard); },
      kRtol, kAtol);
  MG_CHECK(right.ok(), "tensor parallelism over {} NCCL ranks: {}", world->size(), right.where);
  const auto wrong = mg::testing::sharded_against_plain(
      {7, 12, 5, 8, 3}, 5, gpu, 3,
      [&](const nn::Sequential& plain) {
        return rank_shard(plain, tp, mg::testing::shard_without_backward_all_reduce);
      },
      kRtol, kAtol);
  MG_CHECK(!wrong.ok(), "the column layer without the backward all-reduce passed the check");

  std::string mesh_result = "no mesh";
  if (world->size() == 4) {
    parallel::DeviceMesh mesh(world, 2, 2);
    auto mesh_tp = parallel::tensor_parallel_group(mesh.tp_group());
    const auto m = mg::testing::sharded_against_plain(
        {9, 8, 4, 5}, 6, gpu, 3,
        [&](const nn::Sequential& plain) {
          mg::testing::ShardedModel sharded;
          auto shard = parallel::parallelize_mlp(plain, mesh_tp);
          sharded.model = std::make_shared<parallel::DistributedDataParallel>(shard, mesh.dp_group());
          sharded.shards = {{mesh_tp->rank(), shard}};
          sharded.ranks = mesh_tp->size();
          sharded.rows = [&mesh](const Tensor& t) {
            const int64_t half = t.size(0) / 2;
            return t.narrow(0, mesh.dp_rank() * half, half);
          };
          sharded.loss = [&mesh](const Tensor& loss) {
            Tensor mean = ops::clone(loss.detach());
            mesh.dp_group()->allreduce(mean, parallel::ReduceOp::Average)->wait();
            return mean;
          };
          return sharded;
        },
        kRtol, kAtol);
    MG_CHECK(m.ok(), "2 x 2 mesh over NCCL ranks: {}", m.where);
    mesh_result = "2 x 2 mesh ok";
  }
  fmt::print("tp nccl worker {} of {} on {}: tensor parallel ok (worst {:.3g}), {}\n",
             world->rank(), world->size(), gpu, right.worst, mesh_result);
}

TEST_CASE("NCCL: tensor parallelism over 2 and 4 ranks on one GPU, and the 2 x 2 mesh with DDP") {
  mg::testing::require_program(kLauncher);
  for (int world : {2, 4}) {
    const mg::testing::Run r = mg::testing::run_shell(
        fmt::format("{} --nproc-per-node {} {} '[tp-nccl-worker]'", kLauncher, world, kSelf));
    INFO(r.output);
    REQUIRE(r.exit_code == 0);
    for (int rank = 0; rank < world; ++rank)
      REQUIRE_THAT(r.output, MG_CONTAINS(fmt::format("[rank {}] tp nccl worker {} of {}", rank,
                                                     rank, world)));
    if (world == 4) REQUIRE_THAT(r.output, MG_CONTAINS("2 x 2 mesh ok"));
  }
}

#endif  // MINIGRAD_WITH_NCCL
