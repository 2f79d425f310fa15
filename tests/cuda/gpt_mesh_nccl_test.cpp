// The GPT split over real NCCL: its plans over cp and tp (models/gpt_plan.h), then cut over
// pp and replicated over dp (parallel::MeshPipeline; every dimension possibly 1) on 4 and 8 processes started by minigrad-run on one GPU, each its
// own NCCL "host" (as in distributed_nccl_test.cpp). The same code ran on Gloo ranks in
// tests/distributed/test_gpt_4d.cpp; here its tensors live on the GPU and its collectives
// and messages (tp all-reduces and all-gathers, sequence parallelism's reduce-scatters,
// ring attention's sends, the pipeline's activations, the tied gradient's sum) go through
// NCCL. Every rank checks its part against the single-device GPT on the same GPU and the
// whole batch: the loss, every gradient of the first step, the parameters after 3 AdamW
// steps, in float32 (the GPU's log-softmax is float32 only), without biases for the
// reason test_gpt_context_parallel.cpp gives. Skipped without a GPU; compiled with NCCL.
#ifdef MINIGRAD_WITH_NCCL

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "catch_compat.h"
#include "shell_run.h"

#include <minigrad/autograd/grad_mode.h>
#include <minigrad/core/backend.h>
#include <minigrad/core/generator.h>
#include <minigrad/core/ops.h>
#include <minigrad/models/gpt.h>
#include <minigrad/models/gpt_plan.h>
#include <minigrad/nn/optim/adam.h>
#include <minigrad/parallel/c10d/device_mesh.h>
#include <minigrad/parallel/c10d/rendezvous.h>
#include <minigrad/parallel/loss_parallel.h>
#include <minigrad/parallel/pipeline/mesh_pipeline.h>
#include <minigrad/parallel/placement.h>

using namespace mg;

namespace {

const std::string kLauncher = std::string(MINIGRAD_BINARY_DIR) + "/bin/minigrad-run";
const std::string kSelf = std::string(MINIGRAD_BINARY_DIR) + "/bin/test_cuda";

std::shared_ptr<parallel::ProcessGroup> join_nccl_group() {
  const parallel::DistributedEnv env = parallel::DistributedEnv::from_environment();
  ::setenv("NCCL_HOSTID", fmt::format("minigrad-gpt-mesh-rank-{}", env.rank).c_str(), 1);
  ::setenv("NCCL_SOCKET_IFNAME", "lo", 0);
  parallel::ProcessGroupOptions options;
  options.timeout = std::chrono::seconds(120);
  options.device_index = env.local_rank % backend(DeviceType::CUDA).device_count();
  return parallel::init_process_group("nccl", options);
}

double max_abs(const Tensor& t) {
  return ops::to_dtype(ops::abs_max(t), DType::Float64).item<double>();
}

// One configuration: the mesh's sizes, sequence parallelism and model chunks per rank.
struct Split {
  int dp = 1, pp = 1, cp = 1, tp = 1;
  bool sp = false;
  int model_chunks = 1;
  std::string name() const {
    return fmt::format("dp{} pp{} cp{} tp{}{}{}", dp, pp, cp, tp, sp ? " sp" : "",
                       model_chunks > 1 ? fmt::format(" v{}", model_chunks) : "");
  }
};

// Read from MINIGRAD_TEST_GPT_MESH: "dp pp cp tp sp v", set by the parent case.
Split split_from_environment() {
  const char* text = std::getenv("MINIGRAD_TEST_GPT_MESH");
  MG_CHECK(text != nullptr, "the worker needs MINIGRAD_TEST_GPT_MESH");
  Split s;
  int sp = 0;
  MG_CHECK(std::sscanf(text, "%d %d %d %d %d %d", &s.dp, &s.pp, &s.cp, &s.tp, &sp, &s.model_chunks) == 6,
           "MINIGRAD_TEST_GPT_MESH: expected 'dp pp cp tp sp v', got '{}'", text);
  s.sp = sp != 0;
  return s;
}

}  // namespace

