#include <minigrad/parallel/full_state_dict.h>

#include <fmt/format.h>

#include <minigrad/autograd/grad_mode.h>
#include <minigrad/core/ops.h>
#include <minigrad/parallel/piece_exchange.h>
#include <minigrad/parallel/placement.h>

namespace mg::parallel {

nn::TensorDict full_state_dict(const std::vector<nn::NamedTensor>& named,
                               const std::shared_ptr<ProcessGroup>& world) {
  NoGradGuard no_grad;
  std::vector<PieceValues> mine;
  for (const auto& [name, t] : named) {
    MG_CHECK(t.defined(), "full_state_dict: '{}' is an undefined tensor", name);
    for (const ParameterPiece& piece : pieces_of(t, name))
      if (piece.counted_here()) mine.push_back(PieceValues{"", piece, false, piece_values(piece, t.detach()), 0});
  }
  nn::TensorDict out;
  for (auto& [key, whole] : assemble_pieces(all_gather_pieces(mine, world), "full_state_dict"))
    out.emplace(key.first, whole);
  return out;
}

nn::TensorDict full_state_dict(const std::vector<nn::NamedTensor>& named, const DeviceMesh& mesh) {
  return full_state_dict(named, mesh.world());
}

void load_full_state_dict(const std::vector<nn::NamedTensor>& named, const nn::TensorDict& full,
                          const std::string& source) {
  NoGradGuard no_grad;
  // First every part, checked; then the writes, so a bad dict changes nothing.
  std::vector<std::pair<Tensor, Tensor>> writes;  // (where, what)
  std::vector<std::string> problems;
  for (const auto& [name, t] : named) {
    MG_CHECK(t.defined(), "load_full_state_dict: '{}' is an undefined tensor", name);
    for (const ParameterPiece& piece : pieces_of(t, name)) {
      const auto it = full.find(piece.name);
      if (it == full.end()) {
        problems.push_back(fmt::format("'{}' is missing ({} on one device)", piece.name, piece.shape));
        continue;
      }
      const Tensor& whole = it->second;
      if (whole.shape() != piece.shape || whole.dtype() != t.dtype()) {
        problems.push_back(fmt::format("'{}' is {} ({}), but the model's is {} ({})", piece.name, whole.shape(),
                                       whole.dtype(), piece.shape, t.dtype()));
        continue;
      }
      try {
        writes.emplace_back(piece_values(piece, t.detach()), local_part(piece, whole));
      } catch (const Error& e) {  // a placement that does not divide, a range outside
        problems.push_back(fmt::format("'{}' cannot be placed: {}", piece.name, e.what()));
      }
    }
  }
  if (!problems.empty()) {
    std::string list;
    for (const std::string& p : problems) list += "\n  " + p;
    MG_FAIL("load_full_state_dict: {} does not fit this rank's tensors ({} problem{}):{}", source,
            problems.size(), problems.size() == 1 ? "" : "s", list);
  }
  for (auto& [where, what] : writes) ops::copy_(where, ops::view(what, where.shape()));
}

}  // namespace mg::parallel
