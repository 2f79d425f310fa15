// ProcessGroupGloo's send and recv (process_group_gloo.h), over Gloo's unbound buffers.
//
// A message is two Gloo transfers between the same two ranks: a fixed-size header
// (p2p_message.h) on slot H(tag), then the payload on slot P(tag). Gloo pairs the sends
// and recvs of one slot in the order they were posted, and its slots are independent of
// each other, so messages are matched by (peer, tag) and none waits behind a message of
// another tag or another peer.
//
//   send  posts the header and the payload at once, on the caller's thread; a waiter
//         thread waits until the peer has taken both.
//   recv  posts the header recv at once; a waiter thread waits for the header, checks
//         it against the recv's tensors, then posts the payload recv, into the tensors
//         when it matches or into scratch memory when it does not, and waits for it. The
//         payload recvs of one (peer, tag) are posted in the order of their recvs (a
//         ticket each), so they pair with the payloads in the order the sender sent them.
//
// Posting on the caller's thread rather than the communication thread is what keeps
// messages independent of the collectives queued there (PyTorch's Gloo backend posts
// isend/irecv the same way). Gloo moves a payload only once its recv is posted, so a
// send and a recv between two ranks never deadlock, in whichever order they are posted.
#include <chrono>

#include <gloo/rendezvous/context.h>
#include <gloo/transport/unbound_buffer.h>
#include <gloo/types.h>

#include <minigrad/parallel/c10d/gloo/process_group_gloo_internal.h>
#include <minigrad/parallel/c10d/p2p_message.h>

namespace mg::parallel {

namespace gloo_detail {

WaiterThreads::~WaiterThreads() { stop(); }

void WaiterThreads::submit(std::function<void()> job) {
  std::lock_guard<std::mutex> lock(mutex_);
  jobs_.push_back(std::move(job));
  if (jobs_.size() > idle_) {
    ++idle_;  // counted from now, so the next submit does not count on it as well
    threads_.emplace_back([this] { loop(); });
  }
  cv_.notify_one();
}

void WaiterThreads::stop() {
  std::vector<std::thread> threads;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
    threads.swap(threads_);
  }
  cv_.notify_all();
  for (std::thread& t : threads) t.join();
}

void WaiterThreads::loop() {
  block_sigpipe_in_this_thread(nullptr);  // waiters post payload recvs (see gloo_internal.h)
  profiler::set_thread_name("gloo message waiter");
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    cv_.wait(lock, [&] { return stopping_ || !jobs_.empty(); });
    if (jobs_.empty()) return;  // stopping, and nothing left
    std::function<void()> job = std::move(jobs_.front());
    jobs_.pop_front();
    --idle_;
    lock.unlock();
    job();
    job = nullptr;
    lock.lock();
    ++idle_;
  }
}

}  // namespace gloo_detail

