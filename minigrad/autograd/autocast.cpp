// Autocast's state, its guard, the casts the policy asks for, and the cast cache.
#include <minigrad/autograd/autocast.h>

#include <memory>
#include <utility>
#include <unordered_map>

#include <minigrad/autograd/functions.h>
#include <minigrad/autograd/grad_mode.h>

namespace mg {
namespace {

thread_local AutocastState state;

// The cache of 16-bit casts of parameters, for the thread's outermost region. The weak
// pointer tells the tensor from another one made later at the same address; the version
// tells a parameter written in place since.
struct CachedCast {
  std::weak_ptr<TensorImpl> source;
  uint64_t version;
  DType dtype;
  Tensor cast;
};
thread_local std::unordered_map<const TensorImpl*, CachedCast> cache;

size_t index_of(DeviceType type) { return static_cast<size_t>(type); }

// torch's is_eligible: a floating tensor, not float64, on a device type whose region is on.
bool eligible(const Tensor& t) {
  return t.defined() && is_floating_point(t.dtype()) && t.dtype() != DType::Float64 &&
         state.enabled[index_of(t.device().type())];
}

// torch's cached_cast: a float32 leaf that requires grad, cast to the region's 16-bit dtype
// while grad mode records, is cached (the same parameter is cast once per region).
Tensor cast_to(const Tensor& t, DType dtype) {
  if (t.dtype() == dtype) return t;
  const bool cacheable = state.cache_enabled && dtype == state.dtype[index_of(t.device().type())] &&
                         t.dtype() == DType::Float32 && t.is_leaf() && t.requires_grad() &&
                         GradMode::is_enabled();
  if (!cacheable) return to(t, dtype);
  const auto found = cache.find(t.impl());
  if (found != cache.end() && found->second.source.lock().get() == t.impl() &&
      found->second.version == t.version() && found->second.dtype == dtype)
    return found->second.cast;
  Tensor cast = to(t, dtype);
  cache[t.impl()] = CachedCast{t.impl_ptr(), t.version(), dtype, cast};
  return cast;
}

}  // namespace

AutocastState autocast_state() { return state; }
void set_autocast_state(const AutocastState& s) {
  state = s;
  if (state.depth == 0) cache.clear();
}
bool is_autocast_enabled(DeviceType device_type) { return state.enabled[index_of(device_type)]; }
DType autocast_dtype(DeviceType device_type) { return state.dtype[index_of(device_type)]; }

AutocastGuard::AutocastGuard(DeviceType device_type, DType dtype, bool enabled, bool cache_enabled)
    : previous_(state) {
  MG_CHECK(is_reduced_float(dtype),
           "AutocastGuard: autocast runs its ops in bfloat16 or float16, got {} (torch.autocast "
           "takes torch.bfloat16 or torch.float16)",
           dtype);
  state.enabled[index_of(device_type)] = enabled;
  state.dtype[index_of(device_type)] = dtype;
  state.cache_enabled = cache_enabled;
  ++state.depth;
}

AutocastGuard::~AutocastGuard() {
  state = previous_;
  if (state.depth == 0) cache.clear();  // torch clears the cache leaving the outermost region
}

namespace autocast {

std::vector<Tensor> cast_inputs(AutocastOp op, std::vector<Tensor> inputs) {
  std::vector<Tensor> out = std::move(inputs);
  if (!state.enabled[0] && !state.enabled[1]) return out;  // the common case: one check
  const Tensor* first = nullptr;
  for (const Tensor& t : out)
    if (eligible(t)) {
      first = &t;
      break;
    }
  if (first == nullptr) return out;
  const DeviceType device_type = first->device().type();
  const CastPolicy p = policy(op, device_type);
  if (p == CastPolicy::None) return out;
  DType target = DType::Float32;
  if (p == CastPolicy::Lower) target = state.dtype[index_of(device_type)];
  if (p == CastPolicy::Promote) {
    // The widest of the region's 16-bit dtype and the eligible inputs' dtypes.
    target = state.dtype[index_of(device_type)];
    for (const Tensor& t : out)
      if (eligible(t)) target = promote_types(target, t.dtype());
  }
  for (Tensor& t : out)
    if (eligible(t)) t = cast_to(t, target);
  return out;
}

Tensor cast_input(AutocastOp op, const Tensor& input) { return cast_inputs(op, {input})[0]; }

ExcludeGuard::ExcludeGuard() : previous_(state) {
  for (bool& on : state.enabled) on = false;
}
ExcludeGuard::~ExcludeGuard() { state = previous_; }

size_t cached_casts() { return cache.size(); }

}  // namespace autocast

}  // namespace mg
