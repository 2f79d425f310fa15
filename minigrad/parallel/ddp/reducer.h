// Reducer: the gradient bucketing of DistributedDataParallel (PyTorch's c10d::Reducer).
//
// At construction the parameters are packed, in reverse registration order (roughly the
// order backward produces their gradients), into buckets: the first holds about
// first_bucket_bytes (small, so the first all-reduce starts early), the others about
// bucket_bytes. Each parameter gets a post-accumulate-grad hook. In backward:
//
//   hook(p) fires when p.grad is final for this backward
//     -> p is ready; when every parameter of bucket b is ready (and buckets 0..b-1 have
//        been launched, so every rank launches in the same order), its gradients are
//        copied into the bucket's flat buffer and its all-reduce (average) starts on the
//        process group's communication thread/stream, while backward continues;
//   the last bucket's launch finishes the iteration
//     -> wait for every bucket, copy the averaged values back into each p.grad.
//
// So the wait happens inside the last hook, at the end of backward, with no change to the
// autograd engine. Iteration states: Idle (no synced forward since the last reduction;
// hooks do nothing: no_sync() and plain backward calls), Armed (forward ran, gradients
// expected), Finished (reduced; a further gradient before the next forward is an error),
// Failed (a collective failed: its error is thrown again at every later forward, since
// the ranks can no longer agree on the gradients).
//
// With gradient_as_bucket_view, the last step sets each .grad to its slot of the bucket
// instead of copying into it; a .grad that already is its slot (accumulated in place
// since) is not copied into the bucket either.
//
// Unused parameters: with find_unused_parameters, prepare_for_backward walks the graph
// from the output and marks the parameters it does not reach as ready at once; their
// slots in the bucket hold zeros, so after the reduction their grad is the average over
// the ranks that did use them (zeros when no rank did; PyTorch would leave it undefined in
// that last case). Without it, a parameter that gets no gradient keeps its bucket from
// launching; the next forward then fails with an mg::Error naming the parameters.
#pragma once

#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <minigrad/core/tensor.h>
#include <minigrad/parallel/c10d/bucketing.h>
#include <minigrad/parallel/c10d/process_group.h>

namespace mg::parallel {

// How a bucket travels: torch's DDP communication hooks. AllReduce (allreduce_hook, the
// default): in the gradients' own dtype -- float32 for float32 parameters, also under
// autocast (nanoGPT's way: gradients reduced in float32). BF16Compress and FP16Compress
// (bf16_compress_hook, fp16_compress_hook): the bucket rounded to bfloat16 or float16
// before the all-reduce (each gradient off by up to u = 2^-8 or 2^-11 relative) and the
// average widened back after it: half the bytes of float32 over NCCL, which carries the
// 16-bit floats. Over Gloo the 16-bit bucket travels as float32 (process_group_gloo.h):
// the compression's roundings are the same, its bytes are not saved -- on the CPU it shows
// the numerics, not the bandwidth. (torch divides by the world size before its 16-bit sum;
// here the average is the process group's: summed, then scaled, rounded once.)
enum class CommHook { AllReduce, BF16Compress, FP16Compress };

// What the last reduction cost, for benchmarks: the communication thread/stream was busy
// comm_seconds; backward's caller blocked wait_seconds at its end waiting for it. The
// difference is the communication hidden behind backward.
struct ReductionStats {
  size_t buckets = 0;
  size_t bytes = 0;
  double comm_seconds = 0.0;
  double wait_seconds = 0.0;
};

class Reducer : public std::enable_shared_from_this<Reducer> {
 public:
  // Use Reducer::create (the hooks hold weak references to the reducer).
  static std::shared_ptr<Reducer> create(std::vector<Tensor> params,
                                         std::vector<std::string> names,
                                         std::shared_ptr<ProcessGroup> process_group,
                                         size_t first_bucket_bytes, size_t bucket_bytes,
                                         bool find_unused_parameters,
                                         bool gradient_as_bucket_view = false);

  // Before a forward: fails if the previous iteration's reduction is incomplete.
  void prepare_for_forward();
  // After a forward whose backward should reduce gradients: arms the hooks.
  void prepare_for_backward(const Tensor& output);
  // After a forward whose backward should not (no_sync, or grad mode off).
  void disarm();

  // Parameter indices of each bucket, in launch order.
  const std::vector<std::vector<size_t>>& bucket_indices() const { return bucket_indices_; }
  std::vector<size_t> bucket_bytes() const;
  ReductionStats last_stats() const;

  // The hook: parameter `index` has its gradient for this backward.
  void mark_ready(size_t index);

  // Between iterations: how the buckets travel from the next backward on.
  void set_comm_hook(CommHook hook);
  CommHook comm_hook() const { return comm_hook_; }

  Reducer(std::vector<Tensor> params, std::vector<std::string> names,
          std::shared_ptr<ProcessGroup> process_group, size_t first_bucket_bytes,
          size_t bucket_bytes, bool find_unused_parameters, bool gradient_as_bucket_view);

 private:
  enum class State { Idle, Armed, Finished, Failed };
  struct Bucket {
    std::vector<size_t> params;   // indices into params_
    Tensor flat;                  // the gradients of this bucket, contiguous
    std::vector<Tensor> views;    // each parameter's slot of flat, shaped like it
    size_t pending = 0;           // parameters not ready yet this iteration
    std::shared_ptr<Work> work;
    Tensor wire;                  // a compressing hook's 16-bit copy of flat, in flight
  };

  void assign_buckets(size_t first_bucket_bytes, size_t bucket_bytes);
  void register_hooks();
  void reset_iteration();
  void launch_ready_buckets();
  void launch(Bucket& bucket);
  void finalize();
  std::string unready_names() const;

  std::vector<Tensor> params_;
  std::vector<std::string> names_;
  std::shared_ptr<ProcessGroup> process_group_;
  bool find_unused_parameters_;
  bool gradient_as_bucket_view_;
  CommHook comm_hook_ = CommHook::AllReduce;
  std::vector<Bucket> buckets_;
  std::vector<std::vector<size_t>> bucket_indices_;
  std::vector<size_t> bucket_of_;  // parameter index -> bucket

  std::mutex mutex_;
  State state_ = State::Idle;
  std::string failure_;  // why the last reduction failed (State::Failed)
  std::vector<bool> ready_;
  size_t next_bucket_ = 0;
  ReductionStats stats_;
};

}  // namespace mg::parallel
