// The options of cross_entropy (and nn::CrossEntropyLoss), as PyTorch's
// F::CrossEntropyFuncOptions: which target value marks a row to ignore, how much of
// each target's probability is smoothed over all classes, and how the row losses are
// reduced. Chained as in libtorch:
//
//   mg::cross_entropy(logits, targets,
//                     mg::CrossEntropyOptions().ignore_index(-1).label_smoothing(0.1));
//
// With C classes, smoothing eps, and a row i whose target t_i is not ignore_index:
//
//   loss_i = (1 - eps) * (-log p_i[t_i]) + eps / C * sum_j (-log p_i[j]),  p = softmax
//
// Rows whose target is ignore_index have no loss (0 in Reduction::None) and no
// gradient; Reduction::Mean divides the sum by the number of rows not ignored, so a
// batch where every row is ignored has a NaN mean (0 / 0), as in PyTorch. Any other
// target outside [0, C) is an mg::Error.
#pragma once

#include <cstdint>

namespace mg {

enum class Reduction { None, Mean, Sum };

inline const char* reduction_name(Reduction r) {
  switch (r) {
    case Reduction::None: return "none";
    case Reduction::Mean: return "mean";
    case Reduction::Sum: return "sum";
  }
  return "?";
}

class CrossEntropyOptions {
 public:
  CrossEntropyOptions& ignore_index(int64_t v) { ignore_index_ = v; return *this; }
  CrossEntropyOptions& label_smoothing(double v) { label_smoothing_ = v; return *this; }
  CrossEntropyOptions& reduction(Reduction v) { reduction_ = v; return *this; }

  int64_t ignore_index() const { return ignore_index_; }
  double label_smoothing() const { return label_smoothing_; }  // in [0, 1]
  Reduction reduction() const { return reduction_; }

 private:
  int64_t ignore_index_ = -100;
  double label_smoothing_ = 0.0;
  Reduction reduction_ = Reduction::Mean;
};

}  // namespace mg
