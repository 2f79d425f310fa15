#include <minigrad/parallel/sharded/fully_shard.h>

#include <algorithm>
#include <functional>
#include <map>
#include <mutex>
#include <unordered_map>
#include <utility>

#include <minigrad/autograd/functions.h>
#include <minigrad/autograd/grad_mode.h>
#include <minigrad/autograd/node.h>
#include <minigrad/autograd/version_counter.h>
#include <minigrad/core/ops.h>
#include <minigrad/nn/checkpoint.h>
#include <minigrad/parallel/c10d/same_model.h>
#include <minigrad/parallel/clip_grad.h>
#include <minigrad/parallel/placement.h>

namespace mg::parallel {

// One unit: a module's own parameters, one FlatParameter.
struct FSDPModule::Unit {
  std::unique_ptr<FlatParameter> flat;
  FSDPOptions options;
  std::string module;               // its module under the tree's root ("" the root's own)
  std::vector<std::string> names;   // its parameters' names under the root
  std::shared_ptr<Work> gathering;  // an all_gather in flight (a prefetch)
  size_t index = 0;                 // in the tree's units
};

// The units of one root, in module order, and their gathering. Every module of the tree
// shares it; autograd nodes and the reducer's hooks reach it through weak references (a
// graph may outlive the module).
struct FSDPModule::Tree {
  std::shared_ptr<ProcessGroup> group;
  std::vector<std::shared_ptr<Unit>> units;
  std::shared_ptr<ShardedGradReducer> reducer;
  std::string failure;  // a gather that failed: the shards can no longer be trusted
  FSDPStats stats;

  void check(const char* when) const {
    MG_CHECK(failure.empty(), "fully_shard: gathering parameters failed earlier (rank {}, {}): {}", group->rank(),
             when, failure);
  }

  // Allocates unit u's flat buffer and starts filling it, unless it is there already.
  void start_gather(size_t u) {
    Unit& unit = *units[u];
    if (unit.flat->full_is_allocated()) return;
    unit.flat->allocate_full();
    stats.gathered_bytes += unit.flat->full().nbytes();
    stats.peak_gathered_bytes = std::max(stats.peak_gathered_bytes, stats.gathered_bytes);
    stats.all_gather_bytes += unit.flat->full().nbytes();
    ++stats.all_gathers;
    // The gather rewrites the parameters' memory in place, which bumps its version; but
    // what it writes is what the shards hold, and between a unit's forward and its
    // backward the shards do not change, so the parameters autograd saved in forward get
    // back exactly the values it saw (PyTorch's FSDP does the same).
    autograd::UnsafePreserveVersionCounter same_values(unit.flat->full());
    unit.gathering = unit.flat->all_gather(*group);
  }

  void wait_gather(size_t u) {
    Unit& unit = *units[u];
    if (!unit.gathering) return;
    std::shared_ptr<Work> work = std::move(unit.gathering);
    try {
      work->wait();
    } catch (const std::exception& e) {
      failure = e.what();
      free(u);
      throw;
    }
  }

  // Unit u's full parameters, ready to use.
  void unshard(size_t u) {
    start_gather(u);
    wait_gather(u);
  }

  // Frees unit u's flat buffer (after any gather into it has finished).
  void reshard(size_t u) {
    wait_gather(u);
    free(u);
  }

  void free(size_t u) {
    Unit& unit = *units[u];
    if (!unit.flat->full_is_allocated()) return;
    stats.gathered_bytes -= unit.flat->full().nbytes();
    unit.flat->free_full();
  }

  void reshard_all() {
    for (size_t u = 0; u < units.size(); ++u) reshard(u);
  }

  // The root's forward begins a step: every unit sharded (one still gathered was kept for
  // a backward that never came, or prefetched for nothing: it may be stale).
  void begin_step() {
    check("at forward");
    reducer->check("at forward");
    reshard_all();
  }

