#include <minigrad/parallel/pipeline/schedule.h>

#include <algorithm>

#include <fmt/format.h>

#include <minigrad/core/error.h>

namespace mg::parallel {

const char* schedule_name(Schedule schedule) {
  return schedule == Schedule::GPipe ? "gpipe" : "1f1b";
}

Schedule parse_schedule(std::string_view name) {
  if (name == "gpipe") return Schedule::GPipe;
  if (name == "1f1b") return Schedule::OneFOneB;
  MG_FAIL("unknown pipeline schedule '{}' (expected gpipe or 1f1b)", name);
}

std::vector<Action> stage_actions(Schedule schedule, int stage, int stages,
                                  int64_t micro_batches) {
  MG_CHECK(stages > 0 && stage >= 0 && stage < stages && micro_batches > 0,
           "stage_actions: stage {} of {} stages with {} micro-batches", stage, stages,
           micro_batches);
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
  std::string s;
  for (const Action& a : actions) {
    if (!s.empty()) s += ' ';
    s += fmt::format("{}{}", a.pass == Pass::Forward ? 'F' : 'B', a.micro_batch);
  }
  return s;
}

int64_t max_in_flight(Schedule schedule, int stage, int stages, int64_t micro_batches) {
  if (schedule == Schedule::GPipe) return micro_batches;
  return std::min<int64_t>(stages - stage, micro_batches);
}

double ideal_bubble_fraction(int stages, int64_t micro_batches) {
  return static_cast<double>(stages - 1) / static_cast<double>(micro_batches + stages - 1);
}

}  // namespace mg::parallel
