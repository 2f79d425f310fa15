// mg::cuda::CUDAGraph: work captured once from a stream and replayed with one launch
// (torch.cuda.CUDAGraph). For a training step whose shapes do not change, a replay costs
// the GPU's time alone: no op dispatch, no allocator calls, no kernel launches from the
// host.
//
//   mg::cuda::CUDAGraph graph;
//   graph.capture_begin();             // this thread's current stream of the current device
//   loss = step();                     // recorded, not run
//   graph.capture_end();
//   for (...) graph.replay();          // runs the recorded work on the same stream
//
// What can be captured: ops on the captured stream whose tensors keep their addresses
// (the inputs are written in place between replays, as in PyTorch). Memory allocated
// during the capture comes from the graph (the allocator records cudaMallocAsync/
// cudaFreeAsync as graph nodes); tensors made before the capture and freed inside it
// are released when it ends. Host synchronisation (item(), to(cpu)) cannot be captured
// and makes capture_end() fail with an mg::Error. Plain C++: in a build without CUDA
// every method throws an mg::Error that says so.
#pragma once

#include <memory>

namespace mg::cuda {

class CUDAGraph {
 public:
  CUDAGraph();
  ~CUDAGraph();  // ends a capture still in progress (discarding it) and frees the graph
  CUDAGraph(const CUDAGraph&) = delete;
  CUDAGraph& operator=(const CUDAGraph&) = delete;

  // Starts capturing this thread's current stream of `device` (-1: the current device).
  void capture_begin(int device = -1);
  // Ends the capture and makes the graph ready to replay.
  void capture_end();
  // Runs the captured work again, queued on the stream it was captured from.
  void replay();
  // Frees the graph; the object can capture again.
  void reset();
  bool is_capturing() const;
  bool is_ready() const;  // captured, not reset

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace mg::cuda
