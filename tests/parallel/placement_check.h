// What the tests of the readers of placements share (tests/parallel in one process,
// tests/distributed across Gloo ranks): the tolerance of a distributed clip against the
// single-device one, derived from float32's rounding, and the comparison of every piece a
// rank holds with its part of a single-device tensor.
//
// The tolerance. u = 2^-24, float32's unit roundoff. The split and the single device sum
// the same squares in another order: over n elements the sum of squares moves by at most
// about n u of itself (a sequential sum's bound; the backends' sums are no worse), the root
// halves that, and the root, the division and the clamp add a few u: (n / 2 + 4) u on the
// norm. Before that the gradients themselves differ: each element is a sum of at most K
// products (a row layer's inputs, a batch's rows over the ranks) added in another order,
// at most K u of the tensor's scale apart. So
//   norm:                 |total - want| / want               <= (n / 2 + K + 4) u
//   each clipped tensor:  max |got - want| / max |want|        <= (n / 2 + 2 K + 6) u
// (a tensor's largest element is its scale: an element that cancels to nearly 0 is measured
// against it, as its rounding is). With n <= 400 and K <= 16 both stay below 1.6e-5.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <fmt/format.h>

#include <minigrad/minigrad.h>
#include <minigrad/parallel/placement.h>

namespace mg::testing {

constexpr double kUnitRoundoff = 1.0 / (1 << 24);

struct ClipTolerance {
  double norm = 0.0, gradient = 0.0;
};

// n: the elements of the single-device gradient; k: the most products summed in one element.
inline ClipTolerance clip_tolerance(int64_t n, int64_t k) {
  const double half_n = static_cast<double>(n) / 2.0, kk = static_cast<double>(k);
  return {(half_n + kk + 4.0) * kUnitRoundoff, (half_n + 2.0 * kk + 6.0) * kUnitRoundoff};
}

inline int64_t elements_of(const std::vector<nn::NamedTensor>& named) {
  int64_t n = 0;
  for (const auto& [name, t] : named) n += t.numel();
  return n;
}

// The largest normwise error, max |got - want| / max |want| per tensor, of every piece that
// `split` holds (its gradients when `grads`, else its values) against its part of the
// single-device tensors `whole` (by single-device name), and where it is.
struct PieceError {
  double worst = 0.0;
  std::string where = "nothing compared";
  int64_t compared = 0;
};

inline PieceError compare_pieces(const std::vector<nn::NamedTensor>& split, const std::map<std::string, Tensor>& whole,
                                 bool grads) {
  PieceError e;
  for (const auto& [name, t] : split) {
    const Tensor local = grads ? t.grad() : t;
    if (!local.defined()) continue;
    for (const parallel::ParameterPiece& piece : parallel::pieces_of(t, name)) {
      const auto it = whole.find(piece.name);
      if (it == whole.end()) {
        e.worst = INFINITY;
        e.where = fmt::format("no single-device tensor '{}'", piece.name);
        return e;
      }
      const Tensor want_whole = it->second.to(Device::cpu()).detach();
      std::vector<float> want, got;
      try {  // a wrong placement may not fit the single-device tensor at all
        want = parallel::local_part(piece, want_whole).contiguous().to_vector<float>();
        got = parallel::piece_values(piece, local.detach()).to(Device::cpu()).contiguous().to_vector<float>();
      } catch (const Error& error) {
        e.worst = INFINITY;
        e.where = error.what();
        return e;
      }
      double scale = 0.0;
      for (float v : want_whole.contiguous().to_vector<float>()) scale = std::max(scale, std::fabs(double(v)));
      for (size_t i = 0; i < got.size(); ++i) {
        ++e.compared;
        const double err = std::fabs(double(got[i]) - double(want[i])) / (scale > 0 ? scale : 1.0);
        if (!(err <= e.worst)) {
          e.worst = std::isnan(err) ? INFINITY : err;
          e.where = fmt::format("{}: element {} is {}, the single device's {}", piece.str(), i, got[i], want[i]);
        }
      }
    }
  }
  return e;
}

// name -> gradient (or value) of a single-device module.
inline std::map<std::string, Tensor> by_name(const nn::Module& m, bool grads) {
  std::map<std::string, Tensor> out;
  for (const auto& [name, p] : m.named_parameters()) out.emplace(name, grads ? p.grad() : p);
  return out;
}

}  // namespace mg::testing
