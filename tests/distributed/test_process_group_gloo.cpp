// ProcessGroupGloo across 2 and 4 forked processes on loopback: results, and failures
// (a dead rank, a rank that stops calling collectives, one that never arrives).
#ifdef MINIGRAD_WITH_GLOO

#include <signal.h>
#include <unistd.h>

#include <cmath>
#include <thread>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "catch_compat.h"
#include "multiprocess.h"

#include <minigrad/core/ops.h>
#include <minigrad/parallel/c10d/gloo/process_group_gloo.h>

using namespace mg;
using namespace mg::parallel;
using namespace mg::test;
using namespace std::chrono_literals;

namespace {

// Rank r's contribution: element i is (r + 1) * (i + 1) / 8, exact in float.
Tensor contribution(int rank, int64_t n, Shape shape) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = static_cast<float>((rank + 1) * (i + 1)) / 8.0f;
  return from_vector(v, shape);
}

// Rank r's float64 element i: 1 + (r + 1) (i + 1) 2^-40. float32 would round every one to 1;
// their sums over 4 ranks are exact in float64, in any order.
double wide_value(int rank, int64_t i) {
  return 1.0 + static_cast<double>((rank + 1) * (i + 1)) * std::ldexp(1.0, -40);
}

Tensor wide_contribution(int rank, int64_t n) {
  std::vector<double> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = wide_value(rank, i);
  return from_vector(v, Shape{n});
}

// Every value, spelled exactly (the shortest text that reads back as the same double).
std::string exact(const Tensor& t) {
  if (t.dtype() == DType::Int64) return fmt::format("{}", fmt::join(t.contiguous().to_vector<int64_t>(), ", "));
  return fmt::format("{}", fmt::join(t.contiguous().to_vector<double>(), ", "));
}
std::string exact(const std::vector<double>& v) { return fmt::format("{}", fmt::join(v, ", ")); }

}  // namespace

TEST_CASE("ProcessGroupGloo: float64 and wide int64 through every collective and message, exactly") {
  for (int world : {2, 4}) {
    DYNAMIC_SECTION("world size " << world) {
      auto results = run_ranks(world, [](RankContext& ctx) {
        auto pg = ctx.gloo();
        const int w = ctx.world_size, r = ctx.rank;
        Tensor sum = wide_contribution(r, 5);
        pg->allreduce(sum)->wait();
        ctx.report("sum", exact(sum));
        // A list of two, coalesced into one float64 buffer.
        Tensor avg = wide_contribution(r, 3), avg2 = ops::to_dtype(full({2, 2}, r + 0.5), DType::Float64);
        pg->allreduce(std::vector<Tensor>{avg, avg2}, ReduceOp::Average)->wait();
        ctx.report("average", exact(avg) + "; " + exact(avg2));
        Tensor root = wide_contribution(r, 4);
        pg->broadcast(root, w - 1)->wait();
        ctx.report("broadcast", exact(root));
        Tensor gathered = empty({w * 2}, DType::Float64);
        pg->all_gather(gathered, wide_contribution(r, 2))->wait();
        ctx.report("all_gather", exact(gathered));
        Tensor part = empty({3}, DType::Float64);
        pg->reduce_scatter(part, wide_contribution(r, 3 * w))->wait();
        ctx.report("reduce_scatter", exact(part));
        Tensor mean_part = empty({3}, DType::Float64);
        pg->reduce_scatter(mean_part, wide_contribution(r, 3 * w), ReduceOp::Average)->wait();
        ctx.report("reduce_scatter mean", exact(mean_part));
        // A message: rank 0 to rank 1, float64 (the pipeline's activations travel so).
        if (r == 0) pg->send(wide_contribution(7, 6), 1, 3)->wait();
        if (r == 1) {
          Tensor in = empty({6}, DType::Float64);
          pg->recv(in, 0, 3)->wait();
          ctx.report("message", exact(in));
        }
        // int64 past 2^53, which a double could not carry: 2^60 + r summed exactly.
        Tensor ints = from_vector(std::vector<int64_t>{(int64_t{1} << 60) + r, -r}, Shape{2});
        pg->allreduce(ints)->wait();
        ctx.report("int64", exact(ints));
      });
      INFO(describe(results));
      const auto expected_sum = [&](int64_t i) {
        double s = 0;
        for (int r = 0; r < world; ++r) s += wide_value(r, i);  // exact: no rounding to differ
        return s;
      };
      for (const RankResult& res : results) {
        REQUIRE(res.ok());
        std::vector<double> sum, avg, root, gathered, part, mean_part;
        for (int64_t i = 0; i < 5; ++i) sum.push_back(expected_sum(i));
        for (int64_t i = 0; i < 3; ++i) avg.push_back(expected_sum(i) * (1.0 / world));
        for (int64_t i = 0; i < 4; ++i) root.push_back(wide_value(world - 1, i));
        for (int r = 0; r < world; ++r)
          for (int64_t i = 0; i < 2; ++i) gathered.push_back(wide_value(r, i));
        for (int64_t i = 0; i < 3; ++i) part.push_back(expected_sum(res.rank * 3 + i));
        for (double v : part) mean_part.push_back(v * (1.0 / world));
        double avg2 = 0;
        for (int r = 0; r < world; ++r) avg2 += r + 0.5;
        avg2 *= 1.0 / world;
        CHECK(res.text("sum") == exact(sum));
        CHECK(res.text("average") == exact(avg) + "; " + exact(std::vector<double>(4, avg2)));
        CHECK(res.text("broadcast") == exact(root));
        CHECK(res.text("all_gather") == exact(gathered));
        CHECK(res.text("reduce_scatter") == exact(part));
        CHECK(res.text("reduce_scatter mean") == exact(mean_part));
        if (res.rank == 1) {
          std::vector<double> message;
          for (int64_t i = 0; i < 6; ++i) message.push_back(wide_value(7, i));
          CHECK(res.text("message") == exact(message));
        }
        CHECK(res.text("int64") == fmt::format("{}, {}", world * (int64_t{1} << 60) + world * (world - 1) / 2,
                                               -world * (world - 1) / 2));
      }
      // Not float32's values: the 2^-40 parts survived.
      REQUIRE(results[0].text("broadcast") != exact(std::vector<double>(4, 1.0)));
    }
  }
}

