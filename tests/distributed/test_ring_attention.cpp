// Ring attention (parallel/context_parallel/) on 1, 2 and 3 Gloo ranks: each rank's
// sequence shard attends round the ring, and the output and dq, dk, dv, gathered back in
// global order, equal scaled_dot_product_attention on the whole sequence (float64, odd
// head sizes, causal and not). A wrong causal mask across ring steps (every off-diagonal
// block taken as full) must fail that comparison; impossible splits are clear errors.
#ifdef MINIGRAD_WITH_GLOO

#include <algorithm>
#include <cmath>

#include "catch_compat.h"
#include "multiprocess.h"

#include <minigrad/autograd/functions.h>
#include <minigrad/core/fault_injection.h>
#include <minigrad/core/generator.h>
#include <minigrad/core/ops.h>
#include <minigrad/parallel/context_parallel/ring_attention.h>
#include <minigrad/parallel/context_parallel/sequence_layout.h>

using namespace mg;
using namespace mg::parallel;
using namespace mg::parallel::context_parallel;
using namespace mg::test;

namespace {

double max_abs_diff(const Tensor& a, const Tensor& b) {
  MG_CHECK(a.shape() == b.shape(), "shapes differ: {} vs {}", a.shape(), b.shape());
  const std::vector<double> x = to(contiguous(a), DType::Float64).to_vector<double>();
  const std::vector<double> y = to(contiguous(b), DType::Float64).to_vector<double>();
  double worst = 0.0;
  for (size_t i = 0; i < x.size(); ++i) worst = std::max(worst, std::abs(x[i] - y[i]));
  return worst;
}

struct Case {
  int64_t B, H, chunk, D;
  bool causal;
};

// One comparison on this rank: the worst difference of out, dq, dk, dv (gathered) from
// the whole-sequence attention every rank also computes itself.
double compare(RankContext& ctx, const std::shared_ptr<ProcessGroup>& group, const Case& c,
               uint64_t seed) {
  const int cp = group->size();
  const int64_t T = 2 * cp * c.chunk;
  manual_seed(seed);  // the same whole tensors on every rank
  const Shape shape{c.B, c.H, T, c.D};
  const Tensor q = to(randn(shape), DType::Float64), k = to(randn(shape), DType::Float64),
               v = to(randn(shape), DType::Float64), w = to(randn(shape), DType::Float64);

  Tensor qf = q.detach(), kf = k.detach(), vf = v.detach();
  for (Tensor* t : {&qf, &kf, &vf}) t->set_requires_grad(true);
  const Tensor whole = scaled_dot_product_attention(qf, kf, vf, c.causal);
  sum(whole * w).backward();

  Tensor ql = shard_sequence(q, ctx.rank, cp, 2), kl = shard_sequence(k, ctx.rank, cp, 2),
         vl = shard_sequence(v, ctx.rank, cp, 2);
  for (Tensor* t : {&ql, &kl, &vl}) t->set_requires_grad(true);
  const Tensor local = ring_attention(ql, kl, vl, group, c.causal);
  sum(local * shard_sequence(w, ctx.rank, cp, 2)).backward();

  return std::max({max_abs_diff(gather_sequence(local, *group, 2), whole),
                   max_abs_diff(gather_sequence(ql.grad(), *group, 2), qf.grad()),
                   max_abs_diff(gather_sequence(kl.grad(), *group, 2), kf.grad()),
                   max_abs_diff(gather_sequence(vl.grad(), *group, 2), vf.grad())});
}

const std::vector<Case> kCases = {
    {2, 3, 2, 5, true}, {2, 3, 2, 5, false}, {1, 2, 3, 7, true}, {3, 1, 1, 3, true},
    {1, 2, 3, 4, false}};

void run_for(int cp) {
  auto results = run_ranks(cp, [](RankContext& ctx) {
    auto group = ctx.gloo();
    for (size_t i = 0; i < kCases.size(); ++i)
      ctx.report(fmt::format("case {}", i),
                 std::vector<float>{static_cast<float>(compare(ctx, group, kCases[i], 10 + i))});
    {
      testing::FaultGuard fault(testing::Fault::RingAttentionFutureBlocksSeen);
      ctx.report("wrong mask", std::vector<float>{static_cast<float>(
                                   compare(ctx, group, {2, 3, 2, 5, true}, 99))});
    }
    // A local sequence that is not two equal chunks.
    std::string error = "no error";
    try {
      const Tensor odd = to(randn({1, 2, 3, 4}), DType::Float64);
      ring_attention(odd, odd, odd, group, true);
    } catch (const Error& e) {
      error = e.what();
    }
    ctx.report("odd local error", error);
  });
  INFO(describe(results));
  for (const RankResult& r : results) {
    REQUIRE(r.ok());
    for (size_t i = 0; i < kCases.size(); ++i) {
      INFO("cp " << cp << ", rank " << r.rank << ", case " << i);
      REQUIRE(r.floats(fmt::format("case {}", i))[0] < 1e-12f);
    }
    REQUIRE(r.text("odd local error").find("a rank holds two equal sequence chunks, but its q "
                                           "has 3 positions (shape [1, 2, 3, 4])") !=
            std::string::npos);
  }
  // The fault shows on the ranks whose queries hold an early chunk: rank 0 sees chunk 2cp-1.
  REQUIRE(results[0].floats("wrong mask")[0] > 1e-2f);
}

}  // namespace

