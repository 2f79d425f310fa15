// A program outside the minigrad tree, through the installed library and <minigrad/minigrad.h>
// alone: one gradient step, then every documented class named and the one-process
// forms of each parallelism run (a job of one rank for the process-group ones).
#include <map>
#include <type_traits>

#include <minigrad/minigrad.h>

namespace {

template <typename... T>
constexpr bool all_classes() {
  return (std::is_class_v<T> && ...);
}

// The user API's classes, each named as a user names it: a class missing from
// minigrad.h (or from the install) fails this program's build.
static_assert(all_classes<
              mg::Tensor, mg::Device, mg::Shape, mg::Error, mg::Generator, mg::Stream, mg::Event,
              mg::DeviceGuard, mg::StreamGuard, mg::NoGradGuard, mg::AutoGradMode,
              mg::DetectAnomalyGuard, mg::CrossEntropyOptions, mg::profiler::ProfilerOptions,
              mg::cuda::CUDAGraph, mg::nn::Module, mg::nn::Linear, mg::nn::ReLU,
              mg::nn::Sequential, mg::nn::CrossEntropyLoss, mg::nn::Checkpoint,
              mg::nn::LoadOptions, mg::nn::FusionGuard, mg::nn::ColumnParallelLinear,
              mg::nn::RowParallelLinear, mg::optim::Optimizer, mg::optim::SGD, mg::optim::Adam,
              mg::optim::AdamW, mg::data::Dataset, mg::data::TensorDataset,
              mg::data::RandomDataset, mg::data::FashionMNIST, mg::data::DataLoader,
              mg::data::Sampler, mg::data::SequentialSampler, mg::data::RandomSampler,
              mg::data::DistributedSampler, mg::data::IdxArray, mg::parallel::Communicator,
              mg::parallel::DataParallel, mg::parallel::ProcessGroup, mg::parallel::Store,
              mg::parallel::TCPStore, mg::parallel::TorchStoreClient,
              mg::parallel::LaunchEnvironment, mg::parallel::DeviceMesh,
              mg::parallel::DistributedDataParallel, mg::parallel::ZeroRedundancyOptimizer,
              mg::parallel::FullyShardedDataParallel, mg::parallel::Pipe,
              mg::parallel::PipelineStage, mg::parallel::TensorParallel,
              mg::parallel::InProcessGroup, mg::parallel::TensorParallelGroup,
              mg::parallel::Placement, mg::parallel::ParameterPiece
#ifdef MINIGRAD_WITH_GLOO
              , mg::parallel::ProcessGroupGloo
#endif
              >());

bool check(bool ok, const char* what) {
  fmt::print("consumer: {} -> {}\n", what, ok ? "ok" : "WRONG");
  return ok;
}

std::shared_ptr<mg::nn::Sequential> mlp() {
  mg::manual_seed(1);
  return std::make_shared<mg::nn::Sequential>(std::initializer_list<mg::nn::ModulePtr>{
      std::make_shared<mg::nn::Linear>(4, 6), std::make_shared<mg::nn::ReLU>(),
      std::make_shared<mg::nn::Linear>(6, 4), std::make_shared<mg::nn::ReLU>(),
      std::make_shared<mg::nn::Linear>(4, 3)});
}

}  // namespace

int main() {
  using namespace mg;
  bool ok = true;
  Tensor w = from_vector(std::vector<float>{1, 2, 3}, {3}).set_requires_grad(true);
  (w * w).sum().backward();
  ok &= check(w.grad().to_vector<float>() == std::vector<float>{2, 4, 6}, "one gradient step");

  manual_seed(2);
  const Tensor x = randn({6, 4});
  const Tensor y = randint(0, 3, {6});
  const std::vector<Device> two_cpus{Device::cpu(), Device::cpu()};

  // DataParallel, a pipeline and tensor parallelism in one process, over two CPU devices.
  parallel::DataParallel dp(mlp(), two_cpus);
  cross_entropy(dp.forward(x), y).backward();
  ok &= check(dp.module()->parameters()[0].grad().defined(), "DataParallel");
  parallel::PipeOptions pipe_options;
  pipe_options.chunks = 2;
  auto pipe = std::make_shared<parallel::Pipe>(mlp(), two_cpus, pipe_options);
  ok &= check(pipe->forward(x).shape() == Shape{6, 3}, "Pipe");
  parallel::TensorParallel tp(*mlp(), two_cpus);
  cross_entropy(tp.forward(x), y).backward();
  const float norm = parallel::clip_grad_norm_(tp.parameters(), nullptr, 0.01).item<float>();
  ok &= check(norm > 0.01f, "TensorParallel and its clip_grad_norm_");
  std::vector<nn::NamedTensor> shards;
  for (int r = 0; r < 2; ++r)
    for (const auto& named : tp.shard(r)->named_parameters()) shards.push_back(named);
  ok &= check(parallel::full_state_dict(shards, nullptr).size() == mlp()->named_parameters().size(),
              "full_state_dict of the TensorParallel's shards");

  // The launcher's environment, as mpirun would set it.
  const std::map<std::string, std::string> vars = {{"OMPI_COMM_WORLD_RANK", "0"},
                                                   {"OMPI_COMM_WORLD_SIZE", "1"},
                                                   {"OMPI_COMM_WORLD_LOCAL_RANK", "0"}};
  const auto env = parallel::LaunchEnvironment::from([&](const char* name) -> const char* {
    auto it = vars.find(name);
    return it == vars.end() ? nullptr : it->second.c_str();
  });
  ok &= check(env.launcher == parallel::Launcher::OpenMPI && env.master_port == 29500,
              "LaunchEnvironment");

#ifdef MINIGRAD_WITH_GLOO
  // A job of one rank: DDP, ZeRO and FSDP over Gloo, rendezvous through a TCPStore.
  parallel::TCPStoreOptions store_options;
  store_options.is_server = true;
  store_options.rank = 0;
  auto store = std::make_shared<parallel::TCPStore>("127.0.0.1", 0, store_options);
  auto pg = std::make_shared<parallel::ProcessGroupGloo>(store, 0, 1);
  parallel::DistributedDataParallel ddp(mlp(), pg);
  cross_entropy(ddp.forward(x), y).backward();
  auto net = mlp();
  parallel::ZeroRedundancyOptimizer opt(
      net->parameters(), pg,
      [](std::vector<Tensor> shards) { return std::make_unique<optim::AdamW>(shards); });
  cross_entropy(net->forward(x), y).backward();
  opt.step();
  auto fsdp = std::make_shared<parallel::FullyShardedDataParallel>(mlp(), pg);
  cross_entropy(fsdp->forward(x), y).backward();
  ok &= check(true, "DistributedDataParallel, ZeroRedundancyOptimizer, FullyShardedDataParallel");
#endif
  return ok ? 0 : 1;
}
