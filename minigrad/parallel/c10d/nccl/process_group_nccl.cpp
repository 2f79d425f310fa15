// ProcessGroupNccl (process_group_nccl.h): a non-blocking NCCL communicator on this
// process's GPU, a communication stream ordered against the caller's stream by events,
// and a host-side watch of every collective that aborts the communicator on error or
// timeout.
#include <minigrad/parallel/c10d/nccl/process_group_nccl.h>

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <thread>

#include <minigrad/core/backend.h>
#include <minigrad/core/profiler.h>
#include <minigrad/core/stream.h>
#include <minigrad/cuda/check.h>
#include <minigrad/parallel/c10d/nccl/nccl_point_to_point.h>
#include <minigrad/parallel/c10d/p2p_message.h>

namespace mg::parallel {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_of(std::chrono::milliseconds ms) { return static_cast<double>(ms.count()) / 1000.0; }

ncclDataType_t nccl_dtype(DType dtype) {
  switch (dtype) {
    case DType::Float32: return ncclFloat32;
    case DType::Float64: return ncclFloat64;
    case DType::Int64: return ncclInt64;
    // NCCL reduces 16-bit floats itself (a sum of bfloat16 in bfloat16, as torch's NCCL
    // process group: the caller widens first where that loses too much).
    case DType::BFloat16: return ncclBfloat16;
    case DType::Float16: return ncclFloat16;
  }
  MG_FAIL("ProcessGroupNccl: no NCCL type for {}", dtype);
}

cudaStream_t stream_handle(const Stream& stream) { return static_cast<cudaStream_t>(stream.handle); }

int group_counter = 0;  // see gloo_process_group.cpp: the n-th group of every rank agrees
std::mutex group_counter_mutex;

}  // namespace

struct ProcessGroupNccl::Impl {
  int rank = 0;
  int size = 1;
  int device_index = 0;
  std::shared_ptr<Store> store;
  std::string prefix;  // this group's keys in the store: "nccl/0/", "nccl/0/sub1/"
  uint64_t subgroups = 0;  // new_group calls so far
  ProcessGroupOptions options;
  ncclComm_t comm = nullptr;
  cudaStream_t comm_stream = nullptr;
  std::atomic<uint64_t> sequence{0};  // numbers operations in messages: "allreduce #3"
  std::unique_ptr<detail::NcclPointToPoint> p2p;  // send and recv, over lanes of their own

  std::mutex mutex;         // guards the two below (wait() may run on any thread)
  bool aborted = false;
  std::string first_error;

  Device device() const { return Device::cuda(device_index); }

  void throw_if_failed(const char* what) {
    std::lock_guard<std::mutex> lock(mutex);
    MG_CHECK(first_error.empty(),
             "ProcessGroupNccl: {} on rank {} of {} refused: the communicator was aborted after "
             "an earlier failure: {}",
             what, rank, size, first_error);
  }

  // Aborts the communicator once (ends NCCL kernels waiting for a dead peer) and throws.
  [[noreturn]] void fail(const std::string& message) {
    {
      std::lock_guard<std::mutex> lock(mutex);
      if (first_error.empty()) first_error = message;
      if (!aborted && comm != nullptr) {
        aborted = true;
        const ncclResult_t r = ncclCommAbort(comm);
        if (r != ncclSuccess)
          std::fprintf(stderr, "minigrad ProcessGroupNccl: ncclCommAbort failed: %s\n",
                       ncclGetErrorString(r));
      }
    }
    throw Error(message);
  }

  // The communicator's asynchronous state: ncclSuccess, ncclInProgress, or an error.
  ncclResult_t async_state() {
    ncclResult_t state = ncclSuccess;
    const ncclResult_t r = ncclCommGetAsyncError(comm, &state);
    return r == ncclSuccess ? state : r;
  }

