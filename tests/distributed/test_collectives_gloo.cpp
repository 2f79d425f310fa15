// ProcessGroupGloo's flat collectives (reduce_scatter, all_gather) across 2 and 4 forked
// processes: values for odd sizes, float32 and int64, sum and average, in place, empty;
// bfloat16 and float16 carried as float32 and rounded once; the argument checks; a rank
// that dies during an all-gather.
#ifdef MINIGRAD_WITH_GLOO

#include <signal.h>

#include <chrono>

#include "catch_compat.h"
#include "multiprocess.h"

#include <minigrad/core/ops.h>
#include <minigrad/parallel/c10d/gloo/process_group_gloo.h>

using namespace mg;
using namespace mg::parallel;
using namespace mg::test;
using namespace std::chrono_literals;

namespace {

// Rank r's element i: (r + 1) * (i + 1) / 8, exact in float32 for the sizes used here.
float value(int rank, int64_t i) { return static_cast<float>((rank + 1) * (i + 1)) / 8.0f; }

Tensor contribution(int rank, int64_t n, Shape shape) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = value(rank, i);
  return from_vector(v, shape);
}

// Rank r's int64 element i: 1000 * r + i.
Tensor int_contribution(int rank, int64_t n) {
  std::vector<int64_t> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = 1000 * rank + i;
  return from_vector(v, Shape{n});
}

