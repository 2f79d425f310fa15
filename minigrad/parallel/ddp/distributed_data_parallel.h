// DistributedDataParallel: data parallelism with one process per device, as
// torch.nn.parallel.DistributedDataParallel.
//
//   auto pg = parallel::init_process_group("gloo");        // env from minigrad-run
//   auto model = std::make_shared<parallel::DistributedDataParallel>(net, pg);
//   optim::SGD sgd(model->parameters(), 0.1);
//   for (batch in this rank's shard (data::DistributedSampler)) {
//     sgd.zero_grad();
//     loss_fn(model->forward(batch.data), batch.target).backward();  // grads averaged
//     sgd.step();                                                    // same on every rank
//   }
//
// Every process holds a whole replica. At construction rank 0's parameters and buffers
// are broadcast to all ranks (after checking that every rank has the same parameter
// shapes), so the replicas start equal. In backward the gradients are averaged over the
// ranks in buckets whose all-reduce starts while backward is still running (reducer.h),
// so each rank's SGD step is the same and the replicas stay equal. With a mean loss over
// each rank's shard, the averaged gradient is the gradient of the mean loss over the
// whole global batch (for equal shards), i.e. exactly one step of single-process training.
//
// The wrapped module is child "module", so parameter names read "module.<name>" (as in
// PyTorch); the module's own parameters are the ones trained.
//
// Placements (parallel/placement.h): each trained parameter and each buffer is recorded
// Replicate over "dp" (the process group's ranks), named by the wrapped module's names where
// nothing named it before. A gradient is not Partial: DDP averages it itself.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <minigrad/nn/module.h>
#include <minigrad/parallel/c10d/process_group.h>
#include <minigrad/parallel/ddp/reducer.h>

namespace mg::parallel {

struct DDPOptions {
  // Bucket limits in MiB (PyTorch's bucket_cap_mb; its first bucket is 1 MiB too).
  double bucket_cap_mb = 25.0;
  double first_bucket_mb = 1.0;
  // Re-broadcast rank 0's buffers before every forward, as PyTorch does by default.
  bool broadcast_buffers = true;
  // Walk the graph after each forward to find parameters that get no gradient (reducer.h).
  bool find_unused_parameters = false;
  // After each reduction, make every parameter's .grad a view into its bucket instead of
  // copying the averaged values back (PyTorch's option of the same name): one copy of
  // all gradients less per step. The .grad tensors then share memory with the buckets, so
  // a .grad kept from an earlier step changes with the next reduction.
  bool gradient_as_bucket_view = false;
  // How the buckets travel (reducer.h): in the gradients' dtype (float32 for float32
  // parameters, mixed precision's default), or compressed to bfloat16 / float16 as torch's
  // bf16_compress_hook and fp16_compress_hook.
  CommHook comm_hook = CommHook::AllReduce;
};

class DistributedDataParallel : public nn::Module {
 public:
  DistributedDataParallel(nn::ModulePtr module, std::shared_ptr<ProcessGroup> process_group,
                          DDPOptions options = {});

  Tensor forward(const Tensor& input) override;

  const nn::ModulePtr& module() const { return module_; }
  const std::shared_ptr<ProcessGroup>& process_group() const { return process_group_; }
  const DDPOptions& options() const { return options_; }
  const Reducer& reducer() const { return *reducer_; }
  // torch's ddp.register_comm_hook(None, bf16_compress_hook): from the next backward on.
  void register_comm_hook(CommHook hook) { reducer_->set_comm_hook(hook); }
  // What the last gradient reduction cost (benchmarks).
  ReductionStats last_reduction_stats() const { return reducer_->last_stats(); }

  // Gradient accumulation without communication: forward/backward inside the guard's
  // scope only accumulate into .grad locally; the first forward/backward after it reduces
  // the accumulated sum.
  //   { auto guard = ddp->no_sync(); loss(ddp->forward(x1)).backward(); }
  //   loss(ddp->forward(x2)).backward();   // all-reduces grad(x1) + grad(x2)
  class NoSyncGuard {
   public:
    explicit NoSyncGuard(DistributedDataParallel& ddp) : ddp_(ddp), previous_(ddp.require_sync_) {
      ddp_.require_sync_ = false;
    }
    ~NoSyncGuard() { ddp_.require_sync_ = previous_; }
    NoSyncGuard(const NoSyncGuard&) = delete;
    NoSyncGuard& operator=(const NoSyncGuard&) = delete;

   private:
    DistributedDataParallel& ddp_;
    bool previous_;
  };
  NoSyncGuard no_sync() { return NoSyncGuard(*this); }

  std::string extra_repr() const override;

 protected:
  // A DDP wrapper is tied to its process group and hooks; copy the wrapped module instead.
  nn::ModulePtr copy_node() const override;

 private:
  nn::ModulePtr module_;
  std::shared_ptr<ProcessGroup> process_group_;
  DDPOptions options_;
  std::shared_ptr<Reducer> reducer_;
  bool require_sync_ = true;
};

}  // namespace mg::parallel