  // Waits until a non-blocking call (init, or an enqueue) has settled, within `deadline`.
  void settle(const char* what, Clock::time_point start, Clock::time_point deadline) {
    for (;;) {
      const ncclResult_t state = async_state();
      if (state == ncclSuccess) return;
      const double elapsed = std::chrono::duration<double>(Clock::now() - start).count();
      if (state != ncclInProgress)
        fail(fmt::format("ProcessGroupNccl: {} failed on rank {} of {} after {:.2f} s: {} ({})",
                         what, rank, size, elapsed, ncclGetErrorString(state),
                         ncclGetLastError(comm)));
      if (Clock::now() > deadline)
        fail(fmt::format("ProcessGroupNccl: {} timed out on rank {} of {} after {:.2f} s "
                         "(timeout {:.2f} s): a peer rank died or did not arrive; the "
                         "communicator was aborted",
                         what, rank, size, elapsed, seconds_of(options.timeout)));
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
  }
};

namespace {

// One collective in flight: the events that bracket it on the communication stream and
// the tensors it works on (kept alive until the caller's stream is ordered after it).
class NcclWork : public Work {
 public:
  NcclWork(std::shared_ptr<ProcessGroupNccl::Impl> group, std::string description,
           std::shared_ptr<CoalescedBuffer> buffer, std::vector<Tensor> tensors = {})
      : group_(std::move(group)),
        description_(std::move(description)),
        buffer_(std::move(buffer)),
        tensors_(std::move(tensors)) {
    DeviceGuard guard(group_->device());
    MG_CUDA_CHECK(cudaEventCreate(&start_));
    MG_CUDA_CHECK(cudaEventCreate(&end_));
  }

  ~NcclWork() override {
    // Dropped without wait(): the buffer may still be in use on the communication stream;
    // order the caller's stream after it before the buffer's memory can be reused there.
    if (!waited_ && launched_) {
      DeviceGuard guard(group_->device());
      const cudaError_t e =
          cudaStreamWaitEvent(stream_handle(current_stream(group_->device())), end_, 0);
      if (e != cudaSuccess) (void)cudaGetLastError();
    }
    if (start_) (void)cudaEventDestroy(start_);
    if (end_) (void)cudaEventDestroy(end_);
  }

  // Runs `enqueue` on the communication stream, after the caller's queued work. In a
  // trace the collective is a span named by its operation on the caller's thread (the
  // launch) and on the communication stream's track (the collective itself).
  template <typename F>
  void launch(F&& enqueue) {
    DeviceGuard guard(group_->device());
    const Clock::time_point start = Clock::now();
    started_ = start;
    cudaEvent_t ready = nullptr;
    MG_CUDA_CHECK(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming));
    MG_CUDA_CHECK(cudaEventRecord(ready, stream_handle(current_stream(group_->device()))));
    MG_CUDA_CHECK(cudaStreamWaitEvent(group_->comm_stream, ready, 0));
    MG_CUDA_CHECK(cudaEventDestroy(ready));  // released once recorded work completes
    // The span's device part starts here, once the stream has waited for the caller.
    StreamGuard on_comm_stream(Stream{group_->device(), group_->comm_stream});
    profiler::Span span(group_->device(), "{}",
                        std::string_view(description_).substr(0, description_.find(" #")));
    span.category("comm").arg("collective", description_);
    if (!profiler::collective_label().empty()) span.arg("for", profiler::collective_label());
    MG_CUDA_CHECK(cudaEventRecord(start_, group_->comm_stream));
    enqueue(group_->comm, group_->comm_stream);
    group_->settle(description_.c_str(), start, start + group_->options.timeout);
    MG_CUDA_CHECK(cudaEventRecord(end_, group_->comm_stream));
    launched_ = true;
  }

