// What a Pipe says when something is wrong: a failing stage (named, with its
// micro-batch and pass), bad chunks, a model that is not a Sequential, a bad balance,
// and a memory plan that does not fit.
#include "catch_compat.h"

#include <atomic>

#include "core/host_backed_cuda.h"
#include "parallel/pipe_check.h"

using mg::Device;
using mg::Tensor;
using mg::parallel::Checkpoint;
using mg::parallel::Pipe;
using mg::parallel::PipeOptions;
using mg::parallel::Schedule;

namespace {

// Passes its input through, and throws on its `fail_at`-th call (0-based).
class Thrower : public mg::nn::Cloneable<Thrower> {
 public:
  explicit Thrower(int fail_at) : Cloneable<Thrower>("Thrower"), fail_at_(fail_at) {}
  Tensor forward(const Tensor& x) override {
    if (calls_++ == fail_at_) MG_FAIL("boom on call {}", fail_at_);
    return x;
  }

 private:
  int fail_at_;
  int calls_ = 0;
};

std::shared_ptr<mg::nn::Sequential> with_thrower(int fail_at) {
  return std::make_shared<mg::nn::Sequential>(std::initializer_list<mg::nn::ModulePtr>{
      std::make_shared<mg::nn::Linear>(4, 6), std::make_shared<mg::nn::ReLU>(),
      std::make_shared<Thrower>(fail_at), std::make_shared<mg::nn::Linear>(6, 3)});
}

PipeOptions options_of(int64_t chunks, Checkpoint checkpoint = Checkpoint::Never,
                       Schedule schedule = Schedule::GPipe) {
  PipeOptions o;
  o.chunks = chunks;
  o.checkpoint = checkpoint;
  o.schedule = schedule;
  o.check_memory = false;  // the dry run would call the Thrower too
  o.balance = {2, 2};
  return o;
}

}  // namespace

TEST_CASE("Pipe: a stage that throws is named with its micro-batch and pass, and the Pipe still works") {
  mg::manual_seed(51);
  const Tensor x = mg::randn({8, 4});
  const Tensor y = mg::randint(0, 3, {8});
  {
    // The Thrower is in stage 1; its third call is micro-batch 2's forward.
    Pipe pipe(with_thrower(2), mg::testing::cpus(2), options_of(4));
    REQUIRE_THROWS_WITH(pipe.train_step(x, y, mg::parallel::cross_entropy_loss),
                        MG_CONTAINS("Pipe: stage 1 (on cpu) failed in the forward of "
                                    "micro-batch 2: boom on call 2"));
    // A failed step leaves nothing behind: the next one runs.
    const auto step = pipe.train_step(x, y, mg::parallel::cross_entropy_loss);
    REQUIRE(step.loss.defined());
  }
  {
    // Checkpointed, the forward runs again in backward: call 4 is the first backward,
    // micro-batch 3's (GPipe's backwards go last-first).
    Pipe pipe(with_thrower(4), mg::testing::cpus(2), options_of(4, Checkpoint::Always));
    REQUIRE_THROWS_WITH(pipe.train_step(x, y, mg::parallel::cross_entropy_loss),
                        MG_CONTAINS("Pipe: stage 1 (on cpu) failed in the backward of "
                                    "micro-batch 3: boom on call 4"));
  }
  {
    // The loss runs on the last stage; 1F1B as well.
    Pipe pipe(with_thrower(-1), mg::testing::cpus(2), options_of(4, Checkpoint::Never, Schedule::OneFOneB));
    int calls = 0;
    REQUIRE_THROWS_WITH(pipe.train_step(x, y,
                                        [&](const Tensor& out, const Tensor& t) {
                                          if (calls++ == 1) MG_FAIL("bad loss");
                                          return mg::cross_entropy(out, t);
                                        }),
                        MG_CONTAINS("Pipe: stage 1 (on cpu) failed in the forward of "
                                    "micro-batch 1: bad loss"));
    REQUIRE_THROWS_WITH(pipe.train_step(x, y, [](const Tensor& out, const Tensor&) { return out; }),
                        MG_CONTAINS("micro-batch 0: the loss function returned shape [2, 3]; it "
                                    "must return a scalar"));
  }
  {
    // Under forward(): the error surfaces from forward, or from loss.backward().
    Pipe pipe(with_thrower(5), mg::testing::cpus(2), options_of(4, Checkpoint::Always));
    const Tensor out = pipe.forward(x);
    REQUIRE_THROWS_WITH(mg::cross_entropy(out, y).backward(),
                        MG_CONTAINS("Pipe: stage 1 (on cpu) failed in the backward of "
                                    "micro-batch 2: boom on call 5"));
  }
}

