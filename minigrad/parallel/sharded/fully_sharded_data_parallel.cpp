#include <minigrad/parallel/sharded/fully_sharded_data_parallel.h>

#include <algorithm>
#include <limits>
#include <functional>
#include <unordered_set>
#include <utility>

#include <minigrad/autograd/grad_mode.h>
#include <minigrad/autograd/node.h>
#include <minigrad/autograd/version_counter.h>
#include <minigrad/core/ops.h>
#include <minigrad/nn/checkpoint.h>
#include <minigrad/nn/layers.h>
#include <minigrad/parallel/c10d/same_model.h>
#include <minigrad/parallel/clip_grad.h>
#include <minigrad/parallel/placement.h>

namespace mg::parallel {

// The units and the gathering of their parameters. Autograd nodes and the reducer's
// hooks reach it through weak references: a graph may outlive the wrapper.
struct FullyShardedDataParallel::Units {
  struct Unit {
    std::vector<std::string> names;  // the parameters' names in the wrapped module
    std::unique_ptr<FlatParameter> flat;
    std::shared_ptr<Work> gathering;  // an all_gather in flight (a prefetch)
  };

  std::shared_ptr<ProcessGroup> group;
  FSDPOptions options;
  std::vector<Unit> list;
  // The hooks that gather and free each unit around its forward, to remove at the end.
  // They act only inside FullyShardedDataParallel::forward: the wrapped module called on
  // its own still finds its parameters freed, and says so.
  std::vector<std::pair<nn::ModulePtr, nn::Module::HookHandle>> hooks;
  bool in_forward = false;
  // The unit whose forward use ended last: it stays gathered until another unit's use
  // begins, or the forward ends without a backward to follow.
  static constexpr size_t kNone = std::numeric_limits<size_t>::max();
  size_t held = kNone;
  std::string failure;             // a gather that failed: the shards can no longer be trusted
  FSDPStats stats;

  void check(const char* when) const {
    MG_CHECK(failure.empty(),
             "FullyShardedDataParallel: gathering parameters failed earlier (rank {}, {}): {}",
             group->rank(), when, failure);
  }

