// ProcessGroup: the collectives of one process per device, as torch.distributed's
// ProcessGroup. Every rank of the group calls the same collectives in the same order;
// each call returns at once with a Work handle, and the collective runs in the
// background (Gloo: a communication thread; NCCL: a communication stream), so a caller
// such as DistributedDataParallel can launch a bucket's all-reduce and carry on with
// backward while it runs.
//
// What a group does:
//   allreduce, broadcast, barrier      in place, on a list of tensors coalesced into one
//                                      buffer (DistributedDataParallel's gradients)
//   reduce_scatter, all_gather         flat: one tensor in, one out (ZeRO and FSDP shard
//                                      gradients and gather parameters with these)
//   send, recv                         point to point, matched by (peer, tag), checked
//                                      against each other (a pipeline's stages)
//   new_group                          a sub-group of some ranks, with connections of its
//                                      own (tensor parallelism inside data parallelism)
//
// Backends (the network code is theirs; minigrad re-implements no collective):
//   ProcessGroupGloo (process_group_gloo.h): CPU tensors, over Gloo's TCP transport.
//   ProcessGroupNccl (process_group_nccl.h): CUDA tensors, one GPU per process.
// Both fail, never hang, when a peer dies or does not arrive: every collective is
// bounded by ProcessGroupOptions::timeout, and its mg::Error names the collective, the
// rank and the timeout.
#pragma once

#include <chrono>
#include <exception>
#include <memory>
#include <string>
#include <vector>

#include <minigrad/core/device.h>
#include <minigrad/core/tensor.h>

namespace mg::parallel {

class Store;

enum class ReduceOp { Sum, Average };
const char* reduce_op_name(ReduceOp op);

struct ProcessGroupOptions {
  // Bound of the rendezvous and of every collective. A rank that has not joined a
  // collective by then (dead, hung, or on another code path) makes the others throw.
  std::chrono::milliseconds timeout = std::chrono::minutes(5);
  // NCCL: the GPU of this process; -1 means LOCAL_RANK (one GPU per local process).
  int device_index = -1;
  // Gloo: the host name or address this rank's connections bind to; empty chooses:
  // the GLOO_SOCKET_IFNAME interface when that variable is set, 127.0.0.1 when the
  // store is on a loopback address (a one-machine job), else this machine's host name.
  std::string gloo_hostname;
};

// The handle of one collective in flight.
class Work {
 public:
  virtual ~Work() = default;
  // Blocks until the collective has finished and its results are visible to the caller
  // (on a GPU: to work queued afterwards on the caller's current stream); rethrows the
  // collective's mg::Error when it failed.
  virtual void wait() = 0;
  // True once the collective finished (successfully or not); never blocks.
  virtual bool is_completed() = 0;
  // How long the collective itself ran, in seconds, once completed (-1 before).
  virtual double duration_seconds() const = 0;
};

class ProcessGroup {
 public:
  ProcessGroup(int rank, int size);
  virtual ~ProcessGroup() = default;
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  virtual std::string backend_name() const = 0;  // "gloo", "nccl"
  // Where this group's tensors must live: cpu for Gloo, this process's GPU for NCCL.
  virtual Device device() const = 0;
  virtual std::chrono::milliseconds timeout() const = 0;

  // In place on every tensor: tensors[k] becomes the sum (or mean) of tensors[k] over all
  // ranks. The list is reduced as one coalesced buffer; shapes and dtype (float32, float64
  // or int64; an int64 mean is refused) must agree across ranks. The tensors must not be
  // touched until wait().
  virtual std::shared_ptr<Work> allreduce(std::vector<Tensor> tensors,
                                          ReduceOp op = ReduceOp::Sum) = 0;
  std::shared_ptr<Work> allreduce(const Tensor& tensor, ReduceOp op = ReduceOp::Sum) {
    return allreduce(std::vector<Tensor>{tensor}, op);
  }
  // In place: every rank's tensors[k] becomes rank `root`'s tensors[k].
  virtual std::shared_ptr<Work> broadcast(std::vector<Tensor> tensors, int root = 0) = 0;
  std::shared_ptr<Work> broadcast(const Tensor& tensor, int root = 0) {
    return broadcast(std::vector<Tensor>{tensor}, root);
  }
  // Completes once every rank has called barrier().
  virtual std::shared_ptr<Work> barrier() = 0;

  // Flat collectives, as torch.distributed.reduce_scatter_tensor and
  // all_gather_into_tensor. Both tensors contiguous, of one dtype (float32, float64, or
  // int64 but for Average), on device(); their shapes do not matter, only their element
  // counts.
  //   reduce_scatter: input.numel() == size() * output.numel(); output becomes the sum
  //     (or mean) over the ranks r of rank r's input[rank() * n, (rank() + 1) * n),
  //     n = output.numel().
  //   all_gather: output.numel() == size() * input.numel(); output[r * n, (r + 1) * n)
  //     becomes rank r's input, n = input.numel().
  // In place: the smaller tensor may be exactly this rank's slice of the larger one
  // (output = input.narrow(0, rank() * n, n) for reduce_scatter); otherwise the two must
  // not overlap. Uneven data is the caller's business: pad to a multiple of size(), as
  // ZeRO and FSDP do. Neither tensor may be touched until wait(). The output's version
  // counter is bumped (it is rewritten in place): a graph that saved it for backward
  // refuses it, unless the caller re-gathers under autograd::UnsafePreserveVersionCounter.
  virtual std::shared_ptr<Work> reduce_scatter(Tensor output, Tensor input,
                                               ReduceOp op = ReduceOp::Sum) = 0;
  virtual std::shared_ptr<Work> all_gather(Tensor output, Tensor input) = 0;

