// ddp-bench: what DistributedDataParallel and the ZeRO stages cost, in time, memory and
// bytes sent. Run alone (a group of one, in this process) or under minigrad-run:
//
//   build/bin/ddp-bench                                        # overhead of DDP, 1 rank
//   build/bin/minigrad-run --nproc-per-node 2 build/bin/ddp-bench --bucket-cap-mb 1
//   build/bin/minigrad-run --nproc-per-node 2 build/bin/ddp-bench --zero 3 --optimizer adamw
//   build/bin/minigrad-run --nproc-per-node 2 build/bin/ddp-bench --bucket-cap-mb 1
//       --trace ddp.json      # a trace of 3 DDP steps: bench/ddp_overlap.py reads it
//
// For one MLP and one per-rank batch it times, after --warmup untimed rounds, --steps
// rounds of these, one after the other (medians, host clock):
//   plain      zero_grad, forward, cross-entropy, backward, optimizer step; no DDP
//   ddp        the same through DistributedDataParallel (Gloo on the CPU)
//   zero       with --zero 1|2|3: the same sharded (ZeRO-1: DDP + ZeroRedundancyOptimizer;
//              ZeRO-2: ZeroRedundancyOptimizer on the plain model; ZeRO-3: FSDP)
//   allreduce  the all-reduces of DDP's buckets alone, with nothing else running
// and, from the reducer of each DDP step: comm (the communication thread's busy time on
// the buckets) and wait (how long backward's caller blocked at its end for them).
// hidden = 1 - wait / comm is the share of the communication that overlapped backward.
//
// Before the timing, the measured variant (ZeRO-N, or DDP with --zero 0) trains a few
// steps alone and each rank reports what it held at the peak of a step:
//   parameters  DDP, ZeRO-1/2: all of them; ZeRO-3: its shards + the most gathered at once
//   gradients   DDP: the .grad tensors and the buckets; ZeRO-1: those + its gradient
//               shards; ZeRO-2/3: its gradient shards + the flat buffers being reduced
//   optimizer   the optimizer's state tensors (this rank's shards under ZeRO)
//   allocator   everything the CPU allocator counted at the peak (activations and
//               collective scratch included), above what was held before the model
//   arithmetic  parameters + gradients + optimizer state as docs/sharded-data-parallel.md
//               counts them: Ψ(2 + K) for DDP, Ψ(2 + K/N), Ψ(1 + (1 + K)/N), Ψ(2 + K)/N
//   sent        bytes this rank sends per step by the ring algorithms' count (all-reduce
//               2(N-1)/N of the buffer, reduce-scatter and all-gather (N-1)/N), and as
//               measured: bytes written by this process per step (/proc/self/io wchar:
//               Gloo's socket writes)
// Rank 0 prints the results as Markdown tables (headers first).
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <minigrad/core/allocator.h>
#include <minigrad/minigrad.h>
#include <minigrad/nn/optim/adam.h>
#include <minigrad/nn/optim/sgd.h>
#include <minigrad/parallel/c10d/rendezvous.h>
#include <minigrad/parallel/ddp/distributed_data_parallel.h>
#include <minigrad/parallel/sharded/fully_sharded_data_parallel.h>
#include <minigrad/parallel/sharded/zero_redundancy_optimizer.h>

#include "samples/support/command_line.h"
#include "samples/support/trace.h"

