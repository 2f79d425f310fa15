// Backward in three steps:
//  1. count, for every node reachable from the roots, how many edges point at it;
//  2. run nodes whose count has dropped to zero (all their output gradients are in),
//     latest-created first, summing gradients that arrive at the same input slot;
//  3. free each node's saved tensors after it ran, unless retain_graph.
// With anomaly detection on (anomaly_mode.h), every gradient a node returns is checked
// for NaN and infinity before it is passed on.
// Nodes run on the calling thread; on a GPU their kernels queue on each device's current
// stream, so the replicas of DataParallel still run concurrently on their devices.
// While the profiler records, backward is a span, and so is each run of consecutive nodes
// that one DataParallel replica's forward made ("replica 1 backward"); with
// ProfilerOptions::autograd_nodes each node is a span of its own, named by its op.
#include <minigrad/autograd/engine.h>

#include <optional>
#include <queue>
#include <unordered_map>

#include <minigrad/autograd/anomaly_mode.h>
#include <minigrad/autograd/grad_mode.h>
#include <minigrad/autograd/node.h>
#include <minigrad/core/backend.h>
#include <minigrad/core/ops.h>
#include <minigrad/core/profiler.h>
#include <minigrad/core/stream.h>

namespace mg {
namespace {

// Gradients waiting for a node, one slot per output of that node.
struct InputBuffer {
  std::vector<Tensor> grads;
  void add(size_t slot, Tensor grad) {
    Tensor& current = grads[slot];
    if (!current.defined()) {
      current = std::move(grad);
    } else {
      current = ops::binary(BinaryOp::Add, current, grad);
    }
  }
};

struct LaterFirst {
  bool operator()(const Node* a, const Node* b) const { return a->sequence_nr() < b->sequence_nr(); }
};

// What the engine tracks for one node during a backward: one hash-map entry per node
// (not one per map of counts, owners and buffers), since a small model's backward is
// mostly this bookkeeping.
struct NodeTask {
  std::shared_ptr<Node> node;  // keeps the node alive while it is pending
  int dependencies = 0;        // edges into the node whose gradient has not arrived yet
  InputBuffer buffer;
};

// The spans of the replicas' backwards: one per run of consecutive nodes of one replica,
// in the order the engine runs them (on one thread, the replicas' nodes may alternate).
class ReplicaRuns {
 public:
  void enter(const Node& node, Device device) {
    if (node.replica() == replica_) return;
    span_.reset();
    replica_ = node.replica();
    if (replica_ < 0) return;
    span_.emplace(device, "replica {} backward", replica_);
    span_->category("backward").arg("replica", replica_);
  }

 private:
  int replica_ = -1;
  std::optional<profiler::Span> span_;
};

}  // namespace

void run_backward(const std::vector<Tensor>& roots, const std::vector<Tensor>& grad_roots,
                  bool retain_graph) {
  NoGradGuard no_grad;  // backward computes plain tensors; it records no graph of its own
  profiler::Span backward_span("backward");
  backward_span.category("backward");

  // Step 1: dependency counts.
  std::unordered_map<Node*, NodeTask> tasks;
  std::vector<Node*> stack;
  std::vector<Edge> root_edges;
  // The task of the node behind `edge`, made (and the node queued for a visit of its
  // own edges) the first time it is seen.
  auto discover = [&](const Edge& edge) -> NodeTask& {
    auto [it, inserted] = tasks.try_emplace(edge.function.get());
    if (inserted) {
      it->second.node = edge.function;
      stack.push_back(edge.function.get());
    }
    return it->second;
  };
  for (const Tensor& root : roots) {
    Edge edge = gradient_edge(root);
    MG_CHECK(edge.valid(),
             "backward: tensor of shape {} does not require grad and has no grad_fn (did you "
             "forget set_requires_grad(true), or run forward under NoGradGuard?)",
             root.shape());
    root_edges.push_back(edge);
    discover(edge);
  }
  while (!stack.empty()) {
    Node* node = stack.back();
    stack.pop_back();
    for (const Edge& next : node->next_edges()) {
      if (!next.valid()) continue;
      ++discover(next).dependencies;
    }
  }

  // Step 2: run ready nodes.
  auto buffer_of = [&](Node* node) -> InputBuffer& {
    InputBuffer& b = tasks.at(node).buffer;
    if (b.grads.empty()) b.grads.resize(std::max<size_t>(node->outputs().size(), 1));
    return b;
  };
  std::priority_queue<Node*, std::vector<Node*>, LaterFirst> ready;
  for (size_t i = 0; i < root_edges.size(); ++i) {
    Node* node = root_edges[i].function.get();
    buffer_of(node).add(root_edges[i].input_nr, grad_roots[i]);
  }
  for (const Edge& e : root_edges) {
    NodeTask& task = tasks.at(e.function.get());
    if (task.dependencies == 0) {
      task.dependencies = -1;  // queued
      ready.push(e.function.get());
    }
  }

  const bool tracing = backward_span.active();
  const bool trace_nodes = tracing && profiler::records_autograd_nodes();
  ReplicaRuns replica_runs;
  while (!ready.empty()) {
    Node* node = ready.top();
    ready.pop();
    // Only the buffer is taken: the task keeps the node alive until backward ends.
    std::vector<Tensor> grad_outputs = std::move(buffer_of(node).grads);
    // An output nobody differentiated gets a zero gradient of its recorded shape.
    for (size_t i = 0; i < grad_outputs.size() && i < node->outputs().size(); ++i) {
      if (!grad_outputs[i].defined()) {
        const OutputMeta& m = node->outputs()[i];
        grad_outputs[i] = zeros(m.shape, m.dtype, m.device);
      }
    }
    std::vector<Tensor> grad_inputs;
    {
      const Device device = node->outputs().empty() ? Device::cpu() : node->outputs()[0].device;
      if (tracing) replica_runs.enter(*node, device);
      DeviceGuard guard(device);
      std::optional<profiler::Span> node_span;
      if (trace_nodes) {
        node_span.emplace(device, "{}", node->name());
        node_span->category("autograd");
      }
      grad_inputs = node->apply(std::move(grad_outputs));
    }
    // Nodes run in dependency order, so the first non-finite gradient seen is the one
    // this node's backward produced, not one it was handed.
    if (AnomalyMode::is_enabled())
      for (size_t i = 0; i < grad_inputs.size(); ++i)
        if (anomaly::has_non_finite(grad_inputs[i]))
          anomaly::report_non_finite(node->name(), node->creation_context(), i, grad_inputs[i]);
    if (!retain_graph) node->release_saved();

    const auto& edges = node->next_edges();
    for (size_t i = 0; i < edges.size(); ++i) {
      const Edge& next = edges[i];
      if (!next.valid()) continue;
      Node* n = next.function.get();
      if (i < grad_inputs.size() && grad_inputs[i].defined())
        buffer_of(n).add(next.input_nr, std::move(grad_inputs[i]));
      if (--tasks.at(n).dependencies == 0) ready.push(n);
    }
  }
}

}  // namespace mg
