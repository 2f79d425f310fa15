#include <minigrad/autograd/node.h>

#include <atomic>
#include <mutex>
#include <utility>

#include <minigrad/autograd/anomaly_mode.h>
#include <minigrad/autograd/grad_mode.h>
#include <minigrad/autograd/replica_scope.h>
#include <minigrad/core/ops.h>

namespace mg {

namespace {
std::atomic<uint64_t> next_sequence_nr{0};
thread_local int this_thread_replica = -1;
}  // namespace

int current_replica() { return this_thread_replica; }
ReplicaScope::ReplicaScope(int replica) : previous_(std::exchange(this_thread_replica, replica)) {}
ReplicaScope::~ReplicaScope() { this_thread_replica = previous_; }

Node::Node(std::string name)
    : name_(std::move(name)), sequence_nr_(next_sequence_nr++), replica_(this_thread_replica) {}

std::vector<Tensor> FunctionNode::apply(std::vector<Tensor>&& grad_outputs) {
  MG_CHECK(backward_ != nullptr,
           "backward: trying to backward through the graph a second time (the saved tensors "
           "of {} were freed by the first backward); pass retain_graph=true to the first "
           "backward() if you need to call it twice",
           name());
  std::vector<Tensor> grads = backward_(BackwardArgs(grad_outputs, next_edges(), name()));
  MG_CHECK(grads.size() == next_edges().size(),
           "backward of {} returned {} gradients for {} inputs", name(), grads.size(),
           next_edges().size());
  return grads;
}

AccumulateGrad::AccumulateGrad(std::shared_ptr<TensorImpl> leaf)
    : Node("AccumulateGrad"), leaf_(std::move(leaf)) {}

std::vector<Tensor> AccumulateGrad::apply(std::vector<Tensor>&& grad_outputs) {
  Tensor leaf(leaf_);
  Tensor& incoming = grad_outputs[0];
  MG_CHECK(incoming.shape() == leaf.shape() && incoming.device() == leaf.device(),
           "AccumulateGrad: gradient of shape {} on {} does not match the leaf's shape {} on {}",
           incoming.shape(), incoming.device(), leaf.shape(), leaf.device());
  Tensor current = leaf.grad();
  if (!current.defined()) {
    // Keep the incoming buffer when nobody else can see it; otherwise copy, so that a
    // later in-place accumulation cannot change another tensor.
    const bool sole_owner = incoming.impl_ptr().use_count() == 1 &&
                            incoming.storage().use_count() == 1 && incoming.is_contiguous() &&
                            incoming.storage_offset() == 0;
    leaf.set_grad(sole_owner ? incoming : ops::clone(incoming));
  } else {
    backend(current.device()).binary(BinaryOp::Add, current, current, incoming, 1.0);
    bump_version(current, "AccumulateGrad");  // grad += incoming, in place, as PyTorch's
  }
  for (auto& hook : leaf_->autograd.post_accumulate_grad_hooks) hook(leaf);
  return {};
}

Edge gradient_edge(const Tensor& t) {
  if (!t.defined()) return {};
  TensorImpl& impl = *t.impl();
  if (impl.autograd.grad_fn) return {impl.autograd.grad_fn, impl.autograd.output_nr};
  if (!impl.autograd.requires_grad) return {};
  // Replicas running on worker threads (parallel_apply) may use one leaf at the same
  // time: its AccumulateGrad is made once, and its weak pointer written by one thread.
  static std::mutex accumulator_mutex;
  std::lock_guard<std::mutex> lock(accumulator_mutex);
  std::shared_ptr<Node> accumulator = impl.autograd.grad_accumulator.lock();
  if (!accumulator) {
    accumulator = std::make_shared<AccumulateGrad>(t.impl_ptr());
    accumulator->add_output(t);
    impl.autograd.grad_accumulator = accumulator;
  }
  return {accumulator, 0};
}

bool needs_graph(const std::vector<Tensor>& inputs) {
  if (!GradMode::is_enabled()) return false;
  for (const Tensor& t : inputs)
    if (t.defined() && t.requires_grad()) return true;
  return false;
}

void connect_node(const std::shared_ptr<Node>& node, const std::vector<Tensor>& inputs,
                  const std::vector<Tensor>& outputs) {
  std::vector<Edge> edges;
  edges.reserve(inputs.size());
  for (const Tensor& t : inputs) edges.push_back(gradient_edge(t));
  node->set_next_edges(std::move(edges));
  if (AnomalyMode::is_enabled()) node->set_creation_context(anomaly::describe_forward(inputs));
  uint32_t output_nr = 0;
  for (const Tensor& out : outputs) {
    node->add_output(out);
    AutogradMeta& meta = out.impl()->autograd;
    meta.requires_grad = true;
    meta.grad_fn = node;
    meta.output_nr = output_nr++;
  }
}

Tensor alias_for_node(const Tensor& x) { return x.detach(); }

std::shared_ptr<Node> record_function(const char* name, const std::vector<Tensor>& inputs,
                                      const std::vector<Tensor>& outputs,
                                      BackwardFunction backward) {
  if (!needs_graph(inputs)) return nullptr;
  auto node = std::make_shared<FunctionNode>(name, std::move(backward));
  connect_node(node, inputs, outputs);
  return node;
}

}  // namespace mg
