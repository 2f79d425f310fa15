// The pipeline schedules (the lists each stage follows), what they keep alive, counted
// by the schedule and by the allocator, and the timeline a step records.
#include "catch_compat.h"

#include <algorithm>
#include <fstream>

#include "core/host_backed_cuda.h"
#include "parallel/pipe_check.h"

using mg::Device;
using mg::Tensor;
using mg::parallel::Action;
using mg::parallel::actions_str;
using mg::parallel::Pass;
using mg::parallel::Schedule;
using mg::parallel::stage_actions;

TEST_CASE("schedules: GPipe fills and drains, 1F1B alternates after p - 1 - s forwards") {
  REQUIRE(actions_str(stage_actions(Schedule::GPipe, 0, 2, 4)) == "F0 F1 F2 F3 B3 B2 B1 B0");
  REQUIRE(actions_str(stage_actions(Schedule::OneFOneB, 0, 2, 4)) == "F0 F1 B0 F2 B1 F3 B2 B3");
  REQUIRE(actions_str(stage_actions(Schedule::OneFOneB, 1, 2, 4)) == "F0 B0 F1 B1 F2 B2 F3 B3");
  REQUIRE(actions_str(stage_actions(Schedule::OneFOneB, 0, 4, 6)) ==
          "F0 F1 F2 F3 B0 F4 B1 F5 B2 B3 B4 B5");
  // Fewer micro-batches than stages: the warm-up is cut short.
  REQUIRE(actions_str(stage_actions(Schedule::OneFOneB, 0, 4, 2)) == "F0 F1 B0 B1");
  REQUIRE(mg::parallel::ideal_bubble_fraction(2, 8) == Approx(1.0 / 9));
  REQUIRE(mg::parallel::ideal_bubble_fraction(4, 16) == Approx(3.0 / 19));
}

// Plays every stage's list against the others, as the Pipe's threads do: a forward
// waits for the previous stage's forward of that micro-batch, a backward for the next
// stage's backward. Every list must run to its end (no deadlock), the micro-batches
// must reach each stage in the order they left the one before (the hand-offs are
// queues), and a stage must never hold more than max_in_flight micro-batches.
TEST_CASE("schedules: every stage's list runs to its end, in queue order, within its in-flight bound") {
  for (Schedule schedule : {Schedule::GPipe, Schedule::OneFOneB})
    for (int p = 1; p <= 5; ++p)
      for (int64_t m = 1; m <= 9; ++m) {
        INFO(fmt::format("{} p={} m={}", mg::parallel::schedule_name(schedule), p, m));
        std::vector<std::vector<Action>> lists;
        for (int s = 0; s < p; ++s) lists.push_back(stage_actions(schedule, s, p, m));
        std::vector<size_t> next(static_cast<size_t>(p), 0);
        std::vector<std::vector<bool>> forward_done(p, std::vector<bool>(m, false)),
            backward_done(p, std::vector<bool>(m, false));
        std::vector<std::vector<int64_t>> forward_order(p), backward_order(p);
        std::vector<int64_t> alive(static_cast<size_t>(p), 0), most(static_cast<size_t>(p), 0);
        for (bool progress = true; progress;) {
          progress = false;
          for (int s = 0; s < p; ++s) {
            if (next[s] == lists[s].size()) continue;
            const Action a = lists[s][next[s]];
            const auto j = static_cast<size_t>(a.micro_batch);
            if (a.pass == Pass::Forward) {
              if (s > 0 && !forward_done[s - 1][j]) continue;
              forward_done[s][j] = true;
              forward_order[s].push_back(a.micro_batch);
              most[s] = std::max(most[s], ++alive[s]);
            } else {
              if (!forward_done[s][j] || (s + 1 < p && !backward_done[s + 1][j])) continue;
              backward_done[s][j] = true;
              backward_order[s].push_back(a.micro_batch);
              --alive[s];
            }
            ++next[s];
            progress = true;
          }
        }
        for (int s = 0; s < p; ++s) {
          REQUIRE(next[s] == lists[s].size());
          REQUIRE(static_cast<int64_t>(lists[s].size()) == 2 * m);
          REQUIRE(forward_order[s] == forward_order[0]);
          REQUIRE(backward_order[s] == backward_order[0]);
          REQUIRE(most[s] == mg::parallel::max_in_flight(schedule, s, p, m));
        }
      }
}

