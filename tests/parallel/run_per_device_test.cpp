// run_per_device: a task per device at once, with the device, the stream and the caller's
// grad mode; which failure it reports.
#include "catch_compat.h"

#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include <minigrad/autograd/grad_mode.h>
#include <minigrad/core/stream.h>
#include <minigrad/parallel/devices/run_per_device.h>

using mg::Device;

namespace {

std::vector<Device> cpus(size_t n) { return std::vector<Device>(n, Device::cpu()); }

std::vector<mg::Stream> streams_of(const std::vector<Device>& devices) {
  std::vector<mg::Stream> out;
  for (const Device& d : devices) out.push_back(mg::current_stream(d));
  return out;
}

}  // namespace

TEST_CASE("run_per_device runs every task at once, under the caller's grad mode") {
  const auto devices = cpus(3);
  std::atomic<int> arrived{0};
  std::vector<int> grad_on(3, -1);
  {
    mg::NoGradGuard no_grad;
    mg::parallel::run_per_device(devices, streams_of(devices), "test: task", [&](size_t i) {
      // Every task waits for all three: it passes only if they run at the same time.
      ++arrived;
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
      while (arrived.load() < 3 && std::chrono::steady_clock::now() < deadline)
        std::this_thread::yield();
      grad_on[i] = mg::GradMode::is_enabled() ? 1 : 0;
    });
  }
  REQUIRE(arrived.load() == 3);
  REQUIRE(grad_on == std::vector<int>{0, 0, 0});
}

TEST_CASE("run_per_device reports the lowest failing index, or the first in time with on_failure") {
  const auto devices = cpus(3);
  const auto streams = streams_of(devices);
  // Independent tasks: every one fails, the message names task 0 whatever the timing.
  REQUIRE_THROWS_WITH(
      mg::parallel::run_per_device(devices, streams, "test: replica", [](size_t i) {
        if (i == 0) std::this_thread::sleep_for(std::chrono::milliseconds(50));
        throw std::runtime_error("boom " + std::to_string(i));
      }),
      MG_CONTAINS("test: replica 0 on cpu failed: boom 0"));

  // Dependent tasks: task 2 fails first; on_failure makes the others fail after it (as a
  // group's abort does), and task 2's failure is the one reported.
  std::atomic<bool> aborted{false};
  std::vector<std::string> told;
  REQUIRE_THROWS_WITH(
      mg::parallel::run_per_device(
          devices, streams, "test: rank",
          [&](size_t i) {
            if (i == 2) throw std::runtime_error("the cause");
            while (!aborted.load()) std::this_thread::yield();
            throw std::runtime_error("aborted");
          },
          [&](size_t i, const std::string& what) {
            if (i == 2) told.push_back(what);
            aborted = true;
          }),
      MG_CONTAINS("test: rank 2 on cpu failed: the cause"));
  REQUIRE(told == std::vector<std::string>{"the cause"});

  REQUIRE_THROWS_WITH(mg::parallel::run_per_device(devices, {}, "test", [](size_t) {}),
                      MG_CONTAINS("test: got 0 streams for 3 devices"));
}
