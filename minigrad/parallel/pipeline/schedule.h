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
//
// Interleaved 1F1B (Megatron-LM's virtual pipeline, Narayanan et al. 2021): each rank
// holds v model chunks, rank r the chunks r, r + p, ..., r + (v-1)p of a model cut into
// v*p virtual stages, so a micro-batch goes round the ranks v times. A rank's forwards
// take the micro-batches in groups of p (the last group may be smaller): the group
// through chunk 0, the same group through chunk 1, ..., chunk v-1, then the next group;
// its backwards take the same groups with the chunks from v-1 down to 0. It runs
// 2(p-1-r) + (v-1)g forwards to fill the pipe (g: the first group's size, min(p, m)),
// then one forward and one backward in turn, then the backwards that are left (for m
// above p and not a multiple of it, the list of m rounded up to whole groups with the
// phantom micro-batches left out):
//   rank 0 of 2, v = 2, m = 4:  F0.0 F1.0 F0.1 F1.1 F2.0 B0.1 F3.0 B1.1 F2.1 B0.0 ...
// (F j.c: micro-batch j through the rank's chunk c.) Each piece of work is 1/v of a
// stage's, and the fill and drain take p - 1 of those pieces, not of whole stages, so
// the bubble shrinks to (p - 1) / (v m + p - 1) -- for one point-to-point message per
// chunk boundary more, v times as many as 1F1B sends.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace mg::parallel {

enum class Schedule { GPipe, OneFOneB, Interleaved1F1B };
const char* schedule_name(Schedule schedule);  // "gpipe", "1f1b", "interleaved"
Schedule parse_schedule(std::string_view name);  // mg::Error naming the choices

enum class Pass { Forward, Backward };

// One entry of a stage's list: run `pass` of micro-batch `micro_batch` through the
// rank's model chunk `chunk` (always 0 but for the interleaved schedule).
struct Action {
  Pass pass;
  int64_t micro_batch;
  int chunk = 0;
  bool operator==(const Action& o) const {
    return pass == o.pass && micro_batch == o.micro_batch && chunk == o.chunk;
  }
};

// The actions of stage `stage` (0-based) of `stages`, over `micro_batches` micro-batches;
// the interleaved schedule with one chunk per rank.
std::vector<Action> stage_actions(Schedule schedule, int stage, int stages,
                                  int64_t micro_batches);

// The actions of rank `rank` of `ranks`, each holding `model_chunks` chunks (virtual
// stages rank, rank + ranks, ...): the interleaved schedule; GPipe and 1F1B take one
// chunk only (mg::Error otherwise).
std::vector<Action> rank_actions(Schedule schedule, int rank, int ranks, int model_chunks,
                                 int64_t micro_batches);

// "F0 F1 B0 ...": a list as the comment above writes it (tests, docs, errors); a list
// with more than one chunk writes every action as "F<micro-batch>.<chunk>".
std::string actions_str(const std::vector<Action>& actions);

// The most micro-batch-chunks whose activations a rank holds at once: m for GPipe,
// min(p - s, m) for 1F1B; for interleaved (v chunks per rank) counted along its list
// (min(warm-up + 1, v m) when m is a multiple of p).
int64_t max_in_flight(Schedule schedule, int stage, int stages, int64_t micro_batches,
                      int model_chunks = 1);

// The idle share of an ideal pipeline of equal stages: (p - 1) / (m + p - 1); with v
// chunks per rank interleaved, (p - 1) / (v m + p - 1).
double ideal_bubble_fraction(int stages, int64_t micro_batches, int model_chunks = 1);

}  // namespace mg::parallel
