#include <minigrad/parallel/full_optimizer_state.h>

#include <charconv>
#include <cstring>
#include <unordered_map>

#include <fmt/format.h>

#include <minigrad/autograd/grad_mode.h>
#include <minigrad/core/ops.h>
#include <minigrad/parallel/piece_exchange.h>
#include <minigrad/parallel/placement.h>

namespace mg::parallel {

namespace {

// The pieces of optimizer parameter `i`, each named: by its spec, else by `named`.
std::vector<ParameterPiece> named_pieces(const optim::Optimizer& optimizer, size_t i,
                                         const std::unordered_map<const TensorImpl*, std::string>& names,
                                         const char* op) {
  const Tensor& p = optimizer.parameters()[i];
  const auto it = names.find(p.impl());
  std::vector<ParameterPiece> pieces = pieces_of(p, it == names.end() ? std::string() : it->second);
  for (const ParameterPiece& piece : pieces)
    MG_CHECK(!piece.name.empty(),
             "{}: {} parameter {} (shape {}) holds {} of no name: pass it among the named parameters, or record "
             "its single-device name (name_placements)", op, optimizer.name(), i, p.shape(), piece.str());
  return pieces;
}

std::unordered_map<const TensorImpl*, std::string> by_tensor(const std::vector<nn::NamedTensor>& named) {
  std::unordered_map<const TensorImpl*, std::string> out;
  for (const auto& [name, t] : named)
    if (t.defined()) out.emplace(t.impl(), name);
  return out;
}

bool same_values(const Tensor& a, const Tensor& b) {
  const Tensor x = ops::contiguous(ops::copy_to(a, Device::cpu())), y = ops::contiguous(ops::copy_to(b, Device::cpu()));
  return x.shape() == y.shape() && x.dtype() == y.dtype() && std::memcmp(x.data_ptr(), y.data_ptr(), x.nbytes()) == 0;
}

}  // namespace

OptimizerState full_optimizer_state(const optim::Optimizer& optimizer, const std::vector<nn::NamedTensor>& named,
                                    const std::shared_ptr<ProcessGroup>& world) {
  NoGradGuard no_grad;
  const auto names = by_tensor(named);
  std::vector<PieceValues> mine;
  for (size_t i = 0; i < optimizer.parameters().size(); ++i) {
    const Tensor& p = optimizer.parameters()[i];
    const std::vector<ParameterPiece> pieces = named_pieces(optimizer, i, names, "full_optimizer_state");
    for (const auto& [state, t] : optimizer.state(i)) {
      const bool placed = t.shape() == p.shape();  // one value per element of the parameter
      for (const ParameterPiece& piece : pieces) {
        if (!piece.counted_here()) continue;
        mine.push_back(PieceValues{state, piece, !placed, placed ? piece_values(piece, t) : t, 0});
      }
    }
  }
  OptimizerState out;
  for (auto& [key, whole] : assemble_pieces(all_gather_pieces(mine, world), "full_optimizer_state"))
    out[key.first].emplace(key.second, whole);
  return out;
}

void load_full_optimizer_state(optim::Optimizer& optimizer, const std::vector<nn::NamedTensor>& named,
                               const OptimizerState& state, const std::string& source) {
  NoGradGuard no_grad;
  const auto names = by_tensor(named);
  optim::TensorDict dict;  // "<state>.<i>" over the optimizer's own parameters
  std::vector<std::string> problems;
  for (size_t i = 0; i < optimizer.parameters().size(); ++i) {
    const Tensor& p = optimizer.parameters()[i];
    const std::vector<ParameterPiece> pieces = named_pieces(optimizer, i, names, "load_full_optimizer_state");
    // The state names of the first piece with state; every piece must have the same.
    const optim::TensorDict* first = nullptr;
    std::string first_name;
    for (const ParameterPiece& piece : pieces) {
      const auto it = state.find(piece.name);
      const optim::TensorDict* has = it == state.end() ? nullptr : &it->second;
      if (first == nullptr && has != nullptr) {
        first = has;
        first_name = piece.name;
      }
    }
    if (first == nullptr) continue;  // no state: as before its first step
    for (const auto& [sname, ignored] : *first) {
      Tensor local;
      for (const ParameterPiece& piece : pieces) {
        const auto it = state.find(piece.name);
        const Tensor* whole = nullptr;
        if (it != state.end()) {
          const auto s = it->second.find(sname);
          if (s != it->second.end()) whole = &s->second;
        }
        if (whole == nullptr) {
          problems.push_back(fmt::format("'{}' has no '{}', but '{}' does, and {} parameter {} holds pieces of both "
                                         "(a shard holds the state of all its pieces or of none)",
                                         piece.name, sname, first_name, optimizer.name(), i));
          continue;
        }
        if (whole->shape() == piece.shape) {  // placed as the parameter
          if (!local.defined()) local = zeros(p.shape(), whole->dtype(), p.device());
          try {
            ops::copy_(piece_values(piece, local), ops::view(local_part(piece, *whole), piece_values(piece, local).shape()));
          } catch (const Error& e) {
            problems.push_back(fmt::format("'{}' of '{}' cannot be placed: {}", sname, piece.name, e.what()));
          }
        } else if (whole->numel() != 1) {
          problems.push_back(fmt::format("'{}' of '{}' is {}: neither the parameter's shape {} nor one value", sname,
                                         piece.name, whole->shape(), piece.shape));
        } else if (!local.defined()) {  // one value for the whole tensor
          local = ops::clone(*whole);
        } else if (!same_values(local, *whole)) {
          problems.push_back(fmt::format("'{}' differs between '{}' and '{}', which {} parameter {} holds together",
                                         sname, first_name, piece.name, optimizer.name(), i));
        }
      }
      if (local.defined()) dict.emplace(fmt::format("{}.{}", sname, i), local);
    }
  }
  if (!problems.empty()) {
    std::string list;
    for (const std::string& p : problems) list += "\n  " + p;
    MG_FAIL("load_full_optimizer_state: {} does not fit {}'s parameters ({} problem{}):{}", source, optimizer.name(),
            problems.size(), problems.size() == 1 ? "" : "s", list);
  }
  optimizer.load_state_dict(dict, source);  // checked (shapes, dtypes, completeness) before any change
}

optim::TensorDict indexed_optimizer_state(const OptimizerState& state, const std::vector<std::string>& names) {
  std::map<std::string, size_t> index;
  for (size_t i = 0; i < names.size(); ++i) index.emplace(names[i], i);
  optim::TensorDict out;
  for (const auto& [name, dict] : state) {
    const auto it = index.find(name);
    MG_CHECK(it != index.end(), "indexed_optimizer_state: '{}' is not one of the {} parameters named", name,
             names.size());
    for (const auto& [sname, t] : dict) out.emplace(fmt::format("{}.{}", sname, it->second), t);
  }
  return out;
}

OptimizerState named_optimizer_state(const optim::TensorDict& state_dict, const std::vector<std::string>& names) {
  OptimizerState out;
  for (const auto& [key, t] : state_dict) {
    const auto dot = key.rfind('.');
    size_t i = 0;
    const char* end = key.data() + key.size();
    const bool ok = dot != std::string::npos && dot > 0 &&
                    std::from_chars(key.data() + dot + 1, end, i).ptr == end && dot + 1 < key.size();
    MG_CHECK(ok && i < names.size(), "named_optimizer_state: '{}' is not '<state>.<i>' with i below {}", key,
             names.size());
    out[names[i]].emplace(key.substr(0, dot), t);
  }
  return out;
}

}  // namespace mg::parallel
