#include <minigrad/parallel/devices/run_per_device.h>

#include <atomic>
#include <exception>

#include <minigrad/autograd/autocast.h>
#include <minigrad/autograd/grad_mode.h>
#include <minigrad/core/error.h>
#include <minigrad/parallel/devices/worker_pool.h>

namespace mg::parallel {

void run_per_device(const std::vector<Device>& devices, const std::vector<Stream>& streams,
                    const std::string& who, const std::function<void(size_t)>& task,
                    const std::function<void(size_t, const std::string&)>& on_failure) {
  MG_CHECK(streams.size() == devices.size(), "{}: got {} streams for {} devices", who,
           streams.size(), devices.size());
  const size_t n = devices.size();
  const bool grad_enabled = GradMode::is_enabled();
  const AutocastState autocast = autocast_state();
  std::vector<std::string> errors(n);
  std::vector<char> failed(n, 0);  // not vector<bool>: the tasks write it at once
  std::atomic<long> first_in_time{-1};

  auto run_one = [&](size_t i) {
    try {
      DeviceGuard device_guard(devices[i]);
      StreamGuard stream_guard(streams[i]);
      AutoGradMode grad_mode(grad_enabled);
      AutocastStateGuard autocast_regions(autocast);
      task(i);
      return;
    } catch (const std::exception& e) {
      errors[i] = e.what();
    } catch (...) {
      errors[i] = "an unknown exception";
    }
    failed[i] = 1;
    long none = -1;
    first_in_time.compare_exchange_strong(none, static_cast<long>(i));
    if (on_failure) on_failure(i, errors[i]);
  };
  if (n == 1) {
    run_one(0);
  } else if (n > 1) {
    // Every task runs at once on a thread of its own: one may wait for another (a rank in
    // a collective, a stage for its input), so none may wait for a free thread.
    std::vector<std::function<void()>> tasks;
    tasks.reserve(n);
    for (size_t i = 0; i < n; ++i) tasks.emplace_back([&run_one, i] { run_one(i); });
    WorkerPool::instance().run_all(tasks);
  }

  size_t reported = n;
  if (on_failure) {
    if (first_in_time.load() >= 0) reported = static_cast<size_t>(first_in_time.load());
  } else {
    for (size_t i = 0; i < n && reported == n; ++i)
      if (failed[i]) reported = i;
  }
  if (reported < n)
    MG_FAIL("{} {} on {} failed: {}", who, reported, devices[reported], errors[reported]);
}

}  // namespace mg::parallel
