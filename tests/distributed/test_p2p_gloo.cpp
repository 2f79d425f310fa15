// ProcessGroupGloo's send and recv across 2 and 4 forked processes: a pipeline's send and
// recv posted in either order, matching by tag out of order, several messages of one tag,
// lists and views, int64, empty messages, many peers at once beside a collective;
// mismatching messages; argument errors; a dead peer and a missing send.
#ifdef MINIGRAD_WITH_GLOO

#include <signal.h>

#include <chrono>
#include <thread>

#include "catch_compat.h"
#include "multiprocess.h"

#include <minigrad/core/allocator.h>
#include <minigrad/core/ops.h>
#include <minigrad/parallel/c10d/gloo/process_group_gloo.h>

using namespace mg;
using namespace mg::parallel;
using namespace mg::test;
using namespace std::chrono_literals;

namespace {

// n values starting at `first`, step 1/8 (exact in float32).
Tensor ramp(float first, int64_t n, Shape shape) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = first + static_cast<float>(i) / 8.0f;
  return from_vector(v, shape);
}

bool equal(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() &&
         a.contiguous().to_vector<float>() == b.contiguous().to_vector<float>();
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

}  // namespace

TEST_CASE("ProcessGroupGloo: send and recv between two ranks, in either order, matched by tag") {
  auto results = run_ranks(2, [](RankContext& ctx) {
    auto pg = ctx.gloo();
    const int me = ctx.rank, peer = 1 - ctx.rank;
    std::vector<std::string> failures;
    const auto expect = [&](bool ok, const std::string& what) {
      if (!ok) failures.push_back(what);
    };

    // 1F1B: "send activation to next" and "recv gradient from next" in flight together;
    // rank 0 posts its send first, rank 1 its recv first, then the other way round.
    for (int round = 0; round < 2; ++round) {
      const Tensor out = ramp(100.0f * me + round, 1 << 18, Shape{512, 512});  // 1 MiB
      Tensor in = empty(Shape{512, 512});
      std::shared_ptr<Work> s, r;
      if ((me == 0) == (round == 0)) {
        s = pg->send(out, peer, 1);
        r = pg->recv(in, peer, 1);
      } else {
        r = pg->recv(in, peer, 1);
        s = pg->send(out, peer, 1);
      }
      r->wait();
      s->wait();
      expect(equal(in, ramp(100.0f * peer + round, 1 << 18, Shape{512, 512})),
             fmt::format("round {}: the message", round));
      expect(s->is_completed() && r->duration_seconds() >= 0.0, "work state");
    }

    // By tag, out of order: rank 0 sends tag 10 then tag 11; rank 1 waits for tag 11
    // before it even posts the recv of tag 10.
    if (me == 0) {
      auto a = pg->send(ramp(10, 3, Shape{3}), 1, 10);
      auto b = pg->send(ramp(11, 5, Shape{5}), 1, 11);
      b->wait();
      a->wait();
    } else {
      Tensor b = empty(Shape{5}), a = empty(Shape{3});
      pg->recv(b, 0, 11)->wait();
      pg->recv(a, 0, 10)->wait();
      expect(equal(a, ramp(10, 3, Shape{3})) && equal(b, ramp(11, 5, Shape{5})), "by tag");
    }

    // One tag, several messages: they arrive in the order they were sent, whatever the
    // order of the waits.
    if (me == 1) {
      std::vector<std::shared_ptr<Work>> sends;
      for (int k = 0; k < 4; ++k) sends.push_back(pg->send(full(Shape{7}, k), 0, 5));
      for (auto& s : sends) s->wait();
    } else {
      std::vector<Tensor> got;
      std::vector<std::shared_ptr<Work>> recvs;
      for (int k = 0; k < 4; ++k) {
        got.push_back(empty(Shape{7}));
        recvs.push_back(pg->recv(got.back(), 1, 5));
      }
      for (int k = 3; k >= 0; --k) recvs[static_cast<size_t>(k)]->wait();
      for (int k = 0; k < 4; ++k)
        expect(equal(got[static_cast<size_t>(k)], full(Shape{7}, k)), fmt::format("message {}", k));
    }

    // A list (one message) into a list holding a non-contiguous view; int64; empty.
    if (me == 0) {
      pg->send(std::vector<Tensor>{ramp(1, 4, Shape{4}), ramp(2, 6, Shape{3, 2})}, 1, 2)->wait();
      pg->send(from_vector(std::vector<int64_t>{-3, 1LL << 40}, Shape{2}), 1, 3)->wait();
      pg->send(empty(Shape{0}), 1, 4)->wait();
    } else {
      Tensor c = empty(Shape{4});
      Tensor d_storage = empty(Shape{2, 3});
      Tensor d = d_storage.t();  // [3, 2], not contiguous
      pg->recv(std::vector<Tensor>{c, d}, 0, 2)->wait();
      expect(equal(c, ramp(1, 4, Shape{4})) && equal(d, ramp(2, 6, Shape{3, 2})), "list");
      Tensor i = empty(Shape{2}, DType::Int64);
      pg->recv(i, 0, 3)->wait();
      expect(i.to_vector<int64_t>() == std::vector<int64_t>{-3, 1LL << 40}, "int64");
      pg->recv(empty(Shape{0}), 0, 4)->wait();
    }
    std::string all;
    for (const auto& f : failures) all += f + "; ";
    ctx.report("failures", all);
  });
  INFO(describe(results));
  for (const RankResult& r : results) {
    REQUIRE(r.ok());
    CHECK(r.text("failures") == "");
  }
}