namespace {

using Clock = std::chrono::steady_clock;
using namespace mg;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

std::vector<int64_t> parse_widths(const std::string& text) {
  std::vector<int64_t> widths =
      mg::samples::parse_integer_list("--widths", text, 1, 1 << 20, /*max_items=*/64);
  if (widths.size() < 2)
    throw mg::samples::OptionError("--widths needs at least two sizes (input and classes)");
  return widths;
}

std::shared_ptr<nn::Sequential> make_model(const std::vector<int64_t>& widths) {
  manual_seed(0);
  auto model = std::make_shared<nn::Sequential>();
  for (size_t i = 0; i + 1 < widths.size(); ++i) {
    if (i > 0) model->push_back(std::make_shared<nn::ReLU>());
    model->push_back(std::make_shared<nn::Linear>(widths[i], widths[i + 1]));
  }
  return model;
}

// A group of one when not started by a launcher, else the job's group.
std::shared_ptr<parallel::ProcessGroup> process_group(std::chrono::milliseconds timeout) {
  parallel::ProcessGroupOptions options;
  options.timeout = timeout;
  if (parallel::in_launched_job()) return parallel::init_process_group("gloo", options);
  parallel::TCPStoreOptions store_options;
  store_options.is_server = true;
  store_options.rank = 0;
  auto store = std::make_shared<parallel::TCPStore>("127.0.0.1", 0, store_options);
  return parallel::new_process_group("gloo", store, 0, 1, options);
}

// CPU time of this process, all its threads (user + system), in ms: on a machine shared
// with other work, a step's CPU time says what its wall time would be on an idle one.
double process_cpu_ms() {
  rusage usage{};
  ::getrusage(RUSAGE_SELF, &usage);
  const auto ms = [](const timeval& t) { return t.tv_sec * 1e3 + t.tv_usec / 1e3; };
  return ms(usage.ru_utime) + ms(usage.ru_stime);
}

// The bytes this process has written (sockets included) since it started, or -1.
double bytes_written() {
  std::ifstream io("/proc/self/io");
  for (std::string key; io >> key;) {
    double value = 0;
    io >> value;
    if (key == "wchar:") return value;
  }
  return -1;
}

size_t nbytes(const std::vector<Tensor>& tensors, bool grads = false) {
  size_t total = 0;
  for (const Tensor& t : tensors) {
    const Tensor x = grads ? t.grad() : t;
    if (x.defined()) total += x.nbytes();
  }
  return total;
}

size_t state_bytes(const optim::Optimizer& opt) {
  size_t total = 0;
  for (const auto& [name, t] : opt.state_dict()) total += t.nbytes();
  return total;
}

struct BenchOptions {
  std::string optimizer = "sgd";
  double lr = 0.01;
  int zero = 0;
  parallel::DDPOptions ddp;
};

// sgd: plain SGD (no state, as ddp-bench always ran); sgd-momentum: one state tensor per
// parameter; adamw: two (and a step count).
std::unique_ptr<optim::Optimizer> make_optimizer(const BenchOptions& o,
                                                 std::vector<Tensor> params) {
  if (o.optimizer == "adamw")
    return std::make_unique<optim::AdamW>(std::move(params), optim::AdamWOptions().lr(1e-3));
  const double momentum = o.optimizer == "sgd-momentum" ? 0.9 : 0.0;
  return std::make_unique<optim::SGD>(std::move(params), optim::SGDOptions(o.lr).momentum(momentum));
}

// K: the optimizer's state tensors per parameter element.
double states_per_element(const BenchOptions& o) {
  return o.optimizer == "adamw" ? 2.0 : o.optimizer == "sgd-momentum" ? 1.0 : 0.0;
}

// One way of training the model: what forward runs through and the optimizer it steps.
struct Variant {
  std::shared_ptr<nn::Sequential> model;
  nn::ModulePtr net;
  std::shared_ptr<parallel::DistributedDataParallel> ddp;
  std::shared_ptr<parallel::FullyShardedDataParallel> fsdp;
  parallel::ZeroRedundancyOptimizer* zero = nullptr;
  std::unique_ptr<optim::Optimizer> optimizer;
};

// zero: -1 plain (no communication), 0 DDP, 1..3 the ZeRO stages.
Variant make_variant(const std::vector<int64_t>& widths, int zero, const BenchOptions& o,
                     const std::shared_ptr<parallel::ProcessGroup>& pg) {
  Variant v;
  v.model = make_model(widths);
  v.net = v.model;
  auto make = [&o](std::vector<Tensor> params) { return make_optimizer(o, std::move(params)); };
  if (zero == 0 || zero == 1) {
    v.ddp = std::make_shared<parallel::DistributedDataParallel>(v.model, pg, o.ddp);
    v.net = v.ddp;
  }
  if (zero == 3) {
    v.fsdp = std::make_shared<parallel::FullyShardedDataParallel>(v.model, pg);
    v.net = v.fsdp;
    v.optimizer = make(v.fsdp->parameters());
  } else if (zero == 1 || zero == 2) {
    parallel::ZeroOptions zo;
    zo.stage = zero;
    zo.bucket_cap_mb = o.ddp.bucket_cap_mb;
    auto sharded = std::make_unique<parallel::ZeroRedundancyOptimizer>(v.model->parameters(), pg,
                                                                       make, zo);
    v.zero = sharded.get();
    v.optimizer = std::move(sharded);
  } else {
    v.optimizer = make(v.model->parameters());
  }
  return v;
}

void train_step(Variant& v, const Tensor& x, const Tensor& y) {
  v.optimizer->zero_grad();
  cross_entropy(v.net->forward(x), y).backward();
  v.optimizer->step();
}

// What one rank held at the peak of a step and sent per step (see the header).
struct Footprint {
  double parameters = 0, gradients = 0, optimizer = 0, allocator = 0, arithmetic = 0;
  double sent_ring = 0, sent_measured = 0;
  static constexpr int kFields = 7;
  std::vector<double> fields() const {
    return {parameters, gradients, optimizer, allocator, arithmetic, sent_ring, sent_measured};
  }
};

Footprint measure_footprint(const std::vector<int64_t>& widths, const BenchOptions& o,
                            const std::shared_ptr<parallel::ProcessGroup>& pg, const Tensor& x,
                            const Tensor& y) {
  const double n = pg->size();
  const double ring = (n - 1) / n;
  const std::size_t base = cpu_memory_allocated();
  Footprint f;
  {
    Variant v = make_variant(widths, o.zero, o, pg);
    const std::vector<Tensor> params = v.model->parameters();
    const double psi_bytes = static_cast<double>(nbytes(params));  // shapes only for ZeRO-3
    for (int s = 0; s < 2; ++s) train_step(v, x, y);  // state exists; the allocator is warm
    if (v.fsdp) v.fsdp->reset_peak_stats();
    cpu_reset_peak_memory_stats();
    const double written_before = bytes_written();
    constexpr int kSteps = 3;
    size_t peak_grads = 0;
    for (int s = 0; s < kSteps; ++s) {
      v.optimizer->zero_grad();
      cross_entropy(v.net->forward(x), y).backward();
      size_t grads = 0;
      if (v.ddp) {
        grads += nbytes(params, true);
        if (!o.ddp.gradient_as_bucket_view)
          for (size_t b : v.ddp->reducer().bucket_bytes()) grads += b;
      }
      if (v.zero && o.zero == 1) grads += nbytes(v.optimizer->parameters());  // shard grads in step
      if (v.zero && o.zero == 2)
        grads += nbytes(v.optimizer->parameters(), true) +
                 v.zero->last_reduction_stats().peak_buffer_bytes;
      if (v.fsdp)
        grads += nbytes(v.optimizer->parameters(), true) +
                 v.fsdp->last_reduction_stats().peak_buffer_bytes;
      peak_grads = std::max(peak_grads, grads);
      v.optimizer->step();
    }
    const double written = bytes_written() - written_before;
    f.allocator = static_cast<double>(cpu_max_memory_allocated() - base);
    f.sent_measured = written >= 0 ? written / kSteps : -1;
    f.gradients = static_cast<double>(peak_grads);
    f.optimizer = static_cast<double>(state_bytes(*v.optimizer));
    if (v.fsdp) {
      const parallel::FSDPStats st = v.fsdp->stats();
      f.parameters = static_cast<double>(st.shard_bytes + st.peak_gathered_bytes);
      f.sent_ring = ring * static_cast<double>(st.all_gather_bytes) / kSteps;
    } else {
      f.parameters = psi_bytes;
    }
    const double states = states_per_element(o);  // K
    switch (o.zero) {
      case 0: f.arithmetic = psi_bytes * (2 + states); break;
      case 1: f.arithmetic = psi_bytes * (2 + states / n); break;
      case 2: f.arithmetic = psi_bytes * (1 + (1 + states) / n); break;
      default: f.arithmetic = psi_bytes * (2 + states) / n; break;
    }
    // Ring bytes: DDP's all-reduce; ZeRO's reduce-scatter and all-gathers.
    if (v.ddp) {
      double buckets = 0;
      for (size_t b : v.ddp->reducer().bucket_bytes()) buckets += static_cast<double>(b);
      f.sent_ring += 2 * ring * buckets;
    }
    if (v.zero) f.sent_ring += ring * static_cast<double>(v.zero->stats().all_gather_bytes);
    if (v.zero && o.zero == 2)
      f.sent_ring += ring * static_cast<double>(v.zero->last_reduction_stats().bytes);
    if (v.fsdp) f.sent_ring += ring * static_cast<double>(v.fsdp->last_reduction_stats().bytes);
  }
  return f;
}

std::string mib(double bytes) { return fmt::format("{:.2f}", bytes / (1024.0 * 1024.0)); }

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"DistributedDataParallel and ZeRO: time, memory and communication per step"};
  std::string widths_text = "784,1024,1024,1024,10";
  int64_t batch = 128;
  int steps = 20, warmup = 3;
  double timeout_s = 120.0;
  BenchOptions bench;
  using mg::samples::integer_in;
  using mg::samples::number_in;
  app.add_option("--widths", widths_text, "MLP layer widths, input to classes");
  app.add_option("--batch", batch, "rows per rank per step")->check(integer_in(1, 1 << 24));
  app.add_option("--steps", steps, "timed steps")->check(integer_in(1, 1 << 20));
  app.add_option("--warmup", warmup, "untimed steps first")->check(integer_in(0, 1 << 20));
  app.add_option("--bucket-cap-mb", bench.ddp.bucket_cap_mb,
                 "DDPOptions::bucket_cap_mb (and ZeroOptions::bucket_cap_mb)")
      ->check(number_in(0, 1 << 20));
  app.add_option("--first-bucket-mb", bench.ddp.first_bucket_mb, "DDPOptions::first_bucket_mb")
      ->check(number_in(0, 1 << 20));
  app.add_option("--timeout", timeout_s, "process group timeout, seconds")
      ->check(mg::samples::seconds());
  app.add_flag("--gradient-as-bucket-view", bench.ddp.gradient_as_bucket_view,
               "DDPOptions::gradient_as_bucket_view");
  app.add_option("--zero", bench.zero,
                 "0: DDP only; 1, 2: ZeroRedundancyOptimizer stage; 3: FullyShardedDataParallel")
      ->check(CLI::IsMember({0, 1, 2, 3}));
  app.add_option("--optimizer", bench.optimizer,
                 "sgd (lr 0.01), sgd-momentum (0.9), adamw (lr 0.001): K = 0, 1, 2 states")
      ->check(CLI::IsMember({"sgd", "sgd-momentum", "adamw"}));
  bool json = false;
  app.add_flag("--json", json, "rank 0 prints one JSON line instead of the tables");
  mg::samples::TraceOptions trace;
  mg::samples::add_trace_options(app, trace, "DDP step");
  if (const auto exit_code = mg::samples::parse_command_line(app, "ddp-bench", argc, argv))
    return *exit_code;

  try {
    const std::vector<int64_t> widths = parse_widths(widths_text);
    auto pg = process_group(std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000)));
    manual_seed(100 + static_cast<uint64_t>(pg->rank()));
    const Tensor x = randn(Shape{batch, widths.front()});
    const Tensor y = randint(0, widths.back(), Shape{batch});

    // ---- memory and bytes sent, the measured variant alone ----
    const Footprint footprint = measure_footprint(widths, bench, pg, x, y);
    std::vector<float> all(static_cast<size_t>(pg->size() * Footprint::kFields), 0.0f);
    const std::vector<double> mine = footprint.fields();
    for (int k = 0; k < Footprint::kFields; ++k)
      all[static_cast<size_t>(pg->rank() * Footprint::kFields + k)] =
          static_cast<float>(mine[static_cast<size_t>(k)]);
    Tensor gathered = from_vector(all, Shape{static_cast<int64_t>(all.size())});
    pg->allreduce(gathered, parallel::ReduceOp::Sum)->wait();

    // ---- time: plain, DDP and the ZeRO stage alternate, so all see the same machine ----
    Variant plain = make_variant(widths, -1, bench, pg);
    Variant ddp = make_variant(widths, 0, bench, pg);
    Variant zero;
    if (bench.zero > 0) zero = make_variant(widths, bench.zero, bench, pg);
    std::vector<Tensor> buffers;  // the all-reduces of the same buckets, alone
    for (size_t bytes : ddp.ddp->reducer().bucket_bytes())
      buffers.push_back(full(Shape{static_cast<int64_t>(bytes / 4)}, 1.0));

    std::vector<double> plain_ms, ddp_ms, zero_ms, allreduce_ms, comm_ms, wait_ms, hidden;
    // --trace: the DDP steps only (after its own warm-up); the others run untraced.
    mg::samples::StepTracer tracer(trace, pg);
    std::vector<double> ddp_cpu_ms, zero_cpu_ms;
    auto ms_since = [](Clock::time_point t0) {
      return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    };
    for (int s = 0; s < warmup + steps; ++s) {
      const bool timed = s >= warmup;
      auto t0 = Clock::now();
      train_step(plain, x, y);
      if (timed) plain_ms.push_back(ms_since(t0));

      pg->barrier()->wait();  // the ranks start together: waits measure overlap, not skew
      t0 = Clock::now();
      double cpu0 = process_cpu_ms();
      tracer.begin_step(s + 1);
      train_step(ddp, x, y);
      tracer.end_step();
      const double step_ms = ms_since(t0);
      if (timed) ddp_cpu_ms.push_back(process_cpu_ms() - cpu0);
      const parallel::ReductionStats st = ddp.ddp->last_reduction_stats();
      if (timed) {
        ddp_ms.push_back(step_ms);
        comm_ms.push_back(st.comm_seconds * 1e3);
        wait_ms.push_back(st.wait_seconds * 1e3);
        hidden.push_back(st.comm_seconds > 0
                             ? 1.0 - std::min(1.0, st.wait_seconds / st.comm_seconds)
                             : 0.0);
      }

      if (bench.zero > 0) {
        pg->barrier()->wait();
        t0 = Clock::now();
        cpu0 = process_cpu_ms();
        train_step(zero, x, y);
        if (timed) {
          zero_ms.push_back(ms_since(t0));
          zero_cpu_ms.push_back(process_cpu_ms() - cpu0);
        }
      }

      pg->barrier()->wait();
      t0 = Clock::now();
      std::vector<std::shared_ptr<parallel::Work>> works;
      for (const Tensor& b : buffers)
        works.push_back(pg->allreduce(b, parallel::ReduceOp::Average));
      for (auto& w : works) w->wait();
      if (timed) allreduce_ms.push_back(ms_since(t0));
    }
    tracer.finish();  // fewer steps than --trace-warmup + --trace-steps: what ran

    if (pg->rank() == 0 && json) {
      const std::vector<float> values = gathered.to_vector<float>();
      std::string ranks;
      for (int r = 0; r < pg->size(); ++r) {
        const float* v = values.data() + r * Footprint::kFields;
        ranks += fmt::format(
            "{}{{\"rank\":{},\"parameters\":{},\"gradients\":{},\"optimizer\":{},"
            "\"allocator\":{},\"arithmetic\":{},\"sent_ring\":{},\"sent_measured\":{}}}",
            r == 0 ? "" : ",", r, v[0], v[1], v[2], v[3], v[4], v[5], v[6]);
      }
      fmt::print("{{\"bench\":\"ddp-bench\",\"ranks\":{},\"widths\":\"{}\",\"batch\":{},"
                 "\"optimizer\":\"{}\",\"zero\":{},\"plain_ms\":{:.4f},\"ddp_ms\":{:.4f},"
                 "\"zero_ms\":{:.4f},\"ddp_cpu_ms\":{:.4f},\"zero_cpu_ms\":{:.4f},"
                 "\"footprint\":[{}]}}\n",
                 pg->size(), widths_text, batch, bench.optimizer, bench.zero, median(plain_ms),
                 median(ddp_ms), bench.zero > 0 ? median(zero_ms) : median(ddp_ms),
                 median(ddp_cpu_ms), bench.zero > 0 ? median(zero_cpu_ms) : median(ddp_cpu_ms),
                 ranks);
    } else if (pg->rank() == 0) {
      size_t params = 0;
      for (const Tensor& p : plain.model->parameters()) params += static_cast<size_t>(p.numel());
      const char* omp = std::getenv("OMP_NUM_THREADS");
      const std::string model = fmt::format("MLP {} ({:.1f} M params{})", widths_text, params / 1e6,
                                            omp ? fmt::format(", OMP_NUM_THREADS={}", omp) : "");
      fmt::print(
          "| ranks | model | batch/rank | optimizer | buckets | plain ms | DDP ms | overhead | "
          "allreduce alone ms | comm ms | wait ms | hidden |{}\n",
          bench.zero > 0 ? fmt::format(" ZeRO-{} ms | ZeRO-{} / DDP |", bench.zero, bench.zero)
                         : "");
      fmt::print("|---|---|---|---|---|---|---|---|---|---|---|---|{}\n",
                 bench.zero > 0 ? "---|---|" : "");
      fmt::print("| {} | {} | {} | {} | {} (cap {} MiB{}) | {:.2f} | {:.2f} | {:+.1f}% | {:.2f} | "
                 "{:.2f} | {:.2f} | {} |{}\n",
                 pg->size(), model, batch, bench.optimizer, ddp.ddp->reducer().bucket_bytes().size(),
                 bench.ddp.bucket_cap_mb,
                 bench.ddp.gradient_as_bucket_view ? ", grads as bucket views" : "",
                 median(plain_ms), median(ddp_ms),
                 100.0 * (median(ddp_ms) / median(plain_ms) - 1.0), median(allreduce_ms),
                 median(comm_ms), median(wait_ms),
                 // One rank has nothing to send: no overlap to speak of.
                 pg->size() > 1 ? fmt::format("{:.0f}%", 100.0 * median(hidden)) : "-",
                 bench.zero > 0 ? fmt::format(" {:.2f} | {:.2f}x |", median(zero_ms),
                                              median(zero_ms) / median(ddp_ms))
                                : "");
      fmt::print("\n| {} | rank | parameters MiB | gradients MiB | optimizer state MiB | "
                 "allocator peak MiB | arithmetic MiB | sent/step MiB (ring) | written/step MiB "
                 "(measured) |\n|---|---|---|---|---|---|---|---|---|\n",
                 bench.zero > 0 ? fmt::format("ZeRO-{}", bench.zero) : "DDP");
      const std::vector<float> values = gathered.to_vector<float>();
      for (int r = 0; r < pg->size(); ++r) {
        const float* v = values.data() + r * Footprint::kFields;
        fmt::print("| {} | {} | {} | {} | {} | {} | {} | {} | {} |\n",
                   bench.zero > 0 ? fmt::format("ZeRO-{}", bench.zero) : "DDP", r, mib(v[0]),
                   mib(v[1]), mib(v[2]), mib(v[3]), mib(v[4]), mib(v[5]),
                   v[6] >= 0 ? mib(v[6]) : "-");
      }
    }
  } catch (const std::exception& e) {
    return mg::samples::report_error("ddp-bench", e);
  }
  return 0;
}
