#include <minigrad/parallel/pipeline/balance.h>

#include <algorithm>
#include <chrono>
#include <limits>

#include <fmt/ranges.h>

#include <minigrad/autograd/grad_mode.h>
#include <minigrad/core/stream.h>
#include <minigrad/nn/layers.h>
#include <minigrad/parallel/devices/transfer.h>
#include <minigrad/parallel/pipeline/plan.h>

namespace mg::parallel {
namespace {

std::vector<nn::ModulePtr> layers_of(const nn::ModulePtr& model, const char* what) {
  auto sequential = std::dynamic_pointer_cast<nn::Sequential>(model);
  MG_CHECK(sequential != nullptr, "{}: the module must be an nn::Sequential; got {}", what,
           model ? model->type_name() : std::string("null"));
  MG_CHECK(sequential->size() > 0, "{}: the nn::Sequential has no layers", what);
  return sequential->children();
}

// Where `layer` runs: its parameters' device, or where its input already is.
Device device_of(const nn::Module& layer, Device fallback) {
  const auto params = layer.parameters();
  return params.empty() ? fallback : params.front().device();
}

Tensor moved_to(const Tensor& x, Device device) {
  return x.device() == device ? x : copy_to_device(x, device);
}

}  // namespace

std::vector<int64_t> balance_costs(const std::vector<double>& costs, int64_t parts) {
  const auto n = static_cast<int64_t>(costs.size());
  MG_CHECK(parts >= 1 && parts <= n,
           "balance: {} layer{} cannot be cut into {} stages (every stage needs a layer)", n,
           n == 1 ? "" : "s", parts);
  std::vector<double> prefix(static_cast<size_t>(n) + 1, 0.0);
  for (int64_t i = 0; i < n; ++i)
    prefix[static_cast<size_t>(i) + 1] = prefix[static_cast<size_t>(i)] + costs[static_cast<size_t>(i)];
  auto sum = [&](int64_t from, int64_t to) {
    return prefix[static_cast<size_t>(to)] - prefix[static_cast<size_t>(from)];
  };
  // best[k][i]: the smallest largest-stage for the first i layers in k stages; cut[k][i]
  // where its last stage starts.
  const double inf = std::numeric_limits<double>::infinity();
  const auto width = static_cast<size_t>(n) + 1;
  std::vector<std::vector<double>> best(static_cast<size_t>(parts) + 1, std::vector<double>(width, inf));
  std::vector<std::vector<int64_t>> cut(static_cast<size_t>(parts) + 1, std::vector<int64_t>(width, 0));
  best[0][0] = 0.0;
  for (int64_t k = 1; k <= parts; ++k)
    for (int64_t i = k; i <= n; ++i)
      for (int64_t start = k - 1; start < i; ++start) {
        const double value = std::max(best[static_cast<size_t>(k) - 1][static_cast<size_t>(start)], sum(start, i));
        if (value < best[static_cast<size_t>(k)][static_cast<size_t>(i)]) {
          best[static_cast<size_t>(k)][static_cast<size_t>(i)] = value;
          cut[static_cast<size_t>(k)][static_cast<size_t>(i)] = start;
        }
      }
  std::vector<int64_t> balance(static_cast<size_t>(parts));
  for (int64_t k = parts, i = n; k >= 1; --k) {
    const int64_t start = cut[static_cast<size_t>(k)][static_cast<size_t>(i)];
    balance[static_cast<size_t>(k) - 1] = i - start;
    i = start;
  }
  return balance;
}

std::vector<double> layer_sizes(const nn::ModulePtr& model, const Tensor& sample,
                                double param_scale) {
  const auto layers = layers_of(model, "balance_by_size");
  AutoGradMode grad_mode(true);
  // One graph through every layer, all of it kept: each layer's count is what its
  // forward adds while the earlier layers' activations are still alive, as in a step.
  std::vector<Tensor> outputs;
  Tensor x = sample.detach();
  std::vector<double> sizes;
  for (const nn::ModulePtr& layer : layers) {
    const Device device = device_of(*layer, x.device());
    x = moved_to(x, device);
    DeviceGuard guard(device);
    const std::size_t before = memory_allocated(device);
    x = layer->forward(x);
    const std::size_t after = memory_allocated(device);
    double params = 0.0;
    for (const Tensor& p : layer->parameters()) params += static_cast<double>(p.nbytes());
    sizes.push_back(param_scale * params + static_cast<double>(after > before ? after - before : 0));
    outputs.push_back(x);
  }
  return sizes;
}

std::vector<double> layer_times(const nn::ModulePtr& model, const Tensor& sample, int repeats) {
  MG_CHECK(repeats >= 1, "balance_by_time: repeats must be at least 1, got {}", repeats);
  const auto layers = layers_of(model, "balance_by_time");
  AutoGradMode grad_mode(true);
  Tensor x = sample.detach();
  std::vector<double> times;
  for (size_t i = 0; i < layers.size(); ++i) {
    const nn::Module& layer = *layers[i];
    const Device device = device_of(layer, x.device());
    x = moved_to(x, device);
    DeviceGuard guard(device);
    // The timing runs' gradients are dropped again: the layer's stay as they were.
    std::vector<Tensor> params = layer.parameters(), saved;
    for (Tensor& p : params) saved.push_back(p.grad());
    std::vector<double> runs;
    Tensor out;
    for (int r = 0; r <= repeats; ++r) {
      for (Tensor& p : params) p.set_grad(Tensor());
      Tensor input = x.detach();
      if (i > 0 && input.dtype() == DType::Float32) input.set_requires_grad(true);
      const auto start = std::chrono::steady_clock::now();
      out = layers[i]->forward(input);
      if (out.requires_grad()) out.backward(ones(out.shape(), out.dtype(), out.device()));
      synchronize(device);
      const double seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (r > 0) runs.push_back(seconds);  // run 0 warms up
    }
    for (size_t k = 0; k < params.size(); ++k) params[k].set_grad(saved[k]);
    std::sort(runs.begin(), runs.end());
    times.push_back(runs[runs.size() / 2]);
    x = out.detach();
  }
  return times;
}

std::vector<int64_t> even_balance(int64_t layers, int64_t stages) {
  MG_CHECK(stages >= 1 && layers >= stages,
           "the module has {} layer{} for {} stages; every stage needs at least one", layers,
           layers == 1 ? "" : "s", stages);
  std::vector<int64_t> balance(static_cast<size_t>(stages), layers / stages);
  for (int64_t s = 0; s < layers % stages; ++s) ++balance[static_cast<size_t>(s)];
  return balance;
}

std::shared_ptr<nn::Sequential> split_stage(const nn::ModulePtr& model,
                                            const std::vector<int64_t>& balance, int stage,
                                            const char* what) {
  auto sequential = std::dynamic_pointer_cast<nn::Sequential>(model);
  MG_CHECK(sequential != nullptr,
           "{}: the module must be an nn::Sequential, whose layers are cut into stages in "
           "order; got {}",
           what, model ? model->type_name() : std::string("null"));
  const auto layers = static_cast<int64_t>(sequential->size());
  int64_t total = 0;
  for (size_t s = 0; s < balance.size(); ++s) {
    MG_CHECK(balance[s] >= 1, "{}: balance [{}] gives stage {} no layers", what,
             fmt::join(balance, ", "), s);
    total += balance[s];
  }
  MG_CHECK(total == layers, "{}: balance [{}] sums to {} layers, but the module has {}", what,
           fmt::join(balance, ", "), total, layers);
  MG_CHECK(stage >= 0 && static_cast<size_t>(stage) < balance.size(),
           "{}: stage {} of a balance of {} stages", what, stage, balance.size());
  int64_t first = 0;
  for (int s = 0; s < stage; ++s) first += balance[static_cast<size_t>(s)];
  const auto& children = sequential->named_children();
  auto part = std::make_shared<nn::Sequential>();
  for (int64_t k = first; k < first + balance[static_cast<size_t>(stage)]; ++k)
    part->register_module(children[static_cast<size_t>(k)].first,
                          children[static_cast<size_t>(k)].second);
  return part;
}

std::vector<int64_t> balance_by_size(const nn::ModulePtr& model, const std::vector<Device>& devices,
                                     const Tensor& sample, double param_scale) {
  return balance_costs(layer_sizes(model, sample, param_scale),
                       static_cast<int64_t>(devices.size()));
}

std::vector<int64_t> balance_by_time(const nn::ModulePtr& model, const std::vector<Device>& devices,
                                     const Tensor& sample, int repeats) {
  return balance_costs(layer_times(model, sample, repeats), static_cast<int64_t>(devices.size()));
}

}  // namespace mg::parallel
