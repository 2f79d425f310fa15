// The tensor-parallel styles (styles.h): each swaps its module for the layer of
// layers.h / vocab_parallel.h, or hooks it, and records what each rank holds.
#include <minigrad/parallel/tensor_parallel/styles.h>

#include <fmt/format.h>

#include <minigrad/autograd/functions.h>
#include <minigrad/core/ops.h>
#include <minigrad/nn/layers.h>
#include <minigrad/nn/transformer_layers.h>
#include <minigrad/parallel/tensor_parallel/activation_layout.h>
#include <minigrad/parallel/tensor_parallel/functions.h>
#include <minigrad/parallel/tensor_parallel/layers.h>
#include <minigrad/parallel/tensor_parallel/sequence_parallel.h>
#include <minigrad/parallel/tensor_parallel/vocab_parallel.h>

namespace mg::parallel {
namespace {

// A layout's dimension counted from the front of an activation of `dims` dimensions.
int64_t dim_of(const Layout& l, int64_t dims) { return l.dim < 0 ? l.dim + dims : l.dim; }

bool is_sequence(const Layout& l) { return l.kind == Layout::Kind::Shard && l.dim == 1; }
bool is_features(const Layout& l) { return l.kind == Layout::Kind::Shard && l.dim == -1; }

template <typename M>
const M* as(nn::Module& m) {
  return dynamic_cast<const M*>(&m);
}

// Records `placement` on parameter `local` of the module at `name`, by its single-device
// shape `full`.
void place(nn::Module& root, const std::string& name, const std::string& local, const Shape& full,
           const DimPlacement& placement) {
  record_placement(module_at(root, name).parameter(local), join_name(name, local), full, placement);
}

// Every Dropout at or under `module` draws from this rank's generator.
void shard_dropouts(nn::Module& module, const ParallelContext& context) {
  if (auto* d = dynamic_cast<nn::Dropout*>(&module)) d->set_generator(context.sharded_generator);
  for (const nn::ModulePtr& c : module.children()) shard_dropouts(*c, context);
}

}  // namespace

std::string Layout::str() const {
  switch (kind) {
    case Kind::Replicate: return "Replicate()";
    case Kind::Shard: return fmt::format("Shard({})", dim);
    case Kind::Partial: return "Partial()";
  }
  return "?";
}

// ---- ColwiseParallel ----

void ColwiseParallel::apply(nn::Module& root, const std::string& name, const ParallelContext& context) const {
  const auto* linear = as<nn::Linear>(module_at(root, name));
  MG_CHECK(linear != nullptr, "ColwiseParallel splits a Linear, and '{}' is a {}", name,
           module_at(root, name).type_name());
  MG_CHECK(input_.kind == Layout::Kind::Replicate || is_sequence(input_),
           "ColwiseParallel: its input is Replicate() or Shard(1), not {}", input_.str());
  MG_CHECK(is_features(output_) || output_.kind == Layout::Kind::Replicate,
           "ColwiseParallel: its output is Shard(-1) or Replicate(), not {}", output_.str());
  const Shape weight = linear->parameter("weight").shape();
  const bool bias = linear->has_bias();
  const Shape bias_shape = bias ? linear->parameter("bias").shape() : Shape{};
  auto layer = std::make_shared<nn::ColumnParallelLinear>(*linear, context.collectives,
                                                          output_.kind == Layout::Kind::Replicate, stride_);
  layer->set_sequence_parallel(is_sequence(input_));
  root.replace_child(name, layer);
  const DimPlacement rows = context.placement(Placement::shard(0, stride_));
  place(root, name, "weight", weight, rows);
  if (bias) place(root, name, "bias", bias_shape, rows);
}

std::string ColwiseParallel::str() const {
  return fmt::format("ColwiseParallel(input_layouts={}, output_layouts={}{})", input_.str(), output_.str(),
                     stride_ == 1 ? "" : fmt::format(", stride={}", stride_));
}

// ---- RowwiseParallel ----

void RowwiseParallel::apply(nn::Module& root, const std::string& name, const ParallelContext& context) const {
  nn::Module& module = module_at(root, name);
  MG_CHECK(output_.kind == Layout::Kind::Replicate || is_sequence(output_),
           "RowwiseParallel: its output is Replicate() or Shard(1), not {}", output_.str());
  const bool sequence = is_sequence(output_);
  if (const auto* embedding = as<nn::Embedding>(module)) {
    // torch's RowwiseParallel of an Embedding: its rows are the vocabulary.
    MG_CHECK(input_.kind == Layout::Kind::Replicate || input_ == Layout::shard(-1),
             "RowwiseParallel of an Embedding: its input (token ids) is Replicate(), not {}", input_.str());
    const Shape weight = embedding->weight().shape();
    auto layer = std::make_shared<nn::VocabParallelEmbedding>(*embedding, context.collectives);
    layer->set_sequence_parallel(sequence);
    root.replace_child(name, layer);
    place(root, name, "weight", weight, context.placement(Placement::shard(0)));
    return;
  }
  const auto* linear = as<nn::Linear>(module);
  MG_CHECK(linear != nullptr, "RowwiseParallel splits a Linear or an Embedding, and '{}' is a {}", name,
           module.type_name());
  MG_CHECK(is_features(input_) || input_.kind == Layout::Kind::Replicate,
           "RowwiseParallel: its input is Shard(-1) or Replicate(), not {}", input_.str());
  const Shape weight = linear->parameter("weight").shape();
  const bool bias = linear->has_bias();
  const Shape bias_shape = bias ? linear->parameter("bias").shape() : Shape{};
  auto layer = std::make_shared<nn::RowParallelLinear>(*linear, context.collectives, is_features(input_));
  layer->set_sequence_parallel(sequence);
  root.replace_child(name, layer);
  place(root, name, "weight", weight, context.placement(Placement::shard(1)));
  // The bias is added after the sum: whole on every rank; on its positions alone under
  // sequence parallelism, so then its gradient is each rank's share.
  if (bias) place(root, name, "bias", bias_shape, context.placement(Placement::replicate(), sequence));
}

std::string RowwiseParallel::str() const {
  return fmt::format("RowwiseParallel(input_layouts={}, output_layouts={})", input_.str(), output_.str());
}

// ---- SequenceParallel, ShardedDropout ----

void SequenceParallel::apply(nn::Module& root, const std::string& name, const ParallelContext& context) const {
  nn::Module& module = module_at(root, name);
  // Each rank runs the module on its own positions: the parameters' gradients are shares.
  for (const auto& [local, p] : module.named_parameters())
    record_placement(p, join_name(name, local), p.shape(), context.placement(Placement::replicate(), true));
  shard_dropouts(module, context);
}

void ShardedDropout::apply(nn::Module& root, const std::string& name, const ParallelContext& context) const {
  nn::Module& module = module_at(root, name);
  MG_CHECK(dynamic_cast<nn::Dropout*>(&module) != nullptr || !module.children().empty(),
           "ShardedDropout gives a Dropout its rank's generator, and '{}' is a {}", name, module.type_name());
  shard_dropouts(module, context);
}

// ---- moving an activation between layouts ----

Tensor redistribute(const Tensor& x, Layout from, Layout to, const ParallelContext& context) {
  if (from == to) return x;
  const TensorParallelGroupPtr& group = context.collectives;
  const int64_t dims = x.dim();
  const auto fail = [&] {
    MG_FAIL("redistribute: from {} to {} over {} is not a move minigrad makes (activation {})", from.str(), to.str(),
            group->describe(), x.shape());
  };
  if (from.kind == Layout::Kind::Shard && to.kind == Layout::Kind::Replicate) {
    if (dim_of(from, dims) == 1 && dims >= 3) {
      // The positions gathered for the column layers after it: their gradients are each
      // rank's share, which this gather's backward sums (reduce-scatter) -- so they must
      // not sum it again (activation_layout.h).
      Tensor whole = gather_from_sequence_parallel(x, group);
      mark_made_whole(whole, *group);
      return whole;
    }
    if (dim_of(from, dims) == dims - 1) return gather_from_parallel(x, group);
    fail();
  }
  if (from.kind == Layout::Kind::Replicate && to.kind == Layout::Kind::Shard) {
    const int64_t d = dim_of(to, dims);
    if (!x.requires_grad()) {  // indices, positions: this rank's part, nothing flows back
      MG_CHECK(d >= 0 && d < dims && x.size(d) % group->size() == 0,
               "redistribute: dimension {} of {} does not divide over {}", d, x.shape(), group->describe());
      const int64_t part = x.size(d) / group->size();
      return ops::narrow(x, d, group->rank() * part, part);
    }
    if (d == 1 && dims >= 3) return scatter_to_sequence_parallel(x, group);
    if (d == dims - 1) return scatter_to_parallel(x, group);
    fail();
  }
  if (from.kind == Layout::Kind::Partial) {
    if (to.kind == Layout::Kind::Replicate) return reduce_from_parallel(x, group);
    if (is_sequence(to)) return reduce_scatter_to_sequence_parallel(x, group);
  }
  fail();
  return x;
}

void PrepareModuleInput::apply(nn::Module& root, const std::string& name, const ParallelContext& context) const {
  module_at(root, name).register_forward_pre_hook(
      [from = input_, to = desired_, context](nn::Module&, const Tensor& input) {
        return redistribute(input, from, to, context);
      });
}

std::string PrepareModuleInput::str() const {
  return fmt::format("PrepareModuleInput(input_layouts={}, desired_input_layouts={})", input_.str(), desired_.str());
}

void PrepareModuleOutput::apply(nn::Module& root, const std::string& name, const ParallelContext& context) const {
  module_at(root, name).register_forward_hook(
      [from = output_, to = desired_, context](nn::Module&, const Tensor&, const Tensor& output) {
        return redistribute(output, from, to, context);
      });
}

std::string PrepareModuleOutput::str() const {
  return fmt::format("PrepareModuleOutput(output_layouts={}, desired_output_layouts={})", output_.str(),
                     desired_.str());
}

}  // namespace mg::parallel