TEST_CASE("ProcessGroupGloo: allreduce sum and average, one tensor and a list") {
  for (int world : {2, 4}) {
    DYNAMIC_SECTION("world size " << world) {
      auto results = run_ranks(world, [](RankContext& ctx) {
        auto pg = ctx.gloo();
        Tensor a = contribution(ctx.rank, 6, Shape{2, 3});
        pg->allreduce(a)->wait();
        ctx.report("sum", a);

        Tensor b = contribution(ctx.rank, 5, Shape{5});
        pg->allreduce(b, ReduceOp::Average)->wait();
        ctx.report("average", b);

        // A list of differently shaped tensors, one a non-contiguous view: reduced as one
        // coalesced buffer and copied back into each.
        Tensor c = contribution(ctx.rank, 4, Shape{4});
        Tensor d = contribution(ctx.rank, 6, Shape{2, 3}).t();
        auto work = pg->allreduce(std::vector<Tensor>{c, d}, ReduceOp::Sum);
        work->wait();
        MG_CHECK(work->is_completed() && work->duration_seconds() >= 0.0, "work state");
        ctx.report("list0", c);
        ctx.report("list1", d.contiguous());

        Tensor e = from_vector(std::vector<int64_t>{ctx.rank, 10 * ctx.rank}, Shape{2});
        pg->allreduce(e)->wait();
        const auto ev = e.to_vector<int64_t>();
        ctx.report("int64", std::vector<float>(ev.begin(), ev.end()));
      });
      INFO(describe(results));
      const float ranks_sum = world * (world + 1) / 2.0f;  // sum of (r + 1)
      for (const RankResult& r : results) {
        REQUIRE(r.ok());
        const auto sum = r.floats("sum");
        const auto average = r.floats("average");
        for (size_t i = 0; i < sum.size(); ++i) REQUIRE(sum[i] == ranks_sum * (i + 1) / 8.0f);
        for (size_t i = 0; i < average.size(); ++i)
          REQUIRE(average[i] == Approx(ranks_sum / world * (i + 1) / 8.0f));
        const auto l0 = r.floats("list0");
        for (size_t i = 0; i < l0.size(); ++i) REQUIRE(l0[i] == ranks_sum * (i + 1) / 8.0f);
        // d was the transpose of a [2, 3] tensor holding 1..6: element (j, i) is i*3 + j + 1.
        const auto l1 = r.floats("list1");
        REQUIRE(l1.size() == 6);
        for (int j = 0; j < 3; ++j)
          for (int i = 0; i < 2; ++i)
            REQUIRE(l1[static_cast<size_t>(j * 2 + i)] == ranks_sum * (i * 3 + j + 1) / 8.0f);
        const auto iv = r.floats("int64");
        REQUIRE(iv[0] == ranks_sum - world);
        REQUIRE(iv[1] == 10 * (ranks_sum - world));
      }
    }
  }
}