// The same play for the interleaved schedule, over virtual stages: rank r's chunk c is
// virtual stage c p + r of v p; a forward waits for the previous virtual stage's forward
// of that micro-batch (on the previous rank, or on the last rank's previous chunk for
// rank 0), a backward for the next virtual stage's backward. Every rank's list must run
// to its end, hold every (micro-batch, chunk) pass once, and keep at most max_in_flight
// micro-batch-chunks alive. (Hand-offs are matched by tag, not queued, so no order.)
TEST_CASE("schedules: interleaved 1F1B runs to its end on every rank, within its in-flight bound") {
  REQUIRE(actions_str(mg::parallel::rank_actions(Schedule::Interleaved1F1B, 0, 2, 2, 4)) ==
          "F0.0 F1.0 F0.1 F1.1 F2.0 B0.1 F3.0 B1.1 F2.1 B0.0 F3.1 B1.0 B2.1 B3.1 B2.0 B3.0");
  REQUIRE(actions_str(mg::parallel::rank_actions(Schedule::Interleaved1F1B, 1, 2, 2, 4)) ==
          "F0.0 F1.0 F0.1 B0.1 F1.1 B1.1 F2.0 B0.0 F3.0 B1.0 F2.1 B2.1 F3.1 B3.1 B2.0 B3.0");
  REQUIRE_THROWS_WITH(mg::parallel::rank_actions(Schedule::OneFOneB, 0, 2, 2, 4),
                      MG_CONTAINS("the 1f1b schedule runs one model chunk per rank, got 2"));
  REQUIRE(mg::parallel::parse_schedule("interleaved") == Schedule::Interleaved1F1B);
  REQUIRE(mg::parallel::ideal_bubble_fraction(4, 8, 2) == Approx(3.0 / 19));
  for (int p = 1; p <= 5; ++p)
    for (int v = 1; v <= 4; ++v)
      for (int64_t m = 1; m <= 11; ++m) {
        INFO(fmt::format("interleaved p={} v={} m={}", p, v, m));
        const int virtual_stages = p * v;
        std::vector<std::vector<Action>> lists;
        for (int r = 0; r < p; ++r)
          lists.push_back(mg::parallel::rank_actions(Schedule::Interleaved1F1B, r, p, v, m));
        std::vector<size_t> next(static_cast<size_t>(p), 0);
        // done[k][j]: virtual stage k's forward (or backward) of micro-batch j has run.
        std::vector<std::vector<int>> forward_done(virtual_stages, std::vector<int>(m, 0)),
            backward_done(virtual_stages, std::vector<int>(m, 0));
        std::vector<int64_t> alive(static_cast<size_t>(p), 0), most(static_cast<size_t>(p), 0);
        for (bool progress = true; progress;) {
          progress = false;
          for (int r = 0; r < p; ++r) {
            if (next[r] == lists[r].size()) continue;
            const Action a = lists[r][next[r]];
            const auto j = static_cast<size_t>(a.micro_batch);
            const int k = a.chunk * p + r;
            if (a.pass == Pass::Forward) {
              if (k > 0 && !forward_done[k - 1][j]) continue;
              ++forward_done[k][j];
              most[r] = std::max(most[r], ++alive[r]);
            } else {
              if (!forward_done[k][j] || (k + 1 < virtual_stages && !backward_done[k + 1][j])) continue;
              ++backward_done[k][j];
              --alive[r];
            }
            ++next[r];
            progress = true;
          }
        }
        for (int r = 0; r < p; ++r) {
          REQUIRE(next[r] == lists[r].size());
          REQUIRE(static_cast<int64_t>(lists[r].size()) == 2 * m * v);
          REQUIRE(most[r] == mg::parallel::max_in_flight(Schedule::Interleaved1F1B, r, p, m, v));
          // Whole groups: the fill plus the one forward before each backward.
          if (m <= p || m % p == 0)
            REQUIRE(most[r] == std::min<int64_t>(2 * (p - 1 - r) + (v - 1) * std::min<int64_t>(p, m) + 1, v * m));
        }
        for (int k = 0; k < virtual_stages; ++k)
          for (int64_t j = 0; j < m; ++j) {
            REQUIRE(forward_done[k][j] == 1);
            REQUIRE(backward_done[k][j] == 1);
          }
      }
}

