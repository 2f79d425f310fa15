// The MLP's formulas (minigrad/plan/mlp_formulas.h) against the tensors themselves: the
// parameters, gradients and optimizer state of a stepped model, parallelize_mlp's shards and
// ZeRO's buckets, byte for byte. Against the allocator's peak: train_fashion_mnist's memory
// ctests (tests/samples/train_fashion_mnist_memory_test.cpp).
#include "catch_compat.h"

#include <memory>
#include <vector>

#include <minigrad/core/ops.h>
#include <minigrad/core/tensor.h>
#include <minigrad/autograd/functions.h>
#include <minigrad/nn/layers.h>
#include <minigrad/nn/optim/adam.h>
#include <minigrad/nn/optim/master_weights.h>
#include <minigrad/nn/optim/sgd.h>
#include <minigrad/parallel/c10d/bucketing.h>
#include <minigrad/parallel/tensor_parallel/tensor_parallel.h>
#include <minigrad/plan/mlp_formulas.h>

using namespace mg;

namespace {

plan::MLPConfig small_mlp() {
  plan::MLPConfig config;
  config.inputs = 12;
  config.hidden = {8, 6};
  config.classes = 4;
  return config;
}

// train_fashion_mnist's make_mlp for `config`.
std::shared_ptr<nn::Sequential> make_mlp(const plan::MLPConfig& config) {
  auto mlp = std::make_shared<nn::Sequential>();
  int64_t width = config.inputs;
  for (const int64_t h : config.hidden) {
    mlp->push_back(std::make_shared<nn::Linear>(width, h));
    mlp->push_back(std::make_shared<nn::ReLU>());
    width = h;
  }
  mlp->push_back(std::make_shared<nn::Linear>(width, config.classes));
  return mlp;
}

double bytes(const std::vector<Tensor>& tensors) {
  double sum = 0;
  for (const Tensor& t : tensors)
    if (t.defined()) sum += static_cast<double>(t.nbytes());
  return sum;
}

// Two steps on random rows: the optimizer's state made (SGD's momentum at the first step).
void train_two_steps(nn::Module& mlp, optim::Optimizer& optimizer, const plan::MLPConfig& config) {
  for (int step = 0; step < 2; ++step) {
    optimizer.zero_grad();
    const Tensor x = randn({5, config.inputs});
    const Tensor y = from_vector(std::vector<int64_t>{0, 1, 2, 3, 0}, {5});
    cross_entropy(mlp.forward(x), y).backward();
    optimizer.step();
  }
}

}  // namespace

TEST_CASE("mlp formulas: the parameters, gradients and SGD momentum of one device are the tensors' bytes") {
  const plan::MLPConfig config = small_mlp();
  auto mlp = make_mlp(config);
  std::vector<int64_t> numels;
  for (const Tensor& p : mlp->parameters()) numels.push_back(p.numel());
  REQUIRE(plan::mlp_parameter_numels(config) == numels);

  optim::SGD sgd(mlp->parameters(), optim::SGDOptions(0.1, 0.9));
  train_two_steps(*mlp, sgd, config);
  const auto r = plan::mlp_rank_memory(config, plan::Split{}, 5, plan::MLPOptimizer::SGDMomentum);
  REQUIRE(r.has_value());
  std::vector<Tensor> grads, momentum;
  for (size_t i = 0; i < mlp->parameters().size(); ++i) {
    grads.push_back(mlp->parameters()[i].grad());
    momentum.push_back(sgd.momentum_buffer(i));
  }
  CHECK(r->params == bytes(mlp->parameters()));
  CHECK(r->grads == bytes(grads));
  CHECK(r->optimizer == bytes(momentum));
  CHECK(r->buffers == 0);
}

TEST_CASE("mlp formulas: AdamW's state is its two moments and a step a tensor, in bytes") {
  const plan::MLPConfig config = small_mlp();
  auto mlp = make_mlp(config);
  optim::AdamW adamw(mlp->parameters(), optim::AdamWOptions(1e-3));
  train_two_steps(*mlp, adamw, config);
  std::vector<Tensor> state;
  for (size_t i = 0; i < mlp->parameters().size(); ++i)
    for (const auto& [name, t] : adamw.state(i)) state.push_back(t);
  const auto r = plan::mlp_rank_memory(config, plan::Split{}, 5, plan::MLPOptimizer::AdamW);
  REQUIRE(r.has_value());
  CHECK(r->optimizer == bytes(state));
}

