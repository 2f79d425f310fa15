// The backward engine: runs the graph from the roots to the leaves.
#pragma once

#include <vector>

#include <minigrad/core/tensor.h>

namespace mg {

// Computes gradients of `roots` (seeded with `grad_roots`) and accumulates them into
// the leaves. Without retain_graph the saved tensors are freed as each node finishes.
void run_backward(const std::vector<Tensor>& roots, const std::vector<Tensor>& grad_roots,
                  bool retain_graph);

}  // namespace mg
