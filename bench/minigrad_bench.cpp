// minigrad-bench: times one training step (forward, cross-entropy, backward, SGD step) of
// a fixed MLP and prints one JSON line per result, in the same format as
// bench/torch_reference.py, so bench/compare.sh can put the two side by side.
//
//   minigrad-bench --work mnist_mlp --device cpu --mode eager
//   minigrad-bench --work wide_mlp --device cuda --mode eager --tf32
//   minigrad-bench --work mnist_mlp --device cuda --mode graph
//   minigrad-bench --work tutorial --device cuda --mode dataparallel --device-ids 0,1
//   minigrad-bench --work pipe_mlp --mode pipeline --devices cpu,cpu --chunks 8
//   minigrad-bench --work pipe_mlp --mode model_parallel --devices cpu,cpu
//   minigrad-bench --work mnist_mlp --trace t.json    # the same, every timed step traced
//
// The cost of tracing: the median with --trace (and --trace-detail nodes) against the
// one without; the trace is written after the timing.
//
// What is measured: after --warmup untimed steps, --steps steps are timed one by one
// (host clock on the CPU; CUDA events on the stream, with no host synchronisation
// between steps, on a GPU) and the median is reported. TFLOP/s counts the three GEMMs
// of every Linear layer (forward, input gradient, weight gradient: 6*B*in*out), the
// usual model-FLOPs count; it is the same formula in the PyTorch script.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include <unistd.h>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <minigrad/core/profiler.h>
#include <minigrad/minigrad.h>
#include <minigrad/cuda/cuda.h>
#include <minigrad/nn/optim/sgd.h>

#include "bench_common.h"
#include "samples/support/command_line.h"
#include "pipeline_bench.h"

#if __has_include(<minigrad/parallel/data_parallel.h>)
#include <minigrad/parallel/data_parallel.h>
#define MINIGRAD_BENCH_HAS_DATA_PARALLEL 1
#endif

#if MINIGRAD_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace {

using minigrad_bench::median;
using minigrad_bench::mlp_flops_per_step;
using minigrad_bench::percentile;
using minigrad_bench::process_cpu_ms;

using json = nlohmann::json;

// ------------------------------------------------------------------ the works

struct Work {
  std::string name;
  std::vector<int64_t> widths;  // input, hidden..., classes
  int64_t batch;
};

const std::vector<Work>& works() {
  static const std::vector<Work> list = {
      {"tutorial", {5, 2}, 30},
      {"mnist_mlp", {784, 512, 512, 10}, 256},
      {"wide_mlp", {4096, 8192, 8192, 10}, 8192},
      // Eight equal layers, split into two halves by the pipeline modes: 12.9 GFLOP a
      // step, about 100 ms on one core. Wide enough to be matmul-bound, and a batch large
      // enough that 8 or 16 micro-batches still have 512 or 256 rows: with narrow
      // micro-batches of wide layers, each micro-batch's weight gradient (written, then
      // added into .grad) costs as much as its matmuls (docs/pipeline-parallel.md).
      {"pipe_mlp", {256, 256, 256, 256, 256, 256, 256, 256, 256}, 4096},
  };
  return list;
}

// ------------------------------------------------------------------ host facts

std::string utc_now() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char text[32];
  std::strftime(text, sizeof text, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return text;
}

std::string host_name() {
  char name[256] = {};
  gethostname(name, sizeof name - 1);
  return name;
}

std::string env_or(const char* name, const char* fallback) {
  const char* value = std::getenv(name);
  return value ? value : fallback;
}

// A /proc/self/status field in bytes (VmRSS, VmHWM), or 0 where /proc is missing.
int64_t proc_status_bytes(const std::string& field) {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.compare(0, field.size() + 1, field + ":") != 0) continue;
    std::istringstream values(line.substr(field.size() + 1));
    int64_t kib = 0;
    values >> kib;
    return kib * 1024;
  }
  return 0;
}

// Starts a new peak-RSS window (VmHWM := VmRSS); false where the kernel refuses.
bool reset_peak_rss() {
  std::ofstream clear_refs("/proc/self/clear_refs");
  clear_refs << "5";
  clear_refs.flush();
  return static_cast<bool>(clear_refs);
}

