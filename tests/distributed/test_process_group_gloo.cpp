// ProcessGroupGloo across 2 and 4 forked processes on loopback: results, and failures
// (a dead rank, a rank that stops calling collectives, one that never arrives).
#ifdef MINIGRAD_WITH_GLOO

#include <signal.h>
#include <unistd.h>

#include <thread>

#include "catch_compat.h"
#include "multiprocess.h"

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

}  // namespace

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
               MG_CONTAINS("allreduce (gloo): ReduceOp::Average needs float32 tensors, tensor 0 is int64"));
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