  // Backward reached unit u: its parameters now, the unit before it next.
  void before_backward(size_t u) {
    unshard(u);
    if (units[u]->options.backward_prefetch && u > 0) start_gather(u - 1);
  }
};

namespace {

// Identity in forward; in backward, gathers a unit's parameters before the gradient flows on
// into the unit's own nodes (FSDP's pre-backward hook).
class UnshardBeforeBackward final : public Node {
 public:
  explicit UnshardBeforeBackward(std::function<void()> unshard)
      : Node("FSDPUnshardBackward"), unshard_(std::move(unshard)) {}
  std::vector<Tensor> apply(std::vector<Tensor>&& grad_outputs) override {
    unshard_();
    return std::move(grad_outputs);
  }

 private:
  std::function<void()> unshard_;
};

// Every module's FSDP state, as torch keeps it on the module (_module_state_mapping: weak
// references). The module owns its state through its hooks.
std::mutex g_mutex;
std::unordered_map<const nn::Module*, std::weak_ptr<FSDPModule>> g_states;

bool is_under(const std::string& name, const std::string& prefix) {
  return prefix.empty() ||
         (name.size() > prefix.size() && name.compare(0, prefix.size(), prefix) == 0 && name[prefix.size()] == '.');
}

std::string join(const std::string& prefix, const std::string& name) {
  return prefix.empty() ? name : name.empty() ? prefix : prefix + "." + name;
}

}  // namespace

std::shared_ptr<FSDPModule> FSDPModule::state_of(const nn::Module* module) {
  std::lock_guard<std::mutex> lock(g_mutex);
  const auto it = g_states.find(module);
  if (it == g_states.end()) return nullptr;
  std::shared_ptr<FSDPModule> state = it->second.lock();
  // A state outliving its module (a handle kept) must not claim a new module at its address.
  if (state == nullptr || state->module_.lock().get() != module) return nullptr;
  return state;
}

void FSDPModule::remember(const nn::Module* module, const std::shared_ptr<FSDPModule>& state) {
  std::lock_guard<std::mutex> lock(g_mutex);
  for (auto it = g_states.begin(); it != g_states.end();)  // drop the states gone
    it = it->second.expired() ? g_states.erase(it) : std::next(it);
  g_states[module] = state;
}

std::shared_ptr<FSDPModule> FSDPModule::holder_of(const Tensor& p) {
  std::vector<std::shared_ptr<FSDPModule>> states;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    for (const auto& [module, weak] : g_states)
      if (auto s = weak.lock()) states.push_back(std::move(s));
  }
  for (const auto& s : states)
    if (s->own_)
      for (const Tensor& q : s->own_->flat->params())
        if (q.is_same(p)) return s;
  return nullptr;
}

FSDPModule::FSDPModule(const nn::ModulePtr& module, std::shared_ptr<ProcessGroup> group)
    : module_(module), type_(module->type_name()), group_(std::move(group)) {}

nn::ModulePtr FSDPModule::module() const {
  nn::ModulePtr m = module_.lock();
  MG_CHECK(m != nullptr, "FSDPModule: its {} is gone", type_);
  return m;
}

size_t FSDPModule::num_units() const { return units_.size(); }

const FlatParameter& FSDPModule::unit(size_t u) const {
  MG_CHECK(u < units_.size(), "FSDPModule: unit {} out of range ({} units)", u, units_.size());
  return *units_[u]->flat;
}

std::string FSDPModule::unit_module(size_t u) const {
  MG_CHECK(u < units_.size(), "FSDPModule: unit {} out of range ({} units)", u, units_.size());
  // The unit's module under the tree's root, less this module's place there.
  const std::string& under_root = units_[u]->module;
  if (name_.empty()) return under_root;
  return under_root.size() <= name_.size() ? std::string() : under_root.substr(name_.size() + 1);
}

std::vector<Tensor> FSDPModule::parameters() const {
  std::vector<Tensor> out;
  for (const auto& unit : units_) out.push_back(unit->flat->shard());
  return out;
}

