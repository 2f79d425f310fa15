// Activation checkpointing (nn/checkpoint.h): a no-grad forward that keeps its input and
// the generator's state, and a node that reruns it with the graph in backward.
#include <minigrad/nn/checkpoint.h>

#include <atomic>
#include <iterator>
#include <mutex>
#include <unordered_map>
#include <utility>

#include <minigrad/autograd/autocast.h>
#include <minigrad/autograd/engine.h>
#include <minigrad/autograd/grad_mode.h>
#include <minigrad/autograd/node.h>
#include <minigrad/core/fault_injection.h>
#include <minigrad/core/generator.h>

namespace mg::nn {

namespace {

thread_local int g_recomputing = 0;

// The modules set to checkpointing, by address; the weak reference tells a module that
// is gone from a new one at the same address. Module::operator() asks on every call, so
// the common case (none set) is one atomic load.
std::mutex g_modules_mutex;
std::unordered_map<const Module*, std::weak_ptr<Module>> g_modules;
std::atomic<size_t> g_module_count{0};
std::atomic<size_t> g_recomputations{0};

// Marks this thread as recomputing for a scope (nested checkpoints nest).
struct RecomputeScope {
  RecomputeScope() { ++g_recomputing; }
  ~RecomputeScope() { --g_recomputing; }
};

// Puts the generator back to `state` for a scope, and afterwards to where it was.
struct GeneratorStateScope {
  GeneratorStateScope(Generator& gen, Generator::State state) : gen_(gen), saved_(gen.state()) {
    gen_.set_state(state);
  }
  ~GeneratorStateScope() { gen_.set_state(saved_); }
  Generator& gen_;
  Generator::State saved_;
};

class CheckpointBackward final : public Node {
 public:
  CheckpointBackward(CheckpointFunction fn, Tensor input, Generator::State rng,
                     AutocastState autocast)
      : Node("CheckpointBackward"), fn_(std::move(fn)), input_(std::move(input)), rng_(rng),
        autocast_(autocast) {}

  std::vector<Tensor> apply(std::vector<Tensor>&& grad_outputs) override {
    MG_CHECK(fn_ != nullptr,
             "checkpoint: backward through a checkpointed region a second time; its forward "
             "is rerun once (use retain_graph=false, or no checkpoint)");
    const bool wants_input_grad = next_edges()[0].valid();
    Tensor x = input_.detach();
    if (wants_input_grad) x.set_requires_grad(true);
    Tensor y;
    {
      RecomputeScope recomputing;
      ++g_recomputations;
      AutoGradMode grad_on(true);
      Generator& gen = default_generator();
      // The forward's dropout masks again: the generator as it was then.
      Generator::State state = rng_;
      // parity fault: the region is rerun from the generator's current state, drawing fresh
      // dropout masks (a checkpoint that forgot to preserve the RNG state).
      if (testing::fault_is_on(testing::Fault::CheckpointFreshDropout)) state = gen.state();
      GeneratorStateScope same_masks(gen, state);
      // The forward's autocast regions: the rerun casts as forward did (torch's checkpoint too).
      AutocastStateGuard same_casts(autocast_);
      y = fn_(x);
    }
    if (y.requires_grad()) {
      // The region's backward now: its parameters accumulate their gradients here.
      run_backward({y}, {grad_outputs[0]}, /*retain_graph=*/false);
    }
    Tensor grad_input;
    if (wants_input_grad) {
      grad_input = x.grad();
      if (!grad_input.defined()) grad_input = zeros_like(x);
    }
    return {grad_input};
  }

  void release_saved() override {
    fn_ = nullptr;
    input_ = Tensor();
  }

 private:
  CheckpointFunction fn_;
  Tensor input_;
  Generator::State rng_;
  AutocastState autocast_;
};

}  // namespace

Tensor checkpoint(CheckpointFunction fn, const Tensor& input) {
  MG_CHECK(fn != nullptr, "checkpoint: the function is empty");
  MG_CHECK(input.defined(), "checkpoint: the input is undefined");
  if (!GradMode::is_enabled()) return fn(input);
  const Generator::State rng = default_generator().state();
  Tensor y;
  {
    NoGradGuard no_graph;  // nothing inside is kept for backward
    y = fn(input);
  }
  MG_CHECK(y.defined(), "checkpoint: the function returned an undefined tensor");
  // The output's values are forward's; its history is the node that reruns the region.
  auto node = std::make_shared<CheckpointBackward>(std::move(fn), input.detach(), rng, autocast_state());
  Tensor out = alias_for_node(y);
  connect_node(node, {input}, {out});
  return out;
}

Tensor checkpoint(Module& module, const Tensor& input) {
  // Hooks included: an FSDP unit (fully_shard) gathers its parameters for the rerun.
  return checkpoint(
      [&module](const Tensor& x) {
        return module.call_with_hooks(x, [&module](const Tensor& in) { return module.forward(in); });
      },
      input);
}

void set_checkpointing(const ModulePtr& module, bool on) {
  MG_CHECK(module != nullptr, "set_checkpointing: the module is null");
  std::lock_guard<std::mutex> lock(g_modules_mutex);
  for (auto it = g_modules.begin(); it != g_modules.end();)  // drop the modules gone
    it = it->second.expired() ? g_modules.erase(it) : std::next(it);
  if (on) g_modules[module.get()] = module;
  else g_modules.erase(module.get());
  g_module_count = g_modules.size();
}

bool is_checkpointing(const Module& module) {
  if (g_module_count.load(std::memory_order_relaxed) == 0) return false;
  std::lock_guard<std::mutex> lock(g_modules_mutex);
  const auto it = g_modules.find(&module);
  if (it == g_modules.end()) return false;
  const ModulePtr alive = it->second.lock();
  return alive.get() == &module;
}

bool is_recomputing() { return g_recomputing > 0; }

size_t checkpoint_recomputations() { return g_recomputations.load(); }

}  // namespace mg::nn