TEST_CASE("Pipe: errors in its arguments name what is wrong") {
  auto mlp = [] { return mg::testing::make_mlp({4, 5, 3}); };  // 3 layers
  const auto cpus = mg::testing::cpus(2);
  REQUIRE_THROWS_WITH(Pipe(nullptr, cpus), MG_CONTAINS("Pipe: the module is null"));
  REQUIRE_THROWS_WITH(Pipe(std::make_shared<mg::nn::Linear>(4, 3), cpus),
                      MG_CONTAINS("Pipe: the module must be an nn::Sequential, whose layers are "
                                  "cut into stages in order; got Linear"));
  REQUIRE_THROWS_WITH(Pipe(mlp(), {}), MG_CONTAINS("Pipe: expected at least one device"));
  REQUIRE_THROWS_WITH(Pipe(mlp(), mg::testing::cpus(4)),
                      MG_CONTAINS("Pipe: the module has 3 layers for 4 devices"));
  const int gpus = static_cast<int>(mg::parallel::visible_gpus().size());
  REQUIRE_THROWS_WITH(Pipe(mlp(), {Device::cpu(), Device::cuda(gpus)}),
                      MG_CONTAINS(fmt::format("Pipe: devices[1] is cuda:{}, but {} CUDA device",
                                              gpus, gpus)));
  PipeOptions o;
  o.balance = {1, 1};
  REQUIRE_THROWS_WITH(Pipe(mlp(), cpus, o),
                      MG_CONTAINS("Pipe: balance [1, 1] sums to 2 layers, but the module has 3"));
  o.balance = {3, 0};
  REQUIRE_THROWS_WITH(Pipe(mlp(), cpus, o), MG_CONTAINS("Pipe: balance [3, 0] gives stage 1 no layers"));
  o.balance = {3};
  REQUIRE_THROWS_WITH(Pipe(mlp(), cpus, o),
                      MG_CONTAINS("Pipe: balance [3] has 1 entries for 2 devices"));
  o.balance = {};
  o.chunks = 0;
  REQUIRE_THROWS_WITH(Pipe(mlp(), cpus, o), MG_CONTAINS("Pipe: chunks must be at least 1, got 0"));

  // A layer in two stages would have two threads accumulating one gradient.
  auto shared = std::make_shared<mg::nn::Linear>(4, 4);
  auto twice = std::make_shared<mg::nn::Sequential>();
  twice->register_module("a", shared);
  twice->register_module("b", shared);
  REQUIRE_THROWS_WITH(Pipe(twice, cpus),
                      MG_CONTAINS("Pipe: parameter 'b.weight' is used by stages 0 and 1"));

  o.chunks = 8;
  Pipe pipe(mlp(), cpus, o);
  REQUIRE_THROWS_WITH(pipe.train_step(mg::randn({0, 4}), mg::randint(0, 3, {0}), mg::parallel::cross_entropy_loss),
                      MG_CONTAINS("Pipe: the batch has no rows"));
  REQUIRE_THROWS_WITH(pipe.forward(mg::randn({0, 4})), MG_CONTAINS("Pipe: the batch has no rows"));
  REQUIRE_THROWS_WITH(pipe.train_step(mg::randn({9, 4}), mg::randint(0, 3, {8}), mg::parallel::cross_entropy_loss),
                      MG_CONTAINS("Pipe::train_step: the input (shape [9, 4]) and the target "
                                  "(shape [8]) must have the same number of rows"));
  REQUIRE_THROWS_WITH(pipe.forward(mg::scalar_tensor(1.0)),
                      MG_CONTAINS("Pipe: the input is a scalar"));
  {
    mg::NoGradGuard no_grad;
    REQUIRE_THROWS_WITH(pipe.train_step(mg::randn({9, 4}), mg::randint(0, 3, {9}), mg::parallel::cross_entropy_loss),
                        MG_CONTAINS("Pipe::train_step runs backward, but grad mode is off"));
  }
  o.schedule = Schedule::OneFOneB;
  Pipe ofob(mlp(), cpus, o);
  REQUIRE_THROWS_WITH(ofob.forward(mg::randn({9, 4})),
                      MG_CONTAINS("Pipe: forward() with grad mode on runs the gpipe schedule only"));
  REQUIRE_THROWS_WITH(mg::parallel::parse_schedule("zb"),
                      MG_CONTAINS("unknown pipeline schedule 'zb' (expected gpipe, 1f1b or interleaved)"));
  o.schedule = Schedule::Interleaved1F1B;
  REQUIRE_THROWS_WITH(Pipe(mlp(), cpus, o),
                      MG_CONTAINS("Pipe: the interleaved schedule needs several model chunks per "
                                  "rank, which PipelineStage holds"));
  REQUIRE_THROWS_WITH(mg::parallel::parse_checkpoint("sometimes"),
                      MG_CONTAINS("unknown checkpoint mode 'sometimes'"));
  REQUIRE_THROWS_WITH(pipe.clone(), MG_CONTAINS("Pipe: a Pipe cannot be cloned or replicated"));
}