// ------------------------------------------------------------------ timing

// Times a step function: returns milliseconds per step for `steps` steps.
using StepFn = std::function<void()>;


// Wall-clock milliseconds per step; also the process CPU time per step in `cpu_ms`,
// which a machine shared with other work disturbs less than the wall clock.
std::vector<double> time_on_host(const StepFn& step, int steps, std::vector<double>& cpu_ms) {
  std::vector<double> ms;
  ms.reserve(static_cast<size_t>(steps));
  for (int i = 0; i < steps; ++i) {
    const double cpu_start = process_cpu_ms();
    const auto start = std::chrono::steady_clock::now();
    step();
    const auto end = std::chrono::steady_clock::now();
    cpu_ms.push_back(process_cpu_ms() - cpu_start);
    ms.push_back(std::chrono::duration<double, std::milli>(end - start).count());
  }
  return ms;
}

#if MINIGRAD_WITH_CUDA
void cuda_check(cudaError_t status, const char* what) {
  MG_CHECK(status == cudaSuccess, "minigrad-bench: {} failed: {}", what,
           cudaGetErrorString(status));
}

// One event between consecutive steps on the stream the step runs on; the host waits
// once, at the end. A step that is bound by the host shows its host time; one bound by
// the GPU shows the GPU's. `host_ms` gets the wall-clock time of each step() call on
// the host (queueing the work), which says which of the two bounds a step.
std::vector<double> time_on_stream(const StepFn& step, int steps, int device,
                                   std::vector<double>& host_ms) {
  const auto stream = static_cast<cudaStream_t>(mg::cuda::current_stream(device).handle);
  std::vector<cudaEvent_t> events(static_cast<size_t>(steps) + 1);
  for (auto& e : events) cuda_check(cudaEventCreate(&e), "cudaEventCreate");
  cuda_check(cudaEventRecord(events[0], stream), "cudaEventRecord");
  for (int i = 0; i < steps; ++i) {
    const auto start = std::chrono::steady_clock::now();
    step();
    host_ms.push_back(
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
    cuda_check(cudaEventRecord(events[static_cast<size_t>(i) + 1], stream), "cudaEventRecord");
  }
  cuda_check(cudaEventSynchronize(events.back()), "cudaEventSynchronize");
  std::vector<double> ms;
  for (size_t i = 0; i + 1 < events.size(); ++i) {
    float elapsed = 0.0f;
    cuda_check(cudaEventElapsedTime(&elapsed, events[i], events[i + 1]), "cudaEventElapsedTime");
    ms.push_back(elapsed);
  }
  for (auto& e : events) cudaEventDestroy(e);
  return ms;
}
#endif

// ------------------------------------------------------------------ one run

struct Options {
  std::string work = "mnist_mlp";
  std::string device = "cpu";
  std::string mode = "eager";
  bool tf32 = false;
  int steps = 50;
  int warmup = 10;
  int64_t batch = 0;  // 0: the work's own
  std::vector<int> device_ids;
  double lr = 0.01;
  uint64_t seed = 0;
  // The pipeline modes (pipeline_bench.h).
  std::string devices = "cpu,cpu";
  int64_t chunks = 8;
  std::string schedule = "gpipe";
  std::string checkpoint = "never";
  std::string timeline;
  std::string trace;                  // eager and dataparallel: every timed step
  std::string trace_detail = "steps";  // or nodes
};

json base_record(const Options& opt, const Work& work, int64_t batch) {
  json r;
  r["framework"] = "minigrad";
  r["work"] = work.name;
  r["device"] = opt.device;
  r["mode"] = opt.mode;
  r["batch"] = batch;
  r["tf32"] = opt.tf32;
  r["steps"] = opt.steps;
  r["warmup"] = opt.warmup;
  if (opt.device == "cpu") r["blas_threads"] = env_or("OPENBLAS_NUM_THREADS", "default");
  if (opt.mode == "dataparallel") r["device_ids"] = opt.device_ids;
  r["date"] = utc_now();
  r["host"] = host_name();
  return r;
}

json run(const Options& opt) {
  const auto found = std::find_if(works().begin(), works().end(),
                                  [&](const Work& w) { return w.name == opt.work; });
  MG_CHECK(found != works().end(), "minigrad-bench: unknown work '{}'", opt.work);
  const Work& work = *found;
  const int64_t batch = opt.batch > 0 ? opt.batch : work.batch;
  json record = base_record(opt, work, batch);

  if (opt.mode == "pipeline" || opt.mode == "model_parallel") {
    minigrad_bench::PipelineRun run;
    run.mode = opt.mode;
    run.devices = opt.devices;
    run.chunks = opt.chunks;
    run.schedule = opt.schedule;
    run.checkpoint = opt.checkpoint;
    run.widths = work.widths;
    run.batch = batch;
    run.steps = opt.steps;
    run.warmup = opt.warmup;
    run.lr = opt.lr;
    run.seed = opt.seed;
    run.timeline = opt.timeline;
    if (opt.devices.find("cpu") == std::string::npos && !mg::cuda::is_available()) {
      record["error"] = "no CUDA device (minigrad built without CUDA, or no GPU visible)";
      return record;
    }
    minigrad_bench::run_pipeline_bench(run, record);
    return record;
  }

  const bool on_gpu = opt.device == "cuda";
  if (on_gpu && !mg::cuda::is_available()) {
    record["error"] = "no CUDA device (minigrad built without CUDA, or no GPU visible)";
    return record;
  }
  if (opt.mode == "graph" && !on_gpu) {
    record["error"] = "graph mode captures a CUDA graph; it needs --device cuda";
    return record;
  }
#if !MINIGRAD_BENCH_HAS_DATA_PARALLEL
  if (opt.mode == "dataparallel") {
    record["error"] = "DataParallel is not in this build (parallel/data_parallel.h missing)";
    return record;
  }
#endif
  const int device_index = on_gpu ? (opt.device_ids.empty() ? 0 : opt.device_ids[0]) : 0;
  const mg::Device device = on_gpu ? mg::Device::cuda(device_index) : mg::Device::cpu();
  if (on_gpu) {
    mg::cuda::set_device(device_index);
    mg::cuda::set_allow_tf32(opt.tf32);
    mg::cuda::synchronize(device_index);
    mg::cuda::reset_peak_memory_stats(device_index);
  }
  const int64_t rss_before = proc_status_bytes("VmRSS");
  const bool rss_window = !on_gpu && reset_peak_rss();

  // Model, data and optimizer; everything the step touches lives on `device`.
  mg::manual_seed(opt.seed);
  auto model = minigrad_bench::make_mlp(work.widths);
  model->to(device);
  // Standard normal inputs: never all zero; targets uniform over the classes.
  const mg::Tensor x = mg::randn(mg::Shape{batch, work.widths.front()}, device);
  const mg::Tensor y = mg::randint(0, work.widths.back(), mg::Shape{batch}, device);
  mg::optim::SGD sgd(model->parameters(), mg::optim::SGDOptions(opt.lr));

  std::function<mg::Tensor(const mg::Tensor&)> forward = [&](const mg::Tensor& in) {
    return model->forward(in);
  };
#if MINIGRAD_BENCH_HAS_DATA_PARALLEL
  std::shared_ptr<mg::parallel::DataParallel> data_parallel;
  if (opt.mode == "dataparallel") {
    std::vector<mg::Device> devices;
    for (int id : opt.device_ids) devices.push_back(on_gpu ? mg::Device::cuda(id) : mg::Device::cpu());
    if (devices.empty()) devices.push_back(device);
    data_parallel = std::make_shared<mg::parallel::DataParallel>(model, devices);
    forward = [&](const mg::Tensor& in) { return data_parallel->forward(in); };
  }
#endif

  mg::Tensor loss;
  // Eager: gradients are dropped each step (set_to_none) and made afresh by backward,
  // as PyTorch's zero_grad() does by default.
  StepFn step = [&] {
    sgd.zero_grad(/*set_to_none=*/true);
    loss = mg::cross_entropy(forward(x), y);
    loss.backward();
    sgd.step();
  };
  for (int i = 0; i < opt.warmup; ++i) step();
  const float first_loss = loss.defined() ? loss.item<float>() : 0.0f;

  std::vector<double> ms, cpu_ms, host_ms;
  if (opt.mode == "graph") {
#if MINIGRAD_WITH_CUDA
    // As PyTorch's capture does: the gradients are made by backward inside the graph
    // (from the graph's own memory: the allocator turns allocations and frees during a
    // capture into graph nodes) and dropped again at its end, so no kernel zeroes or
    // accumulates them. The loss goes to a buffer made outside the graph.
    mg::Tensor static_loss = mg::zeros(mg::Shape{}, mg::DType::Float32, device);
    sgd.zero_grad(/*set_to_none=*/true);
    StepFn captured = [&] {
      mg::Tensor l = mg::cross_entropy(forward(x), y);
      l.backward();
      sgd.step();
      sgd.zero_grad(/*set_to_none=*/true);
      mg::NoGradGuard no_grad;
      static_loss.copy_(l);
    };
    mg::cuda::synchronize(device_index);
    mg::cuda::CUDAGraph graph;
    try {
      graph.capture_begin(device_index);
      captured();
      graph.capture_end();
    } catch (const std::exception& e) {
      record["error"] = std::string("CUDA graph capture of the training step failed: ") + e.what();
      return record;
    }
    StepFn replay = [&] { graph.replay(); };
    for (int i = 0; i < opt.warmup; ++i) replay();
    ms = time_on_stream(replay, opt.steps, device_index, host_ms);
    record["final_loss"] = static_loss.item<float>();
#endif
  } else {
    if (!opt.trace.empty()) {
      mg::profiler::ProfilerOptions profiler_options;
      profiler_options.autograd_nodes = opt.trace_detail == "nodes";
      mg::profiler::set_thread_name("main");
      mg::profiler::start(profiler_options);
    }
#if MINIGRAD_WITH_CUDA
    if (on_gpu) {
      ms = time_on_stream(step, opt.steps, device_index, host_ms);
    } else {
      ms = time_on_host(step, opt.steps, cpu_ms);
    }
#else
    ms = time_on_host(step, opt.steps, cpu_ms);
#endif
    if (!opt.trace.empty()) {
      mg::profiler::stop();
      mg::profiler::export_chrome_trace(opt.trace);
      record["trace"] = opt.trace;
      record["trace_detail"] = opt.trace_detail;
    }
    record["final_loss"] = loss.item<float>();
  }

  const double median_ms = median(ms);
  record["median_ms"] = median_ms;
  record["p10_ms"] = percentile(ms, 0.10);
  record["p90_ms"] = percentile(ms, 0.90);
  if (!cpu_ms.empty()) record["median_cpu_ms"] = median(cpu_ms);
  if (!host_ms.empty()) record["median_host_ms"] = median(host_ms);
  record["tflops"] = mlp_flops_per_step(work.widths, batch) / (median_ms * 1e-3) / 1e12;
  record["first_loss"] = first_loss;
  if (on_gpu) {
    record["peak_mem_bytes"] = mg::cuda::max_memory_allocated(device_index);
    record["peak_mem_kind"] = "max_memory_allocated";
  } else {
    record["peak_mem_bytes"] = rss_window ? proc_status_bytes("VmHWM") - rss_before : -1;
    record["peak_mem_kind"] = "peak_rss_delta";
  }
  return record;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"minigrad-bench: median time of one training step, as one JSON line"};
  Options opt;
  std::string ids;
  app.add_option("--work", opt.work, "tutorial | mnist_mlp | wide_mlp | pipe_mlp")
      ->check(CLI::IsMember({"tutorial", "mnist_mlp", "wide_mlp", "pipe_mlp"}));
  app.add_option("--device", opt.device, "cpu | cuda")->check(CLI::IsMember({"cpu", "cuda"}));
  app.add_option("--mode", opt.mode, "eager | dataparallel | graph | model_parallel | pipeline")
      ->check(CLI::IsMember({"eager", "dataparallel", "graph", "model_parallel", "pipeline"}));
  app.add_flag("--tf32", opt.tf32, "allow TF32 tensor cores in float32 matmuls (CUDA)");
  using mg::samples::integer_in;
  app.add_option("--steps", opt.steps, "timed steps")->check(integer_in(1, 1 << 20));
  app.add_option("--warmup", opt.warmup, "untimed steps first")->check(integer_in(0, 1 << 20));
  app.add_option("--batch", opt.batch, "batch size (default: the work's)")
      ->check(integer_in(1, 1 << 24));
  app.add_option("--device-ids", ids, "devices for dataparallel, e.g. 0,1,2,3 (default 0)");
  app.add_option("--lr", opt.lr, "SGD learning rate")->check(mg::samples::non_negative_number());
  app.add_option("--seed", opt.seed, "seed of the model and the data")
      ->check(mg::samples::non_negative_integer());
  app.add_option("--devices", opt.devices,
                 "model_parallel/pipeline: a device per stage, e.g. cpu,cpu or 0,0 or 0,1");
  app.add_option("--chunks", opt.chunks, "pipeline: micro-batches per batch")
      ->check(mg::samples::positive_integer());
  app.add_option("--schedule", opt.schedule, "pipeline: gpipe | 1f1b")
      ->check(CLI::IsMember({"gpipe", "1f1b"}));
  app.add_option("--checkpoint", opt.checkpoint, "pipeline: never | except_last | always")
      ->check(CLI::IsMember({"never", "except_last", "always"}));
  app.add_option("--timeline", opt.timeline, "pipeline: write the last step's timeline (SVG) here");
  app.add_option("--trace", opt.trace,
                 "eager and dataparallel: trace every timed step into this Chrome "
                 "trace JSON (the cost of tracing: compare the median with and without)");
  app.add_option("--trace-detail", opt.trace_detail, "steps | nodes (every autograd node)")
      ->check(CLI::IsMember({"steps", "nodes"}));
  const char* program = "minigrad-bench";
  if (const auto exit_code = mg::samples::parse_command_line(app, program, argc, argv))
    return *exit_code;
  // A flag that would do nothing in this mode is refused, not ignored.
  const bool pipeline_mode = opt.mode == "pipeline";
  const bool split_mode = pipeline_mode || opt.mode == "model_parallel";
  for (const auto& [flag, given, applies, modes] :
       std::vector<std::tuple<const char*, bool, bool, const char*>>{
           {"--trace", !opt.trace.empty(), opt.mode == "eager" || opt.mode == "dataparallel",
            "eager and dataparallel"},
           {"--trace-detail", app.count("--trace-detail") > 0, !opt.trace.empty(), "--trace"},
           {"--chunks", app.count("--chunks") > 0, pipeline_mode, "pipeline"},
           {"--schedule", app.count("--schedule") > 0, pipeline_mode, "pipeline"},
           {"--checkpoint", app.count("--checkpoint") > 0, pipeline_mode, "pipeline"},
           {"--timeline", !opt.timeline.empty(), pipeline_mode, "pipeline"},
           {"--devices", app.count("--devices") > 0, split_mode, "model_parallel and pipeline"},
           {"--device-ids", !ids.empty(), opt.mode == "dataparallel", "dataparallel"}}) {
    if (given && !applies)
      return mg::samples::report_error(
          program, mg::samples::OptionError(fmt::format(
                       "{} applies to --mode {} only, not --mode {}; it would do nothing", flag,
                       modes, opt.mode)));
  }

  try {
    for (int64_t id : mg::samples::parse_integer_list("--device-ids", ids.empty() ? "0" : ids, 0,
                                                      1023, /*max_items=*/1024))
      opt.device_ids.push_back(static_cast<int>(id));
  } catch (const std::exception& e) {
    return mg::samples::report_error(program, e);
  }

  try {
    std::printf("%s\n", run(opt).dump().c_str());
  } catch (const std::exception& e) {
    // Still one JSON line, so a table built from many runs shows what went wrong where.
    json r;
    r["framework"] = "minigrad";
    r["work"] = opt.work;
    r["device"] = opt.device;
    r["mode"] = opt.mode;
    r["error"] = e.what();
    std::printf("%s\n", r.dump().c_str());
    return 1;
  }
  return 0;
}
