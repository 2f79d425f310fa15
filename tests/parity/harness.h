// The parity harness: runs a row of the table (table.h) beside the plain single-device
// module on the same data, and compares the loss, every gradient and every parameter at
// every step.
//
// Each form reports what it holds, step by step: the loss (a rank reports its share, the
// shares add up to the whole batch's loss) and, after backward (and clipping) and again
// after the optimizer step, every gradient and parameter it keeps -- whole, or the piece
// of it this rank keeps (rows or columns for tensor parallelism, a range of the flattened
// tensor for a ZeRO or FSDP shard). Every piece is compared with the same piece of the
// plain module's tensor, and every element of every parameter and gradient must have been
// reported at every step, so a form cannot pass by reporting less.
//
// The reference is the plain module's step in float64. A float32 row's tolerance is
// derived per tensor: the plain module's own float32 step, against the float64 one, shows
// what float32 costs that tensor at that point of the run (its largest error over the
// tensor's elements, at least sqrt(N) roundings of the largest, N the rows a gradient sums);
// a form's largest error may be
// kFloat32Multiple times that. A float64 row's relative error |got - want| / max(|want|,
// 1e-3) must stay below kFloat64Tolerance. harness.cpp says why, beside the comparison.
#pragma once

#include <string>
#include <vector>

#include "parity/table.h"

namespace mg::parity {

struct Outcome {
  bool pass = false;
  double largest_error = 0.0;  // the largest error seen (over every step and tensor), as tolerance() measures it
  std::string failure;         // what diverged first: configuration, step, tensor, error
  double seconds = 0.0;
};

// Two float32 steps that round in different orders have errors of one size, not one
// value: over the table, under each of OpenBLAS's six x86-64 kernel sets
// (tests/parity/coretype_sweep.sh), a form's largest error was at most 2.7 times the plain
// float32 step's (docs/parity.md lists each row's). 8 leaves a factor of 3 for kernels not
// seen here; a fault (a gradient halved, a sum skipped) is an error of the size of the
// value, which reads millions of times the float32 error.
constexpr double kFloat32Multiple = 8;
// A float64 row's sums rounded in another order: relative errors of 1e-14 are seen; 1e-9
// leaves room for AdamW's division of a near-zero gradient by its own size, and a fault's
// error is of the order of the value.
constexpr double kFloat64Tolerance = 1e-9;

// The largest error a row may show: kFloat32Multiple for float32 (a multiple of the plain
// float32 step's error), kFloat64Tolerance for float64 (relative).
double tolerance(DType dtype);

// Runs one row (multi-rank rows fork their Gloo ranks on loopback). Never throws: an
// error inside the form is a failed Outcome naming it.
Outcome run_row(const Config& config);

// Rows of these forms only (all of them when `forms` is empty), of `model` only ("MLP",
// "GPT"; every model when empty).
std::vector<Config> rows_of(const std::vector<Form>& forms, const std::string& model = "");

// docs/parity.md: the rows, each with its outcome and the faults it catches (`caught[i]`,
// names of faults; empty when the row catches none), and how long the table took.
std::string markdown(const std::vector<Config>& rows, const std::vector<Outcome>& outcomes,
                     const std::vector<std::vector<std::string>>& caught, double seconds);

}  // namespace mg::parity