TEST_CASE("ProcessGroupGloo: broadcast from a non-zero root, and barrier") {
  auto results = run_ranks(4, [](RankContext& ctx) {
    auto pg = ctx.gloo();
    Tensor t = contribution(ctx.rank, 3, Shape{3});
    Tensor u = from_vector(std::vector<int64_t>{ctx.rank}, Shape{1});
    pg->broadcast(t, 2)->wait();
    pg->broadcast(u, 2)->wait();
    ctx.report("t", t);
    ctx.report("u", std::vector<float>{static_cast<float>(u.item<int64_t>())});
    // After the barrier every rank has passed the "arrived" counter increment.
    ctx.store->add("arrived", 1);
    pg->barrier()->wait();
    ctx.report("arrived", std::vector<float>{static_cast<float>(ctx.store->add("arrived", 0))});
  });
  INFO(describe(results));
  for (const RankResult& r : results) {
    REQUIRE(r.ok());
    REQUIRE(r.floats("t") == std::vector<float>{3 / 8.0f, 6 / 8.0f, 9 / 8.0f});
    REQUIRE(r.floats("u") == std::vector<float>{2.0f});
    REQUIRE(r.floats("arrived") == std::vector<float>{4.0f});
  }
}

TEST_CASE("ProcessGroupGloo: collectives run in the background, in call order") {
  auto results = run_ranks(2, [](RankContext& ctx) {
    auto pg = ctx.gloo();
    std::vector<Tensor> tensors;
    std::vector<std::shared_ptr<Work>> works;
    for (int k = 0; k < 8; ++k) {
      tensors.push_back(full(Shape{1000}, k + ctx.rank));
      works.push_back(pg->allreduce(tensors.back()));  // all launched before any wait
    }
    for (auto& w : works) w->wait();
    std::vector<float> firsts;
    for (const Tensor& t : tensors) firsts.push_back(t.to_vector<float>()[999]);
    ctx.report("firsts", firsts);
  });
  INFO(describe(results));
  for (const RankResult& r : results) {
    REQUIRE(r.ok());
    REQUIRE(r.floats("firsts") == std::vector<float>{1, 3, 5, 7, 9, 11, 13, 15});
  }
}

TEST_CASE("ProcessGroupGloo: arguments are checked with clear errors") {
  auto results = run_ranks(1, [](RankContext& ctx) {
    auto pg = ctx.gloo();
    auto expect_error = [&](const std::string& name, const std::function<void()>& f) {
      try {
        f();
        ctx.report(name, std::string("no error"));
      } catch (const Error& e) {
        ctx.report(name, std::string(e.what()));
      }
    };
    expect_error("int average", [&] {
      pg->allreduce(zeros(Shape{2}, DType::Int64), ReduceOp::Average);
    });
    expect_error("mixed dtypes", [&] {
      pg->allreduce(std::vector<Tensor>{zeros(Shape{2}), zeros(Shape{2}, DType::Int64)});
    });
    expect_error("bad root", [&] { pg->broadcast(zeros(Shape{2}), 3); });
    expect_error("undefined", [&] { pg->allreduce(Tensor()); });
  });
  INFO(describe(results));
  REQUIRE(results[0].ok());
  REQUIRE_THAT(results[0].text("int average"),
               MG_CONTAINS("allreduce (gloo): ReduceOp::Average needs float32 or float64 tensors, tensor 0 is int64"));
  REQUIRE_THAT(results[0].text("mixed dtypes"),
               MG_CONTAINS("tensor 1 is int64 but tensor 0 is float32"));
  REQUIRE_THAT(results[0].text("bad root"), MG_CONTAINS("root 3 is outside [0, 1)"));
  REQUIRE_THAT(results[0].text("undefined"), MG_CONTAINS("tensor 0 is undefined (rank 0)"));
}

