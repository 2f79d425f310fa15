#include <minigrad/parallel/tensor_parallel/tensor_parallel.h>

#include <atomic>
#include <exception>
#include <functional>

#include <minigrad/autograd/engine.h>
#include <minigrad/autograd/grad_mode.h>
#include <minigrad/autograd/node.h>
#include <minigrad/core/ops.h>
#include <minigrad/core/stream.h>
#include <minigrad/parallel/comm.h>
#include <minigrad/parallel/devices/communicator.h>
#include <minigrad/parallel/devices/device_list.h>
#include <minigrad/parallel/devices/run_per_device.h>
#include <minigrad/parallel/devices/transfer.h>
#include <minigrad/parallel/tensor_parallel/layers.h>

namespace mg::parallel {
namespace {

// Runs body(r) for every rank at once, rank r on a thread of its own with its device
// and the caller's stream there current and the caller's grad mode. The first rank to
// fail aborts the group, so that the others leave their collectives, and its error is
// the one re-thrown.
void run_ranks(InProcessGroup& group, const std::function<void(size_t)>& body) {
  std::vector<Stream> streams;
  for (const Device& d : group.devices()) streams.push_back(current_stream(d));
  try {
    run_per_device(
        group.devices(), streams, "TensorParallel: rank",
        body,
        [&](size_t r, const std::string& what) {
          group.abort(fmt::format("rank {} on {} failed: {}", r, group.devices()[r], what));
        });
  } catch (...) {
    group.clear_abort();
    throw;
  }
}

// One rank's piece of the region's input.
Tensor piece_of(const Tensor& input, Placement placement, int rank, int size) {
  if (placement.is_replicate()) return input;
  MG_CHECK(input.dim() >= 1,
           "TensorParallel: a Shard input is split along its last dimension, but it has shape {}",
           input.shape());
  const int64_t part =
      shard_size(input.size(-1), size, "TensorParallel: the last dimension of a Shard input");
  return ops::narrow(input, input.dim() - 1, rank * part, part);
}

// The ranks' outputs as one tensor on `device`: rank 0's (Replicate) or all of them side
// by side along the last dimension (Shard).
Tensor assemble(const std::vector<Tensor>& outputs, Placement placement, Device device) {
  if (placement.is_replicate()) {
    const Tensor& y = outputs[0];
    return y.device() == device ? y.detach() : copy_to_device(y, device);
  }
  return comm::gather(outputs, device, outputs[0].dim() - 1);
}

// What one forward of the region keeps for its backward.
struct RankState {
  Tensor input;                 // the rank's input, a leaf of its own graph (when needed)
  Tensor output;                // the rank's output, root of its own graph
  std::vector<Tensor> aliases;  // leaves standing for the rank's parameters in its graph
};

// The node joining the ranks' graphs to the caller's. Inputs: the region's input, then
// every rank's parameters (rank by rank). Its backward runs the ranks' backwards at once.
class TensorParallelBackward final : public Node {
 public:
  TensorParallelBackward(InProcessGroupPtr group, std::vector<RankState> ranks,
                         Placement input_placement, Placement output_placement, Device input_device)
      : Node("TensorParallelBackward"),
        group_(std::move(group)),
        ranks_(std::move(ranks)),
        input_placement_(input_placement),
        output_placement_(output_placement),
        input_device_(input_device) {}

  std::vector<Tensor> apply(std::vector<Tensor>&& grad_outputs) override {
    MG_CHECK(!ranks_.empty(),
             "TensorParallel: backward through the region a second time (its graph was freed "
             "by the first backward); pass retain_graph=true to the first backward()");
    const Tensor& grad = grad_outputs[0];
    const size_t n = group_->devices().size();
    // Each rank's gradient: the whole of it (Replicate) or its slice (Shard).
    std::vector<Tensor> rank_grads(n);
    int64_t offset = 0;
    for (size_t r = 0; r < n; ++r) {
      const RankState& s = ranks_[r];
      const Device device = group_->devices()[r];
      Tensor piece = grad;
      if (output_placement_.is_shard()) {
        const int64_t width = s.output.size(-1);
        piece = ops::narrow(grad, grad.dim() - 1, offset, width);
        offset += width;
      }
      rank_grads[r] = copy_to_device(piece, device);
    }
    // Retained: a later backward with retain_graph (the caller's) may come through again;
    // release_saved() frees the ranks' graphs otherwise.
    run_ranks(*group_, [&](size_t r) {
      const RankState& s = ranks_[r];
      if (s.output.requires_grad())
        run_backward({s.output}, {rank_grads[r]}, /*retain_graph=*/true);
    });

    std::vector<Tensor> grads;
    grads.push_back(input_grad());
    for (const RankState& s : ranks_) {
      for (const Tensor& alias : s.aliases) {
        grads.push_back(alias.grad());
        alias.set_grad(Tensor());  // a second backward must not add to this one's
      }
    }
    return grads;
  }

  void release_saved() override { ranks_.clear(); }

 private:
  // By the conventions of functions.h a Replicate input's gradient is complete, and the
  // same, on every rank: rank 0's is taken. A Shard input's is the ranks' slices side by side.
  Tensor input_grad() {
    if (!ranks_[0].input.defined()) return Tensor();
    std::vector<Tensor> parts;
    for (const RankState& s : ranks_) {
      Tensor g = s.input.grad();
      if (!g.defined()) g = zeros(s.input.shape(), s.input.dtype(), s.input.device());
      s.input.set_grad(Tensor());
      parts.push_back(g);
    }
    if (input_placement_.is_replicate())
      return parts[0].device() == input_device_ ? parts[0] : copy_to_device(parts[0], input_device_);
    return comm::gather(parts, input_device_, parts[0].dim() - 1);
  }