TEST_CASE("ring attention on 1 Gloo rank (a ring of one, no messages) equals attention", "[ring_attention]") {
  run_for(1);
}

TEST_CASE("ring attention on 2 Gloo ranks equals attention on the whole sequence", "[ring_attention]") {
  run_for(2);
}

TEST_CASE("ring attention on 3 Gloo ranks equals attention on the whole sequence", "[ring_attention]") {
  run_for(3);
}

TEST_CASE("ring attention: with the balanced layout every rank computes the same at every step", "[ring_attention]") {
  for (int cp : {1, 2, 3, 4, 8}) {
    int64_t total = 0;
    for (int rank = 0; rank < cp; ++rank) {
      const std::vector<RingStepWork> steps = ring_attention_work(rank, cp, true);
      REQUIRE(steps.size() == static_cast<size_t>(cp));
      // Step 0: the rank's own block, two diagonals and one full pair; later steps: two
      // full pairs (one query chunk sees both key chunks, or both query chunks one).
      REQUIRE(steps[0].full == 1);
      REQUIRE(steps[0].causal == 2);
      for (int s = 1; s < cp; ++s) {
        INFO("cp " << cp << ", rank " << rank << ", step " << s);
        REQUIRE(steps[static_cast<size_t>(s)].full == 2);
        REQUIRE(steps[static_cast<size_t>(s)].causal == 0);
      }
      for (const RingStepWork& w : steps) total += 2 * w.full + w.causal;
      for (const RingStepWork& w : ring_attention_work(rank, cp, false)) {
        REQUIRE(w.full == 4);
        REQUIRE(w.causal == 0);
      }
    }
    // In half-pair units (a full pair 2, a diagonal 1), what the causal mask leaves of the
    // (2 cp)^2 pairs: 2 cp (2 cp - 1) / 2 full ones and 2 cp diagonals, (2 cp)^2 in all.
    REQUIRE(total == (2 * cp) * (2 * cp));
  }
}

TEST_CASE("context parallel layout: chunks, positions, and sequences that do not split", "[ring_attention]") {
  REQUIRE(chunks_of_rank(0, 2) == std::vector<int64_t>{0, 3});
  REQUIRE(chunks_of_rank(1, 3) == std::vector<int64_t>{1, 4});
  REQUIRE(sequence_positions(8, 0, 2).to_vector<int64_t>() == std::vector<int64_t>{0, 1, 6, 7});
  REQUIRE(sequence_positions(12, 2, 3).to_vector<int64_t>() ==
          std::vector<int64_t>{4, 5, 6, 7});
  const Tensor x = arange(10.0).reshape({1, 10});
  REQUIRE(shard_sequence(x, 0, 1).to_vector<int64_t>() == x.to_vector<int64_t>());
  REQUIRE(shard_sequence(arange(12.0).reshape({1, 12}), 0, 3).to_vector<int64_t>() ==
          std::vector<int64_t>{0, 1, 10, 11});
  const Tensor q = randn({1, 2, 4, 3});
  REQUIRE_THROWS_WITH(ring_attention_function(nullptr)(q, q, q, 0.1),
                      MG_CONTAINS("ring_attention: no attention dropout under context "
                                  "parallelism, got dropout_p 0.1"));
  REQUIRE_THROWS_WITH(ring_attention(q, q, q, nullptr, true),
                      MG_CONTAINS("ring_attention: the context-parallel group is null"));
  REQUIRE_THROWS_WITH(shard_sequence(x, 0, 3),
                      MG_CONTAINS(
                          "shard_sequence: a sequence of length 10 does not cut into 2 * cp = 6 "
                          "equal chunks (cp = 3)"));
  REQUIRE_THROWS_WITH(sequence_positions(7, 0, 2),
                      MG_CONTAINS("a sequence of length 7 does not cut "
                                                         "into 2 * cp = 4 equal chunks"));
}

#endif  // MINIGRAD_WITH_GLOO
