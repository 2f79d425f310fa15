#include <minigrad/parallel/sharded/sharded_state.h>

#include <charconv>
#include <map>
#include <utility>

#include <minigrad/autograd/grad_mode.h>
#include <minigrad/core/ops.h>
#include <minigrad/parallel/c10d/same_model.h>

namespace mg::parallel {

namespace {

// "<name>.<index>", split at the last dot; false for anything else.
bool split_key(const std::string& key, std::string& name, size_t& index) {
  const auto dot = key.rfind('.');
  if (dot == std::string::npos || dot == 0 || dot + 1 == key.size()) return false;
  const char* begin = key.data() + dot + 1;
  const char* end = key.data() + key.size();
  const auto [ptr, ec] = std::from_chars(begin, end, index);
  if (ec != std::errc() || ptr != end) return false;
  name = key.substr(0, dot);
  return true;
}

bool same_values(const Tensor& a, const Tensor& b) {
  if (a.shape() != b.shape() || a.dtype() != b.dtype()) return false;
  if (a.dtype() == DType::Int64) return a.to_vector<int64_t>() == b.to_vector<int64_t>();
  return a.to_vector<float>() == b.to_vector<float>();
}

}  // namespace

nn::TensorDict gather_full_optimizer_state(const nn::TensorDict& sharded,
                                           const std::vector<const FlatParameter*>& groups,
                                           ProcessGroup& group) {
  // The same entries on every rank, or the gathers below would not pair up.
  const std::vector<nn::NamedTensor> entries(sharded.begin(), sharded.end());
  check_same_shapes_across_ranks(group, entries, "gather_full_optimizer_state");
  NoGradGuard no_grad;
  const bool root = group.rank() == 0;
  nn::TensorDict full;
  for (const auto& [key, state] : sharded) {
    std::string name;
    size_t g = 0;
    MG_CHECK(split_key(key, name, g) && g < groups.size(),
             "gather_full_optimizer_state: state '{}' is not '<name>.<shard>' with a shard "
             "index below {}",
             key, groups.size());
    const FlatParameter& flat = *groups[g];
    if (state.shape() == Shape{flat.layout().shard_numel}) {  // one value per element
      Tensor all = empty(Shape{flat.layout().padded_numel()}, state.dtype(), state.device());
      group.all_gather(all, ops::contiguous(state))->wait();
      if (!root) continue;
      for (size_t k = 0; k < flat.params().size(); ++k)
        full.emplace(fmt::format("{}.{}", name, flat.indices()[k]), ops::clone(flat.slot(all, k)));
    } else if (root) {  // one value for the whole group: every parameter gets it
      for (size_t k = 0; k < flat.params().size(); ++k)
        full.emplace(fmt::format("{}.{}", name, flat.indices()[k]), ops::clone(state));
    }
  }
  return full;
}

nn::TensorDict shard_full_optimizer_state(const nn::TensorDict& full,
                                          const std::vector<const FlatParameter*>& groups,
                                          const std::string& source) {
  std::map<size_t, std::pair<size_t, size_t>> where;  // parameter index -> (group, position)
  for (size_t g = 0; g < groups.size(); ++g)
    for (size_t k = 0; k < groups[g]->indices().size(); ++k)
      where[groups[g]->indices()[k]] = {g, k};

  std::vector<std::string> problems;
  std::map<std::pair<std::string, size_t>, std::vector<Tensor>> by_group;
  for (const auto& [key, state] : full) {
    std::string name;
    size_t index = 0;
    if (!split_key(key, name, index)) {
      problems.push_back(fmt::format("'{}' is not '<name>.<parameter index>'", key));
      continue;
    }
    const auto it = where.find(index);
    if (it == where.end()) {
      problems.push_back(fmt::format("'{}' names parameter {}, which is not one of the {} trained",
                                     key, index, where.size()));
      continue;
    }
    auto& slots = by_group[{name, it->second.first}];
    slots.resize(groups[it->second.first]->params().size());
    slots[it->second.second] = state;
  }

  NoGradGuard no_grad;
  nn::TensorDict sharded;
  for (const auto& [entry, states] : by_group) {
    const auto& [name, g] = entry;
    const FlatParameter& flat = *groups[g];
    const Device device = flat.shard().device();
    // A state is one value per element of its parameter (its shape and dtype: momentum,
    // exp_avg) or one value for the whole parameter (a single element: Adam's step), the
    // same kind for every parameter of the group; anything else is named by its key.
    bool complete = true, per_element = true, fits = true;
    for (size_t k = 0; k < states.size(); ++k) {
      const std::string key = fmt::format("{}.{}", name, flat.indices()[k]);
      const Tensor& param = flat.params()[k];
      if (!states[k].defined()) {
        problems.push_back(fmt::format(
            "parameter {} has no '{}' but other parameters of its shard group have one; a "
            "shard holds the state of all of them or of none",
            flat.indices()[k], name));
        complete = false;
        continue;
      }
      const bool element_wise = states[k].shape() == param.shape();
      const bool whole = states[k].numel() == 1 && !element_wise;
      if (!element_wise && !whole) {
        problems.push_back(fmt::format(
            "'{}' has shape {}, but parameter {} has shape {}; a state holds one value per "
            "element of its parameter or one for all of it",
            key, states[k].shape(), flat.indices()[k], param.shape()));
        fits = false;
      } else if (element_wise && states[k].dtype() != param.dtype() &&
                 !(is_reduced_float(param.dtype()) && states[k].dtype() == DType::Float32)) {
        // (A 16-bit parameter's state is float32: MasterWeights' masters and moments.)
        problems.push_back(fmt::format("'{}' is {}, but parameter {} is {}", key,
                                       states[k].dtype(), flat.indices()[k], param.dtype()));
        fits = false;
      } else if (k > 0 && states[0].defined() &&
                 (element_wise != (states[0].shape() == flat.params()[0].shape()) ||
                  states[k].dtype() != states[0].dtype())) {
        problems.push_back(fmt::format(
            "'{}' (shape {}, {}) is not the kind of state that '{}.{}' is (shape {}, {}) "
            "in one shard group",
            key, states[k].shape(), states[k].dtype(), name, flat.indices()[0],
            states[0].shape(), states[0].dtype()));
        fits = false;
      }
      per_element = per_element && element_wise;
    }
    if (!complete || !fits) continue;
    if (per_element) {
      Tensor all = zeros(Shape{flat.layout().padded_numel()}, states[0].dtype(), device);
      for (size_t k = 0; k < states.size(); ++k) ops::copy_(flat.slot(all, k), states[k]);
      const ShardLayout& layout = flat.layout();
      sharded.emplace(fmt::format("{}.{}", name, g),
                      ops::clone(ops::narrow(all, 0, layout.shard_begin(flat.rank()),
                                             layout.shard_numel)));
    } else {
      // Per-parameter state (Adam's step count): one value for the whole group, so every
      // parameter of it must hold the same. It stays where it is (Adam keeps it on the CPU).
      for (size_t k = 1; k < states.size(); ++k)
        if (!same_values(states[k], states[0]))
          problems.push_back(fmt::format(
              "'{}' differs between parameters {} and {} of one shard group (shape {} and {})",
              name, flat.indices()[0], flat.indices()[k], states[0].shape(), states[k].shape()));
      sharded.emplace(fmt::format("{}.{}", name, g), ops::clone(states[0]));
    }
  }
  if (!problems.empty()) {
    std::string list;
    for (const std::string& p : problems) list += "\n  " + p;
    MG_FAIL("shard_full_optimizer_state: {} does not fit the shards ({} problem{}):{}", source,
            problems.size(), problems.size() == 1 ? "" : "s", list);
  }
  return sharded;
}

}  // namespace mg::parallel
