#include <minigrad/parallel/parallelize.h>

#include <fnmatch.h>

#include <algorithm>
#include <map>

#include <fmt/format.h>

#include <minigrad/parallel/c10d/process_group.h>

namespace mg::parallel {
namespace {

std::string slashes(std::string dotted) {
  std::replace(dotted.begin(), dotted.end(), '.', '/');
  return dotted;
}

// The modules of `root` a pattern names, in the tree's order.
std::vector<std::string> matching_modules(const nn::Module& root, const std::string& pattern) {
  std::vector<std::string> out;
  for (const auto& [name, module] : root.named_modules())
    if (module_name_matches(pattern, name)) out.push_back(name);
  return out;
}

// The tensors of the module at `name` (its subtree), by name relative to it.
std::vector<nn::NamedTensor> tensors_at(nn::Module& root, const std::string& name) {
  return module_at(root, name).named_parameters();
}

std::string joined(const std::string& prefix, const std::string& name) { return join_name(prefix, name); }

// A style cut `now` from `old`, which an earlier plan had placed already (cp's Replicate,
// before tp's plan swaps the Linears): those placements come first in `now`'s spec, and
// the single-device shape is old's.
void keep_earlier_placements(const Tensor& old, const Tensor& now) {
  const ParameterSpec *before = spec_of(old), *after = spec_of(now);
  if (before == nullptr) return;
  MG_CHECK(after != nullptr && before->pieces.size() == 1 && after->pieces.size() == 1,
           "parallelize_module: {} was placed, and the style that replaced it recorded no placement",
           before->pieces[0].name);
  ParameterPiece piece = before->pieces[0];
  for (const DimPlacement& d : after->pieces[0].placements) piece.placements.push_back(d);
  MG_CHECK(piece.placed_shape() == now.shape(), "parallelize_module: {} placed as {} would be {}, but it is {}",
           piece.name, piece.str(), piece.placed_shape(), now.shape());
  set_spec(now, {piece});
}

}  // namespace

nn::Module& module_at(nn::Module& root, const std::string& name) {
  nn::Module* m = &root;
  for (size_t start = 0; !name.empty();) {
    const size_t dot = name.find('.', start);
    m = m->child(name.substr(start, dot == std::string::npos ? std::string::npos : dot - start)).get();
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  return *m;
}

std::string join_name(const std::string& prefix, const std::string& name) {
  return prefix.empty() ? name : prefix + "." + name;
}

DimPlacement ParallelContext::placement(Placement p, bool partial_gradient) const {
  return DimPlacement{dim, group, group->rank(), group->size(), p, partial_gradient};
}

bool module_name_matches(const std::string& pattern, const std::string& name) {
  if (name.empty() || pattern.empty()) return name == pattern;  // "" is the root, and only "" names it
  return fnmatch(slashes(pattern).c_str(), slashes(name).c_str(), FNM_PATHNAME) == 0;
}

void parallelize_module(nn::Module& model, const DeviceMesh& mesh, const ParallelPlan& plan,
                        ParallelizeOptions options) {
  parallelize_module(model, mesh.group(plan.dim), plan, options);
}

void parallelize_module(nn::Module& model, std::shared_ptr<ProcessGroup> group, const ParallelPlan& plan,
                        ParallelizeOptions options) {
  MG_CHECK(group != nullptr, "parallelize_module: the {} group is null", plan.dim);
  MG_CHECK(plan.dim == "tp" || plan.dim == "cp",
           "parallelize_module: a plan is for the mesh dimension tp or cp, got '{}'", plan.dim);
  ParallelContext context;
  context.dim = plan.dim;
  context.group = group;
  context.collectives = tensor_parallel_group(group);
  context.sharded_generator =
      std::make_shared<Generator>(options.seed + 2718 + static_cast<uint64_t>(group->rank()));

  // Each single-device tensor a style replaced, and what replaced it: a tied parameter's
  // second module takes the first one's shard.
  std::vector<std::pair<Tensor, Tensor>> replaced;
  for (const auto& [pattern, style] : plan.styles) {
    MG_CHECK(style != nullptr, "parallelize_module: the style for '{}' is null", pattern);
    const std::vector<std::string> names = matching_modules(model, pattern);
    MG_CHECK(!names.empty(), "parallelize_module: the pattern '{}' ({}) names no module of {}", pattern,
             style->str(), model.type_name());
    for (const std::string& name : names) {
      const std::vector<nn::NamedTensor> before = tensors_at(model, name);
      try {
        style->apply(model, name, context);
      } catch (const Error& e) {
        MG_FAIL("parallelize_module: {} on '{}': {}", style->str(), name, e.what());
      }
      for (const nn::NamedTensor& entry : tensors_at(model, name)) {
        const Tensor& now = entry.second;
        const auto old = std::find_if(before.begin(), before.end(), [&](const nn::NamedTensor& b) {
          return b.first == entry.first;
        });
        if (old == before.end() || old->second.is_same(now)) continue;
        const auto tied = std::find_if(replaced.begin(), replaced.end(),
                                       [&](const auto& r) { return r.first.is_same(old->second); });
        if (tied == replaced.end()) {
          keep_earlier_placements(old->second, now);
          replaced.emplace_back(old->second, now);
          continue;
        }
        // The other holder of a tied parameter was split first: one tensor again.
        const ParameterSpec *first = spec_of(tied->second), *second = spec_of(now);
        MG_CHECK(tied->second.shape() == now.shape() && first && second &&
                     first->pieces[0].placements.back().placement == second->pieces[0].placements.back().placement,
                 "parallelize_module: '{}' is tied to a parameter split as {}, and {} splits it as {}",
                 joined(name, entry.first), first ? first->pieces[0].str() : "nothing", style->str(),
                 second ? second->pieces[0].str() : "nothing");
        model.set_parameter(joined(name, entry.first), tied->second);
      }
    }
  }
  // No module may still hold a tensor a style replaced elsewhere (a tie split in one place).
  for (const auto& [name, p] : model.named_parameters())
    for (const auto& [old, now] : replaced)
      MG_CHECK(!p.is_same(old),
               "parallelize_module: '{}' still holds the whole of a tied parameter the plan split elsewhere "
               "(as {}); give every module that holds it a style", name,
               spec_of(now) ? spec_of(now)->pieces[0].str() : "?");

  // Every parameter is placed on this dimension: Replicate where no style split it. Its
  // name is the one named_parameters gives (a tie's first holder's), as on one device.
  const bool partial = plan.dim == "cp";  // every cp rank sees a share of the tokens
  for (const auto& [name, p] : model.named_parameters()) {
    if (const ParameterSpec* spec = spec_of(p); spec && spec->pieces.size() == 1 && spec->pieces[0].name != name) {
      std::vector<ParameterPiece> renamed = spec->pieces;
      renamed[0].name = name;
      set_spec(p, std::move(renamed));
    }
    const ParameterSpec* spec = spec_of(p);
    bool placed = false;
    if (spec)
      for (const DimPlacement& d : spec->pieces[0].placements) placed = placed || d.dim == plan.dim;
    const Shape shape = spec ? spec->pieces[0].shape : p.shape();
    if (!placed) record_placement(p, name, shape, context.placement(Placement::replicate(), partial));
  }
}

}  // namespace mg::parallel
