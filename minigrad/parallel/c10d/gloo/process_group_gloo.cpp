// ProcessGroupGloo (process_group_gloo.h): Gloo's algorithms and TCP transport, a
// communication thread that runs the collectives in call order, and Gloo's failures
// turned into mg::Errors that say which collective, which rank and what to suspect.
#include <minigrad/parallel/c10d/gloo/process_group_gloo.h>

#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>

#include <minigrad/parallel/c10d/gloo/process_group_gloo_internal.h>

#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/alltoall.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>

#include <minigrad/core/ops.h>
#include <minigrad/parallel/c10d/store/socket.h>

namespace mg::parallel {

namespace gloo_detail {

double seconds_of(std::chrono::milliseconds ms) { return static_cast<double>(ms.count()) / 1000.0; }

void block_sigpipe_in_this_thread(sigset_t* previous) {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGPIPE);
  const int rc = pthread_sigmask(SIG_BLOCK, &set, previous);
  MG_CHECK(rc == 0, "ProcessGroupGloo: pthread_sigmask failed: {}", net::errno_string(rc));
}

ScopedSigpipeBlock::ScopedSigpipeBlock() {
  block_sigpipe_in_this_thread(&previous_);
  was_blocked_ = sigismember(&previous_, SIGPIPE) == 1;
}

ScopedSigpipeBlock::~ScopedSigpipeBlock() {
  if (was_blocked_) return;
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGPIPE);
  const timespec no_wait{0, 0};
  while (sigtimedwait(&set, nullptr, &no_wait) == SIGPIPE) {
  }
  pthread_sigmask(SIG_SETMASK, &previous_, nullptr);
}

void GlooWork::wait() {
  std::shared_ptr<const void> held;  // released here, outside the lock (hold_until_wait)
  std::exception_ptr error;
  {
    std::unique_lock<std::mutex> lock(mutex_);
    cv_.wait(lock, [&] { return done_; });
    held = std::move(held_);
    error = error_;
  }
  held.reset();
  if (error) std::rethrow_exception(error);
}

bool GlooWork::is_completed() {
  std::lock_guard<std::mutex> lock(mutex_);
  return done_;
}

double GlooWork::duration_seconds() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return done_ ? duration_ : -1.0;
}

void GlooWork::run() {
  const auto start = std::chrono::steady_clock::now();
  {
    // The span ends before finish() wakes the waiter, so a trace stopped right after
    // wait() still has it.
    profiler::Span span("{}", std::string_view(description_).substr(0, description_.find(" #")));
    span.category("comm").arg("collective", description_);
    if (!label_.empty()) span.arg("for", label_);
    run_();
  }
  finish(nullptr, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
}

void GlooWork::finish(std::exception_ptr error, double duration) {
  std::function<void()> done_with;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    done_with = std::move(run_);
    run_ = nullptr;
  }
  // The buffers it held go outside the lock, but before anyone can see the work done: a
  // caller back from wait() finds them released (the memory it counts is its own).
  done_with = nullptr;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    error_ = std::move(error);
    duration_ = duration;
    done_ = true;
  }
  cv_.notify_all();
}

}  // namespace gloo_detail

namespace {

using Clock = std::chrono::steady_clock;
using gloo_detail::GlooWork;
using gloo_detail::ScopedSigpipeBlock;
using gloo_detail::block_sigpipe_in_this_thread;
using gloo_detail::seconds_of;

// Gloo's rendezvous talks to a gloo::rendezvous::Store; this one forwards to our TCPStore
// under a prefix of its own, so several groups (and NCCL) can share one store.
class GlooStoreAdapter : public gloo::rendezvous::Store {
 public:
  GlooStoreAdapter(parallel::Store& store, std::string prefix, std::chrono::milliseconds timeout)
      : store_(store), prefix_(std::move(prefix)), timeout_(timeout) {}