TEST_CASE("mlp formulas: a tensor-parallel rank's parameters are parallelize_mlp's shards") {
  const plan::MLPConfig config = small_mlp();
  auto mlp = make_mlp(config);
  const parallel::TensorParallel tp(*mlp, {Device::cpu(), Device::cpu()});
  for (int rank = 0; rank < 2; ++rank) {
    std::vector<int64_t> numels;
    for (const Tensor& p : tp.shard(rank)->parameters()) numels.push_back(p.numel());
    CHECK(plan::mlp_rank_parameter_numels(config, 2) == numels);
  }
}

TEST_CASE("mlp formulas: ZeRO's buckets are compute_bucket_assignment_by_size's") {
  plan::MLPConfig config = small_mlp();
  config.hidden = {300, 200};  // 12 x 300 + 300 x 200 + 200 x 4 floats and biases: several buckets of 64 KiB
  auto mlp = make_mlp(config);
  const std::vector<Tensor> params = mlp->parameters();
  const size_t cap = 64 * 1024;
  std::vector<int64_t> want;
  for (const std::vector<size_t>& bucket : parallel::compute_bucket_assignment_by_size(params, cap, cap)) {
    int64_t numel = 0;
    for (const size_t i : bucket) numel += params[i].numel();
    want.push_back(numel);
  }
  REQUIRE(want.size() > 1);
  CHECK(plan::mlp_zero_bucket_numels(config, static_cast<double>(cap)) == want);
}

// TensorParallel in one process: the ranks' threads meet at the all-reduces, so the peak is
// a range whose width is what the other ranks add above their lowest in the same phase.
TEST_CASE("mlp formulas: TensorParallel in one process is a range of its ranks' moments between barriers") {
  plan::MLPConfig config;
  config.hidden = {256, 256};
  const double b = 64;
  const auto wide = plan::mlp_tp_in_process_memory(config, 2, 64, plan::MLPOptimizer::SGDMomentum);
  REQUIRE(wide.has_value());
  CHECK_FALSE(wide->backward);  // the row layer's moment: five [b, 256] tensors over both ranks
  // each rank's copy of the batch, its ReLU output of the column layer, one rank's partial
  // product, sum and bias-added output beside the other's partial product and sum, the running loss
  CHECK(wide->low.activations == 4 * (2 * b * 784 + 2 * b * 128 + 5 * b * 256) + 4);
  CHECK(wide->racing == 4 * b * 256);  // the other rank's bias-added output
  const auto four = plan::mlp_tp_in_process_memory(config, 4, 64, plan::MLPOptimizer::SGDMomentum);
  REQUIRE(four.has_value());
  CHECK(four->racing == 3 * 4 * b * 256);  // the three others'
  const double shards = 784 * 128 + 128 + 128 * 256 + 256 + 256 * 10 + 10;
  CHECK(wide->low.grads == 2 * 4 * shards);
  CHECK(wide->low.params == 4 * (784 * 256 + 256 + 256 * 256 + 256 + 256 * 10 + 10) + 2 * 4 * shards);

  // One hidden layer: the classifier is the row layer, its forward moment [b, 10] tensors, so
  // the backward's is the peak, each rank making its first Linear's gradients.
  config.hidden = {96};
  const auto narrow = plan::mlp_tp_in_process_memory(config, 2, 20, plan::MLPOptimizer::SGDMomentum);
  REQUIRE(narrow.has_value());
  CHECK(narrow->backward);
  CHECK(narrow->racing == 4 * 20 * 48);  // the other rank's gradient of its column layer's output
  CHECK_FALSE(plan::mlp_tp_in_process_memory(config, 1, 20, plan::MLPOptimizer::SGD).has_value());
}