// A message's coalesced copy (a list of tensors sent or received) is released by the
// caller's wait(), not on a waiter thread when the peer happens to take it: what a rank's
// allocator counts at any point of its program is then the same in every run (the activation
// peaks of gpt-parallel-bench's context-parallel rows moved by a message's 4 KiB before).
TEST_CASE("ProcessGroupGloo: a message's coalesced copy is held until the caller waits") {
  auto results = run_ranks(2, [](RankContext& ctx) {
    auto pg = ctx.gloo();
    const int peer = 1 - ctx.rank;
    std::vector<Tensor> tensors = {ramp(1, 1024, Shape{1024}), ramp(2, 1024, Shape{1024})};
    if (ctx.rank == 1) tensors = {empty(Shape{1024}), empty(Shape{1024})};
    const size_t before = cpu_memory_allocated();
    auto work = ctx.rank == 0 ? pg->send(tensors, peer, 7) : pg->recv(tensors, peer, 7);
    const auto deadline = std::chrono::steady_clock::now() + 30s;  // a hang guard, not a timing
    while (!work->is_completed() && std::chrono::steady_clock::now() < deadline) std::this_thread::yield();
    ctx.report("done, not waited", std::to_string(cpu_memory_allocated() - before));
    work->wait();
    ctx.report("waited", std::to_string(cpu_memory_allocated() - before));
    ctx.report("received", ctx.rank == 1 && equal(tensors[1], ramp(2, 1024, Shape{1024})) ? "yes" : "no");
  });
  INFO(describe(results));
  for (const RankResult& r : results) {
    REQUIRE(r.ok());
    CHECK(r.text("done, not waited") == "8192");  // the two tensors' flat copy, 2 x 4 KiB
    CHECK(r.text("waited") == "0");
  }
  CHECK(results[1].text("received") == "yes");
}

TEST_CASE("ProcessGroupGloo: messages between every pair of 4 ranks at once, beside an allreduce") {
  auto results = run_ranks(4, [](RankContext& ctx) {
    auto pg = ctx.gloo();
    const int me = ctx.rank, w = ctx.world_size;
    std::vector<std::shared_ptr<Work>> works;
    std::vector<Tensor> got(static_cast<size_t>(w));
    // Sends to every peer, an allreduce queued between them, then the recvs: all in
    // flight before any wait; the collective does not wait for the messages or they for it.
    for (int peer = 0; peer < w; ++peer)
      if (peer != me)
        works.push_back(pg->send(ramp(10.0f * me + peer, 3 + me, Shape{3 + me}), peer, me));
    Tensor sum = full(Shape{5}, me + 1.0);
    works.push_back(pg->allreduce(sum));
    for (int peer = w - 1; peer >= 0; --peer) {
      if (peer == me) continue;
      got[static_cast<size_t>(peer)] = empty(Shape{3 + peer});
      works.push_back(pg->recv(got[static_cast<size_t>(peer)], peer, peer));
    }
    for (auto& work : works) work->wait();
    std::string bad;
    for (int peer = 0; peer < w; ++peer)
      if (peer != me && !equal(got[static_cast<size_t>(peer)],
                               ramp(10.0f * peer + me, 3 + peer, Shape{3 + peer})))
        bad += fmt::format("from {}; ", peer);
    ctx.report("bad", bad);
    ctx.report("sum", sum);
  });
  INFO(describe(results));
  for (const RankResult& r : results) {
    REQUIRE(r.ok());
    CHECK(r.text("bad") == "");
    CHECK(r.floats("sum") == std::vector<float>(5, 10.0f));
  }
}