TEST_CASE("worker process of an NCCL GPT mesh job", "[.][nccl-gpt-mesh-worker]") {
  const Split split = split_from_environment();
  const auto world = join_nccl_group();
  const Device gpu = world->device();
  parallel::DeviceMesh mesh(world, {{"dp", split.dp}, {"pp", split.pp}, {"cp", split.cp}, {"tp", split.tp}});

  models::GPTConfig config;
  config.bias = false;
  config.block_size = 16;
  config.vocab_size = 18;
  config.n_layer = 4;
  config.n_head = 2;
  config.n_embd = 10;  // heads of 5
  config.dropout = 0.0;
  manual_seed(1234);
  models::GPT gpt(config);
  const int64_t B = 5, T = 8;  // rows 3 + 2 over dp 2; T cut in 2 x cp chunks
  const Tensor x = randint(0, config.vocab_size, {B, T});
  std::vector<int64_t> yv = randint(0, config.vocab_size, {B, T}).to_vector<int64_t>();
  for (size_t i = 2; i < yv.size(); i += 5) yv[i] = -1;  // some targets ignored
  const Tensor y = from_vector(yv, Shape{B, T});

  auto reference = std::static_pointer_cast<models::GPT>(gpt.clone());
  reference->to(gpu);
  gpt.to(gpu);
  models::parallelize_gpt(gpt, mesh, split.sp);
  parallel::MeshPipelineOptions options;
  options.micro_batches = 2;
  if (split.model_chunks > 1) options.schedule = parallel::Schedule::Interleaved1F1B;
  auto model = std::make_unique<parallel::MeshPipeline>(
      gpt, mesh, models::gpt_pipeline_cut(config, split.pp, split.model_chunks), options);
  int64_t targets = 0;
  for (int64_t t : yv) targets += t != -1;
  const auto share = [&mesh, targets](const Tensor& out, const Tensor& t) {
    parallel::LossParallel loss_parallel(mesh);
    return mul(models::GPT::loss(out, t, Reduction::Sum), 1.0 / static_cast<double>(targets));
  };
  // The part of the single-device tensor `full` that this rank's `p` holds.
  const auto part_of = [](const Tensor& p, const Tensor& full) {
    const parallel::ParameterSpec* spec = parallel::spec_of(p);
    return spec ? parallel::local_part(spec->pieces[0], full) : full;
  };
  const Tensor x_local = model->local_batch(x.to(gpu)), y_local = model->local_batch(y.to(gpu));
  const Tensor x_gpu = x.to(gpu), y_gpu = y.to(gpu);

  optim::AdamW reference_opt(reference->parameters(), optim::AdamWOptions(1e-3));
  optim::AdamW opt(model->parameters(), optim::AdamWOptions(1e-3));
  const auto whole = [&](const std::string& name) -> const Tensor& {
    return reference->parameter(name == "lm_head.weight" ? "transformer.wte.weight" : name);
  };
  double loss_error = 0, grad_error = 0, param_error = 0;
  std::string worst;
  for (int step = 0; step < 3; ++step) {
    reference_opt.zero_grad();
    const Tensor reference_loss = models::GPT::loss(reference->forward(x_gpu), y_gpu);
    reference_loss.backward();
    model->zero_grad();
    const Tensor loss = model->train_step(x_local, y_local, share);
    const double want = reference_loss.item<float>();
    loss_error = std::max(loss_error, std::abs(loss.item<float>() - want) / std::abs(want));
    if (step == 0)
      for (const auto& [name, p] : model->named_parameters()) {
        const Tensor expected = part_of(p, whole(name).grad());
        const double err = max_abs(p.grad() - expected) / std::max(max_abs(expected), 1e-6);
        if (err > grad_error) {
          grad_error = err;
          worst = name;
        }
      }
    reference_opt.step();
    opt.step();
  }
  NoGradGuard no_grad;
  for (const auto& [name, p] : model->named_parameters())
    param_error = std::max(param_error, max_abs(p - part_of(p, whole(name))));
  MG_CHECK(loss_error < 1e-5 && grad_error < 1e-4 && param_error < 1e-4,
           "{} rank {}: loss {:.2e}, gradient {:.2e} ({}), parameter {:.2e}", split.name(),
           world->rank(), loss_error, grad_error, worst, param_error);
  fmt::print("nccl gpt mesh worker {} of {} ({}): loss {:.1e}, gradients {:.1e}, parameters {:.1e}\n",
             world->rank(), world->size(), split.name(), loss_error, grad_error, param_error);
}

TEST_CASE("NCCL: the GPT on a dp x pp x cp x tp mesh on one GPU matches the single-device GPT") {
  mg::testing::require_program(kLauncher);
  for (const Split& split : {Split{1, 2, 1, 2, true, 1}, Split{1, 2, 1, 1, false, 2},
                             Split{1, 1, 2, 2, false, 1}, Split{2, 2, 1, 2, false, 1}}) {
    const int world = split.dp * split.pp * split.cp * split.tp;
    const mg::testing::Run r = mg::testing::run_shell(fmt::format(
        "MINIGRAD_TEST_GPT_MESH='{} {} {} {} {} {}' {} --nproc-per-node {} {} '[nccl-gpt-mesh-worker]'",
        split.dp, split.pp, split.cp, split.tp, split.sp ? 1 : 0, split.model_chunks, kLauncher,
        world, kSelf));
    INFO(split.name() << "\n" << r.output);
    REQUIRE(r.exit_code == 0);
    for (int rank = 0; rank < world; ++rank)
      REQUIRE_THAT(r.output, MG_CONTAINS(fmt::format("[rank {}] nccl gpt mesh worker {} of {} ({})",
                                                     rank, rank, world, split.name())));
  }
}

#endif  // MINIGRAD_WITH_NCCL