std::vector<float> as_floats(const Tensor& t) {
  if (t.dtype() == DType::Float32) return t.contiguous().to_vector<float>();
  const auto v = t.contiguous().to_vector<int64_t>();
  return std::vector<float>(v.begin(), v.end());
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

TEST_CASE("ProcessGroupGloo: reduce_scatter and all_gather, odd sizes, float32 and int64") {
  for (int world : {2, 4}) {
    DYNAMIC_SECTION("world size " << world) {
      auto results = run_ranks(world, [](RankContext& ctx) {
        auto pg = ctx.gloo();
        const int w = ctx.world_size, r = ctx.rank;
        // All launched before any wait: they run in call order on the communication thread.
        Tensor rs_in = contribution(r, 3 * w, Shape{w, 3});  // the shapes do not matter
        Tensor rs_out = empty(Shape{3});
        auto rs = pg->reduce_scatter(rs_out, rs_in);
        Tensor avg_in = contribution(r, 5 * w, Shape{5 * w});
        Tensor avg_out = empty(Shape{5});
        auto avg = pg->reduce_scatter(avg_out, avg_in, ReduceOp::Average);
        Tensor int_in = int_contribution(r, 1 * w);
        Tensor int_out = empty(Shape{1}, DType::Int64);
        auto rs_int = pg->reduce_scatter(int_out, int_in);
        // In place: the output is this rank's slice of the input.
        Tensor inplace_in = contribution(r, 7 * w, Shape{7 * w});
        Tensor inplace_out = ops::narrow(inplace_in, 0, r * 7, 7);
        auto rs_inplace = pg->reduce_scatter(inplace_out, inplace_in);

        Tensor ag_in = contribution(r, 3, Shape{3});
        Tensor ag_out = empty(Shape{w, 3});
        auto ag = pg->all_gather(ag_out, ag_in);
        Tensor ag_int_out = empty(Shape{2 * w}, DType::Int64);
        auto ag_int = pg->all_gather(ag_int_out, int_contribution(r, 2));
        Tensor ag_inplace_out = full(Shape{5 * w}, -1.0);
        Tensor ag_inplace_in = ops::narrow(ag_inplace_out, 0, r * 5, 5);
        ops::copy_(ag_inplace_in, contribution(r, 5, Shape{5}));
        auto ag_inplace = pg->all_gather(ag_inplace_out, ag_inplace_in);

        // Empty tensors: nothing to move, complete at once.
        auto rs_empty = pg->reduce_scatter(empty(Shape{0}), empty(Shape{0}));
        auto ag_empty =
            pg->all_gather(empty(Shape{0}, DType::Int64), empty(Shape{0}, DType::Int64));
        MG_CHECK(rs_empty->is_completed() && ag_empty->is_completed(), "empty collectives pending");

        for (auto& w8 : {rs, avg, rs_int, rs_inplace, ag, ag_int, ag_inplace, rs_empty, ag_empty})
          w8->wait();
        MG_CHECK(ag->is_completed() && ag->duration_seconds() >= 0.0, "work state after wait");
        ctx.report("rs", rs_out);
        ctx.report("avg", avg_out);
        ctx.report("rs_int", as_floats(int_out));
        ctx.report("rs_inplace", inplace_out);
        ctx.report("ag", ag_out);
        ctx.report("ag_int", as_floats(ag_int_out));
        ctx.report("ag_inplace", ag_inplace_out);
      });
      INFO(describe(results));
      const float ranks_sum = world * (world + 1) / 2.0f;  // the sum of (r + 1)
      for (const RankResult& res : results) {
        REQUIRE(res.ok());
        const int k = res.rank;
        const auto rs = res.floats("rs");
        REQUIRE(rs.size() == 3);
        for (int64_t j = 0; j < 3; ++j)
          CHECK(rs[static_cast<size_t>(j)] == ranks_sum * static_cast<float>(k * 3 + j + 1) / 8.0f);
        const auto avg = res.floats("avg");
        REQUIRE(avg.size() == 5);
        for (int64_t j = 0; j < 5; ++j)
          CHECK(avg[static_cast<size_t>(j)] ==
                Approx(ranks_sum / world * static_cast<float>(k * 5 + j + 1) / 8.0f));
        // sum over r of 1000 r + k: 1000 * w (w - 1) / 2 + w k.
        CHECK(res.floats("rs_int") ==
              std::vector<float>{static_cast<float>(1000 * world * (world - 1) / 2 + world * k)});
        const auto inplace = res.floats("rs_inplace");
        for (int64_t j = 0; j < 7; ++j)
          CHECK(inplace[static_cast<size_t>(j)] ==
                ranks_sum * static_cast<float>(k * 7 + j + 1) / 8.0f);

        const auto ag = res.floats("ag");
        const auto ag_int = res.floats("ag_int");
        const auto ag_inplace = res.floats("ag_inplace");
        REQUIRE(ag.size() == static_cast<size_t>(3 * world));
        for (int src = 0; src < world; ++src) {
          for (int64_t j = 0; j < 3; ++j)
            CHECK(ag[static_cast<size_t>(src * 3 + j)] == value(src, j));
          for (int64_t j = 0; j < 2; ++j)
            CHECK(ag_int[static_cast<size_t>(src * 2 + j)] == static_cast<float>(1000 * src + j));
          for (int64_t j = 0; j < 5; ++j)
            CHECK(ag_inplace[static_cast<size_t>(src * 5 + j)] == value(src, j));
        }
      }
    }
  }
}

TEST_CASE("ProcessGroupGloo: reduce_scatter and all_gather check their arguments") {
  auto results = run_ranks(2, [](RankContext& ctx) {
    auto pg = ctx.gloo();
    auto expect = [&](const std::string& name, const std::function<void()>& f) {
      ctx.report(name, error_of(f));
    };
    expect("rs size", [&] { pg->reduce_scatter(empty(Shape{3}), empty(Shape{5})); });
    expect("ag size", [&] { pg->all_gather(empty(Shape{2, 3}), empty(Shape{4})); });
    expect("dtypes", [&] { pg->all_gather(empty(Shape{4}), empty(Shape{2}, DType::Int64)); });
    expect("int average", [&] {
      pg->reduce_scatter(empty(Shape{1}, DType::Int64), empty(Shape{2}, DType::Int64),
                         ReduceOp::Average);
    });
    expect("strided", [&] { pg->reduce_scatter(empty(Shape{3}), empty(Shape{3, 2}).t()); });
    expect("undefined", [&] { pg->all_gather(empty(Shape{2}), Tensor()); });
    // Overlapping, but not this rank's slice: the other rank's slice.
    Tensor whole = empty(Shape{8});
    expect("overlap",
           [&] { pg->reduce_scatter(ops::narrow(whole, 0, (1 - ctx.rank) * 4, 4), whole); });
    expect("overlap2", [&] { pg->all_gather(whole, ops::narrow(whole, 0, 2, 4)); });
    // The group is still usable: nothing was queued.
    Tensor out = empty(Shape{2});
    pg->all_gather(out, full(Shape{1}, ctx.rank + 1.0))->wait();
    ctx.report("after", out);
  });
  INFO(describe(results));
  for (const RankResult& res : results) {
    REQUIRE(res.ok());
    CHECK_THAT(res.text("rs size"),
               MG_CONTAINS(fmt::format("reduce_scatter (gloo): input has 5 elements (shape [5]), "
                                       "but a group of 2 needs 2 x 3 = 6 for an output of 3 "
                                       "elements (rank {})",
                                       res.rank)));
    CHECK_THAT(res.text("ag size"),
               MG_CONTAINS("all_gather (gloo): output has 6 elements (shape [2, 3]), but a group "
                           "of 2 needs 2 x 4 = 8 for an input of 4 elements"));
    CHECK_THAT(res.text("dtypes"),
               MG_CONTAINS("all_gather (gloo): output is float32 but input is int64"));
    CHECK_THAT(res.text("int average"),
               MG_CONTAINS("reduce_scatter (gloo): ReduceOp::Average needs float32 or float64 "
                           "tensors, input is int64"));
    CHECK_THAT(res.text("strided"),
               MG_CONTAINS("reduce_scatter (gloo): input of shape [2, 3] is not contiguous"));
    CHECK_THAT(res.text("undefined"), MG_CONTAINS("all_gather (gloo): input is undefined"));
    CHECK_THAT(res.text("overlap"),
               MG_CONTAINS(fmt::format("reduce_scatter (gloo): output overlaps input without "
                                       "being its slice for rank {} (elements [{}, {}))",
                                       res.rank, res.rank * 4, res.rank * 4 + 4)));
    CHECK_THAT(res.text("overlap2"),
               MG_CONTAINS("all_gather (gloo): input overlaps output without being its slice"));
    CHECK(res.floats("after") == std::vector<float>{1.0f, 2.0f});
  }
}

TEST_CASE("ProcessGroupGloo: bfloat16 and float16 travel as float32 and are rounded once") {
  // Three ranks hold 1, e and e with e three quarters of half the spacing above 1 (bfloat16:
  // 2^-7, float16: 2^-10). Summed in float32, 1 + 1.5 x half-spacing rounds up to the next
  // 16-bit value; summed in 16 bits one rank after another, each 1 + e rounds back to 1. So
  // the result says the sum was taken in float32 and rounded once. Element 1 holds r + 1
  // (exact either way); broadcast and all-gather must arrive bit for bit.
  for (DType dtype : {DType::BFloat16, DType::Float16}) {
    DYNAMIC_SECTION(dtype_name(dtype)) {
      const float half_spacing = dtype == DType::BFloat16 ? 1.0f / 256 : 1.0f / 2048;
      auto results = run_ranks(3, [dtype, half_spacing](RankContext& ctx) {
        auto pg = ctx.gloo();
        const int r = ctx.rank;
        const auto mine = [&](Shape shape) {
          const float first = r == 0 ? 1.0f : 0.75f * half_spacing;
          std::vector<float> v;
          for (int64_t i = 0; i < shape.numel(); ++i) v.push_back(i % 2 == 0 ? first : static_cast<float>(r + 1));
          return ops::to_dtype(from_vector(v, shape), dtype);
        };
        Tensor sum = mine(Shape{2}), avg = mine(Shape{2}), bcast = mine(Shape{2});
        pg->allreduce({sum})->wait();
        pg->allreduce({avg}, ReduceOp::Average)->wait();
        pg->broadcast({bcast}, 1)->wait();
        Tensor rs_out = empty(Shape{2}, dtype);
        pg->reduce_scatter(rs_out, mine(Shape{6}))->wait();
        Tensor ag_out = empty(Shape{6}, dtype);
        pg->all_gather(ag_out, mine(Shape{2}))->wait();
        Tensor ag_inplace = zeros(Shape{6}, dtype);
        ops::copy_(ops::narrow(ag_inplace, 0, 2 * r, 2), mine(Shape{2}));
        pg->all_gather(ag_inplace, ops::narrow(ag_inplace, 0, 2 * r, 2))->wait();
        for (const Tensor& t : {sum, avg, bcast, rs_out, ag_out, ag_inplace})
          MG_CHECK(t.dtype() == dtype, "a collective changed the dtype to {}", t.dtype());
        const auto report = [&](const char* name, const Tensor& t) { ctx.report(name, ops::to_dtype(t, DType::Float32)); };
        report("sum", sum);
        report("avg", avg);
        report("bcast", bcast);
        report("rs", rs_out);
        report("ag", ag_out);
        report("ag_inplace", ag_inplace);
      });
      INFO(describe(results));
      const float up = 1.0f + 2 * half_spacing;  // the next 16-bit value above 1
      const float e = 0.75f * half_spacing;
      for (const RankResult& res : results) {
        REQUIRE(res.ok());
        CHECK(res.floats("sum") == std::vector<float>{up, 6.0f});
        // The float32 sum times 1/3 (Gloo's average), rounded once to the 16-bit dtype.
        const Tensor mean32 = from_vector(std::vector<float>{(1.0f + 2 * e) * (1.0f / 3), 2.0f}, Shape{2});
        CHECK(res.floats("avg") == ops::to_dtype(ops::to_dtype(mean32, dtype), DType::Float32).to_vector<float>());
        CHECK(res.floats("bcast") == std::vector<float>{e, 2.0f});
        CHECK(res.floats("rs") == std::vector<float>{up, 6.0f});
        CHECK(res.floats("ag") == std::vector<float>{1.0f, 1.0f, e, 2.0f, e, 3.0f});
        CHECK(res.floats("ag_inplace") == std::vector<float>{1.0f, 1.0f, e, 2.0f, e, 3.0f});
      }
    }
  }
}

TEST_CASE("ProcessGroupGloo: a rank that dies during an all-gather fails the others at once") {
  auto results = run_ranks(2, [](RankContext& ctx) {
    ctx.start_together();
    auto pg = ctx.gloo(3s);
    Tensor out = empty(Shape{2 * 1000});
    pg->all_gather(out, full(Shape{1000}, 1.0))->wait();  // both alive: works
    if (ctx.rank == 1) ::raise(SIGKILL);
    const auto start = std::chrono::steady_clock::now();
    ctx.report("error", error_of([&] { pg->all_gather(out, full(Shape{1000}, 2.0))->wait(); }));
    ctx.report("seconds",
               std::vector<float>{
                   std::chrono::duration<float>(std::chrono::steady_clock::now() - start).count()});
    ctx.report("after",
               error_of([&] { pg->reduce_scatter(empty(Shape{1}), empty(Shape{2}))->wait(); }));
  });
  INFO(describe(results));
  REQUIRE(results[1].signal == SIGKILL);
  REQUIRE(results[0].ok());
  const std::string error = results[0].text("error");
  CHECK_THAT(error, MG_CONTAINS("ProcessGroupGloo: all_gather #1 (2 x 1000 float32 elements) "
                                "failed on rank 0 of 2"));
  CHECK_THAT(error, MG_CONTAINS("a peer rank died"));
  // Bounded: a dead peer's closed connection is noticed at once, well within the timeout.
  CHECK(results[0].floats("seconds")[0] < 3.0f);
  CHECK_THAT(results[0].text("after"),
             MG_CONTAINS("reduce_scatter #2 (sum of 2 float32 elements into 1) on rank 0 of 2 "
                         "was not run because an earlier collective or message failed"));
}

#endif  // MINIGRAD_WITH_GLOO