// The pipeline in one process, its stages' threads replayed from the schedule: at 2 stages
// of two hidden layers the low is the moment derived by hand from --memory-blocks (stage 0
// making its first Linear's weight gradient in micro-batch m-2's backward, stage 1 done
// with what it can run), and more stages only add to what can meet.
TEST_CASE("mlp formulas: the pipeline's range holds the moment read off its blocks") {
  plan::MLPConfig config;
  config.hidden = {64, 32};
  const auto p = plan::mlp_pipe_memory(config, 2, 20, 4, false, plan::MLPOptimizer::SGDMomentum);
  REQUIRE(p.has_value());
  const double psi = 784 * 64 + 64 + 64 * 32 + 32 + 32 * 10 + 10;
  // every parameter, its .grad and momentum; the first Linear's gradients pending; the
  // inputs of micro-batches 0..2, micro-batch 2's root, its gradient, ReLU's input gradient,
  // stage 1's input gradients of 0 and 1 queued; the 4 logits, 4 weighted losses, the running one
  const double moment = 3 * 4 * psi + 4.0 * (784 * 64 + 64) +
                        4.0 * (3 * 5 * 784 + 5 * (2 * 32 + 64) + 2 * 5 * 32 + 4 * 5 * 10) + 4.0 * 5;
  CHECK(p->low.total() == moment);
  CHECK(p->racing >= 0);
  CHECK(p->low.params == 4 * psi);
  const auto three = plan::mlp_pipe_memory(config, 3, 20, 4, false, plan::MLPOptimizer::SGDMomentum);
  REQUIRE(three.has_value());
  CHECK(three->racing > 0);  // stage 1 may make its weight gradient while stage 0 makes its own
  CHECK_FALSE(plan::mlp_pipe_memory(config, 6, 20, 4, false, plan::MLPOptimizer::SGD).has_value());  // 5 layers
  CHECK_FALSE(plan::mlp_pipe_memory(config, 1, 20, 4, false, plan::MLPOptimizer::SGD).has_value());
}

// bf16-true: the model's bfloat16 parameters and gradients, MasterWeights' float32 masters
// and their gradients, and the momentum over the masters, against a stepped model's tensors.
TEST_CASE("mlp formulas: bf16-true's parameters, gradients, masters and state are the tensors' bytes") {
  const plan::MLPConfig config = small_mlp();
  auto mlp = make_mlp(config);
  mlp->to(DType::BFloat16);
  optim::MasterWeights master(mlp->parameters(), [](std::vector<Tensor> masters) {
    return std::make_unique<optim::SGD>(masters, optim::SGDOptions(0.1, 0.9));
  });
  for (int step = 0; step < 2; ++step) {
    master.zero_grad();
    const Tensor x = ops::to_dtype(randn({5, config.inputs}), DType::BFloat16);
    const Tensor y = from_vector(std::vector<int64_t>{0, 1, 2, 3, 0}, {5});
    cross_entropy(mlp->forward(x), y).backward();
    master.prepare_gradients();
    master.step();
  }
  const auto r = plan::mlp_rank_memory(config, plan::Split{}, 5, plan::MLPOptimizer::SGDMomentum, 1,
                                       plan::MLPPrecision::BF16True);
  REQUIRE(r.has_value());
  std::vector<Tensor> grads, master_grads;
  for (const Tensor& p : mlp->parameters()) grads.push_back(p.grad());
  for (const Tensor& m : master.parameters()) master_grads.push_back(m.grad());
  CHECK(r->params == bytes(mlp->parameters()));
  CHECK(r->master == bytes(master.parameters()));
  CHECK(r->grads == bytes(grads) + bytes(master_grads));
  CHECK(r->optimizer == 4 * bytes(mlp->parameters()) / 2);  // float32 momentum over the masters
}

// The 16-bit forward's largest moment, read off train_fashion_mnist --hidden 64,32
// --batch-size 20 --precision bf16-mixed --memory-blocks: the first Linear's GEMM on
// widened copies (the batch, W0 and b0 in float32, the float32 result beside the bfloat16
// output), the batch's and the layer's weight and bias casts; bf16-true has no casts.
TEST_CASE("mlp formulas: the 16-bit forward peaks at the first Linear's widened GEMM") {
  plan::MLPConfig config;
  config.hidden = {64, 32};
  const double b = 20, w0 = 64 * 784;
  const double gemm = 2 * b * 64 + 4 * (b * 64 + 64 + b * 784 + w0);
  const auto mixed = plan::mlp_forward_peak_16bit_bytes(config, 1, 20, true);
  CHECK(mixed.inside == 2 * b * 784 + 2 * (w0 + 64) + gemm);
  const auto bf16_true = plan::mlp_forward_peak_16bit_bytes(config, 1, 20, false);
  CHECK(bf16_true.inside == 2 * b * 784 + gemm);
  // The end: the batch, the two ReLU outputs, the bfloat16 logits (and their float32 cast).
  CHECK(bf16_true.end == 2 * b * (784 + 64 + 32 + 10));
  CHECK(mixed.end - bf16_true.end == 2 * (w0 + 64 + 64 * 32 + 32 + 32 * 10 + 10) + 4 * b * 10);

  // One device and DDP priced (DDP's bucket in the gradients' dtype); the others not yet.
  plan::Split ddp;
  ddp.dp = 2;
  const auto r = plan::mlp_rank_memory(config, ddp, 10, plan::MLPOptimizer::SGD, 1, plan::MLPPrecision::BF16True);
  REQUIRE(r.has_value());
  CHECK(r->buffers == 2 * (w0 + 64 + 64 * 32 + 32 + 32 * 10 + 10));
  CHECK_FALSE(plan::mlp_rank_memory(config, plan::Split{}, 10, plan::MLPOptimizer::SGD, 2,
                                     plan::MLPPrecision::BF16Mixed));  // DataParallel: not yet
}