// The schedules' bubble, on the ideal timeline (equal stages, free messages, backward
// twice the forward): GPipe's and 1F1B's (p - 1) / (m + p - 1); interleaving v chunks
// divides the fill and drain by v, (p - 1) / (v m + p - 1), when m is a multiple of p (or
// equal to it), and still beats 1F1B when it is not.
TEST_CASE("schedules: the ideal timeline's bubble is the formula's") {
  for (int p = 1; p <= 5; ++p)
    for (int64_t m = 1; m <= 10; ++m) {
      INFO(fmt::format("p={} m={}", p, m));
      for (Schedule schedule : {Schedule::GPipe, Schedule::OneFOneB})
        REQUIRE(mg::parallel::ideal_timeline(schedule, p, m).bubble_fraction() ==
                Approx(mg::parallel::ideal_bubble_fraction(p, m)));
      const double one_f_one_b = mg::parallel::ideal_bubble_fraction(p, m);
      for (int v = 2; v <= 4; ++v) {
        INFO(fmt::format("v={}", v));
        const double bubble =
            mg::parallel::ideal_timeline(Schedule::Interleaved1F1B, p, m, v).bubble_fraction();
        if (m % p == 0)
          REQUIRE(bubble == Approx(mg::parallel::ideal_bubble_fraction(p, m, v)));
        else
          REQUIRE(bubble <= one_f_one_b + 1e-12);
      }
    }
  const mg::parallel::PipeTimeline t = mg::parallel::ideal_timeline(Schedule::Interleaved1F1B, 4, 8, 2);
  REQUIRE(t.spans.size() == 4 * 8 * 2 * 2);
  REQUIRE(t.bubble_fraction() == Approx(3.0 / 19));
}

// Not part of the suite (hidden): the pictures of docs/gpt-pipeline.md, ideal timelines of
// 4 ranks and 8 micro-batches (a forward 1 ms, a backward 2 ms).
TEST_CASE("schedules: write docs/gpt-pipeline-*.svg", "[.][write-docs]") {
  const std::string docs = std::string(MINIGRAD_SOURCE_DIR) + "/docs/";
  const auto write = [&](const std::string& name, const std::string& svg) {
    std::ofstream(docs + name) << svg;
  };
  write("gpt-pipeline-1f1b.svg",
        mg::parallel::timeline_svg(mg::parallel::ideal_timeline(Schedule::OneFOneB, 4, 8, 1, 1e-3, 2e-3),
                                   "1F1B, 4 stages, 8 micro-batches: bubble 3/11 = 27%"));
  write("gpt-pipeline-interleaved.svg",
        mg::parallel::timeline_svg(
            mg::parallel::ideal_timeline(Schedule::Interleaved1F1B, 4, 8, 2, 1e-3, 2e-3),
            "interleaved 1F1B, 2 chunks per rank (chunk 1 lighter): bubble 3/19 = 16%"));
}

TEST_CASE("Pipe: 1F1B keeps at most p - s micro-batches alive per stage, GPipe all of them") {
  mg::manual_seed(41);
  for (int p : {2, 3, 4}) {
    for (Schedule schedule : {Schedule::GPipe, Schedule::OneFOneB}) {
      mg::parallel::PipeOptions options;
      options.chunks = 8;
      options.schedule = schedule;
      options.checkpoint = mg::parallel::Checkpoint::Never;
      mg::parallel::Pipe pipe(mg::testing::make_mlp({4, 6, 6, 6, 3}), mg::testing::cpus(p),
                              options);
      pipe.train_step(mg::randn({16, 4}), mg::randint(0, 3, {16}), mg::parallel::cross_entropy_loss);
      for (int s = 0; s < p; ++s)
        CHECK(pipe.last_max_stashed()[static_cast<size_t>(s)] ==
              (schedule == Schedule::GPipe ? 8 : p - s));
    }
  }
}