  void set(const std::string& key, const std::vector<char>& data) override {
    store_.set(prefix_ + key, std::string(data.begin(), data.end()));
  }
  std::vector<char> get(const std::string& key) override {
    const std::string value = store_.get(prefix_ + key, timeout_);
    return std::vector<char>(value.begin(), value.end());
  }
  void wait(const std::vector<std::string>& keys) override { wait(keys, timeout_); }
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override {
    std::vector<std::string> prefixed;
    prefixed.reserve(keys.size());
    for (const std::string& k : keys) prefixed.push_back(prefix_ + k);
    // Gloo passes kNoTimeout (0) for "the default"; ours is the group's timeout.
    store_.wait(prefixed, timeout.count() > 0 ? timeout : timeout_);
  }

 private:
  parallel::Store& store_;
  std::string prefix_;
  std::chrono::milliseconds timeout_;
};

// Ranks create their groups in the same order, so the n-th group of every process gets
// the same store prefix (PyTorch numbers its groups the same way).
std::atomic<int> group_counter{0};

// The host name this rank's Gloo connections bind to (see ProcessGroupOptions).
gloo::transport::tcp::attr transport_attr(const ProcessGroupOptions& options,
                                          const std::string& store_host) {
  gloo::transport::tcp::attr attr;
  if (!options.gloo_hostname.empty()) {
    attr.hostname = options.gloo_hostname;
  } else if (const char* iface = std::getenv("GLOO_SOCKET_IFNAME"); iface && *iface) {
    attr.iface = iface;
  } else if (net::is_loopback(store_host)) {
    attr.hostname = "127.0.0.1";
  } else {
    char name[256] = {};
    MG_CHECK(::gethostname(name, sizeof(name) - 1) == 0,
             "ProcessGroupGloo: gethostname failed: {}", net::errno_string(errno));
    attr.hostname = name;
  }
  return attr;
}

using ReduceFunction = void (*)(void*, const void*, const void*, size_t);

}  // namespace

std::string ProcessGroupGloo::Impl::next_description(const char* op, const std::string& detail) {
  std::lock_guard<std::mutex> lock(mutex);
  std::string description = fmt::format("{} #{}", op, sequence++);
  if (!detail.empty()) description += " (" + detail + ")";
  return description;
}

void ProcessGroupGloo::Impl::record_failure(const std::string& message) {
  std::lock_guard<std::mutex> lock(mutex);
  if (first_error.empty()) first_error = message;
}

std::string ProcessGroupGloo::Impl::failure() {
  std::lock_guard<std::mutex> lock(mutex);
  return first_error;
}

std::shared_ptr<Work> ProcessGroupGloo::Impl::enqueue(const char* op, const std::string& detail,
                                                      std::function<void(uint32_t)> body) {
  std::lock_guard<std::mutex> lock(mutex);
  const uint32_t tag = next_tag++;
  std::string description = fmt::format("{} #{}", op, sequence++);
  if (!detail.empty()) description += " (" + detail + ")";
  auto work = std::make_shared<GlooWork>(std::move(description),
                                         [body = std::move(body), tag] { body(tag); });
  queue.push_back(work);
  cv.notify_one();
  return work;
}

void ProcessGroupGloo::Impl::run_worker() {
  block_sigpipe_in_this_thread(nullptr);  // for good: see ScopedSigpipeBlock
  profiler::set_thread_name(
      fmt::format("gloo comm thread ({})", std::string_view(prefix).substr(0, prefix.size() - 1)));
  for (;;) {
    std::shared_ptr<GlooWork> work;
    {
      std::unique_lock<std::mutex> lock(mutex);
      cv.wait(lock, [&] { return stopping || !queue.empty(); });
      if (queue.empty()) return;  // stopping, and nothing left
      work = std::move(queue.front());
      queue.pop_front();
      if (stopping) {
        work->finish(std::make_exception_ptr(Error(fmt::format(
                         "ProcessGroupGloo: {} was never run: the process group was "
                         "destroyed first (rank {} of {})",
                         work->description(), rank, size))),
                     0.0);
        continue;
      }
      if (!first_error.empty()) {
        work->finish(std::make_exception_ptr(Error(fmt::format(
                         "ProcessGroupGloo: {} on rank {} of {} was not run because an earlier "
                         "collective or message failed: {}",
                         work->description(), rank, size, first_error))),
                     0.0);
        continue;
      }
    }
    const auto start = Clock::now();
    try {
      work->run();
    } catch (const std::exception& e) {
      const double elapsed = std::chrono::duration<double>(Clock::now() - start).count();
      const std::string message = fmt::format(
          "ProcessGroupGloo: {} failed on rank {} of {} after {:.2f} s (timeout {:.2f} s): a "
          "peer rank died, hung, or did not call the same collective. Gloo says: {}",
          work->description(), rank, size, elapsed, seconds_of(options.timeout), e.what());
      record_failure(message);
      work->finish(std::make_exception_ptr(Error(message)), elapsed);
    }
  }
}