namespace {

using Clock = std::chrono::steady_clock;
using gloo_detail::GlooWork;
using gloo_detail::ScopedSigpipeBlock;
using gloo_detail::seconds_of;
using Impl = ProcessGroupGloo::Impl;

// Gloo's collectives take slot prefixes 0x01 to 0x08 (gloo/types.h); these are ours.
constexpr uint8_t kHeaderSlotPrefix = 0x40;
constexpr uint8_t kPayloadSlotPrefix = 0x41;

uint64_t header_slot(int tag) {
  return gloo::Slot::build(kHeaderSlotPrefix, static_cast<uint32_t>(tag));
}
uint64_t payload_slot(int tag) {
  return gloo::Slot::build(kPayloadSlotPrefix, static_cast<uint32_t>(tag));
}

// A recv whose tensors are not what was sent: that recv fails, the group stays usable.
class MessageMismatch : public Error {
 public:
  using Error::Error;
};
// The group was destroyed while the message was in flight.
struct Aborted {};

// One message on its way.
struct Message {
  detail::MessageHeader header;    // sent, or received
  detail::MessageHeader expected;  // recv: what its tensors are
  // The tensors and their coalesced copy; owned by the message's GlooWork, which releases
  // them in the caller's wait() (GlooWork::hold_until_wait), never on a waiter thread.
  CoalescedBuffer* buffer = nullptr;
  std::vector<char> scratch;  // recv: where a mismatching payload goes
  std::unique_ptr<gloo::transport::UnboundBuffer> header_buf;
  std::unique_ptr<gloo::transport::UnboundBuffer> payload_buf;
  int peer = 0;
  int tag = 0;
  uint64_t ticket = 0;  // recv: its place among the recvs of (peer, tag)
  Clock::time_point deadline;
};

// The time left before `deadline`; at least 1 ms, since Gloo reads 0 as "its default".
std::chrono::milliseconds time_left(Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  return std::max(left, std::chrono::milliseconds(1));
}

std::unique_ptr<gloo::transport::UnboundBuffer> make_buffer(Impl& impl, void* data, size_t bytes) {
  auto buffer = impl.context->createUnboundBuffer(data, bytes);
  impl.pending_buffers.insert(buffer.get());  // under p2p_mutex, by every caller
  return buffer;
}

void wait_sent(gloo::transport::UnboundBuffer& buffer, Clock::time_point deadline) {
  if (!buffer.waitSend(time_left(deadline))) throw Aborted{};
}

void wait_received(gloo::transport::UnboundBuffer& buffer, Clock::time_point deadline) {
  if (!buffer.waitRecv(time_left(deadline))) throw Aborted{};
}

std::string failure_message(const Impl& impl, const std::string& description, double elapsed,
                            const char* counterpart, const char* what) {
  return fmt::format(
      "ProcessGroupGloo: {} failed on rank {} of {} after {:.2f} s (timeout {:.2f} s): a peer "
      "rank died, hung, or did not post the matching {}. Gloo says: {}",
      description, impl.rank, impl.size, elapsed, seconds_of(impl.options.timeout), counterpart,
      what);
}

// Runs a message's work on a waiter thread, and says what went wrong in its terms.
void run_message(Impl* impl, const std::shared_ptr<GlooWork>& work,
                 const std::shared_ptr<Message>& message, const char* counterpart) {
  const auto start = Clock::now();
  const auto elapsed = [&] { return std::chrono::duration<double>(Clock::now() - start).count(); };
  try {
    work->run();
  } catch (const MessageMismatch&) {
    work->finish(std::current_exception(), elapsed());
  } catch (const Aborted&) {
    work->finish(std::make_exception_ptr(Error(fmt::format(
                     "ProcessGroupGloo: {} on rank {} of {} was cut short: the process group "
                     "was destroyed first",
                     work->description(), impl->rank, impl->size))),
                 elapsed());
  } catch (const std::exception& e) {
    const std::string error =
        failure_message(*impl, work->description(), elapsed(), counterpart, e.what());
    impl->record_failure(error);
    work->finish(std::make_exception_ptr(Error(error)), elapsed());
  }
  std::lock_guard<std::mutex> lock(impl->p2p_mutex);
  impl->pending_buffers.erase(message->header_buf.get());
  impl->pending_buffers.erase(message->payload_buf.get());
}

// A Work that failed before anything was posted, because the group had failed before.
std::shared_ptr<Work> refused(const Impl& impl, const std::string& description,
                              const std::string& failure) {
  return std::make_shared<CompletedWork>(std::make_exception_ptr(Error(fmt::format(
      "ProcessGroupGloo: {} on rank {} of {} was not posted because an earlier collective or "
      "message failed: {}",
      description, impl.rank, impl.size, failure))));
}

// A Work whose post Gloo refused (a connection already closed): the group has failed.
std::shared_ptr<Work> failed_post(Impl& impl, const std::string& description,
                                  const char* counterpart, const std::exception& e) {
  const std::string error = failure_message(impl, description, 0.0, counterpart, e.what());
  impl.record_failure(error);
  return std::make_shared<CompletedWork>(std::make_exception_ptr(Error(error)));
}

// The recv's turn to post its payload recv (after the recvs of (src, tag) before it),
// then `post`; the next recv's turn comes even when `post` throws.
template <typename F>
void in_turn(Impl& impl, Message& m, const std::string& description, F&& post) {
  std::unique_lock<std::mutex> lock(impl.p2p_mutex);
  const auto key = std::make_pair(m.peer, m.tag);
  Impl::RecvChannel& channel = impl.recv_channels[key];
  // The recvs before this one have their headers (Gloo delivers a slot's messages in
  // order), so their turns come at once; the deadline only guards against a bug.
  const bool ours = impl.p2p_cv.wait_until(
      lock, m.deadline, [&] { return impl.p2p_stopping || channel.payloads == m.ticket; });
  const auto next_turn = [&] {
    ++channel.payloads;
    if (channel.payloads == channel.posted) impl.recv_channels.erase(key);
    impl.p2p_cv.notify_all();
  };
  MG_CHECK(ours, "{}: the recvs posted before it never took their turn", description);
  if (impl.p2p_stopping) {
    next_turn();
    throw Aborted{};
  }
  try {
    post();
  } catch (...) {
    next_turn();
    throw;
  }
  next_turn();
}

}  // namespace

void ProcessGroupGloo::Impl::stop_point_to_point() {
  {
    std::lock_guard<std::mutex> lock(p2p_mutex);
    p2p_stopping = true;
    for (gloo::transport::UnboundBuffer* buffer : pending_buffers) {
      buffer->abortWaitRecv();
      buffer->abortWaitSend();
    }
  }
  p2p_cv.notify_all();
  waiters.stop();
}