TEST_CASE("Pipe: a plan that does not fit a device's free memory is refused, with the numbers") {
  mg::testing::ScopedHostBackedCuda stand_in;
  mg::manual_seed(52);
  const std::vector<Device> devices{Device::cuda(0), Device::cuda(1)};
  PipeOptions o;
  o.chunks = 4;
  o.checkpoint = Checkpoint::Never;
  PipeOptions split = o;
  split.balance = {2, 3};  // Linear ReLU | Linear ReLU Linear
  Pipe pipe(mg::testing::make_mlp({64, 256, 256, 10}), devices, split);
  const Tensor x = mg::randn({256, 64}).to(devices[0]);
  const Tensor y = mg::randint(0, 10, {256}).to(devices[1]);

  // The plan, from a dry run of one micro-batch (64 rows) per stage.
  const auto plan = pipe.plan(x);
  REQUIRE(plan.size() == 2);
  REQUIRE(plan[0].layers == 2);
  REQUIRE(plan[0].parameter_bytes == (64 * 256 + 256) * sizeof(float));
  REQUIRE(plan[0].gradient_bytes == plan[0].parameter_bytes);  // none made yet
  REQUIRE(plan[0].input_bytes == 64 * 64 * sizeof(float));
  // Stage 0 keeps its input and the fused Linear+ReLU's output: 64 x 256 floats.
  REQUIRE(plan[0].activation_bytes >= plan[0].input_bytes + 64 * 256 * sizeof(float));
  REQUIRE(plan[0].in_flight == 4);
  REQUIRE(plan[0].planned_bytes() == plan[0].gradient_bytes + 4 * plan[0].activation_bytes);

  // Free memory unknown: not checked. 1 MiB free: stage 0 alone needs more.
  pipe.train_step(x, y, mg::parallel::cross_entropy_loss);
  stand_in.stand_in().set_free_bytes(std::size_t{1} << 20);
  Pipe small(mg::testing::make_mlp({64, 2048, 10}), devices, o);
  REQUIRE_THROWS_WITH(small.train_step(x, y, mg::parallel::cross_entropy_loss),
                      MG_CONTAINS("Pipe: the plan does not fit on cuda:0: stage 0 needs"));
  REQUIRE_THROWS_WITH(small.train_step(x, y, mg::parallel::cross_entropy_loss),
                      MG_CONTAINS("but cuda:0 has 1.00 MiB free (of 1.00 GiB)"));
  REQUIRE_THROWS_WITH(small.train_step(x, y, mg::parallel::cross_entropy_loss),
                      MG_CONTAINS("stage 0 on cuda:0: 2 layers, parameters 520.00 KiB, gradients "
                                  "520.00 KiB, activations"));
  // Stages that share a device are summed.
  Pipe shared(mg::testing::make_mlp({64, 512, 512, 10}), {Device::cuda(0), Device::cuda(0)}, o);
  REQUIRE_THROWS_WITH(shared.forward(x),
                      MG_CONTAINS("Pipe: the plan does not fit on cuda:0: stages 0, 1 need"));
  // Enough memory: it runs.
  stand_in.stand_in().set_free_bytes(std::size_t{1} << 30);
  REQUIRE(small.train_step(x, y, mg::parallel::cross_entropy_loss).loss.defined());
}

TEST_CASE("Pipe: a layer in two stages on two devices is refused before it moves") {
  mg::testing::ScopedHostBackedCuda stand_in;
  auto shared = std::make_shared<mg::nn::Linear>(4, 4);
  auto twice = std::make_shared<mg::nn::Sequential>();
  twice->register_module("a", shared);
  twice->register_module("b", shared);
  REQUIRE_THROWS_WITH(Pipe(twice, {Device::cuda(0), Device::cuda(1)}),
                      MG_CONTAINS("Pipe: parameter 'b.weight' is used by stages 0 and 1"));
  REQUIRE(shared->weight().device() == Device::cpu());
}
