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
// The error of an element is |got - want| / max(|want|, 1e-3): relative, but absolute for
// values below 1e-3 (gradients near zero carry rounding noise of the size of the larger
// terms they sum). A row passes when no error exceeds tolerance(dtype).
#pragma once

#include <string>
#include <vector>

#include "parity/table.h"

namespace mg::parity {

struct Outcome {
  bool pass = false;
  double largest_error = 0.0;  // the largest error seen (over every step and tensor)
  std::string failure;         // what diverged first: configuration, step, tensor, error
  double seconds = 0.0;
};

// The largest error a row may show: 1e-4 for float32.
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
