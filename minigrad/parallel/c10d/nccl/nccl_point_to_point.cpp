// ProcessGroupNccl's send and recv over lanes: see nccl_point_to_point.h.
#include <minigrad/parallel/c10d/nccl/nccl_point_to_point.h>

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <algorithm>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <thread>

#include <minigrad/core/backend.h>
#include <minigrad/core/ops.h>
#include <minigrad/core/stream.h>
#include <minigrad/cuda/check.h>
#include <minigrad/parallel/c10d/p2p_message.h>

namespace mg::parallel::detail {

namespace {

using Clock = std::chrono::steady_clock;

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
  MG_FAIL("NCCL messages: no NCCL type for {}", dtype);
}

// A failure of the lane: its communicator is aborted and its messages fail with this.
class LaneFailure : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

}  // namespace

// One message through a lane, and its Work.
class MessageWork : public Work {
 public:
  MessageWork(std::shared_ptr<NcclLane> lane, std::string description, Device device,
              std::shared_ptr<CoalescedBuffer> buffer, MessageHeader header, bool receiving,
              std::chrono::milliseconds timeout)
      : lane_(std::move(lane)),
        description_(std::move(description)),
        device_(device),
        buffer_(std::move(buffer)),
        header_(header),
        receiving_(receiving),
        deadline_(Clock::now() + timeout) {
    DeviceGuard guard(device_);
    MG_CUDA_CHECK(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming));
    MG_CUDA_CHECK(cudaEventCreate(&start_));
    MG_CUDA_CHECK(cudaEventCreate(&end_));
  }
  ~MessageWork() override;

  void wait() override;
  bool is_completed() override;
  double duration_seconds() const override {
    std::lock_guard<std::mutex> lock(mutex_);
    return waited_ ? duration_ : -1.0;
  }

  // On the caller's thread, once the message's tensors are in place: the lane's stream
  // will wait for what the caller's stream queued before (the tensors' producers for a
  // send, their previous users for a recv, the coalescing copy, the header's copy).
  void record_ready() {
    MG_CUDA_CHECK(
        cudaEventRecord(ready_, static_cast<cudaStream_t>(current_stream(device_).handle)));
  }
  // On the caller's thread: a recv whose message was already there, copied on the
  // caller's stream into flat().
  void completed_on_caller_stream() {
    std::lock_guard<std::mutex> lock(mutex_);
    waited_ = true;
    duration_ = 0.0;
    buffer_->copy_back();
  }

  // By the lane's thread.
  void launched(std::string error_once_done = {}) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (state_ != State::Queued) return;
      state_ = State::Launched;
      error_once_done_ = std::move(error_once_done);
    }
    cv_.notify_all();
  }
  void failed(const std::string& error) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (state_ == State::Failed || waited_) return;
      state_ = State::Failed;
      error_ = error;
    }
    cv_.notify_all();
  }

  const std::string& description() const { return description_; }
  const MessageHeader& header() const { return header_; }  // sent, or expected
  const Tensor& flat() const { return buffer_->flat(); }
  Clock::time_point deadline() const { return deadline_; }
  cudaEvent_t ready() const { return ready_; }
  cudaEvent_t start() const { return start_; }
  cudaEvent_t end() const { return end_; }
  Tensor header_on_device;  // send: the header's bytes, on the device

 private:
  enum class State { Queued, Launched, Failed };

  std::shared_ptr<NcclLane> lane_;
  std::string description_;
  Device device_;
  std::shared_ptr<CoalescedBuffer> buffer_;
  MessageHeader header_;
  bool receiving_;
  Clock::time_point deadline_;
  cudaEvent_t ready_ = nullptr, start_ = nullptr, end_ = nullptr;

  mutable std::mutex mutex_;
  std::condition_variable cv_;
  State state_ = State::Queued;
  std::string error_;            // Failed: why
  std::string error_once_done_;  // Launched: a recv that drained a mismatching message
  bool waited_ = false;
  double duration_ = -1.0;
};