ProcessGroupGloo::ProcessGroupGloo(std::shared_ptr<Store> store, int rank, int size,
                                   ProcessGroupOptions options)
    : ProcessGroup(rank, size), impl_(std::make_unique<Impl>()) {
  MG_CHECK(store != nullptr, "ProcessGroupGloo: store is null (rank {})", rank);
  MG_CHECK(options.timeout.count() > 0, "ProcessGroupGloo: timeout must be positive, got {} ms",
           options.timeout.count());
  impl_->store = std::move(store);
  impl_->options = options;
  impl_->prefix = fmt::format("gloo/{}/", group_counter++);
  connect();
}

// A sub-group (new_group): the parent's store, options and transport device (one event
// loop thread for all of a process's groups), connections and keys of its own.
ProcessGroupGloo::ProcessGroupGloo(const Impl& parent, std::string prefix, int rank, int size)
    : ProcessGroup(rank, size), impl_(std::make_unique<Impl>()) {
  impl_->store = parent.store;
  impl_->options = parent.options;
  impl_->prefix = std::move(prefix);
  impl_->device = parent.device;
  connect();
}

void ProcessGroupGloo::connect() {
  impl_->rank = rank();
  impl_->size = size();
  const ProcessGroupOptions& options = impl_->options;
  const auto start = Clock::now();
  ScopedSigpipeBlock no_sigpipe;  // also inherited by Gloo's loop thread and our worker
  try {
    if (!impl_->device)
      impl_->device =
          gloo::transport::tcp::CreateDevice(transport_attr(options, impl_->store->host()));
    auto context = std::make_shared<gloo::rendezvous::Context>(rank(), size());
    context->setTimeout(options.timeout);
    GlooStoreAdapter adapter(*impl_->store, impl_->prefix, options.timeout);
    context->connectFullMesh(adapter, impl_->device);
    impl_->context = std::move(context);
    wait_until_every_rank_joined();
  } catch (const std::exception& e) {
    const double elapsed = std::chrono::duration<double>(Clock::now() - start).count();
    MG_FAIL("ProcessGroupGloo: rank {} of {} could not join the group through the store at "
            "{}:{} after {:.2f} s (timeout {:.2f} s; the group's keys are under '{}'): {}",
            rank(), size(), impl_->store->host(), impl_->store->port(), elapsed,
            seconds_of(options.timeout), impl_->prefix, e.what());
  }
  impl_->worker = std::thread([impl = impl_.get()] { impl->run_worker(); });
}

// torch's _store_based_barrier: a rank's connectFullMesh can return while a peer's is still
// shaking hands with it; were the first rank to fail straight after and exit, the peer would
// see "connection closed" instead of that rank's own error. So no rank leaves the
// constructor before every rank's mesh is up.
void ProcessGroupGloo::wait_until_every_rank_joined() {
  Store& store = *impl_->store;
  store.set(fmt::format("{}joined/{}", impl_->prefix, rank()), "1");
  std::vector<std::string> keys;
  for (int r = 0; r < size(); ++r) keys.push_back(fmt::format("{}joined/{}", impl_->prefix, r));
  store.wait(keys, impl_->options.timeout);
}

