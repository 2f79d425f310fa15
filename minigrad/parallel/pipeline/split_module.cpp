// split_module (split_module.h): where each module of a model goes, the stages' copies and
// the tied copies' placements.
#include <minigrad/parallel/pipeline/split_module.h>

#include <algorithm>
#include <map>
#include <set>
#include <utility>

#include <fmt/format.h>

#include <minigrad/parallel/pipeline/balance.h>
#include <minigrad/parallel/placement.h>

namespace mg::parallel {
namespace {

// The module at dotted `name` ("" is the model itself), or null.
const nn::Module* find_module(const nn::Module& root, const std::string& name) {
  if (name.empty()) return &root;
  const nn::Module* m = &root;
  size_t start = 0;
  while (m != nullptr && start <= name.size()) {
    const size_t dot = std::min(name.find('.', start), name.size());
    const std::string part = name.substr(start, dot - start);
    m = m->has_child(part) ? m->child(part).get() : nullptr;
    start = dot + 1;
  }
  return m;
}

std::string join(const std::string& prefix, const std::string& name) {
  return prefix.empty() ? name : prefix + "." + name;
}

bool is_under(const std::string& name, const std::string& module) {
  return name == module || name.rfind(module + ".", 0) == 0;
}

// Where a cut puts the model's modules.
struct Layout {
  int stages = 1;
  std::string container;              // the split points' parent ("" for the model itself)
  std::vector<std::string> children;  // the container's children, in order
  std::vector<size_t> first;          // stage s starts at children[first[s]]
  std::vector<std::string> before, after;  // beside the path to the container: first, last stage