// One direction between this rank and a peer: see nccl_point_to_point.h.
class NcclLane {
 public:
  NcclLane(const NcclLaneConfig& config, int peer, bool sending)
      : config_(config), peer_(peer), sending_(sending) {
    name_ = sending ? fmt::format("the messages from rank {} to rank {}", config.rank, peer)
                    : fmt::format("the messages from rank {} to rank {}", peer, config.rank);
  }
  ~NcclLane() {
    request_stop();
    join();
  }

  void start() {
    thread_ = std::thread([this] { run(); });
  }

  // Stopping may take up to the timeout (a communicator that does not finalise): the
  // lanes of a group are all asked first, then joined.
  void request_stop() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    cv_.notify_all();
  }
  void join() {
    if (thread_.joinable()) thread_.join();
  }

  Device device() const { return Device::cuda(config_.device_index); }

  // A send: queued for the lane's thread. Or a recv: matched at once with a message that
  // arrived before it, else queued until its message comes.
  std::shared_ptr<Work> post(const std::shared_ptr<MessageWork>& work, int tag) {
    std::unique_lock<std::mutex> lock(mutex_);
    if (!failure_.empty())
      return refused(work->description(), "an earlier message on its lane failed: " + failure_);
    if (stopping_) return refused(work->description(), "the process group is being destroyed");
    if (!sending_) {
      auto it = early_.find(tag);
      if (it != early_.end()) {
        Early early = std::move(it->second.front());
        it->second.pop_front();
        if (it->second.empty()) early_.erase(it);
        lock.unlock();
        return take_early(work, std::move(early));
      }
    }
    queue_.push_back({work, tag});
    cv_.notify_all();
    return work;
  }

  // By a Work's wait(), on a timeout or an NCCL error it saw: the lane's thread aborts the
  // communicator (it alone calls NCCL on it) and fails every message of the lane.
  void request_abort(const std::string& why) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (abort_reason_.empty() && failure_.empty()) abort_reason_ = why;
    }
    cv_.notify_all();
  }

  // ncclSuccess, ncclInProgress, or the error of the communicator (ncclSuccess before
  // there is one).
  ncclResult_t async_state() {
    std::lock_guard<std::mutex> lock(mutex_);
    if (comm_ == nullptr || aborted_) return ncclSuccess;
    ncclResult_t state = ncclSuccess;
    const ncclResult_t r = ncclCommGetAsyncError(comm_, &state);
    return r == ncclSuccess ? state : r;
  }

  std::chrono::milliseconds timeout() const { return config_.timeout; }

 private:
  struct Queued {
    std::shared_ptr<MessageWork> work;
    int tag = 0;
  };
  // A message that arrived before its recv was posted.
  struct Early {
    MessageHeader header;
    Tensor data;  // allocated on the lane's stream
    cudaEvent_t done = nullptr;
  };

  std::shared_ptr<Work> refused(const std::string& description, const std::string& why) const {
    return std::make_shared<CompletedWork>(std::make_exception_ptr(
        Error(fmt::format("ProcessGroupNccl: {} on rank {} of {} was not posted because {}",
                          description, config_.rank, config_.size, why))));
  }

  std::string failure_of(const std::string& description, const std::string& why) const {
    return fmt::format(
        "ProcessGroupNccl: {} failed on rank {} of {}: {}; the communicator of {} "
        "was aborted",
        description, config_.rank, config_.size, why, name_);
  }

  // On the caller's thread: the caller's stream takes the early message.
  std::shared_ptr<Work> take_early(const std::shared_ptr<MessageWork>& work, Early early) {
    DeviceGuard guard(device());
    const auto caller = static_cast<cudaStream_t>(current_stream(device()).handle);
    std::shared_ptr<Work> result = work;
    if (same_message(early.header, work->header())) {
      MG_CUDA_CHECK(cudaStreamWaitEvent(caller, early.done, 0));
      if (early.data.numel() > 0)
        ops::copy_(work->flat(), ops::view(early.data, work->flat().shape()));
      work->completed_on_caller_stream();
    } else {
      result = std::make_shared<CompletedWork>(
          std::make_exception_ptr(Error(mismatch(*work, early.header))));
    }
    // The early buffer is freed on the lane's stream: after the caller's copy of it.
    cudaEvent_t copied = nullptr;
    MG_CUDA_CHECK(cudaEventCreateWithFlags(&copied, cudaEventDisableTiming));
    MG_CUDA_CHECK(cudaEventRecord(copied, caller));
    MG_CUDA_CHECK(cudaStreamWaitEvent(stream_, copied, 0));
    MG_CUDA_CHECK(cudaEventDestroy(copied));
    MG_CUDA_CHECK(cudaEventDestroy(early.done));
    early.data = Tensor();
    return result;
  }

  std::string mismatch(const MessageWork& work, const MessageHeader& received) const {
    return fmt::format(
        "ProcessGroupNccl: {} on rank {} of {}: rank {} sent {}; a recv's tensors must match the "
        "send's in number, shapes and dtype. The message was dropped",
        work.description(), config_.rank, config_.size, peer_, describe(received));
  }

  // ---- on the lane's thread ----

  void run() {
    DeviceGuard guard(device());
    try {
      MG_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
      MG_CUDA_CHECK(cudaMallocHost(&header_host_, sizeof(MessageHeader)));
      MG_CUDA_CHECK(cudaMalloc(&header_device_, sizeof(MessageHeader)));
      MG_CUDA_CHECK(cudaEventCreateWithFlags(&header_event_, cudaEventDisableTiming));
    } catch (const std::exception& e) {
      fail_all(fmt::format("setting up its stream and buffers failed: {}", e.what()));
    }
    // Scratch and early buffers are allocated on the lane's stream, and freed there.
    std::unique_ptr<StreamGuard> stream_guard;
    if (stream_ != nullptr) stream_guard = std::make_unique<StreamGuard>(Stream{device(), stream_});
    for (;;) {
      Queued next;
      std::string abort_reason;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        cv_.wait(lock, [&] { return stopping_ || !abort_reason_.empty() || !queue_.empty(); });
        if (stopping_) break;
        abort_reason = abort_reason_;
        if (abort_reason.empty() && failure_.empty()) next = queue_.front();
      }
      if (!abort_reason.empty()) {
        fail_all(abort_reason);
        continue;
      }
      if (!failure_.empty()) {  // posted before the failure was seen: fail the queue
        fail_all(failure_);
        continue;
      }
      try {
        if (sending_) {
          send_next(next);
        } else {
          receive_next();
        }
      } catch (const std::exception& e) {
        fail_all(e.what());
      }
    }
    close();
  }

  // Waits for a non-blocking NCCL call to settle; a LaneFailure on error, timeout or abort.
  void settle(const std::string& what, Clock::time_point deadline) {
    const auto start = Clock::now();
    for (;;) {
      ncclResult_t state = ncclSuccess;
      const ncclResult_t r = ncclCommGetAsyncError(comm_, &state);
      if (r != ncclSuccess) state = r;
      if (state == ncclSuccess) return;
      check_running(what, start, deadline);
      if (state != ncclInProgress)
        throw LaneFailure(
            fmt::format("{}: {} ({})", what, ncclGetErrorString(state), ncclGetLastError(comm_)));
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
  }

  // Waits for `event`, watching the communicator as settle() does.
  void wait_for(cudaEvent_t event, const std::string& what, Clock::time_point deadline) {
    const auto start = Clock::now();
    for (;;) {
      const cudaError_t q = cudaEventQuery(event);
      if (q == cudaSuccess) return;
      if (q != cudaErrorNotReady) {
        (void)cudaGetLastError();
        throw LaneFailure(fmt::format("{}: cudaEventQuery: {}", what, cudaGetErrorString(q)));
      }
      ncclResult_t state = ncclSuccess;
      const ncclResult_t r = ncclCommGetAsyncError(comm_, &state);
      if (r != ncclSuccess) state = r;
      if (state != ncclSuccess && state != ncclInProgress)
        throw LaneFailure(
            fmt::format("{}: {} ({})", what, ncclGetErrorString(state), ncclGetLastError(comm_)));
      check_running(what, start, deadline);
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }

  void check_running(const std::string& what, Clock::time_point start, Clock::time_point deadline) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (stopping_) throw LaneFailure(what + ": the process group was destroyed");
      if (!abort_reason_.empty()) throw LaneFailure(abort_reason_);
    }
    if (Clock::now() > deadline)
      throw LaneFailure(fmt::format(
          "{} timed out after {:.2f} s (timeout {:.2f} s): the peer died, hung, or did not post "
          "the matching {}",
          what, std::chrono::duration<double>(Clock::now() - start).count(),
          static_cast<double>(config_.timeout.count()) / 1000.0, sending_ ? "recv" : "send"));
  }

  // The lane's communicator: two ranks, the sender 0 and the receiver 1, meeting through a
  // store connection of the lane's own (a wait on the group's connection would hold up
  // every other user of it).
  void ensure_comm(Clock::time_point deadline) {
    if (comm_ != nullptr) return;
    const int src = sending_ ? config_.rank : peer_;
    const int dst = sending_ ? peer_ : config_.rank;
    const std::string key = fmt::format("{}p2p/{}->{}", config_.prefix, src, dst);
    const auto left =
        std::max(std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()),
                 std::chrono::milliseconds(1));
    const std::unique_ptr<Store> connection = config_.store->connect_again(left);
    Store& store = *connection;
    ncclUniqueId id;
    if (sending_) {
      MG_NCCL_CHECK(ncclGetUniqueId(&id));
      store.set(key, std::string(reinterpret_cast<const char*>(&id), sizeof(id)));
    } else {
      const std::string bytes = store.get(key, left);
      MG_CHECK(bytes.size() == sizeof(id),
               "ProcessGroupNccl: {}: the unique id under '{}' has {} bytes, expected {}", name_,
               key, bytes.size(), sizeof(id));
      std::memcpy(&id, bytes.data(), sizeof(id));
    }
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclComm_t comm = nullptr;
    MG_NCCL_CHECK_NONBLOCKING(ncclCommInitRankConfig(&comm, 2, id, sending_ ? 0 : 1, &config));
    {
      std::lock_guard<std::mutex> lock(mutex_);
      comm_ = comm;
    }
    settle(fmt::format("making the communicator of {}", name_), deadline);
  }

  void send_next(const Queued& next) {
    const auto& work = next.work;
    ensure_comm(work->deadline());
    MG_CUDA_CHECK(cudaStreamWaitEvent(stream_, work->ready(), 0));
    MG_CUDA_CHECK(cudaEventRecord(work->start(), stream_));
    MG_NCCL_CHECK_NONBLOCKING(ncclSend(work->header_on_device.data_ptr(), sizeof(MessageHeader),
                                       ncclUint8, 1, comm_, stream_));
    settle(work->description(), work->deadline());
    const Tensor& flat = work->flat();
    if (flat.numel() > 0) {
      MG_NCCL_CHECK_NONBLOCKING(ncclSend(flat.data_ptr(), static_cast<size_t>(flat.numel()),
                                         nccl_dtype(flat.dtype()), 1, comm_, stream_));
      settle(work->description(), work->deadline());
    }
    MG_CUDA_CHECK(cudaEventRecord(work->end(), stream_));
    std::lock_guard<std::mutex> lock(mutex_);
    queue_.pop_front();
    in_flight_.push_back(work);
    prune_in_flight();
    work->launched();
  }

  // Takes the next message from the peer (a recv is waiting), and puts it where it goes.
  void receive_next() {
    Clock::time_point deadline;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      deadline = queue_.front().work->deadline();  // the oldest recv's, so the earliest
    }
    ensure_comm(deadline);
    const std::string what = fmt::format("waiting for a message of {}", name_);
    MG_NCCL_CHECK_NONBLOCKING(
        ncclRecv(header_device_, sizeof(MessageHeader), ncclUint8, 0, comm_, stream_));
    settle(what, deadline);
    MG_CUDA_CHECK(cudaMemcpyAsync(header_host_, header_device_, sizeof(MessageHeader),
                                  cudaMemcpyDeviceToHost, stream_));
    MG_CUDA_CHECK(cudaEventRecord(header_event_, stream_));
    wait_for(header_event_, what, deadline);
    MessageHeader header;
    std::memcpy(&header, header_host_, sizeof(header));
    const size_t bytes = payload_bytes(header, fmt::format("ProcessGroupNccl: {}", name_));
    const auto dtype = static_cast<DType>(header.dtype);
    const int64_t numel = static_cast<int64_t>(header.numel);

    std::shared_ptr<MessageWork> work;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto it = std::find_if(queue_.begin(), queue_.end(),
                             [&](const Queued& q) { return q.tag == header.tag; });
      if (it != queue_.end()) {
        work = it->work;
        queue_.erase(it);
        prune_in_flight();
        in_flight_.push_back(work);  // failed with the lane from here on
      }
    }
    const auto receive_into = [&](void* data, const std::string& label) {
      if (bytes == 0) return;
      MG_NCCL_CHECK_NONBLOCKING(
          ncclRecv(data, static_cast<size_t>(numel), nccl_dtype(dtype), 0, comm_, stream_));
      settle(label, deadline);
    };
    if (!work) {
      // No recv of this tag waits: the message goes into a buffer of its own for a later one.
      Early early;
      early.header = header;
      early.data = empty(Shape{numel}, dtype, device());
      receive_into(early.data.numel() > 0 ? early.data.data_ptr() : nullptr, what);
      MG_CUDA_CHECK(cudaEventCreateWithFlags(&early.done, cudaEventDisableTiming));
      MG_CUDA_CHECK(cudaEventRecord(early.done, stream_));
      std::lock_guard<std::mutex> lock(mutex_);
      early_[header.tag].push_back(std::move(early));
      return;
    }
    MG_CUDA_CHECK(cudaStreamWaitEvent(stream_, work->ready(), 0));
    MG_CUDA_CHECK(cudaEventRecord(work->start(), stream_));
    std::string error_once_done;
    if (same_message(header, work->header())) {
      receive_into(work->flat().data_ptr(), work->description());
    } else {
      // Taken and dropped, so the sender's send completes and the lane stays in step. The
      // scratch is freed on the lane's stream, so only after the recv into it.
      const Tensor scratch = empty(Shape{numel}, dtype, device());
      receive_into(bytes > 0 ? scratch.data_ptr() : nullptr, work->description());
      error_once_done = mismatch(*work, header);
    }
    MG_CUDA_CHECK(cudaEventRecord(work->end(), stream_));
    work->launched(std::move(error_once_done));
  }

  // Keeps in_flight_ to the messages whose end may not have passed (under mutex_).
  void prune_in_flight() {
    in_flight_.erase(std::remove_if(in_flight_.begin(), in_flight_.end(),
                                    [](const std::weak_ptr<MessageWork>& w) {
                                      auto work = w.lock();
                                      return !work || work->is_completed();
                                    }),
                     in_flight_.end());
  }

  // Fails every message of the lane, then aborts the communicator (on this thread): a
  // kernel stuck waiting for the peer ends only with the abort, so its Work is failed
  // first and never mistakes the end for a completion.
  void fail_all(const std::string& why) {
    std::deque<Queued> queued;
    std::vector<std::weak_ptr<MessageWork>> in_flight;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (failure_.empty()) failure_ = why;
      abort_reason_.clear();
      queued.swap(queue_);
      in_flight.swap(in_flight_);
    }
    for (const Queued& q : queued) q.work->failed(failure_of(q.work->description(), why));
    for (const auto& w : in_flight)
      if (auto work = w.lock(); work && !work->is_completed())
        work->failed(failure_of(work->description(), why));
    std::lock_guard<std::mutex> lock(mutex_);
    if (comm_ != nullptr && !aborted_) {
      aborted_ = true;
      const ncclResult_t r = ncclCommAbort(comm_);
      if (r != ncclSuccess)
        std::fprintf(stderr, "minigrad ProcessGroupNccl: ncclCommAbort (%s) failed: %s\n",
                     name_.c_str(), ncclGetErrorString(r));
    }
  }

  void close() {
    std::deque<Queued> queued;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      queued.swap(queue_);
    }
    for (const Queued& q : queued)
      q.work->failed(
          fmt::format("ProcessGroupNccl: {} on rank {} of {} was never run: the process "
                      "group was destroyed first",
                      q.work->description(), config_.rank, config_.size));
    if (comm_ != nullptr && !aborted_) {
      // A communicator that does not finalise within the timeout (messages launched but
      // never taken, a peer gone) is aborted rather than hang here.
      bool finalized = false;
      const ncclResult_t r = ncclCommFinalize(comm_);
      if (r == ncclSuccess || r == ncclInProgress) {
        const auto deadline = Clock::now() + config_.timeout;
        for (;;) {
          ncclResult_t state = ncclSuccess;
          const ncclResult_t q = ncclCommGetAsyncError(comm_, &state);
          if (q != ncclSuccess) state = q;
          if (state != ncclInProgress) {
            finalized = state == ncclSuccess;
            break;
          }
          if (Clock::now() > deadline) break;
          std::this_thread::sleep_for(std::chrono::microseconds(100));
        }
      }
      if (finalized) {
        const ncclResult_t freed = ncclCommDestroy(comm_);
        if (freed != ncclSuccess)
          std::fprintf(stderr, "minigrad ProcessGroupNccl: freeing the communicator of %s: %s\n",
                       name_.c_str(), ncclGetErrorString(freed));
        std::lock_guard<std::mutex> lock(mutex_);
        aborted_ = true;  // gone: nothing may query it any more
      } else {
        fail_all("the process group was destroyed while its messages were in flight");
      }
    }
    {
      std::lock_guard<std::mutex> lock(mutex_);
      for (auto& [tag, list] : early_)
        for (Early& e : list)
          if (e.done) (void)cudaEventDestroy(e.done);
      early_.clear();  // freed on the stream, which still exists
    }
    if (header_event_) (void)cudaEventDestroy(header_event_);
    if (header_device_) (void)cudaFree(header_device_);
    if (header_host_) (void)cudaFreeHost(header_host_);
    // Released once its queued work is done; nothing is allocated on it any more.
    if (stream_) (void)cudaStreamDestroy(stream_);
  }

  NcclLaneConfig config_;
  int peer_;
  bool sending_;
  std::string name_;
  std::thread thread_;

  std::mutex mutex_;  // guards the members below, and comm_'s being set or aborted
  std::condition_variable cv_;
  std::deque<Queued> queue_;                // sends to launch, or recvs waiting for their message
  std::map<int, std::deque<Early>> early_;  // by tag
  std::vector<std::weak_ptr<MessageWork>> in_flight_;
  std::string abort_reason_;  // asked for by a Work
  std::string failure_;       // the first failure; the lane is dead after it
  bool stopping_ = false;
  bool aborted_ = false;
  ncclComm_t comm_ = nullptr;

  cudaStream_t stream_ = nullptr;
  void* header_host_ = nullptr;    // pinned: the received header, copied from the device
  void* header_device_ = nullptr;  // where a received header lands
  cudaEvent_t header_event_ = nullptr;
};