ProcessGroupGloo::~ProcessGroupGloo() {
  {
    std::lock_guard<std::mutex> lock(impl_->mutex);
    impl_->stopping = true;
  }
  impl_->cv.notify_all();
  impl_->worker.join();
  impl_->stop_point_to_point();
}

std::chrono::milliseconds ProcessGroupGloo::timeout() const { return impl_->options.timeout; }

namespace {

template <typename T>
void gloo_allreduce(const std::shared_ptr<gloo::Context>& context, const Tensor& flat,
                    uint32_t tag, std::chrono::milliseconds timeout) {
  gloo::AllreduceOptions opts(context);
  opts.setOutput<T>(flat.data<T>(), static_cast<size_t>(flat.numel()));
  opts.setReduceFunction(static_cast<ReduceFunction>(&gloo::sum<T>));
  opts.setTag(tag);
  opts.setTimeout(timeout);
  gloo::allreduce(opts);
}

template <typename T>
void gloo_broadcast(const std::shared_ptr<gloo::Context>& context, const Tensor& flat, int root,
                    uint32_t tag, std::chrono::milliseconds timeout) {
  gloo::BroadcastOptions opts(context);
  opts.setOutput<T>(flat.data<T>(), static_cast<size_t>(flat.numel()));
  opts.setRoot(root);
  opts.setTag(tag);
  opts.setTimeout(timeout);
  gloo::broadcast(opts);
}

template <typename T>
void gloo_alltoall(const std::shared_ptr<gloo::Context>& context, const Tensor& input,
                   const Tensor& output, uint32_t tag, std::chrono::milliseconds timeout) {
  gloo::AlltoallOptions opts(context);
  opts.setInput<T>(input.data<T>(), static_cast<size_t>(input.numel()));
  opts.setOutput<T>(output.data<T>(), static_cast<size_t>(output.numel()));
  opts.setTag(tag);
  opts.setTimeout(timeout);
  gloo::alltoall(opts);
}

// `input` null: in place (this rank's slice of `output` already holds its contribution).
template <typename T>
void gloo_allgather(const std::shared_ptr<gloo::Context>& context, const Tensor* input,
                    const Tensor& output, uint32_t tag, std::chrono::milliseconds timeout) {
  gloo::AllgatherOptions opts(context);
  if (input != nullptr) opts.setInput<T>(input->data<T>(), static_cast<size_t>(input->numel()));
  opts.setOutput<T>(output.data<T>(), static_cast<size_t>(output.numel()));
  opts.setTag(tag);
  opts.setTimeout(timeout);
  gloo::allgather(opts);
}

// Runs f(T{}) with T the element type of `dtype`: the three dtypes Gloo carries here
// (gloo's sum and its transport work for any arithmetic type). The 16-bit floats never
// reach it: they travel widened (below).
template <typename F>
void with_element_type(DType dtype, F f) {
  switch (dtype) {
    case DType::Float32: return f(float{});
    case DType::Float64: return f(double{});
    case DType::Int64: return f(int64_t{});
    default: break;
  }
  MG_FAIL("ProcessGroupGloo: unsupported dtype {}", dtype);
}

// bfloat16 and float16 on the wire: Gloo's reductions have no 16-bit float type that this
// build can name (gloo::float16 is IEEE half only, and there is no bfloat16), so a 16-bit
// tensor travels as float32 -- exact, every 16-bit value is a float32 -- is summed in
// float32, and is rounded once into its own dtype on arrival (docs/mixed-precision.md).
// Twice NCCL's bytes on the wire, and a sum at least as exact as NCCL's (which rounds in
// 16 bits as its ring goes); broadcasts and gathers arrive bit for bit.
Tensor widened(const Tensor& t) { return is_reduced_float(t.dtype()) ? ops::to_dtype(t, DType::Float32) : t; }

// Writes `wire` (widened(dst)'s result) back into `dst`, rounded once; nothing when it is dst.
// Through the backend, not ops::copy_: the collective has counted its write into dst already
// (bump_version on the caller's thread), and an FSDP gather that rewrites what a backward
// saved declares it there (UnsafePreserveVersionCounter); this runs later, on the
// communication thread.
void narrow_into(const Tensor& dst, const Tensor& wire) {
  if (wire.numel() > 0 && wire.data_ptr() != dst.data_ptr())
    backend(dst.device()).copy(dst, ops::view(ops::to_dtype(wire, dst.dtype()), dst.shape()));
}

// A group of one: the result is the input itself.
void copy_flat(const Tensor& dst, const Tensor& src) {
  if (dst.numel() > 0 && dst.data_ptr() != src.data_ptr())
    ops::copy_(dst, ops::view(src, dst.shape()));
}

}  // namespace