// The same bound, counted in bytes by each device's allocator: two stand-in GPUs (host
// memory, counted per device), one stage on each.
TEST_CASE("Pipe: the allocator sees 1F1B's activations bounded by p - s micro-batches, GPipe's grow with m") {
  mg::testing::ScopedHostBackedCuda stand_in;
  mg::manual_seed(42);
  const std::vector<Device> devices{Device::cuda(0), Device::cuda(1)};
  constexpr int64_t kRows = 64;  // per micro-batch
  auto run = [&](Schedule schedule, int64_t chunks) {
    mg::parallel::PipeOptions options;
    options.chunks = chunks;
    options.schedule = schedule;
    options.checkpoint = mg::parallel::Checkpoint::Never;
    options.check_memory = false;  // the dry run would count too
    mg::manual_seed(43);
    mg::parallel::Pipe pipe(mg::testing::make_mlp({32, 48, 48, 48, 48, 48, 48, 10}), devices,
                            options);
    const Tensor x = mg::randn({kRows * chunks, 32}).to(devices[0]);
    const Tensor y = mg::randint(0, 10, {kRows * chunks}).to(devices[1]);
    pipe.train_step(x, y, mg::parallel::cross_entropy_loss);  // makes the gradients, kept from here on
    std::vector<std::size_t> peak;
    std::vector<std::size_t> start;
    for (int d = 0; d < 2; ++d) {
      mg::testing::host_backed_memory(d).reset_peak();
      start.push_back(mg::testing::host_backed_memory(d).current_bytes());
    }
    pipe.zero_grad(/*set_to_none=*/false);
    pipe.train_step(x, y, mg::parallel::cross_entropy_loss);
    for (int d = 0; d < 2; ++d) peak.push_back(mg::testing::host_backed_memory(d).peak_bytes() - start[d]);
    return peak;
  };
  // One micro-batch: its activations and whatever its backward needs on top.
  const std::vector<std::size_t> one = run(Schedule::GPipe, 1);
  const std::vector<std::size_t> gpipe = run(Schedule::GPipe, 8);
  const std::vector<std::size_t> ofob = run(Schedule::OneFOneB, 8);
  // The last stage also keeps every micro-batch's output (64 x 10 floats) for the step's
  // gathered output, 7 more than the single micro-batch run; and the gradients it hands
  // back wait on its device until stage 0 takes them (1F1B lets it run at most two
  // ahead: it needs stage 0's next forward, which follows stage 0's next backward).
  const std::size_t outputs = 7 * kRows * 10 * sizeof(float);
  const std::size_t handoffs = 2 * kRows * 48 * sizeof(float);
  for (int s = 0; s < 2; ++s) {
    INFO(fmt::format("stage {}: one micro-batch {} B, GPipe m=8 {} B, 1F1B m=8 {} B", s, one[s],
                     gpipe[s], ofob[s]));
    CHECK(ofob[s] <= static_cast<std::size_t>(2 - s) * one[s] + (s == 1 ? outputs + handoffs : 0));
    CHECK(gpipe[s] > 2 * one[s]);
    CHECK(gpipe[s] > ofob[s]);
  }
}

TEST_CASE("Pipe: the timeline has a span per stage, micro-batch and pass, inside the step") {
  mg::manual_seed(44);
  mg::parallel::PipeOptions options;
  options.chunks = 5;
  options.schedule = Schedule::OneFOneB;
  mg::parallel::Pipe pipe(mg::testing::make_mlp({4, 8, 8, 3}), mg::testing::cpus(3), options);
  pipe.train_step(mg::randn({10, 4}), mg::randint(0, 3, {10}), mg::parallel::cross_entropy_loss);
  const mg::parallel::PipeTimeline t = pipe.last_timeline();
  REQUIRE(t.stages == 3);
  REQUIRE(t.spans.size() == 3 * 5 * 2);
  REQUIRE(t.windows.size() == 1);
  for (int s = 0; s < 3; ++s) {
    std::vector<std::string> order;
    for (const auto& span : t.spans) {
      if (span.stage != s) continue;
      order.push_back(fmt::format("{}{}", span.pass == Pass::Forward ? 'F' : 'B', span.micro_batch));
      REQUIRE(span.start >= t.windows[0].first);
      REQUIRE(span.end <= t.windows[0].second);
      REQUIRE(span.end >= span.start);
    }
    // Each stage's spans are its schedule, in order.
    REQUIRE(fmt::format("{}", fmt::join(order, " ")) ==
            actions_str(stage_actions(Schedule::OneFOneB, s, 3, 5)));
    REQUIRE(t.busy_fraction(s) > 0.0);
    REQUIRE(t.busy_fraction(s) <= 1.0);
  }
  const std::string svg = mg::parallel::timeline_svg(t, "three stages");
  REQUIRE(svg.find("<svg") == 0);
  REQUIRE(svg.find("three stages") != std::string::npos);
  REQUIRE(std::count(svg.begin(), svg.end(), '\n') > 30);

  // forward() and its backward: two windows, the backward spans in the second.
  options.schedule = Schedule::GPipe;
  mg::parallel::Pipe gpipe(mg::testing::make_mlp({4, 8, 3}), mg::testing::cpus(2), options);
  mg::cross_entropy(gpipe.forward(mg::randn({10, 4})), mg::randint(0, 3, {10})).backward();
  const mg::parallel::PipeTimeline g = gpipe.last_timeline();
  REQUIRE(g.windows.size() == 2);
  REQUIRE(g.spans.size() == 2 * 5 * 2);
  for (const auto& span : g.spans)
    if (span.pass == Pass::Backward) REQUIRE(span.start >= g.windows[1].first);
}
