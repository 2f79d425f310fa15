// Pipe on CPU devices: the central test (the same loss, gradients and parameters after
// SGD steps as the plain module on the whole batch) over stages, chunks, schedules,
// checkpointing and both ways of calling it; and wrong variants that it must catch.
#include "catch_compat.h"

#include "parallel/pipe_check.h"

using mg::Device;
using mg::Tensor;
using mg::parallel::Checkpoint;
using mg::parallel::Schedule;
using mg::testing::compare_pipe_with_plain;
using mg::testing::PipeCase;

namespace {

// Seven layers (Linear ReLU Linear ReLU Linear ReLU Linear): enough for four stages,
// and odd widths.
const std::vector<int64_t> kWidths{6, 9, 7, 8, 3};

}  // namespace

TEST_CASE("Pipe::train_step matches the plain module over stages, chunks, schedules and checkpointing") {
  mg::manual_seed(31);
  // 19 rows: chunks 3 -> 7 7 5, chunks 8 -> seven micro-batches of 3 3 3 3 3 3 1.
  for (int stages : {2, 3, 4})
    for (int64_t chunks : {1, 3, 8})
      for (Schedule schedule : {Schedule::GPipe, Schedule::OneFOneB})
        for (Checkpoint checkpoint : {Checkpoint::Never, Checkpoint::ExceptLast, Checkpoint::Always}) {
          PipeCase c;
          c.widths = kWidths;
          c.stages = stages;
          c.chunks = chunks;
          c.batch = 19;
          c.schedule = schedule;
          c.checkpoint = checkpoint;
          INFO(c.str());
          const auto difference = compare_pipe_with_plain(c);
          INFO(difference.value_or("none"));
          REQUIRE_FALSE(difference.has_value());
        }
}

TEST_CASE("Pipe::forward and loss.backward() match the plain module (GPipe)") {
  mg::manual_seed(32);
  for (int stages : {2, 3, 4})
    for (int64_t chunks : {1, 3, 8})
      for (Checkpoint checkpoint : {Checkpoint::Never, Checkpoint::ExceptLast, Checkpoint::Always}) {
        PipeCase c;
        c.widths = kWidths;
        c.stages = stages;
        c.chunks = chunks;
        c.batch = 17;
        c.checkpoint = checkpoint;
        c.through_forward = true;
        INFO(c.str());
        const auto difference = compare_pipe_with_plain(c);
        INFO(difference.value_or("none"));
        REQUIRE_FALSE(difference.has_value());
      }
}

TEST_CASE("Pipe: batches that the chunks divide, a chunk per row, and one layer per stage") {
  mg::manual_seed(33);
  for (auto [widths, stages, chunks, batch] :
       std::vector<std::tuple<std::vector<int64_t>, int, int64_t, int64_t>>{
           {{5, 4, 3}, 3, 4, 16},  // 4 4 4 4
           {{5, 4, 3}, 3, 5, 5},   // one row each
           {{5, 4, 3}, 2, 4, 9},   // 3 3 3: fewer micro-batches than chunks
           {{5, 4, 3}, 2, 8, 5},   // fewer rows than chunks (an epoch's last batch): 5 of 1
           {{5, 4, 3}, 3, 8, 1},   // a single row: one micro-batch
           {{5, 3}, 1, 3, 10}}) {  // a single stage
    for (Schedule schedule : {Schedule::GPipe, Schedule::OneFOneB}) {
      PipeCase c;
      c.widths = widths;
      c.stages = stages;
      c.chunks = chunks;
      c.batch = batch;
      c.schedule = schedule;
      INFO(c.str());
      const auto difference = compare_pipe_with_plain(c);
      INFO(difference.value_or("none"));
      REQUIRE_FALSE(difference.has_value());
    }
  }
}

