#include <minigrad/parallel/pipeline/schedule.h>

#include <algorithm>

#include <fmt/format.h>

#include <minigrad/core/error.h>

namespace mg::parallel {

const char* schedule_name(Schedule schedule) {
  switch (schedule) {
    case Schedule::GPipe: return "gpipe";
    case Schedule::OneFOneB: return "1f1b";
    case Schedule::Interleaved1F1B: return "interleaved";
  }
  return "?";
}

Schedule parse_schedule(std::string_view name) {
  if (name == "gpipe") return Schedule::GPipe;
  if (name == "1f1b") return Schedule::OneFOneB;
  if (name == "interleaved") return Schedule::Interleaved1F1B;
  MG_FAIL("unknown pipeline schedule '{}' (expected gpipe, 1f1b or interleaved)", name);
}

namespace {

// The interleaved schedule's fill: 2(p-1-r) forwards so that rank r's first backward
// meets the last rank's, plus (v-1) g to run the first group through the chunks before
// the last (g = min(p, m), the first group's size).
int64_t interleaved_warmup(int rank, int ranks, int model_chunks, int64_t micro_batches) {
  const int64_t group = std::min<int64_t>(ranks, micro_batches);
  return std::min<int64_t>(2 * (ranks - 1 - rank) + (model_chunks - 1) * group,
                           model_chunks * micro_batches);
}

// Megatron's order of a rank's forwards (backward: chunks from v-1 down): micro-batches
// in groups of p, each group through every chunk before the next group starts.
std::vector<Action> interleaved_order(Pass pass, int ranks, int model_chunks,
                                      int64_t micro_batches) {
  std::vector<Action> order;
  for (int64_t start = 0; start < micro_batches; start += ranks) {
    const int64_t end = std::min<int64_t>(start + ranks, micro_batches);
    for (int k = 0; k < model_chunks; ++k) {
      const int chunk = pass == Pass::Forward ? k : model_chunks - 1 - k;
      for (int64_t j = start; j < end; ++j) order.push_back({pass, j, chunk});
    }
  }
  return order;
}

std::vector<Action> interleaved_actions(int rank, int ranks, int model_chunks,
                                        int64_t micro_batches) {
  // A last group smaller than p breaks the fill's arithmetic (p = 4, v = 3, m = 5
  // deadlocks), so the list is made for m rounded up to whole groups and the phantom
  // micro-batches' actions are dropped: no real action waits for a phantom one, so the
  // real ones keep an order that runs (tests/parallel/pipe_schedule_test.cpp plays them).
  const int64_t padded = micro_batches <= ranks
                             ? micro_batches
                             : (micro_batches + ranks - 1) / ranks * ranks;
  const std::vector<Action> forwards = interleaved_order(Pass::Forward, ranks, model_chunks, padded);
  const std::vector<Action> backwards = interleaved_order(Pass::Backward, ranks, model_chunks, padded);
  const int64_t warmup = interleaved_warmup(rank, ranks, model_chunks, padded);
  std::vector<Action> all(forwards.begin(), forwards.begin() + warmup);
  size_t f = static_cast<size_t>(warmup), b = 0;
  while (f < forwards.size()) {
    all.push_back(forwards[f++]);
    all.push_back(backwards[b++]);
  }
  while (b < backwards.size()) all.push_back(backwards[b++]);
  std::vector<Action> actions;
  for (const Action& a : all)
    if (a.micro_batch < micro_batches) actions.push_back(a);
  return actions;
}

}  // namespace

std::vector<Action> rank_actions(Schedule schedule, int rank, int ranks, int model_chunks,
                                 int64_t micro_batches) {
  MG_CHECK(ranks > 0 && rank >= 0 && rank < ranks && micro_batches > 0 && model_chunks > 0,
           "rank_actions: rank {} of {} ranks, {} model chunks each, with {} micro-batches",
           rank, ranks, model_chunks, micro_batches);
  if (schedule == Schedule::Interleaved1F1B)
    return interleaved_actions(rank, ranks, model_chunks, micro_batches);
  MG_CHECK(model_chunks == 1,
           "the {} schedule runs one model chunk per rank, got {}; interleaving chunks is "
           "the interleaved schedule's",
           schedule_name(schedule), model_chunks);
  return stage_actions(schedule, rank, ranks, micro_batches);
}

std::vector<Action> stage_actions(Schedule schedule, int stage, int stages,
                                  int64_t micro_batches) {
  MG_CHECK(stages > 0 && stage >= 0 && stage < stages && micro_batches > 0,
           "stage_actions: stage {} of {} stages with {} micro-batches", stage, stages,
           micro_batches);
  if (schedule == Schedule::Interleaved1F1B)
    return interleaved_actions(stage, stages, 1, micro_batches);
  std::vector<Action> actions;
  actions.reserve(static_cast<size_t>(2 * micro_batches));
  if (schedule == Schedule::GPipe) {
    for (int64_t j = 0; j < micro_batches; ++j) actions.push_back({Pass::Forward, j});
    for (int64_t j = micro_batches - 1; j >= 0; --j) actions.push_back({Pass::Backward, j});
    return actions;
  }
  // 1F1B: the later a stage, the sooner its first backward can start.
  const int64_t warmup = std::min<int64_t>(stages - 1 - stage, micro_batches);
  int64_t next_forward = 0, next_backward = 0;
  while (next_forward < warmup) actions.push_back({Pass::Forward, next_forward++});
  while (next_forward < micro_batches) {
    actions.push_back({Pass::Forward, next_forward++});
    actions.push_back({Pass::Backward, next_backward++});
  }
  while (next_backward < micro_batches) actions.push_back({Pass::Backward, next_backward++});
  return actions;
}

std::string actions_str(const std::vector<Action>& actions) {
  const bool chunks = std::any_of(actions.begin(), actions.end(),
                                  [](const Action& a) { return a.chunk != 0; });
  std::string s;
  for (const Action& a : actions) {
    if (!s.empty()) s += ' ';
    s += fmt::format("{}{}", a.pass == Pass::Forward ? 'F' : 'B', a.micro_batch);
    if (chunks) s += fmt::format(".{}", a.chunk);
  }
  return s;
}

int64_t max_in_flight(Schedule schedule, int stage, int stages, int64_t micro_batches,
                      int model_chunks) {
  if (schedule == Schedule::GPipe) return micro_batches;
  if (schedule == Schedule::Interleaved1F1B) {  // counted along the list
    int64_t alive = 0, most = 0;
    for (const Action& a : interleaved_actions(stage, stages, model_chunks, micro_batches))
      most = std::max(most, alive += a.pass == Pass::Forward ? 1 : -1);
    return most;
  }
  return std::min<int64_t>(stages - stage, micro_batches);
}

double ideal_bubble_fraction(int stages, int64_t micro_batches, int model_chunks) {
  return static_cast<double>(stages - 1) /
         static_cast<double>(model_chunks * micro_batches + stages - 1);
}

}  // namespace mg::parallel