  void wait() override {
    if (waited_) return;
    DeviceGuard guard(group_->device());
    const Clock::time_point deadline = started_ + group_->options.timeout;
    for (;;) {
      const cudaError_t q = cudaEventQuery(end_);
      if (q == cudaSuccess) break;
      MG_CHECK(q == cudaErrorNotReady, "ProcessGroupNccl: {} on rank {}: cudaEventQuery: {}",
               description_, group_->rank, cudaGetErrorString(q));
      const ncclResult_t state = group_->async_state();
      const double elapsed = std::chrono::duration<double>(Clock::now() - started_).count();
      if (state != ncclSuccess && state != ncclInProgress)
        group_->fail(fmt::format(
            "ProcessGroupNccl: {} failed on rank {} of {} after {:.2f} s: {} ({}); the "
            "communicator was aborted",
            description_, group_->rank, group_->size, elapsed, ncclGetErrorString(state),
            ncclGetLastError(group_->comm)));
      if (Clock::now() > deadline)
        group_->fail(fmt::format(
            "ProcessGroupNccl: {} timed out on rank {} of {} after {:.2f} s (timeout {:.2f} s): "
            "a peer rank died, hung, or did not call the same collective; the communicator was "
            "aborted",
            description_, group_->rank, group_->size, elapsed,
            seconds_of(group_->options.timeout)));
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
    float ms = 0.0f;
    MG_CUDA_CHECK(cudaEventElapsedTime(&ms, start_, end_));
    duration_ = ms / 1000.0;
    // Later work on the caller's stream (the copy back, the optimizer) sees the result.
    MG_CUDA_CHECK(cudaStreamWaitEvent(stream_handle(current_stream(group_->device())), end_, 0));
    if (buffer_) buffer_->copy_back();
    waited_ = true;
  }

  bool is_completed() override { return waited_ || cudaEventQuery(end_) == cudaSuccess; }
  double duration_seconds() const override { return waited_ ? duration_ : -1.0; }

 private:
  std::shared_ptr<ProcessGroupNccl::Impl> group_;
  std::string description_;
  std::shared_ptr<CoalescedBuffer> buffer_;
  std::vector<Tensor> tensors_;
  cudaEvent_t start_ = nullptr;
  cudaEvent_t end_ = nullptr;
  Clock::time_point started_;
  bool launched_ = false;
  bool waited_ = false;
  double duration_ = -1.0;
};

}  // namespace

namespace {

std::string next_group_prefix() {
  std::lock_guard<std::mutex> lock(group_counter_mutex);
  return fmt::format("nccl/{}/", group_counter++);
}

}  // namespace

ProcessGroupNccl::ProcessGroupNccl(std::shared_ptr<Store> store, int rank, int size,
                                   ProcessGroupOptions options)
    : ProcessGroupNccl(std::move(store), next_group_prefix(), rank, size, options) {}

// Also a sub-group (new_group): its own communicator, made like any group's from a
// unique id that its rank 0 puts in the store under the sub-group's keys.
ProcessGroupNccl::ProcessGroupNccl(std::shared_ptr<Store> store, std::string prefix, int rank,
                                   int size, ProcessGroupOptions options)
    : ProcessGroup(rank, size), impl_(std::make_shared<Impl>()) {
  MG_CHECK(store != nullptr, "ProcessGroupNccl: store is null (rank {})", rank);
  MG_CHECK(options.timeout.count() > 0, "ProcessGroupNccl: timeout must be positive, got {} ms",
           options.timeout.count());
  const int visible = backend(DeviceType::CUDA).device_count();
  MG_CHECK(visible > 0, "ProcessGroupNccl: rank {} sees no CUDA device", rank);
  const int index = options.device_index >= 0 ? options.device_index : rank % visible;
  MG_CHECK(index < visible,
           "ProcessGroupNccl: rank {} was given cuda:{}, but only {} device(s) are visible "
           "(LOCAL_RANK or ProcessGroupOptions::device_index)",
           rank, index, visible);
  impl_->rank = rank;
  impl_->size = size;
  impl_->device_index = index;
  impl_->store = std::move(store);
  impl_->options = options;

  impl_->prefix = std::move(prefix);
  DeviceGuard guard(impl_->device());
  const Clock::time_point start = Clock::now();
  const Clock::time_point deadline = start + options.timeout;

  // The unique id travels through the store: rank 0 makes it, the others wait for it.
  ncclUniqueId id;
  const std::string key = impl_->prefix + "unique_id";
  if (rank == 0) {
    MG_NCCL_CHECK(ncclGetUniqueId(&id));
    impl_->store->set(key, std::string(reinterpret_cast<const char*>(&id), sizeof(id)));
  } else {
    const std::string bytes = impl_->store->get(key, options.timeout);
    MG_CHECK(bytes.size() == sizeof(id),
             "ProcessGroupNccl: the unique id in the store under '{}' has {} bytes, expected {} "
             "(rank {}; different NCCL versions?)",
             key, bytes.size(), sizeof(id), rank);
    std::memcpy(&id, bytes.data(), sizeof(id));
  }

  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;  // init and collectives return at once; settle() watches them
  MG_NCCL_CHECK_NONBLOCKING(ncclCommInitRankConfig(&impl_->comm, size, id, rank, &config));
  impl_->settle(fmt::format("ncclCommInitRankConfig (world size {}, cuda:{})", size, index).c_str(),
                start, deadline);
  MG_CUDA_CHECK(cudaStreamCreateWithFlags(&impl_->comm_stream, cudaStreamNonBlocking));
  profiler::set_stream_name(Stream{impl_->device(), impl_->comm_stream},
                            fmt::format("nccl stream ({})", impl_->prefix));
  detail::NcclLaneConfig lanes;
  lanes.store = impl_->store;
  lanes.prefix = impl_->prefix;
  lanes.rank = rank;
  lanes.size = size;
  lanes.device_index = index;
  lanes.timeout = options.timeout;
  impl_->p2p = std::make_unique<detail::NcclPointToPoint>(std::move(lanes));
}

ProcessGroupNccl::~ProcessGroupNccl() {
  if (!impl_) return;
  impl_->p2p.reset();  // stops the lanes
  DeviceGuard guard(impl_->device());
  if (impl_->comm != nullptr && !impl_->aborted) {
    // A non-blocking communicator is finalised first (that flushes the collectives still
    // queued), watched like everything else, then destroyed; if it does not settle within
    // the timeout (a peer gone), it is aborted rather than hang in a destructor.
    bool finalized = false;
    const ncclResult_t r = ncclCommFinalize(impl_->comm);
    if (r == ncclSuccess || r == ncclInProgress) {
      const Clock::time_point deadline = Clock::now() + impl_->options.timeout;
      for (;;) {
        const ncclResult_t state = impl_->async_state();
        if (state != ncclInProgress) {
          finalized = state == ncclSuccess;
          break;
        }
        if (Clock::now() > deadline) break;
        std::this_thread::sleep_for(std::chrono::microseconds(100));
      }
    }
    const ncclResult_t freed =
        finalized ? ncclCommDestroy(impl_->comm) : ncclCommAbort(impl_->comm);
    if (!finalized)
      std::fprintf(stderr,
                   "minigrad ProcessGroupNccl: rank %d: the communicator did not finalise "
                   "(ncclCommFinalize: %s); aborted it instead\n",
                   impl_->rank, ncclGetErrorString(r));
    if (freed != ncclSuccess)
      std::fprintf(stderr, "minigrad ProcessGroupNccl: rank %d: freeing the communicator: %s\n",
                   impl_->rank, ncclGetErrorString(freed));
  }
  if (impl_->comm_stream != nullptr) (void)cudaStreamDestroy(impl_->comm_stream);
}

Device ProcessGroupNccl::device() const { return impl_->device(); }
std::chrono::milliseconds ProcessGroupNccl::timeout() const { return impl_->options.timeout; }

std::shared_ptr<Work> ProcessGroupNccl::allreduce(std::vector<Tensor> tensors, ReduceOp op) {
  check_tensors("allreduce", tensors, op == ReduceOp::Average);
  impl_->throw_if_failed("allreduce");
  DeviceGuard guard(impl_->device());
  // Flattened on the caller's stream; the collective waits for it there.
  auto buffer = std::make_shared<CoalescedBuffer>(std::move(tensors), "allreduce");
  auto work = std::make_shared<NcclWork>(
      impl_,
      fmt::format("allreduce #{} ({} of {} bytes)", impl_->sequence++, reduce_op_name(op),
                  buffer->nbytes()),
      buffer);
  const Tensor flat = buffer->flat();
  work->launch([&](ncclComm_t comm, cudaStream_t stream) {
    MG_NCCL_CHECK_NONBLOCKING(ncclAllReduce(flat.data_ptr(), flat.data_ptr(),
                                            static_cast<size_t>(flat.numel()),
                                            nccl_dtype(flat.dtype()),
                                            op == ReduceOp::Average ? ncclAvg : ncclSum, comm,
                                            stream));
  });
  return work;
}

std::shared_ptr<Work> ProcessGroupNccl::broadcast(std::vector<Tensor> tensors, int root) {
  check_tensors("broadcast", tensors, false);
  MG_CHECK(root >= 0 && root < size(), "broadcast (nccl): root {} is outside [0, {}) (rank {})",
           root, size(), rank());
  impl_->throw_if_failed("broadcast");
  DeviceGuard guard(impl_->device());
  auto buffer = std::make_shared<CoalescedBuffer>(std::move(tensors), "broadcast");
  auto work = std::make_shared<NcclWork>(
      impl_,
      fmt::format("broadcast #{} ({} bytes from rank {})", impl_->sequence++, buffer->nbytes(),
                  root),
      buffer);
  const Tensor flat = buffer->flat();
  work->launch([&](ncclComm_t comm, cudaStream_t stream) {
    MG_NCCL_CHECK_NONBLOCKING(ncclBroadcast(flat.data_ptr(), flat.data_ptr(),
                                            static_cast<size_t>(flat.numel()),
                                            nccl_dtype(flat.dtype()), root, comm, stream));
  });
  return work;
}

std::shared_ptr<Work> ProcessGroupNccl::reduce_scatter(Tensor output, Tensor input, ReduceOp op) {
  check_flat_pair("reduce_scatter", input, "input", output, "output", op == ReduceOp::Average);
  impl_->throw_if_failed("reduce_scatter");
  if (output.numel() == 0) return std::make_shared<CompletedWork>();
  bump_version(output, "reduce_scatter");  // rewritten in place (core/tensor.h)
  DeviceGuard guard(impl_->device());
  auto work = std::make_shared<NcclWork>(
      impl_,
      fmt::format("reduce_scatter #{} ({} of {} {} elements into {})", impl_->sequence++,
                  reduce_op_name(op), input.numel(), dtype_name(input.dtype()), output.numel()),
      nullptr, std::vector<Tensor>{output, input});
  // In place (output = input's slice for this rank) is the form NCCL documents.
  work->launch([&](ncclComm_t comm, cudaStream_t stream) {
    MG_NCCL_CHECK_NONBLOCKING(ncclReduceScatter(input.data_ptr(), output.data_ptr(),
                                                static_cast<size_t>(output.numel()),
                                                nccl_dtype(input.dtype()),
                                                op == ReduceOp::Average ? ncclAvg : ncclSum, comm,
                                                stream));
  });
  return work;
}

std::shared_ptr<Work> ProcessGroupNccl::all_gather(Tensor output, Tensor input) {
  check_flat_pair("all_gather", output, "output", input, "input", false);
  impl_->throw_if_failed("all_gather");
  if (input.numel() == 0) return std::make_shared<CompletedWork>();
  bump_version(output, "all_gather");  // rewritten in place (core/tensor.h)
  DeviceGuard guard(impl_->device());
  auto work = std::make_shared<NcclWork>(
      impl_,
      fmt::format("all_gather #{} ({} x {} {} elements)", impl_->sequence++, size(),
                  input.numel(), dtype_name(input.dtype())),
      nullptr, std::vector<Tensor>{output, input});
  work->launch([&](ncclComm_t comm, cudaStream_t stream) {
    MG_NCCL_CHECK_NONBLOCKING(ncclAllGather(input.data_ptr(), output.data_ptr(),
                                            static_cast<size_t>(input.numel()),
                                            nccl_dtype(input.dtype()), comm, stream));
  });
  return work;
}

std::shared_ptr<Work> ProcessGroupNccl::send(std::vector<Tensor> tensors, int dst, int tag) {
  check_message("send", tensors, dst, tag);
  std::string description =
      fmt::format("send #{} (to rank {}, tag {}: {})", impl_->sequence++, dst, tag,
                  detail::describe(detail::message_header(tensors, tag)));
  return impl_->p2p->send(std::move(tensors), dst, tag, std::move(description));
}

std::shared_ptr<Work> ProcessGroupNccl::recv(std::vector<Tensor> tensors, int src, int tag) {
  check_message("recv", tensors, src, tag);
  std::string description =
      fmt::format("recv #{} (from rank {}, tag {}: {})", impl_->sequence++, src, tag,
                  detail::describe(detail::message_header(tensors, tag)));
  return impl_->p2p->recv(std::move(tensors), src, tag, std::move(description));
}

std::shared_ptr<ProcessGroup> ProcessGroupNccl::new_group(const std::vector<int>& ranks) {
  const int index = check_new_group(ranks);
  // Every rank of this group calls new_group in the same order, members or not, so the
  // n-th sub-group has the same keys everywhere; they are under this group's own.
  const std::string prefix = fmt::format("{}sub{}/", impl_->prefix, impl_->subgroups++);
  if (index < 0) return nullptr;
  agree_on_members(*impl_->store, prefix, ranks);
  ProcessGroupOptions options = impl_->options;
  options.device_index = impl_->device_index;
  return std::shared_ptr<ProcessGroupNccl>(new ProcessGroupNccl(
      impl_->store, prefix, index, static_cast<int>(ranks.size()), options));
}

std::shared_ptr<Work> ProcessGroupNccl::barrier() {
  impl_->throw_if_failed("barrier");
  DeviceGuard guard(impl_->device());
  auto buffer = std::make_shared<CoalescedBuffer>(
      std::vector<Tensor>{zeros(Shape{1}, DType::Float32, impl_->device())}, "barrier");
  auto work = std::make_shared<NcclWork>(
      impl_, fmt::format("barrier #{}", impl_->sequence++), buffer);
  const Tensor flat = buffer->flat();
  work->launch([&](ncclComm_t comm, cudaStream_t stream) {
    MG_NCCL_CHECK_NONBLOCKING(
        ncclAllReduce(flat.data_ptr(), flat.data_ptr(), 1, ncclFloat32, ncclSum, comm, stream));
  });
  return work;
}

}  // namespace mg::parallel
