#include <minigrad/parallel/tensor_parallel/layers.h>

#include <typeinfo>

#include <minigrad/autograd/functions.h>
#include <minigrad/autograd/grad_mode.h>
#include <minigrad/core/fault_injection.h>
#include <minigrad/core/ops.h>
#include <minigrad/parallel/placement.h>
#include <minigrad/parallel/tensor_parallel/activation_layout.h>
#include <minigrad/parallel/tensor_parallel/functions.h>
#include <minigrad/parallel/tensor_parallel/sequence_parallel.h>

namespace mg::nn {
namespace {

const parallel::TensorParallelGroupPtr& checked(const parallel::TensorParallelGroupPtr& group,
                                                const char* layer) {
  MG_CHECK(group != nullptr, "{}: the tensor-parallel group is null", layer);
  return group;
}

// rows [start, start + length) of dimension `dim` of `full`, as a new leaf on `device`.
Tensor shard_of(const Tensor& full, int64_t dim, int64_t start, int64_t length, Device device) {
  NoGradGuard no_grad;
  Tensor shard = ops::clone(ops::narrow(full, dim, start, length));
  return shard.device() == device ? shard : ops::copy_to(shard, device);
}

Tensor whole_on(const Tensor& full, Device device) {
  return shard_of(full, 0, 0, full.size(0), device);
}

const char* python_bool(bool b) { return b ? "True" : "False"; }

// Records on `t` (a parameter of the Linear `full`, whose tensor `which` it is) how this
// rank's tensor is the whole: the layer does not know the model's name for it (placement.h).
void record(const Tensor& t, const Linear& full, const char* which, const parallel::TensorParallelGroup& group,
            parallel::Placement placement, bool partial_gradient = false) {
  parallel::record_placement(t, "", full.parameter(which).shape(),
                             parallel::tensor_parallel_placement(group, placement, partial_gradient));
}

}  // namespace

// ---- ColumnParallelLinear: y_r = x W_r^T + b_r, W_r the rows r*out/n .. of W ----

ColumnParallelLinear::ColumnParallelLinear(int64_t in_features, int64_t out_features,
                                           parallel::TensorParallelGroupPtr group,
                                           bool gather_output, bool bias)
    : ColumnParallelLinear(Linear(in_features, out_features, bias),
                           checked(group, "ColumnParallelLinear"), gather_output) {}

ColumnParallelLinear::ColumnParallelLinear(const Linear& full,
                                           parallel::TensorParallelGroupPtr group,
                                           bool gather_output, int64_t stride)
    : Cloneable<ColumnParallelLinear>("ColumnParallelLinear"),
      in_features_(full.in_features()),
      out_features_(full.out_features()),
      has_bias_(full.has_bias()),
      gather_output_(gather_output),
      stride_(stride),
      group_(checked(group, "ColumnParallelLinear")) {
  MG_CHECK(stride_ >= 1 && out_features_ % stride_ == 0,
           "ColumnParallelLinear: out_features {} is not {} blocks of equal size (stride {})", out_features_, stride_,
           stride_);
  parallel::shard_size(out_features_ / stride_, group_->size(),
                       stride_ == 1 ? "ColumnParallelLinear: out_features"
                                    : "ColumnParallelLinear: out_features / stride (each block's rows)");
  MG_CHECK(stride_ == 1 || !gather_output_,
           "ColumnParallelLinear: gather_output with stride {} would interleave the blocks' parts", stride_);
  // parity fault: the blocks ignored, the rows cut as one block.
  const parallel::Placement rows =
      parallel::Placement::shard(0, testing::fault_is_on(testing::Fault::ColwiseStrideIgnored) ? 1 : stride_);
  auto shard = [&](const Tensor& t) {
    NoGradGuard no_grad;
    Tensor part = ops::clone(parallel::shard_tensor(t, rows, group_->rank(), group_->size()));
    return part.device() == group_->device() ? part : ops::copy_to(part, group_->device());
  };
  register_parameter("weight", shard(full.parameter("weight")));
  if (has_bias_) register_parameter("bias", shard(full.parameter("bias")));
  // What the layer holds, whatever a fault cut: the placement the stride says.
  // parity fault: the weight's shard recorded as a Replicate of a weight of its own shape,
  // so a reader of placements counts only rank 0's rows (the clip's norm).
  if (testing::fault_is_on(testing::Fault::PlacementReplicateWhereSharded)) {
    parallel::record_placement(weight(), "", weight().shape(),
                               parallel::tensor_parallel_placement(*group_, parallel::Placement::replicate()));
  } else {
    record(weight(), full, "weight", *group_, parallel::Placement::shard(0, stride_));
  }
  if (has_bias_) record(bias(), full, "bias", *group_, parallel::Placement::shard(0, stride_));
}

Tensor ColumnParallelLinear::forward(const Tensor& input) {
  MG_CHECK(input.defined() && input.dim() >= 1 && input.size(-1) == in_features_,
           "ColumnParallelLinear({}, {}): expected an input of shape [..., {}], got {} ({})",
           in_features_, out_features_, in_features_,
           input.defined() ? input.shape().str() : "undefined", group_->describe());
  // f: the whole input on every rank; its gradient is the sum of the ranks' parts. With
  // sequence parallelism the whole input is first gathered from the ranks' positions. An
  // input a style has made whole already carries that sum in its own backward.
  const Tensor x = parallel::is_made_whole_for(input, *group_)  ? input
                   : sequence_parallel_ ? parallel::gather_from_sequence_parallel(input, group_)
                                        : parallel::copy_to_parallel(input, group_);
  const Tensor y = linear(x, weight(), has_bias_ ? bias() : Tensor());  // [.., out/n]
  return gather_output_ ? parallel::gather_from_parallel(y, group_) : y;
}

std::string ColumnParallelLinear::extra_repr() const {
  return fmt::format("in_features={}, out_features={} ({} per rank{}), bias={}, "
                     "gather_output={}, rank {} of {}",
                     in_features_, out_features_, out_features_ / group_->size(),
                     stride_ == 1 ? "" : fmt::format(", {} blocks", stride_), python_bool(has_bias_),
                     python_bool(gather_output_), group_->rank(), group_->size());
}

// ---- RowParallelLinear: y = sum_r x_r W_r^T + b, W_r the columns r*in/n .. of W ----

RowParallelLinear::RowParallelLinear(int64_t in_features, int64_t out_features,
                                     parallel::TensorParallelGroupPtr group,
                                     bool input_is_parallel, bool bias)
    : RowParallelLinear(Linear(in_features, out_features, bias),
                        checked(group, "RowParallelLinear"), input_is_parallel) {}

RowParallelLinear::RowParallelLinear(const Linear& full, parallel::TensorParallelGroupPtr group,
                                     bool input_is_parallel)
    : Cloneable<RowParallelLinear>("RowParallelLinear"),
      in_features_(full.in_features()),
      out_features_(full.out_features()),
      has_bias_(full.has_bias()),
      input_is_parallel_(input_is_parallel),
      group_(checked(group, "RowParallelLinear")) {
  const int64_t part =
      parallel::shard_size(in_features_, group_->size(), "RowParallelLinear: in_features");
  register_parameter("weight", shard_of(full.parameter("weight"), 1, group_->rank() * part, part,
                                        group_->device()));
  if (has_bias_) register_parameter("bias", whole_on(full.parameter("bias"), group_->device()));
  record(weight(), full, "weight", *group_, parallel::Placement::shard(1));
  if (has_bias_) record(bias(), full, "bias", *group_, parallel::Placement::replicate());
}

Tensor RowParallelLinear::forward(const Tensor& input) {
  const int64_t expected = input_is_parallel_ ? in_features_per_rank() : in_features_;
  MG_CHECK(input.defined() && input.dim() >= 1 && input.size(-1) == expected,
           "RowParallelLinear({}, {}): expected an input of shape [..., {}] ({}), got {} ({})",
           in_features_, out_features_, expected,
           input_is_parallel_ ? "this rank's slice of the input features" : "the whole input",
           input.defined() ? input.shape().str() : "undefined", group_->describe());
  const Tensor x = input_is_parallel_ ? input : parallel::scatter_to_parallel(input, group_);
  // g: each rank's product is a partial sum over its input features; one all-reduce adds
  // them. The bias is added once, after the sum, so it is not counted n times.
  // parity fault: the bias added before the all-reduce, so once per rank.
  if (has_bias_ && testing::fault_is_on(testing::Fault::RowParallelBiasPerRank))
    return parallel::reduce_from_parallel(linear(x, weight(), bias()), group_);
  const Tensor partial = linear(x, weight());
  const Tensor y = sequence_parallel_
                       ? parallel::reduce_scatter_to_sequence_parallel(partial, group_)
                       : parallel::reduce_from_parallel(partial, group_);
  return has_bias_ ? y + bias() : y;
}

void RowParallelLinear::set_sequence_parallel(bool on) {
  MG_CHECK(!on || input_is_parallel_,
           "RowParallelLinear({}, {}): sequence parallelism needs input_is_parallel (the input "
           "is the column layer's slice of the features)", in_features_, out_features_);
  sequence_parallel_ = on;
  // The bias is added to this rank's positions only: each rank's gradient is a share of the
  // sum (reduce_partial_gradients adds them).
  if (has_bias_)
    parallel::replace_placement(bias(),
                                parallel::tensor_parallel_placement(*group_, parallel::Placement::replicate(), on));
}

std::string RowParallelLinear::extra_repr() const {
  return fmt::format("in_features={} ({} per rank), out_features={}, bias={}, "
                     "input_is_parallel={}, rank {} of {}",
                     in_features_, in_features_ / group_->size(), out_features_,
                     python_bool(has_bias_), python_bool(input_is_parallel_), group_->rank(),
                     group_->size());
}

}  // namespace mg::nn