// ---- the hooks ----

void FSDPModule::register_hooks() {
  std::shared_ptr<FSDPModule> self = shared_from_this();  // the module owns its state
  const nn::ModulePtr m = module();
  m->register_forward_pre_hook([self](nn::Module&, const Tensor& x) {
    self->before_forward();
    // MixedPrecisionPolicy::cast_forward_inputs: a float input in the unit's compute dtype.
    const MixedPrecisionPolicy& mp = self->options_.mp_policy;
    if (mp.param_dtype && mp.cast_forward_inputs && x.defined() && is_floating_point(x.dtype()) &&
        x.dtype() != *mp.param_dtype)
      return to(x, *mp.param_dtype);
    return Tensor();
  });
  m->register_forward_hook([self](nn::Module&, const Tensor&, const Tensor& y) {
    const MixedPrecisionPolicy& mp = self->options_.mp_policy;
    const bool cast = mp.output_dtype && y.defined() && is_floating_point(y.dtype()) && y.dtype() != *mp.output_dtype;
    const Tensor out = cast ? to(y, *mp.output_dtype) : y;
    const Tensor hooked = self->after_forward(out);
    return hooked.defined() ? hooked : (cast ? out : Tensor());
  });
}

void FSDPModule::before_forward() {
  Tree& tree = *tree_;
  if (nn::is_recomputing()) {  // backward reruns a checkpointed module: gathered for it
    if (own_) tree.before_backward(own_->index);
    return;
  }
  if (root_) tree.begin_step();
  if (!own_) return;
  tree.unshard(own_->index);
  if (options_.forward_prefetch && own_->index + 1 < tree.units.size()) tree.start_gather(own_->index + 1);
}

Tensor FSDPModule::after_forward(const Tensor& y) {
  Tree& tree = *tree_;
  if (nn::is_recomputing()) return Tensor();  // freed once its gradients are reduced
  const bool backward_follows = GradMode::is_enabled() && y.defined() && y.requires_grad();
  if (root_ && !backward_follows) {  // the step ends here
    tree.reshard_all();
    return Tensor();
  }
  if (!root_ && own_ && options_.reshard_after_forward) tree.reshard(own_->index);
  if (!backward_follows || (!root_ && !own_)) return Tensor();
  std::weak_ptr<FSDPModule> weak = weak_from_this();
  auto node = std::make_shared<UnshardBeforeBackward>([weak] {
    if (auto self = weak.lock()) self->before_backward();
  });
  Tensor out = alias_for_node(y);
  connect_node(node, {y}, {out});
  return out;
}

void FSDPModule::before_backward() {
  Tree& tree = *tree_;
  if (!root_) return tree.before_backward(own_->index);
  // The root's backward begins the step's: its own unit (kept since forward) and the last
  // unit, whose backward comes first.
  if (own_) tree.unshard(own_->index);
  const size_t last = tree.units.size() - 1;
  if (options_.backward_prefetch && !tree.units.empty() && tree.units[last] != own_) tree.start_gather(last);
}

// ---- fully_shard ----