std::shared_ptr<Work> ProcessGroupGloo::allreduce(std::vector<Tensor> tensors, ReduceOp op) {
  check_tensors("allreduce", tensors, op == ReduceOp::Average);
  // A group of one has nothing to exchange: the sum and the mean are the tensors as they are.
  if (size() == 1) return std::make_shared<CompletedWork>();
  // Coalesced on the caller's thread: the caller may reuse its gradients at once.
  auto buffer = std::make_shared<CoalescedBuffer>(std::move(tensors), "allreduce");
  const std::string detail = fmt::format("{} of {} bytes", reduce_op_name(op), buffer->nbytes());
  Impl* impl = impl_.get();
  return impl->enqueue("allreduce", detail, [impl, buffer, op](uint32_t tag) {
    const Tensor flat = widened(buffer->flat());
    if (flat.numel() > 0) {
      with_element_type(flat.dtype(), [&](auto t) {
        gloo_allreduce<decltype(t)>(impl->context, flat, tag, impl->options.timeout);
      });
    }
    // Gloo has no average: sum, then scale, as PyTorch's DDP comm hook does.
    if (op == ReduceOp::Average)
      backend(flat.device()).binary_scalar(BinaryOp::Mul, flat, flat, 1.0 / impl->size);
    narrow_into(buffer->flat(), flat);
    buffer->copy_back();
  });
}

std::shared_ptr<Work> ProcessGroupGloo::broadcast(std::vector<Tensor> tensors, int root) {
  check_tensors("broadcast", tensors, false);
  MG_CHECK(root >= 0 && root < size(), "broadcast (gloo): root {} is outside [0, {}) (rank {})",
           root, size(), rank());
  if (size() == 1) return std::make_shared<CompletedWork>();
  auto buffer = std::make_shared<CoalescedBuffer>(std::move(tensors), "broadcast");
  const std::string detail = fmt::format("{} bytes from rank {}", buffer->nbytes(), root);
  Impl* impl = impl_.get();
  return impl->enqueue("broadcast", detail, [impl, buffer, root](uint32_t tag) {
    const Tensor flat = widened(buffer->flat());
    if (flat.numel() > 0) {
      with_element_type(flat.dtype(), [&](auto t) {
        gloo_broadcast<decltype(t)>(impl->context, flat, root, tag, impl->options.timeout);
      });
    }
    narrow_into(buffer->flat(), flat);
    buffer->copy_back();
  });
}

