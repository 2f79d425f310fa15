// TensorParallelGroup: the ranks that share one layer's weights, as one rank sees them.
//
// Megatron's column and row parallel layers talk to the other shards through exactly two
// collectives, a sum all-reduce and an all-gather, and sequence parallelism adds a third,
// the reduce-scatter. This interface is those three and nothing else, so the same layer code (layers.h, functions.h) runs over either kind of
// group:
//   - across processes: tensor_parallel_group(process_group) below; each process is one
//     rank (Gloo on the CPU, NCCL on its GPU), as in Megatron and picotron;
//   - in one process: InProcessGroup (in_process_group.h); rank r is a worker thread
//     driving devices[r], and each collective runs over the Communicator of the devices
//     (NCCL for distinct GPUs, host copies otherwise) once every rank's thread has
//     arrived: TensorParallel (tensor_parallel.h) runs the threads.
// As with a ProcessGroup, every rank calls the same collectives in the same order.
//
// Each rank counts its collectives and their payload (stats()), so tests can check that
// an MLP block costs two all-reduces per step, and benchmarks can hold the bytes against
// the arithmetic of docs/tensor-parallel.md.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include <minigrad/core/tensor.h>
#include <minigrad/parallel/placement.h>

namespace mg::parallel {

class ProcessGroup;

struct TensorParallelStats {
  int64_t all_reduces = 0;
  int64_t all_gathers = 0;
  int64_t all_reduce_bytes = 0;  // this rank's input bytes, summed over its all-reduces
  int64_t all_gather_bytes = 0;  // this rank's input bytes, summed over its all-gathers
  int64_t reduce_scatters = 0;    // sequence parallelism's (sequence_parallel.h)
  int64_t reduce_scatter_bytes = 0;  // this rank's input bytes, summed over its reduce-scatters
};

class TensorParallelGroup {
 public:
  virtual ~TensorParallelGroup() = default;
  TensorParallelGroup() = default;
  TensorParallelGroup(const TensorParallelGroup&) = delete;
  TensorParallelGroup& operator=(const TensorParallelGroup&) = delete;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Where this rank's shards and activations live.
  virtual Device device() const = 0;
  // "gloo rank 1 of 2", "in-process rank 0 of [cpu, cpu]": for messages.
  virtual std::string describe() const = 0;
  // The process group behind the collectives (what a placement records as its group:
  // placement.h); null when the ranks are threads of one process (InProcessGroup).
  virtual std::shared_ptr<ProcessGroup> process_group() const { return nullptr; }

  // The sum over the ranks of `tensor` (on device(), one shape and dtype on every rank):
  // a new tensor, the same values on every rank. `tensor` is not changed.
  Tensor all_reduce(const Tensor& tensor);
  // Every rank's `tensor` (same shape on every rank), stacked: shape [size(), shape...],
  // entry s being rank s's tensor.
  Tensor all_gather(const Tensor& tensor);
  // The sum over the ranks of `tensor` (same shape on every rank, size(0) divisible by
  // size()), of which this rank keeps part rank() along dimension 0: shape
  // [size(0) / size(), ...]. Sequence parallelism's replacement for all_reduce: the same
  // sum for 1/size() of the bytes received.
  Tensor reduce_scatter(const Tensor& tensor);

  TensorParallelStats stats() const;
  void reset_stats();

 protected:
  virtual Tensor all_reduce_impl(const Tensor& tensor) = 0;
  virtual Tensor all_gather_impl(const Tensor& tensor) = 0;
  // By default all_reduce_impl, then this rank's part (right, but every rank receives the
  // whole sum): the in-process group keeps it; process groups override it with the real one.
  virtual Tensor reduce_scatter_impl(const Tensor& tensor);

 private:
  void check(const char* collective, const Tensor& tensor) const;

  std::atomic<int64_t> all_reduces_{0}, all_gathers_{0};
  std::atomic<int64_t> all_reduce_bytes_{0}, all_gather_bytes_{0};
  std::atomic<int64_t> reduce_scatters_{0}, reduce_scatter_bytes_{0};
};

using TensorParallelGroupPtr = std::shared_ptr<TensorParallelGroup>;

// This process's rank of `process_group` as a tensor-parallel group: its collectives are
// the process group's allreduce and all_gather, waited for at once (the next layer needs
// the result). One view per process group while any holder keeps it: every caller over
// the same group shares its stats(). Gloo and NCCL alike. Float64, which process groups do not reduce, travels as the
// bits of int64 (all-gathered, then summed on every rank in rank order).
TensorParallelGroupPtr tensor_parallel_group(std::shared_ptr<ProcessGroup> process_group);

// This rank's placement on the tensor-parallel dimension "tp" of `group` (placement.h),
// for a layer to record on the parameters it splits or replicates.
DimPlacement tensor_parallel_placement(const TensorParallelGroup& group, Placement placement,
                                       bool partial_gradient = false);

// `size` cut into `parts` equal shards, or an mg::Error naming `what` (e.g.
// "ColumnParallelLinear: out_features") when it does not divide: minigrad refuses uneven
// shards rather than padding them, as Megatron does.
int64_t shard_size(int64_t size, int parts, const char* what);

}  // namespace mg::parallel