  InProcessGroupPtr group_;
  std::vector<RankState> ranks_;
  Placement input_placement_, output_placement_;
  Device input_device_;
};

}  // namespace

Tensor tensor_parallel_apply(const std::vector<nn::ModulePtr>& shards,
                             const InProcessGroupPtr& group, const Tensor& input,
                             Placement input_placement, Placement output_placement,
                             std::optional<Device> output_device) {
  MG_CHECK(group != nullptr, "tensor_parallel_apply: the group is null");
  const size_t n = group->devices().size();
  MG_CHECK(shards.size() == n,
           "tensor_parallel_apply: got {} shards for a group of {} ranks ({}); expected one per "
           "rank",
           shards.size(), n, device_list_str(group->devices()));
  MG_CHECK(input.defined(), "tensor_parallel_apply: the input is undefined");
  for (size_t r = 0; r < n; ++r) {
    MG_CHECK(shards[r] != nullptr, "tensor_parallel_apply: shard {} is null", r);
    const Device device = group->devices()[r];
    for (const auto& [name, p] : shards[r]->named_parameters())
      MG_CHECK(p.device() == device,
               "tensor_parallel_apply: parameter '{}' of rank {} is on {}, but rank {} runs on {}",
               name, r, p.device(), r, device);
  }
  const Device out_device = output_device.value_or(group->devices()[0]);

  // The region records a node when the caller's graph would: grad mode on, and the input
  // or some parameter requiring grad.
  std::vector<Tensor> node_inputs{input};
  for (const nn::ModulePtr& shard : shards)
    for (const Tensor& p : shard->parameters())
      if (p.requires_grad()) node_inputs.push_back(p);
  const bool record = needs_graph(node_inputs);

  // Each rank's input is a copy on its device, and in a recorded region each rank's
  // module runs on aliases of its parameters: leaves of the rank's own graph, whose
  // gradients the node hands on (as replicate's replicas do).
  std::vector<RankState> ranks(n);
  std::vector<nn::ModulePtr> modules = shards;
  for (size_t r = 0; r < n; ++r) {
    RankState& s = ranks[r];
    const Device device = group->devices()[r];
    {
      NoGradGuard no_grad;
      s.input = copy_to_device(piece_of(input, input_placement, static_cast<int>(r), static_cast<int>(n)), device);
    }
    if (record && input.requires_grad()) s.input.set_requires_grad(true);
    if (!record) continue;
    nn::ModulePtr replica = shards[r]->shallow_clone();
    for (const auto& [name, p] : shards[r]->named_parameters()) {
      if (!p.requires_grad()) continue;
      Tensor alias = p.detach();
      alias.set_requires_grad(true);
      replica->set_parameter(name, alias);
      s.aliases.push_back(alias);
    }
    modules[r] = replica;
  }

  run_ranks(*group, [&](size_t r) {
    RankState& s = ranks[r];
    s.output = (*modules[r])(s.input);
  });

  std::vector<Tensor> outputs;
  for (const RankState& s : ranks) outputs.push_back(s.output);
  for (size_t r = 1; r < n; ++r)
    MG_CHECK(outputs[r].dim() == outputs[0].dim(),
             "tensor_parallel_apply: rank {} returned shape {}, rank 0 returned {}", r,
             outputs[r].shape(), outputs[0].shape());
  Tensor out;
  {
    NoGradGuard no_grad;
    out = assemble(outputs, output_placement, out_device);
  }
  if (record) {
    if (!input.requires_grad())
      for (RankState& s : ranks) s.input = Tensor();  // no input gradient to hand back
    connect_node(std::make_shared<TensorParallelBackward>(group, std::move(ranks), input_placement,
                                                          output_placement, input.device()),
                 node_inputs, {out});
  }
  return out;
}

// ---- TensorParallel ----

namespace {
std::vector<nn::ModulePtr> split_mlp(const nn::Sequential& mlp, const InProcessGroup& group) {
  std::vector<nn::ModulePtr> shards;
  for (const TensorParallelGroupPtr& rank : group.ranks()) shards.push_back(parallelize_mlp(mlp, rank));
  return shards;
}
}  // namespace

TensorParallel::TensorParallel(const nn::Sequential& mlp, std::vector<Device> devices)
    : TensorParallel(std::vector<nn::ModulePtr>{},
                     std::make_shared<InProcessGroup>(std::move(devices))) {
  for (nn::ModulePtr& shard : split_mlp(mlp, *group_))
    register_module(fmt::format("rank{}", named_children().size()), std::move(shard));
}

TensorParallel::TensorParallel(std::vector<nn::ModulePtr> shards, InProcessGroupPtr group)
    : nn::Cloneable<TensorParallel>("TensorParallel"), group_(std::move(group)) {
  MG_CHECK(group_ != nullptr, "TensorParallel: the group is null");
  MG_CHECK(shards.empty() || static_cast<int>(shards.size()) == group_->size(),
           "TensorParallel: got {} shards for a group of {} ranks ({})", shards.size(),
           group_->size(), device_list_str(group_->devices()));
  for (size_t r = 0; r < shards.size(); ++r)
    register_module(fmt::format("rank{}", r), std::move(shards[r]));
}

Tensor TensorParallel::forward(const Tensor& input) {
  return tensor_parallel_apply(children(), group_, input);
}

nn::ModulePtr TensorParallel::shard(int rank) const {
  MG_CHECK(rank >= 0 && rank < group_->size(), "TensorParallel: rank {} is outside [0, {})", rank,
           group_->size());
  return child(fmt::format("rank{}", rank));
}

std::string TensorParallel::extra_repr() const {
  return fmt::format("devices={}, communicator={}", device_list_str(group_->devices()),
                     group_->communicator_name());
}

}  // namespace mg::parallel