// ZeRO-2 in 16 bits at --hidden 16, 25 rows a rank (read off --memory-blocks): no gradients
// are held before the reduce-scatter, so the first weight-gradient GEMM is the peak; the
// others at --hidden 64,32, 10 rows.
TEST_CASE("mlp formulas: ZeRO in 16 bits, the weight-gradient GEMM and bf16-true's widened collectives") {
  plan::MLPConfig config;
  config.hidden = {16};
  plan::Split split;
  split.dp = 2;
  split.zero = 2;
  const double b = 25, w0 = 16 * 784, psi = w0 + 16 + 16 * 10 + 10;
  const auto narrow = plan::mlp_rank_memory(config, split, 25, plan::MLPOptimizer::SGDMomentum, 1,
                                            plan::MLPPrecision::BF16Mixed);
  REQUIRE(narrow.has_value());
  CHECK(narrow->grads == 0);             // the shards' gradients not made yet
  CHECK(narrow->buffers == 4 * psi);     // the flat gradient the classifier's went into
  // the batch's and W0's casts saved, the arriving gradient, dy and x widened, the float32
  // and bfloat16 weight gradient; the running loss, the loss, its copy and the seed
  CHECK(narrow->activations == 2 * b * 784 + 2 * w0 + 2 * b * 16 + 4 * (b * 16 + b * 784 + w0) + 2 * w0 + 16);

  config.hidden = {64, 32};
  const double psi2 = 784 * 64 + 64 + 64 * 32 + 32 + 32 * 10 + 10;  // even: shards of psi2 / 2
  const auto reduce = plan::mlp_rank_memory(config, split, 10, plan::MLPOptimizer::SGDMomentum, 1,
                                            plan::MLPPrecision::BF16True);
  REQUIRE(reduce.has_value());
  // the bfloat16 flat gradient, it widened, the float32 slices, their float32 sum and its
  // rounding, the first weight's bfloat16 gradient
  CHECK(reduce->buffers == 2 * psi2 + 2 * 4 * psi2 + 4 * psi2 / 2 + 2 * psi2 / 2 + 2 * 784 * 64);
  split.zero = 1;
  const auto gather = plan::mlp_rank_memory(config, split, 10, plan::MLPOptimizer::SGDMomentum, 1,
                                            plan::MLPPrecision::BF16True);
  REQUIRE(gather.has_value());
  // DDP's bfloat16 bucket, the all-gather's float32 output and widened shard, the rounding
  CHECK(gather->buffers == 2 * psi2 + 4 * psi2 + 4 * psi2 / 2 + 2 * psi2);
  CHECK(gather->master == 4 * psi2 / 2);
}