TEST_CASE(
    "ProcessGroupGloo: a recv that does not match the message fails clearly, the group goes on") {
  auto results = run_ranks(2, [](RankContext& ctx) {
    auto pg = ctx.gloo();
    if (ctx.rank == 0) {
      // Each of these completes: the receiver takes the message, then refuses it.
      pg->send(ramp(0, 12, Shape{3, 4}), 1)->wait();  // recv'd as [12]: other shape
      pg->send(ramp(0, 5, Shape{5}), 1)->wait();      // recv'd as [6]: other size
      pg->send(ramp(0, 6, Shape{6}), 1)->wait();      // recv'd as int64
      pg->send(std::vector<Tensor>{ramp(0, 2, Shape{2}), ramp(0, 2, Shape{2})}, 1)->wait();
      pg->send(ramp(7, 9, Shape{9}), 1)->wait();  // and then a good one
      ctx.report("sender", std::string("all sends completed"));
      return;
    }
    Tensor untouched = full(Shape{12}, -1.0);
    ctx.report("shape", error_of([&] { pg->recv(untouched, 0)->wait(); }));
    ctx.report("size", error_of([&] { pg->recv(empty(Shape{6}), 0)->wait(); }));
    ctx.report("dtype", error_of([&] { pg->recv(empty(Shape{6}, DType::Int64), 0)->wait(); }));
    ctx.report("count", error_of([&] { pg->recv(empty(Shape{4}), 0)->wait(); }));
    Tensor good = empty(Shape{9});
    pg->recv(good, 0)->wait();
    ctx.report("good", good);
    ctx.report("untouched", untouched);  // a refused message never lands in the tensors
  });
  INFO(describe(results));
  REQUIRE(results[0].ok());
  REQUIRE(results[1].ok());
  CHECK(results[0].text("sender") == "all sends completed");
  const RankResult& r = results[1];
  CHECK_THAT(r.text("shape"),
             MG_CONTAINS("ProcessGroupGloo: recv #0 (from rank 0, tag 0: 1 tensor of float32 [12], "
                         "12 elements) on rank 1 of 2: rank 0 sent 1 tensor of float32 [3, 4], 12 "
                         "elements; a recv's tensors must match the send's in number, shapes and "
                         "dtype. The message was dropped"));
  CHECK_THAT(r.text("size"), MG_CONTAINS("float32 [6], 6 elements) on rank 1 of 2: rank 0 sent 1 "
                                         "tensor of float32 [5], 5 elements"));
  CHECK_THAT(r.text("dtype"), MG_CONTAINS("1 tensor of int64 [6], 6 elements) on rank 1 of 2: rank "
                                          "0 sent 1 tensor of float32 [6], 6 elements"));
  CHECK_THAT(r.text("count"), MG_CONTAINS("rank 0 sent 2 tensors of float32 [2], [2], 4 elements"));
  CHECK(r.floats("good") == ramp(7, 9, Shape{9}).to_vector<float>());
  CHECK(r.floats("untouched") == std::vector<float>(12, -1.0f));
}