MessageWork::~MessageWork() {
  DeviceGuard guard(device_);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    // Dropped without wait(): the caller's stream must not reuse the tensors' memory
    // before the lane is done with them.
    if (!waited_ && state_ == State::Launched) {
      const cudaError_t e =
          cudaStreamWaitEvent(static_cast<cudaStream_t>(current_stream(device_).handle), end_, 0);
      if (e != cudaSuccess) (void)cudaGetLastError();
    }
  }
  (void)cudaEventDestroy(ready_);
  (void)cudaEventDestroy(start_);
  (void)cudaEventDestroy(end_);
}

void MessageWork::wait() {
  DeviceGuard guard(device_);
  std::unique_lock<std::mutex> lock(mutex_);
  if (waited_) {
    if (!error_.empty()) throw Error(error_);
    return;
  }
  // Launched by the lane's thread in time, or the lane fails it.
  if (!cv_.wait_until(lock, deadline_, [&] { return state_ != State::Queued; })) {
    lock.unlock();
    lane_->request_abort(fmt::format(
        "it was not under way after {:.2f} s (the timeout): the peer died, hung, or did not "
        "post the matching {}",
        static_cast<double>(lane_->timeout().count()) / 1000.0, receiving_ ? "send" : "recv"));
    lock.lock();
    cv_.wait(lock, [&] { return state_ != State::Queued; });
  }
  for (;;) {
    if (state_ == State::Failed) {
      waited_ = true;
      throw Error(error_);
    }
    const cudaError_t q = cudaEventQuery(end_);
    if (q == cudaSuccess) break;  // a failure is marked before an abort could end the kernel
    lock.unlock();
    if (q != cudaErrorNotReady) {
      (void)cudaGetLastError();
      lane_->request_abort(fmt::format("cudaEventQuery: {}", cudaGetErrorString(q)));
    } else if (const ncclResult_t state = lane_->async_state();
               state != ncclSuccess && state != ncclInProgress) {
      lane_->request_abort(fmt::format("{}", ncclGetErrorString(state)));
    } else if (Clock::now() > deadline_) {
      lane_->request_abort(fmt::format(
          "it did not complete within {:.2f} s (the timeout): the peer died, hung, or did not "
          "post the matching {}",
          static_cast<double>(lane_->timeout().count()) / 1000.0, receiving_ ? "send" : "recv"));
    }
    std::this_thread::sleep_for(std::chrono::microseconds(50));
    lock.lock();
  }
  float ms = 0.0f;
  MG_CUDA_CHECK(cudaEventElapsedTime(&ms, start_, end_));
  duration_ = ms / 1000.0;
  waited_ = true;
  // Later work on the caller's stream sees the message (recv) or may reuse its memory (send).
  MG_CUDA_CHECK(
      cudaStreamWaitEvent(static_cast<cudaStream_t>(current_stream(device_).handle), end_, 0));
  if (!error_once_done_.empty()) {
    error_ = error_once_done_;
    throw Error(error_);
  }
  if (receiving_) buffer_->copy_back();
}