  int stage_of_child(size_t index) const {
    int s = 0;
    while (s + 1 < stages && first[static_cast<size_t>(s + 1)] <= index) ++s;
    return s;
  }
};

Layout layout_of(const nn::Module& model, const std::vector<std::string>& points) {
  Layout out;
  out.stages = static_cast<int>(points.size()) + 1;
  if (points.empty()) return out;
  const std::string& type = model.type_name();
  for (const std::string& point : points)
    MG_CHECK(!point.empty() && find_module(model, point) != nullptr,
             "split_module: the split point '{}' names no module of {}", point, type);
  const auto parent_of = [](const std::string& name) {
    const size_t dot = name.rfind('.');
    return dot == std::string::npos ? std::string() : name.substr(0, dot);
  };
  out.container = parent_of(points.front());
  for (const std::string& point : points)
    MG_CHECK(parent_of(point) == out.container,
             "split_module: the split points '{}' and '{}' are not children of one module; the points "
             "cut one container of {} (a Sequential or ModuleList), each naming a child",
             points.front(), point, type);
  const nn::Module& container = *find_module(model, out.container);
  const std::string container_name = out.container.empty() ? type : out.container;
  for (const auto& [name, child] : container.named_children()) out.children.push_back(name);
  MG_CHECK(out.children.size() >= static_cast<size_t>(out.stages),
           "split_module: {} split points make {} stages, but {} has {} modules; every stage holds at "
           "least one", points.size(), out.stages, container_name, out.children.size());
  out.first.push_back(0);
  for (const std::string& point : points) {
    const std::string leaf = point.substr(out.container.empty() ? 0 : out.container.size() + 1);
    const size_t index = static_cast<size_t>(
        std::find(out.children.begin(), out.children.end(), leaf) - out.children.begin());
    MG_CHECK(index > 0, "split_module: the split point '{}' is the first of {}'s modules: stage 0 would "
             "hold none of them", point, container_name);
    MG_CHECK(index > out.first.back(),
             "split_module: the split points are out of order: '{}' comes before '{}' in {}; give the "
             "first module of each stage in the model's order", point,
             join(out.container, out.children[out.first.back()]), container_name);
    out.first.push_back(index);
  }
  // The path from the model to the container: what stands before it goes first, after it last.
  const nn::Module* m = &model;
  std::string prefix;
  size_t start = 0;
  while (true) {
    const auto own = m->named_parameters(/*recurse=*/false);
    MG_CHECK(own.empty(), "split_module: {} holds a parameter of its own ('{}'), above the split points: a "
             "cut by module names keeps or drops whole child modules, and would copy it to every stage",
             prefix.empty() ? type : prefix, join(prefix, own.front().first));
    if (prefix == out.container) break;
    const size_t dot = std::min(out.container.find('.', start), out.container.size());
    const std::string next = out.container.substr(start, dot - start);
    bool seen = false;
    for (const auto& [name, child] : m->named_children()) {
      if (name == next) seen = true;
      else (seen ? out.after : out.before).push_back(join(prefix, name));
    }
    prefix = join(prefix, next);
    m = m->child(next).get();
    start = dot + 1;
  }
  return out;
}

int stage_in(const Layout& layout, const std::string& name, const std::string& model_type) {
  if (layout.stages == 1) return 0;
  for (const std::string& m : layout.before)
    if (is_under(name, m)) return 0;
  for (const std::string& m : layout.after)
    if (is_under(name, m)) return layout.stages - 1;
  const std::string prefix = layout.container.empty() ? "" : layout.container + ".";
  if (name.rfind(prefix, 0) == 0 && name.size() > prefix.size()) {
    const std::string rest = name.substr(prefix.size());
    const std::string child = rest.substr(0, rest.find('.'));
    const auto it = std::find(layout.children.begin(), layout.children.end(), child);
    if (it != layout.children.end()) return layout.stage_of_child(static_cast<size_t>(it - layout.children.begin()));
  }
  MG_FAIL("split_module: '{}' is in no stage of {} cut at {}", name, model_type,
          layout.container.empty() ? "its children" : layout.container);
}

// Every name under which `model` holds a parameter (a tied tensor under each of its
// names), in named_parameters' order: the first name of a tensor is its single-device one.
std::vector<nn::NamedTensor> every_parameter_name(const nn::Module& model) {
  std::vector<nn::NamedTensor> out;
  for (const auto& [prefix, m] : model.named_modules())
    for (const auto& [name, t] : m->named_parameters(/*recurse=*/false)) out.emplace_back(join(prefix, name), t);
  return out;
}

// A tie, checked against the model: its tensor, single-device name and the stages using it.
struct TieUse {
  std::string name;  // the single-device name
  Tensor tensor;
  std::vector<int> stages;  // sorted, distinct
};

std::vector<TieUse> check_ties(const nn::Module& model, const PipelineCut& cut, const Layout& layout) {
  const std::vector<nn::NamedTensor> names = every_parameter_name(model);
  const auto tensor_named = [&](const std::string& name) -> const Tensor* {
    for (const auto& [n, t] : names)
      if (n == name) return &t;
    return nullptr;
  };
  std::vector<TieUse> ties;
  for (const std::vector<std::string>& tie : cut.ties) {
    const std::string listed = fmt::format("{{{}}}", fmt::join(tie, ", "));
    MG_CHECK(tie.size() >= 2, "split_module: the tie {} names {} parameter{}; a tie names a tensor's uses, "
             "two or more", listed, tie.size(), tie.size() == 1 ? "" : "s");
    TieUse use;
    for (const std::string& name : tie) {
      const Tensor* t = tensor_named(name);
      MG_CHECK(t != nullptr, "split_module: the tie {} names '{}', which is no parameter of {}", listed, name,
               model.type_name());
      if (!use.tensor.defined()) use.tensor = *t;
      MG_CHECK(t->is_same(use.tensor), "split_module: the tie {}: '{}' and '{}' are two tensors of {}, not "
               "one; a tie names one tensor the model uses in several modules", listed, tie.front(), name,
               model.type_name());
    }
    ties.push_back(std::move(use));
  }
  // Every name of each tied tensor says where it is used; a tensor used by several stages
  // must be a tie.
  std::vector<std::pair<Tensor, std::vector<std::string>>> tensors;
  for (const auto& [name, t] : names) {
    auto it = std::find_if(tensors.begin(), tensors.end(), [&t = t](const auto& e) { return e.first.is_same(t); });
    if (it == tensors.end()) tensors.push_back({t, {name}});
    else it->second.push_back(name);
  }
  for (const auto& [t, its_names] : tensors) {
    std::set<int> stages;
    for (const std::string& n : its_names) stages.insert(stage_in(layout, n, model.type_name()));
    auto tie = std::find_if(ties.begin(), ties.end(), [&t = t](const TieUse& u) { return u.tensor.is_same(t); });
    if (tie != ties.end()) {
      tie->name = its_names.front();
      tie->stages.assign(stages.begin(), stages.end());
      continue;
    }
    MG_CHECK(stages.size() == 1,
             "split_module: '{}' and '{}' are one tensor of {}, used by stages {} and {}; name them as a tie "
             "(PipelineCut::ties), or each stage would train a copy of its own", its_names.front(), its_names.back(),
             model.type_name(), *stages.begin(), *stages.rbegin());
  }
  return ties;
}

}  // namespace

std::vector<std::string> even_split_points(const std::string& container, int64_t count, int stages) {
  MG_CHECK(stages >= 1 && count >= stages,
           "even_split_points: {} has {} modules, too few for {} stages; every stage holds at least one",
           container, count, stages);
  std::vector<std::string> points;
  int64_t first = 0;
  const std::vector<int64_t> balance = even_balance(count, stages);
  for (int s = 0; s + 1 < stages; ++s) {
    first += balance[static_cast<size_t>(s)];
    points.push_back(join(container, std::to_string(first)));
  }
  return points;
}

int stage_of(const nn::Module& model, const PipelineCut& cut, const std::string& name) {
  return stage_in(layout_of(model, cut.split_points), name, model.type_name());
}

nn::ModulePtr cut_stage(const nn::Module& model, const PipelineCut& cut, int stage, Device device) {
  const Layout layout = layout_of(model, cut.split_points);
  MG_CHECK(stage >= 0 && stage < layout.stages, "cut_stage: stage {} of a cut into {} stages", stage,
           layout.stages);
  // Removed from a copy of the tree (the same tensors), then the rest copied to the device:
  // the model is untouched and only the stage's own tensors are copied.
  nn::ModulePtr copy = model.shallow_clone();
  if (layout.stages > 1) {
    for (size_t i = 0; i < layout.children.size(); ++i)
      if (layout.stage_of_child(i) != stage) copy->remove_child(join(layout.container, layout.children[i]));
    if (stage != 0)
      for (const std::string& m : layout.before) copy->remove_child(m);
    if (stage != layout.stages - 1)
      for (const std::string& m : layout.after) copy->remove_child(m);
  }
  return copy->clone(device);
}

std::vector<nn::ModulePtr> split_module(const nn::Module& model, const PipelineCut& cut,
                                        const std::shared_ptr<ProcessGroup>& pp) {
  MG_CHECK(pp != nullptr, "split_module: the pipeline's process group is null");
  const int p = pp->size(), rank = pp->rank(), stages = cut.stages();
  MG_CHECK(stages % p == 0,
           "split_module: {} split points make {} stages, which {} ranks cannot share evenly; give p x v - 1 "
           "points for v stages per rank", cut.split_points.size(), stages, p);
  const Layout layout = layout_of(model, cut.split_points);
  const std::vector<TieUse> ties = check_ties(model, cut, layout);
  std::vector<nn::ModulePtr> chunks;
  for (int k = rank; k < stages; k += p) chunks.push_back(cut_stage(model, cut, k, pp->device()));
  // One group per set of holding ranks: ties between the same ranks share it, so their sums
  // are one (reduce_partial_gradients sums a dimension over one group).
  std::map<std::vector<int>, std::shared_ptr<ProcessGroup>> groups;
  for (const TieUse& tie : ties) {
    // This rank's chunks that use the tie share one tensor: the first one's.
    Tensor mine;
    for (size_t c = 0; c < chunks.size(); ++c) {
      const int k = static_cast<int>(c) * p + rank;
      if (!std::binary_search(tie.stages.begin(), tie.stages.end(), k)) continue;
      for (const auto& [name, t] : every_parameter_name(model))
        if (t.is_same(tie.tensor) && stage_in(layout, name, model.type_name()) == k) {
          if (!mine.defined()) mine = chunks[c]->parameter(name);
          else chunks[c]->set_parameter(name, mine);
          break;
        }
    }
    std::set<int> holders;
    for (int k : tie.stages) holders.insert(k % p);
    if (holders.size() < 2) continue;
    // Every rank of pp makes the group, in the ties' order; its members get it.
    const std::vector<int> ranks(holders.begin(), holders.end());
    if (!groups.count(ranks)) groups[ranks] = pp->new_group(ranks);
    const std::shared_ptr<ProcessGroup>& group = groups[ranks];
    if (!mine.defined()) continue;
    DimPlacement placement;
    placement.dim = "tied";
    placement.group = group;
    placement.rank = group->rank();
    placement.size = group->size();
    placement.placement = Placement::replicate();
    placement.partial_gradient = true;
    record_placement(mine, tie.name, tie.tensor.shape(), std::move(placement));
  }
  return chunks;
}

std::vector<nn::NamedTensor> chunk_parameters(const std::vector<nn::ModulePtr>& chunks) {
  std::vector<nn::NamedTensor> out;
  std::set<const void*> seen;
  for (const nn::ModulePtr& chunk : chunks)
    for (auto& [name, t] : chunk->named_parameters())
      if (seen.insert(t.impl()).second) out.emplace_back(name, t);
  return out;
}

std::vector<Tensor> chunk_parameter_tensors(const std::vector<nn::ModulePtr>& chunks) {
  std::vector<Tensor> out;
  for (auto& [name, t] : chunk_parameters(chunks)) out.push_back(t);
  return out;
}

}  // namespace mg::parallel