namespace mg::parallel {

std::shared_ptr<nn::Sequential> parallelize_mlp(const nn::Sequential& mlp,
                                                const TensorParallelGroupPtr& group) {
  MG_CHECK(group != nullptr, "parallelize_mlp: the tensor-parallel group is null");
  const auto& children = mlp.named_children();
  size_t linears = 0;
  for (const auto& [name, child] : children) {
    const nn::Module& m = *child;
    MG_CHECK(typeid(m) == typeid(nn::Linear) || typeid(m) == typeid(nn::ReLU),
             "parallelize_mlp: layer '{}' is a {}; only a Sequential of Linear and ReLU layers "
             "can be split into column/row pairs",
             name, m.type_name());
    if (typeid(m) == typeid(nn::Linear)) ++linears;
  }
  const size_t paired = linears - linears % 2;  // the Linear layers that get a partner

  auto out = std::make_shared<nn::Sequential>();
  size_t index = 0;  // among the Linear layers
  for (const auto& [name, child] : children) {
    if (typeid(*child) == typeid(nn::ReLU)) {
      out->push_back(std::make_shared<nn::ReLU>());
      continue;
    }
    const auto& linear = static_cast<const nn::Linear&>(*child);
    if (index >= paired) {
      nn::ModulePtr whole = child->clone(group->device());  // whole on every rank
      for (const Tensor& p : whole->parameters())
        record_placement(p, "", p.shape(), tensor_parallel_placement(*group, Placement::replicate()));
      out->push_back(whole);
    } else if (index % 2 == 0) {
      out->push_back(std::make_shared<nn::ColumnParallelLinear>(linear, group, false));
    } else {
      out->push_back(std::make_shared<nn::RowParallelLinear>(linear, group, true));
    }
    ++index;
  }
  name_placements(out->named_parameters());  // the Sequential's names are the plain one's
  return out;
}

}  // namespace mg::parallel