bool MessageWork::is_completed() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (waited_ || state_ == State::Failed) return true;
  return state_ == State::Launched && cudaEventQuery(end_) == cudaSuccess;
}

NcclPointToPoint::NcclPointToPoint(NcclLaneConfig config) : config_(std::move(config)) {}

NcclPointToPoint::~NcclPointToPoint() {
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto& [key, lane] : lanes_) lane->request_stop();
  for (auto& [key, lane] : lanes_) lane->join();
  lanes_.clear();
}

std::shared_ptr<NcclLane> NcclPointToPoint::lane(int peer, bool sending) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto& lane = lanes_[{peer, sending}];
  if (!lane) {
    lane = std::make_shared<NcclLane>(config_, peer, sending);
    lane->start();
  }
  return lane;
}

std::shared_ptr<Work> NcclPointToPoint::send(std::vector<Tensor> tensors, int dst, int tag,
                                             std::string description) {
  const Device device = Device::cuda(config_.device_index);
  DeviceGuard guard(device);
  const MessageHeader header = message_header(tensors, tag);
  // On the caller's stream; a send only reads the tensors (their versions stay).
  auto buffer = std::make_shared<CoalescedBuffer>(std::move(tensors), /*writes_as=*/nullptr);
  auto lane = this->lane(dst, true);
  auto work = std::make_shared<MessageWork>(lane, std::move(description), device, buffer, header,
                                            false, config_.timeout);
  // NCCL sends from device memory: the header's bytes go there on the caller's stream.
  std::vector<int64_t> words(sizeof(MessageHeader) / sizeof(int64_t));
  std::memcpy(words.data(), &header, sizeof(MessageHeader));
  work->header_on_device = from_vector(words, Shape{static_cast<int64_t>(words.size())}).to(device);
  work->record_ready();
  return lane->post(work, tag);
}

std::shared_ptr<Work> NcclPointToPoint::recv(std::vector<Tensor> tensors, int src, int tag,
                                             std::string description) {
  const Device device = Device::cuda(config_.device_index);
  DeviceGuard guard(device);
  const MessageHeader expected = message_header(tensors, tag);
  auto buffer = std::make_shared<CoalescedBuffer>(std::move(tensors), "recv");
  auto lane = this->lane(src, false);
  auto work = std::make_shared<MessageWork>(lane, std::move(description), device, buffer, expected,
                                            true, config_.timeout);
  work->record_ready();
  return lane->post(work, tag);
}

}  // namespace mg::parallel::detail
