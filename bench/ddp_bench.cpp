// ddp-bench: what DistributedDataParallel costs and how much of its communication hides
// behind backward. Run alone (a group of one, in this process) or under minigrad-run:
//
//   build/bin/ddp-bench                                        # overhead of DDP, 1 rank
//   build/bin/minigrad-run --nproc-per-node 2 build/bin/ddp-bench --bucket-cap-mb 1
//
// For one MLP and one per-rank batch it times, after --warmup untimed rounds, --steps
// rounds of these three, one after the other (medians, host clock):
//   plain      zero_grad, forward, cross-entropy, backward, SGD step; no DDP
//   ddp        the same through DistributedDataParallel (Gloo on the CPU)
//   allreduce  the all-reduces of the same buckets alone, with nothing else running
// and, from the reducer of each DDP step: comm (the communication thread's busy time on
// the buckets) and wait (how long backward's caller blocked at its end for them).
// hidden = 1 - wait / comm is the share of the communication that overlapped backward.
// Rank 0 prints the results as one Markdown table row (the header first).
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <minigrad/minigrad.h>
#include <minigrad/nn/optim/sgd.h>
#include <minigrad/parallel/distributed/distributed_data_parallel.h>
#include <minigrad/parallel/distributed/rendezvous.h>

namespace {

using Clock = std::chrono::steady_clock;
using namespace mg;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

std::vector<int64_t> parse_widths(const std::string& text) {
  std::vector<int64_t> widths;
  std::stringstream ss(text);
  for (std::string item; std::getline(ss, item, ',');) widths.push_back(std::stoll(item));
  MG_CHECK(widths.size() >= 2, "ddp-bench: --widths needs at least two sizes, got '{}'", text);
  return widths;
}

nn::ModulePtr make_model(const std::vector<int64_t>& widths) {
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
  if (std::getenv("RANK") != nullptr) return parallel::init_process_group("gloo", options);
  parallel::TCPStoreOptions store_options;
  store_options.is_server = true;
  store_options.rank = 0;
  auto store = std::make_shared<parallel::TCPStore>("127.0.0.1", 0, store_options);
  return parallel::new_process_group("gloo", store, 0, 1, options);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"DistributedDataParallel overhead and communication/backward overlap"};
  std::string widths_text = "784,1024,1024,1024,10";
  int64_t batch = 128;
  int steps = 20, warmup = 3;
  double bucket_cap_mb = 25.0, first_bucket_mb = 1.0, timeout_s = 120.0;
  bool as_view = false;
  app.add_option("--widths", widths_text, "MLP layer widths, input to classes");
  app.add_option("--batch", batch, "rows per rank per step");
  app.add_option("--steps", steps, "timed steps");
  app.add_option("--warmup", warmup, "untimed steps first");
  app.add_option("--bucket-cap-mb", bucket_cap_mb, "DDPOptions::bucket_cap_mb");
  app.add_option("--first-bucket-mb", first_bucket_mb, "DDPOptions::first_bucket_mb");
  app.add_option("--timeout", timeout_s, "process group timeout, seconds");
  app.add_flag("--gradient-as-bucket-view", as_view, "DDPOptions::gradient_as_bucket_view");
  CLI11_PARSE(app, argc, argv);

  try {
    const std::vector<int64_t> widths = parse_widths(widths_text);
    auto pg = process_group(std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000)));
    manual_seed(100 + static_cast<uint64_t>(pg->rank()));
    const Tensor x = randn(Shape{batch, widths.front()});
    const Tensor y = randint(0, widths.back(), Shape{batch});
    nn::CrossEntropyLoss loss_fn;

    // Plain and DDP models start equal; their steps alternate, so that both see the same
    // machine (on a shared machine the load changes from one second to the next).
    auto plain = make_model(widths);
    optim::SGD plain_sgd(plain->parameters(), 0.01);
    parallel::DDPOptions options;
    options.bucket_cap_mb = bucket_cap_mb;
    options.first_bucket_mb = first_bucket_mb;
    options.gradient_as_bucket_view = as_view;
    auto model = make_model(widths);
    auto ddp = std::make_shared<parallel::DistributedDataParallel>(model, pg, options);
    optim::SGD sgd(ddp->parameters(), 0.01);
    // The all-reduces of the same buckets, alone.
    std::vector<Tensor> buffers;
    for (size_t bytes : ddp->reducer().bucket_bytes())
      buffers.push_back(full(Shape{static_cast<int64_t>(bytes / 4)}, 1.0));

    std::vector<double> plain_ms, ddp_ms, allreduce_ms, comm_ms, wait_ms, hidden;
    auto ms_since = [](Clock::time_point t0) {
      return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    };
    for (int s = 0; s < warmup + steps; ++s) {
      const bool timed = s >= warmup;
      // ---- a plain step ----
      auto t0 = Clock::now();
      plain_sgd.zero_grad();
      loss_fn(plain->forward(x), y).backward();
      plain_sgd.step();
      if (timed) plain_ms.push_back(ms_since(t0));

      // ---- a DDP step ----
      pg->barrier()->wait();  // the ranks start together: waits measure overlap, not skew
      t0 = Clock::now();
      sgd.zero_grad();
      loss_fn(ddp->forward(x), y).backward();
      sgd.step();
      const double step_ms = ms_since(t0);
      const parallel::ReductionStats st = ddp->last_reduction_stats();
      if (timed) {
        ddp_ms.push_back(step_ms);
        comm_ms.push_back(st.comm_seconds * 1e3);
        wait_ms.push_back(st.wait_seconds * 1e3);
        hidden.push_back(st.comm_seconds > 0
                             ? 1.0 - std::min(1.0, st.wait_seconds / st.comm_seconds)
                             : 0.0);
      }

      // ---- the all-reduces alone ----
      pg->barrier()->wait();
      t0 = Clock::now();
      std::vector<std::shared_ptr<parallel::Work>> works;
      for (const Tensor& b : buffers) works.push_back(pg->allreduce(b, parallel::ReduceOp::Average));
      for (auto& w : works) w->wait();
      if (timed) allreduce_ms.push_back(ms_since(t0));
    }

    if (pg->rank() == 0) {
      size_t params = 0;
      for (const Tensor& p : model->parameters()) params += static_cast<size_t>(p.numel());
      const char* omp = std::getenv("OMP_NUM_THREADS");
      fmt::print("| ranks | model | batch/rank | buckets | plain ms | DDP ms | overhead | "
                 "allreduce alone ms | comm ms | wait ms | hidden |\n");
      fmt::print("|---|---|---|---|---|---|---|---|---|---|---|\n");
      fmt::print("| {} | MLP {} ({:.1f} M params{}) | {} | {} (cap {} MiB{}) | {:.2f} | {:.2f} | "
                 "{:+.1f}% | {:.2f} | {:.2f} | {:.2f} | {} |\n",
                 pg->size(), widths_text, params / 1e6,
                 omp ? fmt::format(", OMP_NUM_THREADS={}", omp) : std::string(), batch,
                 ddp->reducer().bucket_bytes().size(), bucket_cap_mb,
                 as_view ? ", grads as bucket views" : "", median(plain_ms),
                 median(ddp_ms), 100.0 * (median(ddp_ms) / median(plain_ms) - 1.0),
                 median(allreduce_ms), median(comm_ms), median(wait_ms),
                 // One rank has nothing to send: no overlap to speak of.
                 pg->size() > 1 ? fmt::format("{:.0f}%", 100.0 * median(hidden)) : "-");
    }
  } catch (const std::exception& e) {
    fmt::print(stderr, "ddp-bench: {}\n", e.what());
    return 1;
  }
  return 0;
}