std::shared_ptr<Work> ProcessGroupGloo::reduce_scatter(Tensor output, Tensor input, ReduceOp op) {
  check_flat_pair("reduce_scatter", input, "input", output, "output", op == ReduceOp::Average);
  if (size() == 1) {  // the sum and the mean of one contribution are the contribution
    copy_flat(output, input);
    return std::make_shared<CompletedWork>();
  }
  if (output.numel() == 0) return std::make_shared<CompletedWork>();
  bump_version(output, "reduce_scatter");  // rewritten in place (core/tensor.h)
  const std::string detail = fmt::format("{} of {} {} elements into {}", reduce_op_name(op),
                                         input.numel(), dtype_name(input.dtype()), output.numel());
  Impl* impl = impl_.get();
  return impl->enqueue("reduce_scatter", detail, [impl, output, input, op](uint32_t tag) {
    // slices[r] becomes rank r's input[rank * n, (rank + 1) * n): what this rank reduces.
    // Allocated here rather than by the caller, so queued collectives hold no scratch.
    // A 16-bit input travels and is summed in float32, the output rounded once at the end.
    const Tensor wire = widened(input);
    const Tensor slices = empty(Shape{input.numel()}, wire.dtype(), input.device());
    with_element_type(wire.dtype(), [&](auto t) {
      gloo_alltoall<decltype(t)>(impl->context, wire, slices, tag, impl->options.timeout);
    });
    // Summed in rank order, so every rank's slice is reduced the same way. The input is
    // no longer read, so output may be a slice of it (in place).
    const int64_t n = output.numel();
    const Tensor out = wire.dtype() == output.dtype() ? ops::view(output, Shape{n}) : empty(Shape{n}, wire.dtype());
    Backend& cpu = backend(out.device());
    cpu.binary(BinaryOp::Add, out, ops::narrow(slices, 0, 0, n), ops::narrow(slices, 0, n, n), 1.0);
    for (int r = 2; r < impl->size; ++r)
      cpu.binary(BinaryOp::Add, out, out, ops::narrow(slices, 0, r * n, n), 1.0);
    if (op == ReduceOp::Average) cpu.binary_scalar(BinaryOp::Mul, out, out, 1.0 / impl->size);
    narrow_into(output, out);
  });
}

std::shared_ptr<Work> ProcessGroupGloo::all_gather(Tensor output, Tensor input) {
  const bool in_place = check_flat_pair("all_gather", output, "output", input, "input", false);
  if (size() == 1) {
    copy_flat(output, input);
    return std::make_shared<CompletedWork>();
  }
  if (input.numel() == 0) return std::make_shared<CompletedWork>();
  bump_version(output, "all_gather");  // rewritten in place (core/tensor.h)
  const std::string detail = fmt::format("{} x {} {} elements", size(), input.numel(),
                                         dtype_name(input.dtype()));
  Impl* impl = impl_.get();
  return impl->enqueue("all_gather", detail, [impl, output, input, in_place](uint32_t tag) {
    // A 16-bit all-gather moves float32 copies (in place or not, the widened input is
    // another buffer) and rounds them back: exact both ways.
    const Tensor wire_out = is_reduced_float(output.dtype()) ? empty(output.shape(), DType::Float32) : output;
    const Tensor wire_in = widened(input);
    const Tensor* in = in_place && wire_out.data_ptr() == output.data_ptr() ? nullptr : &wire_in;
    with_element_type(wire_out.dtype(), [&](auto t) {
      gloo_allgather<decltype(t)>(impl->context, in, wire_out, tag, impl->options.timeout);
    });
    narrow_into(output, wire_out);
  });
}

std::shared_ptr<ProcessGroup> ProcessGroupGloo::new_group(const std::vector<int>& ranks) {
  const int index = check_new_group(ranks);
  // Every rank of this group calls new_group in the same order, members or not, so the
  // n-th sub-group has the same keys everywhere; they are under this group's own.
  const std::string prefix = fmt::format("{}sub{}/", impl_->prefix, impl_->subgroups++);
  if (index < 0) return nullptr;
  agree_on_members(*impl_->store, prefix, ranks);
  return std::shared_ptr<ProcessGroupGloo>(
      new ProcessGroupGloo(*impl_, prefix, index, static_cast<int>(ranks.size())));
}

std::shared_ptr<Work> ProcessGroupGloo::barrier() {
  if (size() == 1) return std::make_shared<CompletedWork>();
  Impl* impl = impl_.get();
  return impl->enqueue("barrier", "", [impl](uint32_t tag) {
    gloo::BarrierOptions opts(impl->context);
    opts.setTag(tag);
    opts.setTimeout(impl->options.timeout);
    gloo::barrier(opts);
  });
}

}  // namespace mg::parallel
