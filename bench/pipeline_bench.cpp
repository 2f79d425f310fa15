#include "pipeline_bench.h"

#include <algorithm>
#include <cstdio>
#include <chrono>
#include <memory>

#include <minigrad/core/allocator.h>
#include <minigrad/core/files.h>
#include <minigrad/cuda/cuda.h>
#include <minigrad/minigrad.h>

#include "bench_common.h"

namespace minigrad_bench {
namespace {

using namespace mg;

// Equal shares of the Linear layers per stage, each Linear with the ReLU after it.
std::vector<int64_t> halves(const nn::Sequential& model, size_t stages) {
  const auto linears = static_cast<int64_t>((model.size() + 1) / 2);
  MG_CHECK(linears >= static_cast<int64_t>(stages), "minigrad-bench: {} Linear layers for {} stages",
           linears, stages);
  std::vector<int64_t> balance;
  int64_t used = 0;
  for (size_t s = 0; s < stages; ++s) {
    const int64_t mine = (linears - used) / static_cast<int64_t>(stages - s);
    const int64_t modules = s + 1 == stages ? static_cast<int64_t>(model.size()) - 2 * used : 2 * mine;
    balance.push_back(modules);
    used += mine;
  }
  return balance;
}

// The naive split: each stage's layers on its device, the activations moved with
// Tensor::to (whose backward moves the gradient back), everything on one thread.
class NaiveSplit : public nn::Cloneable<NaiveSplit> {
 public:
  NaiveSplit(const nn::Sequential& model, const std::vector<int64_t>& balance,
             const std::vector<Device>& devices)
      : Cloneable<NaiveSplit>("NaiveSplit"), devices_(devices) {
    const auto& children = model.named_children();
    size_t next = 0;
    for (size_t s = 0; s < balance.size(); ++s) {
      auto stage = std::make_shared<nn::Sequential>();
      for (int64_t k = 0; k < balance[s]; ++k, ++next)
        stage->register_module(children[next].first, children[next].second);
      stage->to(devices[s]);
      register_module(std::to_string(s), stage);
    }
  }
  Tensor forward(const Tensor& x) override {
    Tensor h = x;
    for (size_t s = 0; s < devices_.size(); ++s) {
      DeviceGuard guard(devices_[s]);
      h = child(std::to_string(s))->forward(h.device() == devices_[s] ? h : h.to(devices_[s]));
    }
    return h;
  }