std::shared_ptr<FSDPModule> fully_shard(nn::ModulePtr module, std::shared_ptr<ProcessGroup> group,
                                        FSDPOptions options) {
  MG_CHECK(module != nullptr, "fully_shard: the module is null");
  const std::string type = module->type_name();
  MG_CHECK(group != nullptr, "fully_shard({}): the process group is null", type);
  MG_CHECK(FSDPModule::state_of(module.get()) == nullptr,
           "fully_shard({}): this module is sharded already; call fully_shard once per module", type);

  // The modules sharded inside this one by earlier calls: their units join this one's tree.
  struct Inner {
    std::string name;
    std::shared_ptr<FSDPModule> state;
  };
  std::vector<Inner> inner;
  for (const auto& [name, m] : module->named_modules())
    if (!name.empty())
      if (auto s = FSDPModule::state_of(m)) inner.push_back({name, std::move(s)});
  std::vector<const Inner*> top;  // those not inside another (named_modules: parents first)
  for (const Inner& i : inner)
    if (std::none_of(top.begin(), top.end(), [&](const Inner* t) { return is_under(i.name, t->name); }))
      top.push_back(&i);
  // Each parameter of those units, with the module whose unit holds it.
  std::unordered_map<const TensorImpl*, std::string> unit_module_of;
  for (const Inner* t : top) {
    MG_CHECK(t->state->is_root(),
             "fully_shard({}): '{}' belongs to the FSDP tree of a module sharded after it, which holds this {}; "
             "shard children first, then their parent (FSDP2's order)",
             type, t->name, type);
    MG_CHECK(t->state->process_group() == group,
             "fully_shard({}): '{}' was sharded over another process group ({} ranks, this one {}); a tree of "
             "units shares one group",
             type, t->name, t->state->process_group()->size(), group->size());
    for (const auto& unit : t->state->units_)
      for (const Tensor& p : unit->flat->params()) unit_module_of[p.impl()] = join(t->name, unit->module);
  }
  // A parameter in an inner unit must be held only inside that unit's module (ties).
  for (const auto& [name, m] : module->named_modules())
    for (const auto& [local, p] : m->named_parameters(/*recurse=*/false)) {
      const auto it = unit_module_of.find(p.impl());
      MG_CHECK(it == unit_module_of.end() || is_under(name, it->second) || name == it->second,
               "fully_shard({}): parameter '{}' is in the unit of '{}' (sharded earlier), but '{}' holds it too, "
               "outside that module; a parameter two modules hold belongs to the unit of their nearest common "
               "ancestor: shard neither holder on its own",
               type, join(name, local), it == unit_module_of.end() ? "" : it->second, name);
    }

  // This module's own parameters: the rest.
  const std::vector<nn::NamedTensor> named = module->named_parameters();
  std::vector<size_t> own;
  for (size_t i = 0; i < named.size(); ++i) {
    const auto& [name, p] = named[i];
    if (unit_module_of.count(p.impl()) > 0) continue;
    if (const auto holder = FSDPModule::holder_of(p))
      MG_FAIL("fully_shard({}): parameter '{}' is in the unit of a {} sharded earlier; shard children before "
              "their parent (FSDP2's order), and leave a parameter two modules hold (a tied weight) to the unit "
              "of their nearest common ancestor",
              type, name, holder->type_);
    MG_CHECK(p.device() == group->device(),
             "fully_shard({}): parameter '{}' is on {}, but the process group ({}) works on {}; move the module "
             "there first",
             type, name, p.device(), group->backend_name(), group->device());
    MG_CHECK(p.requires_grad(), "fully_shard({}): parameter '{}' does not require grad; every parameter is sharded "
                                "and trained", type, name);
    own.push_back(i);
  }
  MG_CHECK(!own.empty() || !top.empty(), "fully_shard({}): the module has no parameters", type);

  // Every rank starts from rank 0's values (the inner units' were synchronized by their calls).
  std::vector<nn::NamedTensor> synced;
  for (size_t i : own) synced.push_back(named[i]);
  for (auto& b : module->named_buffers()) synced.push_back(std::move(b));
  check_same_shapes_across_ranks(*group, synced, fmt::format("fully_shard({})", type));
  std::vector<Tensor> values;
  for (const auto& [name, t] : synced) values.push_back(t);
  broadcast_from_rank0(*group, values);
  for (const Tensor& b : module->buffers())  // whole on every rank of the group
    record_placement(b, "", b.shape(),
                     DimPlacement{"dp", group, group->rank(), group->size(), Placement::replicate(), false});

  auto self = std::make_shared<FSDPModule>(module, group);
  self->options_ = options;
  if (!own.empty()) {
    std::vector<Tensor> params;
    for (size_t i : own) params.push_back(named[i].second);
    self->own_ = std::make_shared<FSDPModule::Unit>();
    self->own_->flat = std::make_unique<FlatParameter>(
        std::move(params), own, group->rank(), group->size(), ShardStorage::Separate,
        FlatDtypes{options.mp_policy.param_dtype, options.mp_policy.reduce_dtype});
    self->own_->options = options;
    self->units_.push_back(self->own_);
  }
  for (const Inner* t : top) {
    t->state->tree_->reshard_all();  // a unit left gathered by a forward before this call
    for (const auto& unit : t->state->units_) {
      unit->module = join(t->name, unit->module);  // now under this module
      self->units_.push_back(unit);
    }
  }

  // The tree: every unit renumbered and named under this module, its pieces recorded.
  auto tree = std::make_shared<FSDPModule::Tree>();
  tree->group = group;
  tree->units = self->units_;
  std::unordered_map<const TensorImpl*, size_t> index_of;
  for (size_t i = 0; i < named.size(); ++i) index_of.emplace(named[i].second.impl(), i);
  for (size_t u = 0; u < tree->units.size(); ++u) {
    FSDPModule::Unit& unit = *tree->units[u];
    unit.index = u;
    unit.names.clear();
    std::vector<size_t> indices;
    for (const Tensor& p : unit.flat->params()) {
      const size_t i = index_of.at(p.impl());
      indices.push_back(i);
      unit.names.push_back(named[i].first);
    }
    unit.flat->set_indices(std::move(indices));
    unit.flat->record_spec(unit.names, "dp", group);  // its pieces, under this module's names
    tree->stats.shard_bytes += unit.flat->shard().nbytes();
    tree->stats.largest_unit_bytes = std::max(tree->stats.largest_unit_bytes, unit.flat->full().nbytes());
  }
  // Gradients are complete last unit first: the reduce-scatters' order, the same on every rank.
  const size_t n = tree->units.size();
  std::vector<FlatParameter*> groups;
  std::vector<std::vector<std::string>> names;
  for (size_t g = 0; g < n; ++g) {
    groups.push_back(tree->units[n - 1 - g]->flat.get());
    names.push_back(tree->units[n - 1 - g]->names);
  }
  std::weak_ptr<FSDPModule::Tree> weak = tree;
  tree->reducer = ShardedGradReducer::create(std::move(groups), std::move(names), group, "fully_shard",
                                             [weak, n](size_t g) {
                                               if (auto t = weak.lock()) t->reshard(n - 1 - g);
                                             });
  // Every module under this one is part of its tree now (their earlier trees are dropped,
  // and with them their reducers, whose hooks hold them weakly).
  for (const Inner& i : inner) {
    i.state->tree_ = tree;
    i.state->name_ = i.name;
    i.state->root_ = false;
  }
  self->tree_ = std::move(tree);
  self->register_hooks();
  FSDPModule::remember(module.get(), self);
  return self;
}