// The comparison is only worth something if it fails when the pipeline is wrong. Each
// variant below is a pipeline mistake written as the loss function the last stage
// runs (the Pipe weights micro-batch j's loss by rows_j / rows; these undo that).
TEST_CASE("Pipe: wrong micro-batch weightings fail the comparison") {
  mg::manual_seed(34);
  PipeCase c;
  c.widths = kWidths;
  c.stages = 3;
  c.chunks = 3;
  c.batch = 10;  // 4 4 2
  c.steps = 1;
  const int64_t m = 3;
  const auto rows = static_cast<double>(c.batch);

  // Unscaled: the micro-batches' losses summed (m times the gradient).
  const auto summed = compare_pipe_with_plain(c, [&](const Tensor& out, const Tensor& y) {
    return mg::cross_entropy(out, y) * (rows / static_cast<double>(out.size(0)));
  });
  INFO(summed.value_or("none"));
  REQUIRE(summed.has_value());

  // Each micro-batch weighted 1/m: right only when every micro-batch has the same rows.
  const auto equal_weights = compare_pipe_with_plain(c, [&](const Tensor& out, const Tensor& y) {
    return mg::cross_entropy(out, y) *
           (rows / static_cast<double>(out.size(0)) / static_cast<double>(m));
  });
  INFO(equal_weights.value_or("none"));
  REQUIRE(equal_weights.has_value());
  c.batch = 12;  // 4 4 4: then it is right, which is why the uneven batch matters
  REQUIRE_FALSE(compare_pipe_with_plain(c, [&](const Tensor& out, const Tensor& y) {
                  return mg::cross_entropy(out, y) * (12.0 / static_cast<double>(out.size(0)) / 3.0);
                }).has_value());
  c.batch = 10;

  // The last, partial micro-batch dropped.
  const auto dropped = compare_pipe_with_plain(c, [&](const Tensor& out, const Tensor& y) {
    return mg::cross_entropy(out, y) * (out.size(0) == 2 ? 0.0 : 1.0);
  });
  INFO(dropped.value_or("none"));
  REQUIRE(dropped.has_value());
}

TEST_CASE("Pipe: an input that requires grad gets the plain module's input gradient") {
  mg::manual_seed(35);
  auto plain = mg::testing::make_mlp(kWidths);
  auto copy = plain->clone();
  mg::parallel::PipeOptions options;
  options.chunks = 3;
  mg::parallel::Pipe pipe(copy, mg::testing::cpus(3), options);
  const Tensor x = mg::randn({10, kWidths.front()});
  const Tensor y = mg::randint(0, kWidths.back(), {10});
  const Tensor x_plain = x.detach().set_requires_grad(true);
  mg::cross_entropy(plain->forward(x_plain), y).backward();

  const Tensor x_step = x.detach().set_requires_grad(true);
  pipe.train_step(x_step, y, mg::parallel::cross_entropy_loss);
  mg::testing::require_close(x_step.grad(), x_plain.grad(), "input grad (train_step)", 1e-5, 1e-6);

  const Tensor x_forward = x.detach().set_requires_grad(true);
  mg::cross_entropy(pipe.forward(x_forward), y).backward();
  mg::testing::require_close(x_forward.grad(), x_plain.grad(), "input grad (forward)", 1e-5, 1e-6);
}

TEST_CASE("Pipe: forward under NoGradGuard is an inference pipeline, for either schedule") {
  mg::manual_seed(36);
  auto plain = mg::testing::make_mlp(kWidths);
  const Tensor x = mg::randn({11, kWidths.front()});
  for (Schedule schedule : {Schedule::GPipe, Schedule::OneFOneB}) {
    mg::parallel::PipeOptions options;
    options.chunks = 4;
    options.schedule = schedule;
    mg::parallel::Pipe pipe(plain->clone(), mg::testing::cpus(2), options);
    mg::NoGradGuard no_grad;
    const Tensor out = pipe.forward(x);
    REQUIRE_FALSE(out.requires_grad());
    mg::testing::require_close(out, plain->forward(x), "output", 1e-6, 1e-6);
  }
}

TEST_CASE("Pipe registers the model as 'module', cuts it by balance and prints as a Module") {
  auto mlp = mg::testing::make_mlp(kWidths);  // 7 layers
  mg::parallel::PipeOptions options;
  options.chunks = 4;
  options.balance = {3, 1, 3};
  mg::parallel::Pipe pipe(mlp, mg::testing::cpus(3), options);
  REQUIRE(pipe.module() == mlp);
  REQUIRE(pipe.named_parameters().front().first == "module.0.weight");
  REQUIRE(pipe.stage(1)->size() == 1);
  // A stage's layers keep their names in the model.
  REQUIRE(pipe.stage(2)->named_children().front().first == "4");
  REQUIRE(pipe.stage(2)->named_parameters().front().first == "4.weight");
  REQUIRE(pipe.str().find("Pipe(devices=[cpu, cpu, cpu], balance=[3, 1, 3], chunks=4, "
                          "schedule=gpipe, checkpoint=except_last") == 0);
  // No balance: as even as possible, the first stages one layer more.
  mg::parallel::Pipe even(mg::testing::make_mlp(kWidths), mg::testing::cpus(3));
  REQUIRE(even.balance() == std::vector<int64_t>{3, 2, 2});
}