TEST_CASE("ProcessGroupGloo: send and recv check their arguments") {
  auto results = run_ranks(2, [](RankContext& ctx) {
    auto pg = ctx.gloo();
    ctx.report("self", error_of([&] { pg->send(empty(Shape{2}), ctx.rank); }));
    ctx.report("range", error_of([&] { pg->recv(empty(Shape{2}), 2); }));
    ctx.report("tag", error_of([&] { pg->send(empty(Shape{2}), 1 - ctx.rank, -1); }));
    ctx.report("undefined", error_of([&] { pg->recv(Tensor(), 1 - ctx.rank); }));
    ctx.report("dtypes", error_of([&] {
                 pg->send(std::vector<Tensor>{empty(Shape{1}), empty(Shape{1}, DType::Int64)},
                          1 - ctx.rank);
               }));
    // Nothing was posted; and no rank leaves while the other is still connecting.
    pg->barrier()->wait();
  });
  INFO(describe(results));
  for (const RankResult& r : results) {
    REQUIRE(r.ok());
    CHECK_THAT(
        r.text("self"),
        MG_CONTAINS(fmt::format("send (gloo): destination rank {} is this rank itself", r.rank)));
    CHECK_THAT(r.text("range"), MG_CONTAINS("recv (gloo): source rank 2 is outside [0, 2)"));
    CHECK_THAT(r.text("tag"), MG_CONTAINS("send (gloo): tag -1 is negative"));
    CHECK_THAT(r.text("undefined"), MG_CONTAINS("recv (gloo): tensor 0 is undefined"));
    CHECK_THAT(r.text("dtypes"),
               MG_CONTAINS("send (gloo): tensor 1 is int64 but tensor 0 is float32"));
  }
}

TEST_CASE(
    "ProcessGroupGloo: a recv from a rank that died fails at once, the group refuses the next") {
  auto results = run_ranks(3, [](RankContext& ctx) {
    ctx.start_together();
    auto pg = ctx.gloo(5s);
    pg->barrier()->wait();
    if (ctx.rank == 2) ::raise(SIGKILL);
    if (ctx.rank == 1) {
      // Alive, but sends nothing: wait until rank 0 has given up on it.
      ctx.store->wait({"rank0 done"}, 60s);
      return;
    }
    auto from_dead = pg->recv(empty(Shape{4}), 2);
    auto start = std::chrono::steady_clock::now();
    ctx.report("dead", error_of([&] { from_dead->wait(); }));
    ctx.report("dead seconds",
               std::vector<float>{
                   std::chrono::duration<float>(std::chrono::steady_clock::now() - start).count()});
    ctx.report("later", error_of([&] { pg->recv(empty(Shape{4}), 1)->wait(); }));
    ctx.store->set("rank0 done", "1");
  });
  INFO(describe(results));
  REQUIRE(results[2].signal == SIGKILL);
  REQUIRE(results[0].ok());
  REQUIRE(results[1].ok());
  const std::string dead = results[0].text("dead");
  CHECK_THAT(dead, MG_CONTAINS("ProcessGroupGloo: recv #1 (from rank 2, tag 0: 1 tensor of "
                               "float32 [4], 4 elements) failed on rank 0 of 3"));
  CHECK_THAT(dead, MG_CONTAINS("a peer rank died, hung, or did not post the matching send"));
  CHECK(results[0].floats("dead seconds")[0] < 5.0f);  // at once, not after the timeout
  CHECK_THAT(results[0].text("later"),
             MG_CONTAINS("recv #2 (from rank 1, tag 0: 1 tensor of float32 [4], 4 elements) on "
                         "rank 0 of 3 was not posted because an earlier collective or message "
                         "failed"));
}

TEST_CASE("ProcessGroupGloo: a recv whose send never comes times out") {
  auto results = run_ranks(2, [](RankContext& ctx) {
    ctx.start_together();
    auto pg = ctx.gloo(2s);
    if (ctx.rank == 1) {
      ctx.store->wait({"rank0 done"}, 60s);
      return;
    }
    ctx.report("error", error_of([&] { pg->recv(empty(Shape{4}), 1, 3)->wait(); }));
    ctx.store->set("rank0 done", "1");
  });
  INFO(describe(results));
  REQUIRE(results[0].ok());
  REQUIRE(results[1].ok());
  const std::string error = results[0].text("error");
  CHECK_THAT(error, MG_CONTAINS("ProcessGroupGloo: recv #0 (from rank 1, tag 3"));
  CHECK_THAT(error, MG_CONTAINS("timeout 2.00 s"));
  CHECK_THAT(error, MG_CONTAINS("Timed out"));
}

#endif  // MINIGRAD_WITH_GLOO
