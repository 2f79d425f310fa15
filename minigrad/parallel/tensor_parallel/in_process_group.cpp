#include <minigrad/parallel/tensor_parallel/in_process_group.h>

#include <algorithm>
#include <condition_variable>
#include <mutex>

#include <fmt/ranges.h>

#include <minigrad/core/stream.h>
#include <minigrad/parallel/devices/communicator.h>
#include <minigrad/parallel/devices/device_list.h>

namespace mg::parallel {
namespace {

enum class CollectiveKind { AllReduce, AllGather };

const char* kind_name(CollectiveKind kind) {
  return kind == CollectiveKind::AllReduce ? "all_reduce" : "all_gather";
}

}  // namespace

// One collective at a time: the ranks arrive (Collecting); the last to arrive runs the
// Communicator's collective for all of them; every rank takes its result (Distributing);
// when the last has taken its own, the next collective may begin. A rank that finished
// early and calls the next collective waits at the door until then.
struct InProcessGroup::Rendezvous {
  Rendezvous(std::vector<Device> devices_, std::chrono::milliseconds timeout_)
      : devices(std::move(devices_)),
        timeout(timeout_),
        communicator(communicator_for(devices)),
        inputs(devices.size()),
        outputs(devices.size()),
        streams(devices.size()),
        present(devices.size(), false) {}

  int size() const { return static_cast<int>(devices.size()); }

  std::string who(int rank) const {
    return fmt::format("in-process rank {} of {}", rank, device_list_str(devices));
  }

  // Ranks that have not arrived at the collective being collected.
  std::string missing_ranks() const {
    std::vector<int> missing;
    for (int r = 0; r < size(); ++r)
      if (!present[static_cast<size_t>(r)]) missing.push_back(r);
    return fmt::format("{}", fmt::join(missing, ", "));
  }

  // Runs on the last rank to arrive, with the lock released. Each device's work goes on
  // the stream its rank's thread had current, as if each rank had called it itself.
  std::vector<Tensor> run(CollectiveKind kind) {
    std::vector<std::unique_ptr<StreamGuard>> guards;
    std::vector<Device> guarded;
    for (size_t r = 0; r < devices.size(); ++r) {
      if (std::find(guarded.begin(), guarded.end(), devices[r]) != guarded.end()) continue;
      guarded.push_back(devices[r]);
      guards.push_back(std::make_unique<StreamGuard>(streams[r]));
    }
    std::vector<Tensor> result = kind == CollectiveKind::AllReduce
                                     ? communicator->all_reduce(inputs)
                                     : communicator->all_gather(inputs);
    while (!guards.empty()) guards.pop_back();  // innermost first
    return result;
  }

  Tensor collective(CollectiveKind kind, int rank, const Tensor& tensor) {
    const size_t r = static_cast<size_t>(rank);
    std::unique_lock<std::mutex> lock(mutex);
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    auto fail_if_aborted = [&] {
      if (!aborted.empty())
        MG_FAIL("{} ({}): abandoned because {}", kind_name(kind), who(rank), aborted);
    };
    auto give_up = [&](const std::string& why) {
      aborted = why;
      changed.notify_all();
      MG_FAIL("{} ({}): {}", kind_name(kind), who(rank), why);
    };

    // At the door: the previous collective must have been taken by every rank.
    if (!changed.wait_until(lock, deadline,
                            [&] { return !aborted.empty() || phase == Phase::Collecting; }))
      give_up(fmt::format("the previous collective was still being handed out after {} ms",
                          timeout.count()));
    fail_if_aborted();
    MG_CHECK(!present[r],
             "{} ({}): this rank is already waiting in a collective; two threads are using the "
             "handle of one rank",
             kind_name(kind), who(rank));
    if (arrived == 0) {
      current = kind;
    } else if (kind != current) {
      give_up(fmt::format("rank {} called {} while other ranks are in {}: every rank must call "
                          "the same collectives in the same order",
                          rank, kind_name(kind), kind_name(current)));
    }
    inputs[r] = tensor;
    streams[r] = current_stream(tensor.device());
    present[r] = true;
    const uint64_t round = generation;

    if (++arrived == size()) {
      lock.unlock();
      std::vector<Tensor> result;
      std::string failure;
      try {
        result = run(kind);
      } catch (const std::exception& e) {
        failure = e.what();
      }
      lock.lock();
      outputs = std::move(result);
      if (outputs.size() != devices.size()) outputs.resize(devices.size());
      error = failure;
      phase = Phase::Distributing;
      changed.notify_all();
    } else if (!changed.wait_until(lock, deadline, [&] {
                 return !aborted.empty() || (phase == Phase::Distributing && generation == round);
               })) {
      give_up(fmt::format("rank {} waited {} ms for rank(s) {}, which never called {}", rank,
                          timeout.count(), missing_ranks(), kind_name(kind)));
    }
    fail_if_aborted();

    Tensor out = outputs[r];
    const std::string failure = error;
    outputs[r] = Tensor();
    inputs[r] = Tensor();
    present[r] = false;
    if (++taken == size()) {
      phase = Phase::Collecting;
      arrived = 0;
      taken = 0;
      error.clear();
      ++generation;
      changed.notify_all();
    }
    lock.unlock();
    if (!failure.empty()) MG_FAIL("{} ({}) failed: {}", kind_name(kind), who(rank), failure);
    return out;
  }