  // Allocates unit u's flat buffer and starts filling it, unless it is there already.
  void start_gather(size_t u) {
    Unit& unit = list[u];
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

  // Unit u's full parameters, ready to use.
  void unshard(size_t u) {
    start_gather(u);
    wait_gather(u);
  }

  void wait_gather(size_t u) {
    Unit& unit = list[u];
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

  // Frees unit u's flat buffer (after any gather into it has finished).
  void reshard(size_t u) {
    wait_gather(u);
    free(u);
  }

  void free(size_t u) {
    Unit& unit = list[u];
    if (!unit.flat->full_is_allocated()) return;
    stats.gathered_bytes -= unit.flat->full().nbytes();
    unit.flat->free_full();
  }

  // What a forward starts from: every unit sharded. (A unit still gathered is one kept
  // for a backward that never came, or a prefetch nobody used: it may be stale.)
  void reshard_all() {
    for (size_t u = 0; u < list.size(); ++u) reshard(u);
  }

  // Backward reached unit u's output: its parameters are needed now, the previous
  // unit's next.
  void before_backward(size_t u) {
    unshard(u);
    if (options.backward_prefetch && u > 0) start_gather(u - 1);
  }

  // A forward use of unit u begins: the unit used before is no longer needed.
  void begin_use(size_t u) {
    if (held != kNone && held != u) reshard(held);
    held = u;
  }
};

namespace {

// Identity in forward; in backward, gathers the unit's parameters before the gradient
// flows on into the unit's own nodes (FSDP's pre-backward hook).
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

}  // namespace

FullyShardedDataParallel::FullyShardedDataParallel(nn::ModulePtr module,
                                                   std::shared_ptr<ProcessGroup> process_group,
                                                   FSDPOptions options)
    : nn::Module("FullyShardedDataParallel"),
      module_(std::move(module)),
      process_group_(std::move(process_group)),
      units_(std::make_shared<Units>()) {
  MG_CHECK(module_ != nullptr, "FullyShardedDataParallel: module is null");
  // The units: the children of a Sequential that have parameters, or the whole module.
  std::vector<FSDPUnit> units;
  if (dynamic_cast<nn::Sequential*>(module_.get()) != nullptr) {
    for (const auto& [child_name, child] : module_->named_children())
      if (!child->named_parameters().empty()) units.push_back(FSDPUnit{{child}, {}});
  } else {
    units.push_back(FSDPUnit{{module_}, {}});
  }
  units_->options = options;
  build(std::move(units));
}

FullyShardedDataParallel::FullyShardedDataParallel(nn::ModulePtr module,
                                                   std::shared_ptr<ProcessGroup> process_group,
                                                   std::vector<FSDPUnit> units,
                                                   FSDPOptions options)
    : nn::Module("FullyShardedDataParallel"),
      module_(std::move(module)),
      process_group_(std::move(process_group)),
      units_(std::make_shared<Units>()) {
  MG_CHECK(module_ != nullptr, "FullyShardedDataParallel: module is null");
  MG_CHECK(!units.empty(), "FullyShardedDataParallel: an empty list of units");
  units_->options = options;
  build(std::move(units));
}

void FullyShardedDataParallel::build(std::vector<FSDPUnit> specs) {
  MG_CHECK(process_group_ != nullptr, "FullyShardedDataParallel: process group is null");
  units_->group = process_group_;

  // Every parameter is sharded and trained, each exactly once.
  const std::vector<nn::NamedTensor> named = module_->named_parameters();
  MG_CHECK(!named.empty(), "FullyShardedDataParallel: the module has no parameters");
  std::unordered_map<const TensorImpl*, size_t> index_of;
  const Device device = process_group_->device();
  for (size_t i = 0; i < named.size(); ++i) {
    const auto& [name, p] = named[i];
    MG_CHECK(p.device() == device,
             "FullyShardedDataParallel: parameter '{}' is on {}, but the process group ({}) works "
             "on {}; move the module there first",
             name, p.device(), process_group_->backend_name(), device);
    MG_CHECK(p.requires_grad(),
             "FullyShardedDataParallel: parameter '{}' does not require grad; every parameter "
             "is sharded and trained",
             name);
    const auto [it, inserted] = index_of.emplace(p.impl(), i);
    MG_CHECK(inserted,
             "FullyShardedDataParallel: parameters '{}' and '{}' are the same tensor; a shared "
             "parameter cannot be sharded in two units",
             named[it->second].first, name);
  }

  // Each unit's parameters, under the wrapped module's names; each in one unit only.
  std::vector<std::vector<size_t>> unit_params(specs.size());
  std::vector<int> unit_of(named.size(), -1);
  for (size_t u = 0; u < specs.size(); ++u) {
    MG_CHECK(!specs[u].modules.empty(), "FullyShardedDataParallel: unit {} names no module", u);
    for (const nn::ModulePtr& m : specs[u].modules) {
      MG_CHECK(m != nullptr, "FullyShardedDataParallel: unit {} names a null module", u);
      for (const Tensor& p : m->parameters()) {
        const auto it = index_of.find(p.impl());
        MG_CHECK(it != index_of.end(),
                 "FullyShardedDataParallel: unit {} ({}) has a parameter that is not the "
                 "wrapped module's",
                 u, m->type_name());
        const size_t i = it->second;
        if (unit_of[i] == static_cast<int>(u)) continue;  // two of its modules share it
        MG_CHECK(unit_of[i] < 0,
                 "FullyShardedDataParallel: parameter '{}' is in units {} and {}; each "
                 "parameter belongs to one unit",
                 named[i].first, unit_of[i], u);
        unit_of[i] = static_cast<int>(u);
        unit_params[u].push_back(i);
      }
    }
    MG_CHECK(!unit_params[u].empty(), "FullyShardedDataParallel: unit {} has no parameters", u);
  }
  for (size_t i = 0; i < named.size(); ++i)
    MG_CHECK(unit_of[i] >= 0,
             "FullyShardedDataParallel: parameter '{}' is in no unit; the units must hold "
             "every parameter",
             named[i].first);

  // Every rank starts from rank 0's model; the buffers stay whole on every rank.
  sync_module_states(*process_group_, *module_, "FullyShardedDataParallel");
  for (const Tensor& b : module_->buffers())
    record_placement(b, "", b.shape(),
                     DimPlacement{"dp", process_group_, process_group_->rank(), process_group_->size(),
                                  Placement::replicate(), false});

  for (size_t u = 0; u < specs.size(); ++u) {
    Units::Unit unit;
    std::vector<Tensor> params;
    for (size_t i : unit_params[u]) {
      unit.names.push_back(named[i].first);
      params.push_back(named[i].second);
    }
    unit.flat = std::make_unique<FlatParameter>(std::move(params), unit_params[u],
                                                process_group_->rank(), process_group_->size(),
                                                ShardStorage::Separate);
    unit.flat->record_spec(unit.names, "dp", process_group_);  // the wrapped module's names
    register_parameter(fmt::format("flat_shard_{}", u), unit.flat->shard());
    units_->stats.shard_bytes += unit.flat->shard().nbytes();
    units_->stats.largest_unit_bytes =
        std::max(units_->stats.largest_unit_bytes, unit.flat->full().nbytes());
    units_->list.push_back(std::move(unit));
  }

  for (size_t u = 0; u < specs.size(); ++u) {
    for (const nn::ModulePtr& m : specs[u].modules) register_unit_hooks(m, u);
    for (const nn::ModulePtr& m : specs[u].used_after) {
      MG_CHECK(m != nullptr, "FullyShardedDataParallel: unit {} is used after a null module", u);
      register_use_after(m, u);
    }
  }

  // Gradients are ready last unit first: that is the launch order of their reductions.
  const size_t n = units_->list.size();
  std::vector<FlatParameter*> groups;
  std::vector<std::vector<std::string>> names;
  for (size_t g = 0; g < n; ++g) {
    groups.push_back(units_->list[n - 1 - g].flat.get());
    names.push_back(units_->list[n - 1 - g].names);
  }
  std::weak_ptr<Units> weak = units_;
  reducer_ = ShardedGradReducer::create(std::move(groups), std::move(names), process_group_,
                                        "FullyShardedDataParallel", [weak, n](size_t g) {
                                          if (auto units = weak.lock()) units->reshard(n - 1 - g);
                                        });
}

FullyShardedDataParallel::~FullyShardedDataParallel() {
  for (auto& [module, handle] : units_->hooks) module->remove_hook(handle);
}

// Unit u around its module's own forward (PyTorch's FSDP does the same with hooks):
// gathered just before; kept after it until another unit's forward begins (or the forward
// ends without a backward); in backward, gathered again by a node on its output before the
// unit's own nodes run. A checkpointed module's rerun in backward gathers it as well.
void FullyShardedDataParallel::register_unit_hooks(const nn::ModulePtr& module, size_t u) {
  const size_t last = units_->list.size() - 1;
  std::weak_ptr<Units> weak = units_;
  auto gather_before = [weak, u, last](nn::Module&, const Tensor&) {
    std::shared_ptr<Units> units = weak.lock();
    if (!units) return Tensor();
    if (nn::is_recomputing()) {  // backward reruns u: the unit before it comes next
      units->before_backward(u);
    } else if (units->in_forward) {
      units->begin_use(u);
      units->unshard(u);
      if (units->options.forward_prefetch && u < last) units->start_gather(u + 1);
    }
    return Tensor();
  };
  auto mark_after = [weak, u](nn::Module&, const Tensor&, const Tensor& y) {
    std::shared_ptr<Units> units = weak.lock();
    if (!units || !units->in_forward || nn::is_recomputing()) return Tensor();
    units->held = u;
    if (!(GradMode::is_enabled() && y.requires_grad())) return Tensor();
    auto node = std::make_shared<UnshardBeforeBackward>([weak, u] {
      if (auto alive = weak.lock()) alive->before_backward(u);
    });
    Tensor out = alias_for_node(y);
    connect_node(node, {y}, {out});
    return out;
  };
  units_->hooks.emplace_back(module, module->register_forward_pre_hook(gather_before));
  units_->hooks.emplace_back(module, module->register_forward_hook(mark_after));
}

// Unit u read again after `module`'s forward, outside any module (GPT's head is wte):
// gathered there; in backward, once that use's gradient has gone through (the node sits
// on `module`'s output, which the use read), freed until u's own modules need it.
void FullyShardedDataParallel::register_use_after(const nn::ModulePtr& module, size_t u) {
  std::weak_ptr<Units> weak = units_;
  auto gather_after = [weak, u](nn::Module&, const Tensor&, const Tensor& y) {
    std::shared_ptr<Units> units = weak.lock();
    if (!units || !units->in_forward || nn::is_recomputing()) return Tensor();
    units->begin_use(u);
    units->unshard(u);
    if (!(GradMode::is_enabled() && y.requires_grad())) return Tensor();
    auto node = std::make_shared<UnshardBeforeBackward>([weak, u] {
      if (auto alive = weak.lock()) alive->reshard(u);
    });
    Tensor out = alias_for_node(y);
    connect_node(node, {y}, {out});
    return out;
  };
  units_->hooks.emplace_back(module, module->register_forward_hook(gather_after));
}

size_t FullyShardedDataParallel::num_units() const { return units_->list.size(); }

const FlatParameter& FullyShardedDataParallel::unit(size_t u) const {
  MG_CHECK(u < units_->list.size(), "FullyShardedDataParallel: unit {} out of range ({} units)",
           u, units_->list.size());
  return *units_->list[u].flat;
}

Tensor FullyShardedDataParallel::forward(const Tensor& input) {
  units_->check("at forward");
  reducer_->check("at forward");
  module_->train(is_training());
  units_->reshard_all();
  units_->held = Units::kNone;
  units_->in_forward = true;
  try {
    Tensor out = (*module_)(input);  // each unit's hooks gather and free it around its forward
    units_->in_forward = false;
    const size_t held = std::exchange(units_->held, Units::kNone);
    if (held == Units::kNone) return out;
    if (!(GradMode::is_enabled() && out.requires_grad())) {
      units_->reshard(held);
      return out;
    }
    // The unit in use at the end stays gathered: backward begins with it. (A node makes
    // sure of it, should something have freed it in between: a backward run twice.)
    std::weak_ptr<Units> weak = units_;
    auto node = std::make_shared<UnshardBeforeBackward>([weak, held] {
      if (auto alive = weak.lock()) alive->unshard(held);
    });
    Tensor last = alias_for_node(out);
    connect_node(node, {out}, {last});
    return last;
  } catch (...) {
    units_->in_forward = false;
    units_->held = Units::kNone;
    units_->reshard_all();
    throw;
  }
}

Tensor FullyShardedDataParallel::clip_grad_norm_(double max_norm, double norm_type) {
  return parallel::clip_grad_norm_(parameters(), process_group_, max_norm, norm_type);
}

nn::TensorDict FullyShardedDataParallel::full_state_dict() {
  units_->check("in full_state_dict");
  NoGradGuard no_grad;
  nn::TensorDict out;
  const bool root = process_group_->rank() == 0;
  for (const Units::Unit& unit : units_->list) {
    const FlatParameter& flat = *unit.flat;
    // A buffer of its own: the unit's storage block stays as it is (freed at rest).
    Tensor full = empty(Shape{flat.layout().padded_numel()}, DType::Float32, flat.shard().device());
    process_group_->all_gather(full, flat.shard().detach())->wait();
    if (!root) continue;
    for (size_t k = 0; k < unit.names.size(); ++k)
      out.emplace(unit.names[k], ops::clone(flat.slot(full, k)));
  }
  if (root)
    for (const auto& [name, b] : module_->named_buffers()) out.emplace(name, ops::clone(b));
  return out;
}

void FullyShardedDataParallel::load_full_state_dict(const nn::TensorDict& state,
                                                    const std::string& source) {
  nn::check_state_dict(*module_, state, source);  // names, shapes, dtypes: nothing is read
  NoGradGuard no_grad;
  for (const Units::Unit& unit : units_->list) {
    FlatParameter& flat = *unit.flat;
    Tensor full = zeros(Shape{flat.layout().padded_numel()}, DType::Float32, flat.shard().device());
    for (size_t k = 0; k < unit.names.size(); ++k)
      ops::copy_(flat.slot(full, k), state.at(unit.names[k]));
    flat.load_shard_from_full(full);
  }
  for (auto& [name, b] : module_->named_buffers()) ops::copy_(b, state.at(name));
}

FSDPStats FullyShardedDataParallel::stats() const { return units_->stats; }

void FullyShardedDataParallel::reset_peak_stats() {
  units_->stats.peak_gathered_bytes = units_->stats.gathered_bytes;
  units_->stats.all_gather_bytes = 0;
  units_->stats.all_gathers = 0;
}

std::string FullyShardedDataParallel::extra_repr() const {
  return fmt::format("backend={}, rank={}, world_size={}, units={}",
                     process_group_->backend_name(), process_group_->rank(),
                     process_group_->size(), units_->list.size());
}

nn::ModulePtr FullyShardedDataParallel::copy_node() const {
  MG_FAIL("FullyShardedDataParallel cannot be copied (clone, shallow_clone): it is bound to its "
          "process group, and the wrapped module's parameters are views of its shards' "
          "gathered buffers; copy full_state_dict() into a plain module instead");
}

std::shared_ptr<FullyShardedDataParallel> fully_shard(nn::ModulePtr module,
                                                      std::shared_ptr<ProcessGroup> process_group,
                                                      FSDPOptions options) {
  return std::make_shared<FullyShardedDataParallel>(std::move(module), std::move(process_group),
                                                    options);
}

std::shared_ptr<FullyShardedDataParallel> fully_shard(nn::ModulePtr module,
                                                      std::shared_ptr<ProcessGroup> process_group,
                                                      std::vector<FSDPUnit> units,
                                                      FSDPOptions options) {
  return std::make_shared<FullyShardedDataParallel>(std::move(module), std::move(process_group),
                                                    std::move(units), options);
}

}  // namespace mg::parallel