std::shared_ptr<Work> ProcessGroupGloo::send(std::vector<Tensor> tensors, int dst, int tag) {
  check_message("send", tensors, dst, tag);
  Impl* impl = impl_.get();
  auto m = std::make_shared<Message>();
  m->peer = dst;
  m->tag = tag;
  m->header = detail::message_header(tensors, tag);
  const std::string description = impl->next_description(
      "send", fmt::format("to rank {}, tag {}: {}", dst, tag, detail::describe(m->header)));
  const std::string failure = impl->failure();
  if (!failure.empty()) return refused(*impl, description, failure);
  // Coalesced now: the caller may reuse a list's tensors at once (not a single one, which
  // is sent from where it lies).
  auto buffer = std::make_shared<CoalescedBuffer>(std::move(tensors), /*writes_as=*/nullptr);
  m->buffer = buffer.get();
  m->deadline = Clock::now() + impl->options.timeout;
  try {
    ScopedSigpipeBlock no_sigpipe;  // posting may write to the socket on this thread
    std::lock_guard<std::mutex> lock(impl->p2p_mutex);
    m->header_buf = make_buffer(*impl, &m->header, sizeof(m->header));
    if (m->buffer->nbytes() > 0)
      m->payload_buf = make_buffer(*impl, m->buffer->flat().data_ptr(), m->buffer->nbytes());
    m->header_buf->send(dst, header_slot(tag));
    if (m->payload_buf) m->payload_buf->send(dst, payload_slot(tag));
  } catch (const std::exception& e) {
    std::lock_guard<std::mutex> lock(impl->p2p_mutex);
    impl->pending_buffers.erase(m->header_buf.get());
    impl->pending_buffers.erase(m->payload_buf.get());
    return failed_post(*impl, description, "recv", e);
  }
  auto work = std::make_shared<GlooWork>(description, [m] {
    wait_sent(*m->header_buf, m->deadline);
    if (m->payload_buf) wait_sent(*m->payload_buf, m->deadline);
  });
  work->hold_until_wait(std::move(buffer));
  impl->waiters.submit([impl, work, m] { run_message(impl, work, m, "recv"); });
  return work;
}

std::shared_ptr<Work> ProcessGroupGloo::recv(std::vector<Tensor> tensors, int src, int tag) {
  check_message("recv", tensors, src, tag);
  Impl* impl = impl_.get();
  auto m = std::make_shared<Message>();
  m->peer = src;
  m->tag = tag;
  m->expected = detail::message_header(tensors, tag);
  const std::string description = impl->next_description(
      "recv", fmt::format("from rank {}, tag {}: {}", src, tag, detail::describe(m->expected)));
  const std::string failure = impl->failure();
  if (!failure.empty()) return refused(*impl, description, failure);
  auto buffer = std::make_shared<CoalescedBuffer>(std::move(tensors), "recv");
  m->buffer = buffer.get();
  m->deadline = Clock::now() + impl->options.timeout;
  try {
    ScopedSigpipeBlock no_sigpipe;
    std::lock_guard<std::mutex> lock(impl->p2p_mutex);
    m->header_buf = make_buffer(*impl, &m->header, sizeof(m->header));
    m->header_buf->recv(src, header_slot(tag));
    m->ticket = impl->recv_channels[{src, tag}].posted++;  // only once the recv is posted
  } catch (const std::exception& e) {
    std::lock_guard<std::mutex> lock(impl->p2p_mutex);
    impl->pending_buffers.erase(m->header_buf.get());
    return failed_post(*impl, description, "send", e);
  }
  auto work = std::make_shared<GlooWork>(description, [impl, m, description] {
    wait_received(*m->header_buf, m->deadline);
    size_t bytes = 0;
    bool match = false;
    in_turn(*impl, *m, description, [&] {
      bytes = detail::payload_bytes(m->header, description);  // a garbled header throws
      match = detail::same_message(m->header, m->expected);
      if (bytes == 0) return;
      void* into = m->buffer->flat().data_ptr();
      if (!match) {
        m->scratch.resize(bytes);
        into = m->scratch.data();
      }
      m->payload_buf = make_buffer(*impl, into, bytes);
      m->payload_buf->recv(m->peer, payload_slot(m->tag));
    });
    if (m->payload_buf) wait_received(*m->payload_buf, m->deadline);
    if (!match)
      throw MessageMismatch(fmt::format(
          "ProcessGroupGloo: {} on rank {} of {}: rank {} sent {}; a recv's tensors must match "
          "the send's in number, shapes and dtype. The message was dropped",
          description, impl->rank, impl->size, m->peer, detail::describe(m->header)));
    m->buffer->copy_back();
  });
  work->hold_until_wait(std::move(buffer));
  impl->waiters.submit([impl, work, m] { run_message(impl, work, m, "send"); });
  return work;
}

}  // namespace mg::parallel