std::shared_ptr<FSDPModule> fully_shard(nn::ModulePtr module, const DeviceMesh& mesh, FSDPOptions options) {
  MG_CHECK(mesh.has_dim("dp"), "fully_shard: {} has no dp dimension to shard over", mesh.str());
  return fully_shard(std::move(module), mesh.group("dp"), options);
}

std::shared_ptr<FSDPModule> fully_shard_blocks(const nn::ModulePtr& root, const std::vector<nn::ModulePtr>& blocks,
                                               std::shared_ptr<ProcessGroup> group, FSDPOptions options) {
  MG_CHECK(root != nullptr, "fully_shard_blocks: the root module is null");
  for (size_t i = 0; i < blocks.size(); ++i) {
    FSDPOptions block = options;
    block.mp_policy.output_dtype.reset();
    block.reshard_after_forward = options.reshard_after_forward && i + 1 < blocks.size();
    fully_shard(blocks[i], group, block);
  }
  return fully_shard(root, std::move(group), options);
}

// ---- what the handle offers ----

Tensor FSDPModule::clip_grad_norm_(double max_norm, double norm_type) {
  for (const auto& unit : units_)
    for (size_t k = 0; k < unit->flat->params().size(); ++k)
      if (const ParameterSpec* spec = spec_of(unit->flat->params()[k]))
        for (const DimPlacement& d : spec->pieces[0].placements)
          MG_CHECK(d.dim == "dp" || d.size == 1,
                   "FSDPModule::clip_grad_norm_: '{}' is placed on {} too ({}); this clip sums over dp alone: call "
                   "parallel::clip_grad_norm_(parameters(), mesh, max_norm), which sums over the mesh",
                   unit->names[k], d.dim, d.str());
  return parallel::clip_grad_norm_(parameters(), group_, max_norm, norm_type);
}