// ZeRO-3 in 16 bits at --hidden 64,32, 10 rows a rank (read off --memory-blocks): under
// autocast the low is the first weight's bfloat16 gradient cast back to float32 (the unit
// gathered, the flat gradient the bias went into, the second unit's flat gradient still in
// flight, the first unit's shard not made); in bf16-true the scratch is Gloo's widened
// reduce-scatter (the flat gradient in float32, float32 slices, their sum and its rounding).
TEST_CASE("mlp formulas: ZeRO-3 in 16 bits, the weight gradient's cast and Gloo's widened reduce-scatter") {
  plan::MLPConfig config;
  config.hidden = {64, 32};
  plan::Split split;
  split.dp = 2;
  split.zero = 3;
  const double w0 = 784 * 64, unit0 = w0 + 64, unit1 = 64 * 32 + 32, unit2 = 32 * 10 + 10;  // even: no padding
  const double shards = (unit0 + unit1 + unit2) / 2;
  const auto mixed = plan::mlp_zero3_memory(config, split, 10, plan::MLPOptimizer::SGDMomentum,
                                            plan::MLPPrecision::BF16Mixed);
  REQUIRE(mixed.has_value());
  CHECK(mixed->low.grads == 4 * (shards - unit0 / 2));          // the first unit's shard not made
  CHECK(mixed->low.buffers == 4 * unit0 + 4 * unit1 + 4 * unit0);  // gathered, in flight, flat
  CHECK(mixed->low.activations == 2 * w0 + 4 * w0 + 16);         // the cast, the loss's scalars
  CHECK(mixed->scratch == 4 * unit0);                             // Gloo's slices at the launch
  // the launch holds the first shard and drops the cast and the second unit's flat gradient
  CHECK(mixed->high_at_launch);
  CHECK(mixed->high_below_low == 2 * w0 + 4 * unit1 - 4 * unit0 / 2);
  const auto f16 = plan::mlp_zero3_memory(config, split, 10, plan::MLPOptimizer::SGDMomentum,
                                          plan::MLPPrecision::F16Mixed);
  REQUIRE(f16.has_value());
  CHECK(f16->low.total() == mixed->low.total() + 4);  // GradScaler's scaled loss

  const auto bf16 = plan::mlp_zero3_memory(config, split, 10, plan::MLPOptimizer::SGDMomentum,
                                           plan::MLPPrecision::BF16True);
  REQUIRE(bf16.has_value());
  CHECK(bf16->low.params == 2 * shards);
  CHECK(bf16->low.master == 4 * shards);
  CHECK(bf16->scratch == 2 * 4 * unit0 + 4 * unit0 / 2 + 2 * unit0 / 2);
  // the launch in bf16-true: the unit gathered, its flat gradient, W0's gradient, every shard's
  const double launch = 2 * 2 * unit0 + 2 * w0 + 2 * shards + 2 * 10 * 784 + 16;
  CHECK(bf16->high_at_launch);
  CHECK(bf16->low.total() - bf16->high_below_low ==
        launch + bf16->low.params + bf16->low.master + bf16->low.optimizer);
  const auto f32 = plan::mlp_zero3_memory(config, split, 10, plan::MLPOptimizer::SGDMomentum);
  REQUIRE(f32.has_value());
  CHECK(f32->high_below_low == 0);  // 32-true's low is the launch
  // A small first Linear (--hidden 16): under autocast the high is the cast with the
  // second unit's slices on Gloo's thread, the low's own moment.
  config.hidden = {16};
  const auto small = plan::mlp_zero3_memory(config, split, 25, plan::MLPOptimizer::SGDMomentum,
                                            plan::MLPPrecision::BF16Mixed);
  REQUIRE(small.has_value());
  CHECK(!small->high_at_launch);
  CHECK(small->high_below_low == 0);
  CHECK(small->scratch == 4 * (16 * 10 + 10));
}

// tp in 16 bits at --hidden 16,2048, 50 rows (read off --memory-blocks): the row layer's
// moments are the peak; under autocast its bias add (the partial product and the sum in
// bfloat16, the sum copied to float32 and the float32 result), in bf16-true its all-reduce
// (the partial product, the sum, Gloo's float32 wire and the rounding back).
TEST_CASE("mlp formulas: tp in 16 bits, the row layer's all-reduce and bias add") {
  plan::MLPConfig config;
  config.hidden = {16, 2048};
  const double b = 50, out = 2048;
  // kept before the row layer: the 16-bit batch, the column layer's ReLU output
  const double kept = 2 * b * 784 + 2 * b * 8;
  const auto bf16_true = plan::mlp_forward_peak_16bit_bytes(config, 2, 50, false);
  CHECK(bf16_true.inside == kept + 2 * b * out + 2 * b * out + 4 * b * out + 2 * b * out);
  const auto mixed = plan::mlp_forward_peak_16bit_bytes(config, 2, 50, true);
  const double casts = 2 * (8 * 784 + 8) + 2 * (2048 * 8);  // the column's weight and bias, the row's weight
  CHECK(mixed.inside == kept + casts + 2 * b * out + 2 * b * out + 4 * b * out + 4 * b * out);
}
