// The pipeline on GPUs: the central test on cuda:0 repeated (two and three stages on
// one GPU, each on a stream of its own) and on distinct GPUs when the machine has them;
// the streams the stages run on; the plan against the GPU's free memory. Skipped
// (exit 77) without a GPU.
#include "gpu_compare.h"

#include "parallel/pipe_check.h"

using mg::Device;
using mg::Tensor;
using mg::parallel::Checkpoint;
using mg::parallel::Schedule;

namespace {

// Records, inside forward, which stream its device has current.
class StreamRecorder : public mg::nn::Cloneable<StreamRecorder> {
 public:
  StreamRecorder() : Cloneable<StreamRecorder>("StreamRecorder") {}
  Tensor forward(const Tensor& x) override {
    seen = mg::current_stream(x.device());
    return x;
  }
  mg::Stream seen;
};

}  // namespace

TEST_CASE("Pipe on cuda:0 twice and three times matches the plain module [gpu]") {
  mg::manual_seed(71);
  for (int stages : {2, 3})
    for (int64_t chunks : {1, 3, 8})
      for (Schedule schedule : {Schedule::GPipe, Schedule::OneFOneB})
        for (Checkpoint checkpoint : {Checkpoint::Never, Checkpoint::ExceptLast}) {
          mg::testing::PipeCase c;
          c.widths = {13, 64, 32, 32, 10};
          c.stages = stages;
          c.chunks = chunks;
          c.batch = 67;
          c.schedule = schedule;
          c.checkpoint = checkpoint;
          c.device = Device::cuda(0);
          c.rtol = 1e-4;  // GPU matmuls of other row counts may pick other kernels
          c.atol = 1e-5;
          INFO(c.str());
          const auto difference = mg::testing::compare_pipe_with_plain(c);
          INFO(difference.value_or("none"));
          REQUIRE_FALSE(difference.has_value());
        }
  mg::testing::PipeCase c;
  c.widths = {13, 64, 32, 10};
  c.chunks = 4;
  c.batch = 30;
  c.through_forward = true;
  c.device = Device::cuda(0);
  c.rtol = 1e-4;
  c.atol = 1e-5;
  const auto difference = mg::testing::compare_pipe_with_plain(c);
  INFO(difference.value_or("none"));
  REQUIRE_FALSE(difference.has_value());
}

TEST_CASE("Pipe: stages sharing a GPU run on streams of their own [gpu]") {
  auto first = std::make_shared<StreamRecorder>();
  auto second = std::make_shared<StreamRecorder>();
  auto model = std::make_shared<mg::nn::Sequential>(std::initializer_list<mg::nn::ModulePtr>{
      std::make_shared<mg::nn::Linear>(4, 4), first, std::make_shared<mg::nn::Linear>(4, 4), second});
  mg::parallel::PipeOptions options;
  options.chunks = 2;
  const Device gpu = Device::cuda(0);
  mg::parallel::Pipe pipe(model, {gpu, gpu}, options);
  const Tensor x = mg::randn({4, 4}, gpu);
  pipe.train_step(x, mg::randint(0, 4, {4}, gpu), mg::parallel::cross_entropy_loss);
  REQUIRE(first->seen == mg::compute_stream(gpu));  // the caller's current stream
  REQUIRE(second->seen == mg::stream_from_pool(gpu, 0));
  REQUIRE_FALSE(second->seen == first->seen);
}

TEST_CASE("Pipe over distinct GPUs, and from host input, matches the plain module [gpu]") {
  mg::manual_seed(72);
  if (mg::cuda::device_count() >= 2) {
    auto plain = mg::testing::make_mlp({13, 64, 32, 10});
    auto copy = plain->clone();
    mg::parallel::PipeOptions options;
    options.chunks = 4;
    options.schedule = Schedule::OneFOneB;
    mg::parallel::Pipe pipe(copy, {Device::cuda(0), Device::cuda(1)}, options);
    const Tensor x = mg::randn({33, 13});
    const Tensor y = mg::randint(0, 10, {33});
    const Tensor loss = pipe.train_step(x, y, mg::parallel::cross_entropy_loss).loss;
    REQUIRE(loss.device() == Device::cuda(1));
    const Tensor plain_loss = mg::cross_entropy(plain->forward(x), y);
    plain_loss.backward();
    mg::testing::require_close(loss, plain_loss, "loss", 1e-4, 1e-5);
    const auto p = pipe.parameters(), q = plain->parameters();
    for (size_t k = 0; k < p.size(); ++k)
      mg::testing::require_close(p[k].grad(), q[k].grad(), "grad", 1e-4, 1e-5);
  }
  // Host input and targets, stages on the GPU: the Pipe copies the micro-batches in.
  auto plain = mg::testing::make_mlp({13, 32, 10});
  plain->to(Device::cuda(0));
  mg::parallel::PipeOptions options;
  options.chunks = 3;
  mg::parallel::Pipe pipe(plain->clone(), {Device::cuda(0), Device::cuda(0)}, options);
  const Tensor x = mg::randn({10, 13});
  const Tensor y = mg::randint(0, 10, {10});
  const Tensor loss = pipe.train_step(x, y, mg::parallel::cross_entropy_loss).loss;
  mg::testing::require_close(loss, mg::cross_entropy(plain->forward(x.to(Device::cuda(0))),
                                                     y.to(Device::cuda(0))),
                             "loss", 1e-4, 1e-5);
}

TEST_CASE("Pipe: the plan is checked against the GPU's free memory [gpu]") {
  const mg::MemoryInfo info = mg::parallel::memory_info(Device::cuda(0));
  REQUIRE(info.known);
  REQUIRE(info.free_bytes <= info.total_bytes);
  mg::parallel::PipeOptions options;
  options.chunks = 2;
  options.checkpoint = Checkpoint::Never;
  const Device gpu = Device::cuda(0);
  mg::parallel::Pipe pipe(mg::testing::make_mlp({64, 256, 10}), {gpu, gpu}, options);
  const auto plan = pipe.plan(mg::randn({128, 64}, gpu));
  REQUIRE(plan[0].input_bytes == 64 * 64 * sizeof(float));
  REQUIRE(plan[0].activation_bytes >= plan[0].input_bytes + 64 * 256 * sizeof(float));
  REQUIRE(plan[1].in_flight == 2);
}