 private:
  std::vector<Device> devices_;
};

void synchronize_all(const std::vector<Device>& devices) {
  for (const Device& d : devices) synchronize(d);
}

}  // namespace

void run_pipeline_bench(const PipelineRun& run, nlohmann::json& record) {
  const std::vector<Device> devices = parallel::parse_device_list(run.devices);
  MG_CHECK(devices.size() >= 2, "minigrad-bench: --mode {} needs two devices or more (--devices {})",
           run.mode, run.devices);
  record["devices"] = run.devices;
  manual_seed(run.seed);
  auto model = make_mlp(run.widths);
  const std::vector<int64_t> balance = halves(*model, devices.size());
  record["balance"] = balance;

  std::shared_ptr<parallel::Pipe> pipe;
  std::shared_ptr<NaiveSplit> naive;
  if (run.mode == "pipeline") {
    parallel::PipeOptions options;
    options.chunks = run.chunks;
    options.balance = balance;
    options.schedule = parallel::parse_schedule(run.schedule);
    options.checkpoint = parallel::parse_checkpoint(run.checkpoint);
    pipe = std::make_shared<parallel::Pipe>(model, devices, options);
    record["chunks"] = run.chunks;
    record["schedule"] = run.schedule;
    record["checkpoint"] = run.checkpoint;
  } else {
    naive = std::make_shared<NaiveSplit>(*model, balance, devices);
  }
  const Tensor x = randn(Shape{run.batch, run.widths.front()}, devices.front());
  const Tensor y = randint(0, run.widths.back(), Shape{run.batch}, devices.back());
  optim::SGD sgd(pipe ? pipe->parameters() : naive->parameters(), optim::SGDOptions(run.lr));

  Tensor loss;
  auto step = [&] {
    sgd.zero_grad(/*set_to_none=*/true);
    if (pipe) {
      loss = pipe->train_step(x, y, parallel::cross_entropy_loss).loss;
    } else {
      loss = cross_entropy(naive->forward(x), y);
      loss.backward();
    }
    sgd.step();
    synchronize_all(devices);  // a step's time includes its GPU work
  };
  for (int i = 0; i < run.warmup; ++i) step();
  const float first_loss = loss.defined() ? loss.item<float>() : 0.0f;

  // The allocator's high-water mark above what lives between steps (the parameters and
  // the batch): a step's gradients, activations and temporaries, on the host or summed
  // over the GPUs.
  auto allocated = [&] {
    std::size_t total = 0;
    if (devices.front().is_cpu()) return cpu_memory_allocated();
    for (const Device& d : devices) total += cuda::memory_allocated(d.index());
    return total;
  };
  sgd.zero_grad(/*set_to_none=*/true);
  const std::size_t resting = allocated();  // parameters and the batch
  if (devices.front().is_cpu()) {
    cpu_reset_peak_memory_stats();
  } else {
    for (const Device& d : devices) cuda::reset_peak_memory_stats(d.index());
  }

  std::vector<double> ms, cpu_ms, bubbles;
  std::vector<std::vector<double>> busy(devices.size());
  for (int i = 0; i < run.steps; ++i) {
    const double cpu_start = process_cpu_ms();
    const auto start = std::chrono::steady_clock::now();
    step();
    const auto end = std::chrono::steady_clock::now();
    cpu_ms.push_back(process_cpu_ms() - cpu_start);
    ms.push_back(std::chrono::duration<double, std::milli>(end - start).count());
    if (pipe) {
      const parallel::PipeTimeline t = pipe->last_timeline();
      for (size_t s = 0; s < devices.size(); ++s) busy[s].push_back(t.busy_fraction(static_cast<int>(s)));
      bubbles.push_back(t.bubble_fraction());
    }
  }
  std::size_t peak = 0;
  if (devices.front().is_cpu()) {
    peak = cpu_max_memory_allocated();
  } else {
    for (const Device& d : devices) peak += cuda::max_memory_allocated(d.index());
  }

  const double median_ms = median(ms);
  record["median_ms"] = median_ms;
  record["p10_ms"] = percentile(ms, 0.10);
  record["p90_ms"] = percentile(ms, 0.90);
  record["median_cpu_ms"] = median(cpu_ms);
  record["tflops"] = mlp_flops_per_step(run.widths, run.batch) / (median_ms * 1e-3) / 1e12;
  record["first_loss"] = first_loss;
  record["final_loss"] = loss.item<float>();
  record["peak_mem_bytes"] = peak > resting ? peak - resting : 0;
  record["peak_mem_kind"] = "allocator_peak_above_resting";
  if (pipe) {
    std::vector<double> busy_median;
    for (auto& b : busy) busy_median.push_back(median(b));
    record["busy_fraction"] = busy_median;
    record["bubble_fraction"] = median(bubbles);
    const int64_t m = parallel::MicroBatches(run.batch, run.chunks, "minigrad-bench").count();
    record["micro_batches"] = m;
    record["ideal_bubble_fraction"] =
        parallel::ideal_bubble_fraction(static_cast<int>(devices.size()), m);
    record["max_stashed"] = pipe->last_max_stashed();
    if (!run.timeline.empty()) {
      const std::string split =
          m == 1 ? std::string("one micro-batch (the naive split)")
                 : fmt::format("{}, {} micro-batches of {} rows", run.schedule, m,
                               (run.batch + m - 1) / m);
      const std::string title = fmt::format(
          "pipe_mlp on {}: {}; step {:.0f} ms, bubble {:.0f}% (ideal {:.0f}%)", run.devices,
          split, median_ms, 100.0 * median(bubbles),
          100.0 * parallel::ideal_bubble_fraction(static_cast<int>(devices.size()), m));
      files::write_atomically("minigrad-bench: --timeline", run.timeline,
                              parallel::timeline_svg(pipe->last_timeline(), title));
      record["timeline"] = run.timeline;
    }
  }
}

}  // namespace minigrad_bench