nn::TensorDict FSDPModule::full_state_dict() {
  tree_->check("in full_state_dict");
  NoGradGuard no_grad;
  const nn::ModulePtr m = module();
  std::unordered_map<const TensorImpl*, std::string> name_of;
  for (const auto& [name, p] : m->named_parameters()) name_of.emplace(p.impl(), name);
  nn::TensorDict out;
  const bool root = group_->rank() == 0;
  for (const auto& unit : units_) {
    const FlatParameter& flat = *unit->flat;
    // A buffer of its own: the unit's storage block stays as it is (freed at rest).
    Tensor full = empty(Shape{flat.layout().padded_numel()}, flat.shard().dtype(), flat.shard().device());
    group_->all_gather(full, flat.shard().detach())->wait();
    if (!root) continue;
    for (size_t k = 0; k < flat.params().size(); ++k)
      out.emplace(name_of.at(flat.params()[k].impl()), ops::clone(flat.slot(full, k)));
  }
  if (root)
    for (const auto& [name, b] : m->named_buffers()) out.emplace(name, ops::clone(b));
  return out;
}

void FSDPModule::load_full_state_dict(const nn::TensorDict& state, const std::string& source) {
  const nn::ModulePtr m = module();
  NoGradGuard no_grad;
  std::unordered_map<const TensorImpl*, std::string> name_of;
  for (const auto& [name, p] : m->named_parameters()) name_of.emplace(p.impl(), name);
  // Names, shapes, dtypes, before anything is written. A parameter's dtype is its shard's
  // (what full_state_dict returns), not the module's tensor's: under a MixedPrecisionPolicy
  // that is a view in param_dtype of the gathered unit, while the shards keep float32.
  std::map<std::string, nn::TensorSpec> expected;
  for (const auto& [name, b] : m->named_buffers()) expected[name] = {b.shape(), b.dtype()};
  for (const auto& unit : units_)
    for (const Tensor& p : unit->flat->params())
      expected[name_of.at(p.impl())] = {p.shape(), unit->flat->shard().dtype()};
  nn::check_state_dict(expected, state, "FSDPModule::load_full_state_dict", m->type_name(), source);
  for (const auto& unit : units_) {
    FlatParameter& flat = *unit->flat;
    Tensor full = zeros(Shape{flat.layout().padded_numel()}, flat.shard().dtype(), flat.shard().device());
    for (size_t k = 0; k < flat.params().size(); ++k)
      ops::copy_(flat.slot(full, k), state.at(name_of.at(flat.params()[k].impl())));
    flat.load_shard_from_full(full);
  }
  for (auto& [name, b] : m->named_buffers()) ops::copy_(b, state.at(name));
}

FSDPStats FSDPModule::stats() const { return tree_->stats; }

void FSDPModule::reset_peak_stats() {
  FSDPStats& s = tree_->stats;
  s.peak_gathered_bytes = s.gathered_bytes;
  s.all_gather_bytes = 0;
  s.all_gathers = 0;
}

ShardedReductionStats FSDPModule::last_reduction_stats() const { return tree_->reducer->last_stats(); }

}  // namespace mg::parallel