TEST_CASE("ProcessGroupGloo: a killed rank makes the others fail with a clear error, not hang") {
  auto results = run_ranks(2, [](RankContext& ctx) {
    auto pg = ctx.gloo(3s);
    Tensor t = full(Shape{1024}, 1.0);
    pg->allreduce(t)->wait();  // both alive: works
    if (ctx.rank == 1) ::raise(SIGKILL);
    try {
      pg->allreduce(t)->wait();
      ctx.report("second", std::string("returned"));
    } catch (const Error& e) {
      ctx.report("second", std::string(e.what()));
    }
    // The group is unusable now, and says so at once.
    try {
      pg->allreduce(t)->wait();
      ctx.report("third", std::string("returned"));
    } catch (const Error& e) {
      ctx.report("third", std::string(e.what()));
    }
  });
  INFO(describe(results));
  REQUIRE(results[1].signal == SIGKILL);
  REQUIRE(results[0].ok());
  const std::string second = results[0].text("second");
  REQUIRE_THAT(second, MG_CONTAINS("ProcessGroupGloo: allreduce #1"));
  REQUIRE_THAT(second, MG_CONTAINS("failed on rank 0 of 2"));
  REQUIRE_THAT(second, MG_CONTAINS("a peer rank died"));
  REQUIRE_THAT(results[0].text("third"),
               MG_CONTAINS("because an earlier collective or message failed"));
}

TEST_CASE("ProcessGroupGloo: a rank that stops calling collectives makes the others time out") {
  auto results = run_ranks(2, [](RankContext& ctx) {
    auto pg = ctx.gloo(1s);
    Tensor t = full(Shape{16}, 1.0);
    if (ctx.rank == 1) {
      // Alive and connected, but never joins: wait until rank 0 has given up.
      ctx.store->wait({"rank0 done"}, 60s);
      return;
    }
    try {
      pg->allreduce(t)->wait();
      ctx.report("error", std::string("returned"));
    } catch (const Error& e) {
      ctx.report("error", std::string(e.what()));
    }
    ctx.store->set("rank0 done", "1");
  });
  INFO(describe(results));
  REQUIRE(results[0].ok());
  REQUIRE(results[1].ok());
  const std::string error = results[0].text("error");
  REQUIRE_THAT(error, MG_CONTAINS("ProcessGroupGloo: allreduce #0"));
  REQUIRE_THAT(error, MG_CONTAINS("timeout 1.00 s"));
  REQUIRE_THAT(error, MG_CONTAINS("Timed out"));
}

TEST_CASE("ProcessGroupGloo: a rank that never arrives makes the rendezvous time out") {
  TCPStoreOptions options;
  options.is_server = true;
  options.rank = 0;
  auto store = std::make_shared<TCPStore>("127.0.0.1", 0, options);
  ProcessGroupOptions pg_options;
  pg_options.timeout = 300ms;
  try {
    ProcessGroupGloo pg(store, 0, 2, pg_options);
    FAIL("joining a group of 2 alone returned");
  } catch (const Error& e) {
    const std::string message = e.what();
    CHECK_THAT(message, MG_CONTAINS("ProcessGroupGloo: rank 0 of 2 could not join the group"));
    CHECK_THAT(message, MG_CONTAINS(fmt::format("127.0.0.1:{}", store->port())));
    CHECK_THAT(message, MG_CONTAINS("timeout 0.30 s"));
    CHECK_THAT(message, MG_CONTAINS("TCPStore::"));
  }
}

#endif  // MINIGRAD_WITH_GLOO
