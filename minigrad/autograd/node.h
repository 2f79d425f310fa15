// The backward graph. Every differentiable op that sees an input requiring grad
// creates a Node; the Node's edges point at the Nodes that produced its inputs, so
// backward can walk from the loss to the leaves. Leaves end in an AccumulateGrad node
// that adds the incoming gradient into the leaf's grad().
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <minigrad/core/tensor.h>

namespace mg {

class Node;

// Where a gradient goes: input slot `input_nr` of `function` (null: nowhere).
struct Edge {
  std::shared_ptr<Node> function;
  uint32_t input_nr = 0;
  bool valid() const { return function != nullptr; }
};

// Shape, dtype and device of one output, so a missing gradient can be made as zeros.
struct OutputMeta {
  Shape shape;
  DType dtype;
  Device device;
};

class Node {
 public:
  explicit Node(std::string name);
  virtual ~Node() = default;
  Node(const Node&) = delete;
  Node& operator=(const Node&) = delete;

  // Given the gradients of this node's outputs, returns the gradients of its inputs
  // (one per next edge; undefined where an input needs none).
  virtual std::vector<Tensor> apply(std::vector<Tensor>&& grad_outputs) = 0;
  // Frees what forward saved for backward (called after a backward without retain_graph).
  virtual void release_saved() {}

  const std::string& name() const { return name_; }
  const std::vector<Edge>& next_edges() const { return next_edges_; }
  void set_next_edges(std::vector<Edge> edges) { next_edges_ = std::move(edges); }
  const std::vector<OutputMeta>& outputs() const { return outputs_; }
  void add_output(const Tensor& t) { outputs_.push_back({t.shape(), t.dtype(), t.device()}); }
  // Creation order; backward runs ready nodes latest-first, as PyTorch does, so hooks
  // on parameters fire roughly in reverse order of use.
  uint64_t sequence_nr() const { return sequence_nr_; }
  // What forward recorded about this node's inputs while anomaly detection was on
  // (anomaly_mode.h); empty otherwise. Anomaly errors quote it.
  const std::string& creation_context() const { return creation_context_; }
  void set_creation_context(std::string context) { creation_context_ = std::move(context); }
  int replica() const { return replica_; }  // whose forward made it, or -1 (replica_scope.h)

 private:
  std::string name_;
  std::string creation_context_;
  std::vector<Edge> next_edges_;
  std::vector<OutputMeta> outputs_;
  uint64_t sequence_nr_;
  int replica_;
};

// What a backward function receives: the output gradients (zeros where an output got
// none), which inputs want a gradient, so it can skip work nobody needs, and the name
// of the node, which SavedTensor::unpack quotes when a saved tensor was modified.
class BackwardArgs {
 public:
  BackwardArgs(const std::vector<Tensor>& grads, const std::vector<Edge>& edges,
               const std::string& node_name)
      : grads_(grads), edges_(edges), node_name_(node_name) {}
  const Tensor& grad(size_t output = 0) const { return grads_[output]; }
  const std::vector<Tensor>& grads() const { return grads_; }
  bool needs(size_t input) const { return edges_[input].valid(); }
  const std::string& node_name() const { return node_name_; }

 private:
  const std::vector<Tensor>& grads_;
  const std::vector<Edge>& edges_;
  const std::string& node_name_;
};

using BackwardFunction = std::function<std::vector<Tensor>(const BackwardArgs&)>;

// A Node whose backward is a closure written next to its forward (see autograd/functions/).
// The closure holds what forward saved: tensors only as SavedTensor
// (autograd/saved_tensor.h), which checks their version when backward unpacks them, so
// an in-place write between forward and backward is an error and not a wrong gradient.
// release_saved() drops the closure.
class FunctionNode final : public Node {
 public:
  FunctionNode(std::string name, BackwardFunction backward)
      : Node(std::move(name)), backward_(std::move(backward)) {}
  std::vector<Tensor> apply(std::vector<Tensor>&& grad_outputs) override;
  void release_saved() override { backward_ = nullptr; }

 private:
  BackwardFunction backward_;
};

// The sink of a leaf: adds the gradient into leaf.grad() and runs the leaf's hooks.
class AccumulateGrad final : public Node {
 public:
  explicit AccumulateGrad(std::shared_ptr<TensorImpl> leaf);
  std::vector<Tensor> apply(std::vector<Tensor>&& grad_outputs) override;
  const std::shared_ptr<TensorImpl>& leaf() const { return leaf_; }

 private:
  std::shared_ptr<TensorImpl> leaf_;
};

// The edge a gradient for `t` should flow along: its grad_fn, its leaf accumulator, or
// none when it does not require grad.
Edge gradient_edge(const Tensor& t);

// Connects `outputs`, computed from `inputs`, into the graph: when grad mode is on and
// some input requires grad, creates a FunctionNode named `name` with `backward` and
// makes the outputs require grad with it as grad_fn. Returns the node (or null).
std::shared_ptr<Node> record_function(const char* name, const std::vector<Tensor>& inputs,
                                      const std::vector<Tensor>& outputs,
                                      BackwardFunction backward);
// The same for a custom Node (DataParallel's Broadcast, Scatter, Gather).
void connect_node(const std::shared_ptr<Node>& node, const std::vector<Tensor>& inputs,
                  const std::vector<Tensor>& outputs);
// True when recording is on and at least one of `inputs` requires grad.
bool needs_graph(const std::vector<Tensor>& inputs);
// A tensor of its own over x's memory (same values, shape, strides and version counter)
// with no history: the output of a node that is the identity in forward (FSDP's gather
// before backward, tensor parallelism's f), which connect_node then makes its grad_fn.
Tensor alias_for_node(const Tensor& x);

}  // namespace mg
