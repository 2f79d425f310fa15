// PipelineStage over real NCCL: 2 and 4 processes started by minigrad-run on one GPU
// (each its own NCCL "host", as in distributed_nccl_test.cpp), both schedules; every
// rank checks its stage's gradients and parameters against the plain module run on
// the same GPU. Skipped without a GPU; compiled only with NCCL.
#ifdef MINIGRAD_WITH_NCCL

#include <cmath>
#include <cstdlib>

#include "catch_compat.h"
#include "shell_run.h"

#include <minigrad/autograd/functions.h>
#include <minigrad/autograd/grad_mode.h>
#include <minigrad/core/backend.h>
#include <minigrad/core/generator.h>
#include <minigrad/nn/layers.h>
#include <minigrad/parallel/c10d/rendezvous.h>
#include <minigrad/parallel/pipeline/balance.h>
#include <minigrad/parallel/pipeline/pipeline_stage.h>

using namespace mg;
using namespace mg::parallel;

namespace {

const std::string kLauncher = std::string(MINIGRAD_BINARY_DIR) + "/bin/minigrad-run";
const std::string kSelf = std::string(MINIGRAD_BINARY_DIR) + "/bin/test_cuda";

std::shared_ptr<ProcessGroup> join_nccl_group() {
  const DistributedEnv env = DistributedEnv::from_environment();
  ::setenv("NCCL_HOSTID", fmt::format("minigrad-pipeline-rank-{}", env.rank).c_str(), 1);
  ::setenv("NCCL_SOCKET_IFNAME", "lo", 0);
  ProcessGroupOptions options;
  options.timeout = std::chrono::seconds(60);
  options.device_index = env.local_rank % backend(DeviceType::CUDA).device_count();
  return init_process_group("nccl", options);
}

std::shared_ptr<nn::Sequential> make_model(Device device) {
  manual_seed(5);
  auto mlp = std::make_shared<nn::Sequential>(std::initializer_list<nn::ModulePtr>{
      std::make_shared<nn::Linear>(12, 32), std::make_shared<nn::ReLU>(),
      std::make_shared<nn::Linear>(32, 32), std::make_shared<nn::ReLU>(),
      std::make_shared<nn::Linear>(32, 32), std::make_shared<nn::ReLU>(),
      std::make_shared<nn::Linear>(32, 6)});
  mlp->to(device);
  return mlp;
}

float max_diff(const Tensor& a, const Tensor& b) {
  const auto x = a.to_vector<float>(), y = b.to_vector<float>();
  float m = 0;
  for (size_t i = 0; i < x.size(); ++i) m = std::max(m, std::abs(x[i] - y[i]));
  return m;
}

}  // namespace

TEST_CASE("worker process of an NCCL pipeline job", "[.][nccl-pipeline-worker]") {
  const auto group = join_nccl_group();
  const Device gpu = group->device();
  const bool first = group->rank() == 0, last = group->rank() + 1 == group->size();
  for (Schedule schedule : {Schedule::GPipe, Schedule::OneFOneB}) {
    auto model = make_model(gpu);
    auto plain = make_model(gpu);
    const auto balance = even_balance(static_cast<int64_t>(model->size()), group->size());
    PipelineStageOptions options;
    options.chunks = 3;
    options.schedule = schedule;
    PipelineStage stage(split_stage(model, balance, group->rank()), group, options);
    const auto mine = stage.module()->named_parameters();
    const auto reference = split_stage(plain, balance, group->rank())->named_parameters();
    for (int step = 0; step < 2; ++step) {
      manual_seed(50 + static_cast<uint64_t>(step));
      const Tensor x = randn({17, 12}, gpu);  // 6 6 5
      const Tensor y = randint(0, 6, {17}, gpu);
      stage.module()->zero_grad();
      plain->zero_grad();
      const Tensor loss = stage.train_step(first ? x : Tensor(), last ? y : Tensor(), mg::parallel::cross_entropy_loss);
      const Tensor plain_loss = cross_entropy(plain->forward(x), y);
      plain_loss.backward();
      if (last) MG_CHECK(max_diff(loss, plain_loss) < 1e-4f, "loss differs at step {}", step);
      NoGradGuard no_grad;
      for (size_t k = 0; k < mine.size(); ++k) {
        MG_CHECK(max_diff(mine[k].second.grad(), reference[k].second.grad()) < 1e-4f,
                 "rank {}: grad of {} differs at step {} ({})", group->rank(), mine[k].first,
                 step, schedule_name(schedule));
        Tensor p = mine[k].second;
        p.add_(p.grad(), -0.1);
      }
      for (Tensor p : plain->parameters()) p.add_(p.grad(), -0.1);
    }
  }
  fmt::print("nccl pipeline worker {} of {}: gradients and parameters match\n", group->rank(),
             group->size());
}

TEST_CASE("NCCL: PipelineStage over 2 and 4 ranks on one GPU matches the plain module") {
  mg::testing::require_program(kLauncher);
  for (int world : {2, 4}) {
    const mg::testing::Run r = mg::testing::run_shell(
        fmt::format("{} --nproc-per-node {} {} '[nccl-pipeline-worker]'", kLauncher, world, kSelf));
    INFO(r.output);
    REQUIRE(r.exit_code == 0);
    for (int rank = 0; rank < world; ++rank)
      REQUIRE_THAT(r.output, MG_CONTAINS(fmt::format(
                                 "[rank {}] nccl pipeline worker {} of {}: gradients and "
                                 "parameters match", rank, rank, world)));
  }
}

#endif  // MINIGRAD_WITH_NCCL