  void abort(const std::string& reason) {
    std::lock_guard<std::mutex> lock(mutex);
    if (aborted.empty()) aborted = reason;
    changed.notify_all();
  }

  void clear_abort() {
    std::lock_guard<std::mutex> lock(mutex);
    aborted.clear();
    error.clear();
    phase = Phase::Collecting;
    arrived = taken = 0;
    ++generation;
    for (size_t r = 0; r < devices.size(); ++r) {
      inputs[r] = outputs[r] = Tensor();
      present[r] = false;
    }
  }

  const std::vector<Device> devices;
  const std::chrono::milliseconds timeout;
  const std::shared_ptr<Communicator> communicator;

  enum class Phase { Collecting, Distributing };
  std::mutex mutex;
  std::condition_variable changed;
  Phase phase = Phase::Collecting;
  CollectiveKind current = CollectiveKind::AllReduce;
  int arrived = 0;
  int taken = 0;
  uint64_t generation = 0;
  std::vector<Tensor> inputs, outputs;
  std::vector<Stream> streams;
  std::vector<bool> present;
  std::string error;    // the collective itself failed (shapes differ): every rank throws it
  std::string aborted;  // abort(), a timeout or a mismatch: every rank throws it
};

namespace {

// Rank r's view of the group: what a layer holds.
class InProcessRank final : public TensorParallelGroup {
 public:
  InProcessRank(std::shared_ptr<InProcessGroup::Rendezvous> rendezvous, int rank)
      : rendezvous_(std::move(rendezvous)), rank_(rank) {}

  int rank() const override { return rank_; }
  int size() const override { return rendezvous_->size(); }
  Device device() const override { return rendezvous_->devices[static_cast<size_t>(rank_)]; }
  std::string describe() const override {
    return fmt::format("{} ({})", rendezvous_->who(rank_), rendezvous_->communicator->name());
  }

 protected:
  Tensor all_reduce_impl(const Tensor& tensor) override {
    return rendezvous_->collective(CollectiveKind::AllReduce, rank_, tensor);
  }
  Tensor all_gather_impl(const Tensor& tensor) override {
    return rendezvous_->collective(CollectiveKind::AllGather, rank_, tensor);
  }

 private:
  std::shared_ptr<InProcessGroup::Rendezvous> rendezvous_;
  int rank_;
};

}  // namespace

InProcessGroup::InProcessGroup(std::vector<Device> devices, std::chrono::milliseconds timeout)
    : devices_(std::move(devices)) {
  MG_CHECK(!devices_.empty(), "InProcessGroup: expected at least one device");
  rendezvous_ = std::make_shared<Rendezvous>(devices_, timeout);
  for (int r = 0; r < size(); ++r) handles_.push_back(std::make_shared<InProcessRank>(rendezvous_, r));
}

const TensorParallelGroupPtr& InProcessGroup::rank(int r) const {
  MG_CHECK(r >= 0 && r < size(), "InProcessGroup: rank {} is outside [0, {}) of {}", r, size(),
           device_list_str(devices_));
  return handles_[static_cast<size_t>(r)];
}

std::string InProcessGroup::communicator_name() const { return rendezvous_->communicator->name(); }

void InProcessGroup::abort(const std::string& reason) { rendezvous_->abort(reason); }

void InProcessGroup::clear_abort() { rendezvous_->clear_abort(); }

}  // namespace mg::parallel
