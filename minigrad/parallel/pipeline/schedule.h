// Pipeline schedules: the order in which one stage runs the forward (F) and backward (B)
// passes of the micro-batches of a step. The in-process Pipe (pipe.h) and the
// multi-process PipelineStage (pipeline_stage.h) both follow these lists; everything
// else they do is moving tensors between stages.
//
// With p stages and m micro-batches, stage s of
//   GPipe (fill and drain):  F0 F1 ... F(m-1)  B(m-1) ... B1 B0
//     all m micro-batches' activations are alive when the first backward starts; the
//     backwards go last-first, as autograd runs them in torchgpipe, so the last
//     micro-batch's backward follows its forward at once (why checkpoint=except_last
//     spares it);
//   1F1B (PipeDream-flush):  p-1-s forwards to fill the pipe, then one forward and one
//     backward in turn, then the backwards that are left:
//       stage 0 of 2, m = 4:  F0  F1 B0  F2 B1  F3 B2  B3
//       stage 1 of 2, m = 4:  F0 B0  F1 B1  F2 B2  F3 B3
//     a stage holds at most p - s micro-batches' activations, whatever m is.
// Both have the same bubble (the share of a step a stage idles while the pipe fills
// and drains): (p - 1) / (m + p - 1) for stages of equal cost.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace mg::parallel {

enum class Schedule { GPipe, OneFOneB };
const char* schedule_name(Schedule schedule);  // "gpipe", "1f1b"
Schedule parse_schedule(std::string_view name);  // mg::Error naming the choices

enum class Pass { Forward, Backward };

// One entry of a stage's list: run `pass` of micro-batch `micro_batch`.
struct Action {
  Pass pass;
  int64_t micro_batch;
  bool operator==(const Action& o) const {
    return pass == o.pass && micro_batch == o.micro_batch;
  }
};

// The actions of stage `stage` (0-based) of `stages`, over `micro_batches` micro-batches.
std::vector<Action> stage_actions(Schedule schedule, int stage, int stages,
                                  int64_t micro_batches);

// "F0 F1 B0 ...": a list as the comment above writes it (tests, docs, errors).
std::string actions_str(const std::vector<Action>& actions);

// The most micro-batches whose activations a stage holds at once: m for GPipe,
// min(p - s, m) for 1F1B.
int64_t max_in_flight(Schedule schedule, int stage, int stages, int64_t micro_batches);

// The idle share of an ideal pipeline of equal stages: (p - 1) / (m + p - 1).
double ideal_bubble_fraction(int stages, int64_t micro_batches);

}  // namespace mg::parallel
