// tp-bench: what tensor parallelism saves and costs, held against the arithmetic of
// docs/tensor-parallel.md. In one process (TensorParallel over --devices), or across
// processes under minigrad-run (Gloo ranks, one shard each):
//
//   build/bin/tp-bench                                              # --devices cpu,cpu
//   build/bin/minigrad-run --nproc-per-node 2 build/bin/tp-bench    # 2 Gloo ranks
//
// For an MLP split by parallelize_mlp it prints, for rank 0:
//   memory   parameter bytes per rank: the arithmetic, and the shards' bytes counted
//   comm     all-reduces per step and their payload: the arithmetic (one forward all-reduce
//            of [batch, out] per block, one backward of [batch, in] but for the first
//            block, whose input is the data), and what the group counted; across processes
//            also the bytes this process wrote (/proc/self/io, Gloo's sockets) against a
//            ring all-reduce's 2 (n - 1) / n x payload
//   time     medians of --steps steps (after --warmup) of the plain model and of the
//            tensor-parallel one, alternating so both see the same machine; across
//            processes rank 0 times the plain step alone while the others wait
// The only target is the count: two all-reduces per block. Times on a shared machine are
// for reading, not for asserting.
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <minigrad/minigrad.h>
#include <minigrad/parallel/c10d/rendezvous.h>
#include <minigrad/parallel/devices/device_list.h>

#include "samples/support/command_line.h"

namespace {

using Clock = std::chrono::steady_clock;
using namespace mg;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

std::vector<std::string> split(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream ss(text);
  for (std::string item; std::getline(ss, item, ',');) out.push_back(item);
  return out;
}

std::vector<int64_t> parse_widths(const std::string& text) {
  std::vector<int64_t> widths =
      mg::samples::parse_integer_list("--widths", text, 1, 1 << 20, /*max_items=*/64);
  if (widths.size() < 3)
    throw mg::samples::OptionError(
        fmt::format("--widths needs at least two layers (three sizes), got '{}'", text));
  return widths;
}

// "cpu" or a GPU index per rank, at most 1024 of them (checked before any is made).
std::vector<Device> parse_devices(const std::string& text) {
  const std::vector<std::string> items = split(text);
  if (items.empty() || items.size() > 1024)
    throw mg::samples::OptionError(
        fmt::format("--devices takes 1 to 1024 devices, got {}", items.size()));
  std::vector<Device> devices;
  for (const std::string& d : items)
    devices.push_back(d == "cpu" ? Device::cpu()
                                 : Device::cuda(static_cast<int>(
                                       mg::samples::parse_integer("--devices", d, 0, 1023))));
  return devices;
}

std::shared_ptr<nn::Sequential> make_mlp(const std::vector<int64_t>& widths, Device device) {
  manual_seed(0);
  auto mlp = std::make_shared<nn::Sequential>();
  for (size_t i = 0; i + 1 < widths.size(); ++i) {
    if (i > 0) mlp->push_back(std::make_shared<nn::ReLU>());
    mlp->push_back(std::make_shared<nn::Linear>(widths[i], widths[i + 1]));
  }
  mlp->to(device);
  return mlp;
}

// docs/tensor-parallel.md's arithmetic, written out independently of the layers.
struct Arithmetic {
  int64_t unsharded_param_bytes = 0;
  int64_t param_bytes_per_rank = 0;
  int64_t all_reduces_per_step = 0;
  int64_t payload_bytes_per_step = 0;  // what each rank hands to its all-reduces
  int64_t blocks = 0;
};

Arithmetic arithmetic(const std::vector<int64_t>& w, int64_t n, int64_t batch) {
  Arithmetic a;
  const size_t layers = w.size() - 1;
  const size_t paired = layers - layers % 2;
  for (size_t i = 0; i < layers; ++i) {
    const int64_t in = w[i], out = w[i + 1];
    a.unsharded_param_bytes += 4 * (in * out + out);
    if (i >= paired) {
      a.param_bytes_per_rank += 4 * (in * out + out);  // whole on every rank
    } else if (i % 2 == 0) {
      a.param_bytes_per_rank += 4 * (in * (out / n) + out / n);  // column: rows of W and b
      if (i > 0) {  // the block's input needs a gradient: f's all-reduce in backward
        a.all_reduces_per_step += 1;
        a.payload_bytes_per_step += 4 * batch * in;
      }
    } else {
      a.param_bytes_per_rank += 4 * ((in / n) * out + out);  // row: columns of W, all of b
      a.all_reduces_per_step += 1;  // g's all-reduce in forward
      a.payload_bytes_per_step += 4 * batch * out;
      a.blocks += 1;
    }
  }
  return a;
}

// Bytes this process has written with write(2) and friends, sockets included
// (/proc/self/io's wchar); -1 where the file is not there.
int64_t bytes_written() {
  std::ifstream io("/proc/self/io");
  for (std::string key; io >> key;) {
    int64_t value = 0;
    io >> value;
    if (key == "wchar:") return value;
  }
  return -1;
}

int64_t param_bytes(const nn::Module& m) {
  int64_t bytes = 0;
  for (const Tensor& p : m.parameters()) bytes += static_cast<int64_t>(p.nbytes());
  return bytes;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Tensor parallelism: parameter bytes and communication against the arithmetic, "
               "and step time against the unsharded model"};
  std::string widths_text = "784,1024,1024,1024,1024,10";
  std::string devices_text = "cpu,cpu";
  int64_t batch = 128;
  int steps = 20, warmup = 3;
  double timeout_s = 120.0;
  using mg::samples::integer_in;
  app.add_option("--widths", widths_text, "MLP layer widths, input to classes")->capture_default_str();
  app.add_option("--batch", batch, "rows per step")->check(integer_in(1, 1 << 24))->capture_default_str();
  app.add_option("--devices", devices_text,
                 "in one process: the devices, one rank each (cpu,cpu or 0,1)")->capture_default_str();
  app.add_option("--steps", steps, "timed steps")->check(integer_in(1, 1 << 20))->capture_default_str();
  app.add_option("--warmup", warmup, "untimed steps first")->check(integer_in(0, 1 << 20))->capture_default_str();
  app.add_option("--timeout", timeout_s, "process group timeout, seconds (under minigrad-run)")
      ->check(mg::samples::seconds());
  if (const auto exit_code = mg::samples::parse_command_line(app, "tp-bench", argc, argv))
    return *exit_code;

