// ShardedGradReducer: the gradients of ZeRO-2 and FSDP, reduce-scattered during backward.
//
// The parameters come in groups, each a FlatParameter (ZeRO-2: buckets of about
// bucket_cap_mb, in reverse order of registration; FSDP: one per unit, last unit first).
// Every parameter gets a post-accumulate-grad hook, as in DistributedDataParallel's
// Reducer (reducer.h). In backward:
//
//   hook(p) fires when p.grad is final for this backward
//     -> p.grad is copied into its slot of the group's flat gradient buffer (allocated at
//        the group's first hook) and freed (p.grad = none);
//     -> when every parameter of group g is in (and groups 0..g-1 have launched, so that
//        every rank issues its collectives in one order), reduce_scatter(average) starts
//        on the buffer: this rank receives only its shard of the averaged gradient;
//     -> after_launch(g) runs (FSDP frees the unit's gathered parameters there);
//   the last group's launch ends the iteration
//     -> wait for the reduction still running; each one's result goes into its group's
//        shard().grad (set on the first backward after zero_grad, added to after that, so
//        gradient accumulation over several backwards works).
//
// Between backward and the optimizer step a rank so holds 1/N of the gradients. During
// backward it holds, besides, the flat buffer of the group being filled, the one being
// reduced (one reduction in flight: launching the next first waits for it, which costs
// nothing on a Gloo group, whose collectives run one at a time anyway; Gloo's
// reduce_scatter also allocates a scratch of the buffer's size while it runs) and the
// gradient autograd is producing.
//
// A parameter that gets no gradient keeps its group from launching; the next check()
// (FSDP's forward, ZeRO's step) names it. A failed collective is reported by the
// backward that launched or waited for it, and again by every later check(): the ranks
// can no longer agree on the parameters.
#pragma once

#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <minigrad/parallel/c10d/process_group.h>
#include <minigrad/parallel/sharded/flat_parameter.h>

namespace mg::parallel {

// What the reductions of the last backward moved, for benchmarks.
struct ShardedReductionStats {
  size_t collectives = 0;
  size_t bytes = 0;          // flat gradient buffers handed to reduce_scatter
  double comm_seconds = 0.0; // the communication thread's busy time on them
  double wait_seconds = 0.0; // how long backward blocked waiting for them
  size_t peak_buffer_bytes = 0;  // the most flat gradient buffers held at once
};

class ShardedGradReducer : public std::enable_shared_from_this<ShardedGradReducer> {
 public:
  static constexpr size_t kMaxInFlight = 1;

  // `groups` in launch order; names[g][k] names parameter k of group g in messages.
  // `owner` ("ZeroRedundancyOptimizer", "fully_shard") starts every message.
  static std::shared_ptr<ShardedGradReducer> create(
      std::vector<FlatParameter*> groups, std::vector<std::vector<std::string>> names,
      std::shared_ptr<ProcessGroup> process_group, std::string owner,
      std::function<void(size_t)> after_launch = nullptr);

  // mg::Error if a backward left some gradients unreduced, or a reduction failed.
  void check(const char* when) const;
  // The hook: parameter k of group g has its gradient for this backward.
  void mark_ready(size_t group, size_t param);
  ShardedReductionStats last_stats() const;

  ShardedGradReducer(std::vector<FlatParameter*> groups,
                     std::vector<std::vector<std::string>> names,
                     std::shared_ptr<ProcessGroup> process_group, std::string owner,
                     std::function<void(size_t)> after_launch);

 private:
  struct InFlight {
    size_t group;
    std::shared_ptr<Work> work;
    Tensor input;   // the flat gradients, kept alive until the collective is done
    Tensor output;  // this rank's shard of their average
  };

  void register_hooks();
  void launch(size_t group);
  void complete_oldest();
  void finish_iteration();
  void hold(size_t bytes);  // counts a flat buffer into the peak
  void reset_iteration();
  void fail(const std::exception& e);
  std::string unready_names() const;

  std::vector<FlatParameter*> groups_;
  std::vector<std::vector<std::string>> names_;
  std::shared_ptr<ProcessGroup> process_group_;
  std::string owner_;
  std::function<void(size_t)> after_launch_;

  mutable std::mutex mutex_;
  std::vector<std::vector<bool>> ready_;
  std::vector<size_t> pending_;  // parameters of each group not ready yet
  std::vector<Tensor> filling_;  // each group's flat gradients while they come in
  size_t next_group_ = 0;        // the next group to launch
  bool iteration_started_ = false;
  std::deque<InFlight> in_flight_;
  size_t buffer_bytes_ = 0;  // flat buffers held now (filling and in flight)
  std::string failure_;
  ShardedReductionStats stats_, last_stats_;
};

}  // namespace mg::parallel