  // Point to point, as torch.distributed.isend / irecv: the tensors travel as one message
  // (coalesced; float32, float64 or int64, one dtype) to group rank `dst`, and recv fills its
  // tensors from the message that rank `src` sent. Messages from one rank to another are
  // matched by tag (tag >= 0), in the order they were posted; other tags and other peers
  // are independent, so any number may be in flight, and a send and a recv between the
  // same two ranks may be posted in either order (a 1F1B pipeline posts both). Only
  // wait() blocks: a send completes once its peer has taken the message (Gloo) or it has
  // left (NCCL), a recv once the message is in its tensors. A recv whose tensors differ
  // from the message's (number, shapes or dtype) fails with both descriptions, and the
  // message is dropped. The tensors must not be touched until wait(); the wait is bounded
  // by the group's timeout.
  virtual std::shared_ptr<Work> send(std::vector<Tensor> tensors, int dst, int tag = 0) = 0;
  virtual std::shared_ptr<Work> recv(std::vector<Tensor> tensors, int src, int tag = 0) = 0;
  std::shared_ptr<Work> send(const Tensor& tensor, int dst, int tag = 0) {
    return send(std::vector<Tensor>{tensor}, dst, tag);
  }
  std::shared_ptr<Work> recv(const Tensor& tensor, int src, int tag = 0) {
    return recv(std::vector<Tensor>{tensor}, src, tag);
  }

  // Sub-groups, as torch.distributed.new_group: every rank of this group calls it, in the
  // same order, with the same sorted list of distinct ranks of this group; the members
  // get a new group whose rank() is their index in `ranks`, the others nullptr. Same
  // backend, device and timeout. A sub-group has connections, store keys and tags of its
  // own, so its collectives and messages run beside this group's and other sub-groups'
  // without mixing (a 2-D mesh: row and column groups). Sub-groups have sub-groups too.
  virtual std::shared_ptr<ProcessGroup> new_group(const std::vector<int>& ranks) = 0;

 protected:
  // Checks the tensors of a collective against this group: defined, on device(), one
  // dtype that the op supports. Names the collective, the tensor index and the rank.
  void check_tensors(const char* collective, const std::vector<Tensor>& tensors,
                     bool average) const;
  // Checks the two tensors of reduce_scatter (whole = input, part = output) or all_gather
  // (whole = output, part = input) as the comment above says, naming the collective, the
  // sizes and the rank. Returns true when part is whole's slice for this rank (in place).
  // Checks a send or recv: its tensors (as check_tensors), a peer in [0, size()) other
  // than this rank, and a tag >= 0.
  void check_message(const char* op, const std::vector<Tensor>& tensors, int peer,
                     int tag) const;
  // Checks new_group's ranks (not empty, sorted, distinct, in [0, size())) and returns
  // this rank's index in them, or -1 when it is not a member.
  int check_new_group(const std::vector<int>& ranks) const;
  // For a member of a new sub-group: checks through the store, under the sub-group's
  // keys, that every member was given the same ranks (an mg::Error naming the first one
  // that was not, or that did not arrive within timeout()).
  void agree_on_members(Store& store, const std::string& prefix,
                        const std::vector<int>& ranks) const;
  bool check_flat_pair(const char* collective, const Tensor& whole, const char* whole_name,
                       const Tensor& part, const char* part_name, bool average) const;

 private:
  int rank_;
  int size_;
};

// The tensors of a collective as one contiguous buffer, and the copy back afterwards.
// A single contiguous tensor is used as it is (no copy at all). For a collective that
// rewrites the tensors in place (allreduce, broadcast, recv), `writes_as` is its name and
// making the buffer bumps every tensor's version counter under it (core/tensor.h:
// bump_version), so a graph that saved one of them for backward refuses it instead of
// using the new values; a collective that only reads them (send) passes nullptr and
// leaves their versions alone (a pipeline stage sends activations its graph still needs).
class CoalescedBuffer {
 public:
  CoalescedBuffer(std::vector<Tensor> tensors, const char* writes_as);
  const Tensor& flat() const { return flat_; }
  // Copies the reduced values back into the tensors (nothing when flat() is theirs).
  void copy_back() const;
  std::size_t nbytes() const { return flat_.defined() ? flat_.nbytes() : 0; }

 private:
  std::vector<Tensor> tensors_;
  Tensor flat_;
  bool aliased_ = false;
};

// A Work that is already complete (empty collectives, a group of one).
class CompletedWork : public Work {
 public:
  explicit CompletedWork(std::exception_ptr error = nullptr) : error_(std::move(error)) {}
  void wait() override {
    if (error_) std::rethrow_exception(error_);
  }
  bool is_completed() override { return true; }
  double duration_seconds() const override { return 0.0; }

 private:
  std::exception_ptr error_;
};

}  // namespace mg::parallel