  try {
    const std::vector<int64_t> widths = parse_widths(widths_text);
    const bool distributed = parallel::in_launched_job();

    // The ranks: this process's shard of a Gloo group, or a thread per device here.
    std::shared_ptr<parallel::ProcessGroup> pg;
    std::vector<Device> devices;
    if (distributed) {
      parallel::ProcessGroupOptions options;
      options.timeout = std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000));
      pg = parallel::init_process_group("gloo", options);
      devices = {Device::cpu()};
    } else {
      devices = parse_devices(devices_text);
    }
    const int rank = pg ? pg->rank() : 0;
    const int64_t n = pg ? pg->size() : static_cast<int64_t>(devices.size());
    auto barrier = [&] {
      if (pg) pg->barrier()->wait();
    };

    auto plain = make_mlp(widths, devices[0]);
    optim::SGD plain_sgd(plain->parameters(), 0.01);
    nn::ModulePtr tp;
    parallel::TensorParallelGroupPtr group;  // rank 0's, for the counts
    int64_t shard_bytes = 0;
    if (pg) {
      group = parallel::tensor_parallel_group(pg);
      tp = parallel::parallelize_mlp(*plain, group);
      shard_bytes = param_bytes(*tp);
    } else {
      auto in_process = std::make_shared<parallel::TensorParallel>(*plain, devices);
      group = in_process->group()->rank(0);
      shard_bytes = param_bytes(*in_process->shard(0));
      tp = in_process;
    }
    optim::SGD tp_sgd(tp->parameters(), 0.01);

    manual_seed(1);
    const Tensor x = randn(Shape{batch, widths.front()}, devices[0]);
    const Tensor y = randint(0, widths.back(), Shape{batch}, devices[0]);
    auto step = [&](nn::Module& model, optim::SGD& sgd) {
      sgd.zero_grad();
      cross_entropy(model.forward(x), y).backward();
      sgd.step();
      synchronize(devices[0]);
    };
    auto ms_since = [](Clock::time_point t0) {
      return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    };

    std::vector<double> plain_ms, tp_ms;
    int64_t written = 0;
    parallel::TensorParallelStats counted;
    for (int s = 0; s < warmup + steps; ++s) {
      const bool timed = s >= warmup;
      barrier();
      if (rank == 0) {  // alone: the other ranks wait at the barrier, off the cores
        const auto t0 = Clock::now();
        step(*plain, plain_sgd);
        if (timed) plain_ms.push_back(ms_since(t0));
      }
      barrier();
      group->reset_stats();
      const int64_t before = bytes_written();
      const auto t0 = Clock::now();
      step(*tp, tp_sgd);
      const double ms = ms_since(t0);
      const int64_t after = bytes_written();
      if (timed) {
        tp_ms.push_back(ms);
        counted = group->stats();
        if (before >= 0) written += after - before;
      }
    }

    if (rank == 0) {
      const Arithmetic a = arithmetic(widths, n, batch);
      const double ring = 2.0 * static_cast<double>(n - 1) / static_cast<double>(n);
      const char* blas = std::getenv("OPENBLAS_NUM_THREADS");
      const std::string where =
          pg ? fmt::format("{} Gloo ranks", n)
             : fmt::format("one process, {}", parallel::device_list_str(devices));
      fmt::print("tp-bench: MLP {} split over {} ({} blocks), batch {}{}\n", widths_text, where,
                 a.blocks, batch, blas ? fmt::format(", OPENBLAS_NUM_THREADS={}", blas) : "");
      fmt::print("| | arithmetic | counted |\n|---|---|---|\n");
      fmt::print("| parameter bytes, unsharded | {} | {} |\n", a.unsharded_param_bytes,
                 param_bytes(*plain));
      fmt::print("| parameter bytes per rank | {} | {} |\n", a.param_bytes_per_rank, shard_bytes);
      fmt::print("| all-reduces per step per rank | {} | {} |\n", a.all_reduces_per_step,
                 counted.all_reduces);
      fmt::print("| all-gathers per step per rank | 0 | {} |\n", counted.all_gathers);
      fmt::print("| all-reduce payload bytes per step per rank | {} | {} |\n",
                 a.payload_bytes_per_step, counted.all_reduce_bytes);
      if (pg)
        fmt::print("| bytes written per step per rank (ring: 2(n-1)/n x payload) | {:.0f} | {} |\n",
                   ring * static_cast<double>(a.payload_bytes_per_step),
                   steps > 0 ? written / steps : 0);
      fmt::print("\n| plain step ms | tensor-parallel step ms | ratio |\n|---|---|---|\n");
      fmt::print("| {:.2f} | {:.2f} | {:.2f} |\n", median(plain_ms), median(tp_ms),
                 median(tp_ms) / median(plain_ms));
    }
  } catch (const std::exception& e) {
    return mg::samples::report_error("tp-bench", e);
  }
  return 0;
}
