// The central check of the parallel layer, shared by tests/parallel (CPU replicas) and
// tests/cuda (GPU replicas): DataParallel over a device list gives the same loss, the
// same parameter gradients and, after several SGD steps, the same parameters as the
// plain module on the whole batch.
#pragma once

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "catch_compat.h"

#include <minigrad/autograd/node.h>
#include <minigrad/minigrad.h>
#include <minigrad/parallel/devices/device_list.h>

namespace mg::testing {

// n CPU "devices": how CI runs several replicas without a GPU.
inline std::vector<Device> cpus(size_t n) { return std::vector<Device>(n, Device::cpu()); }

// Linear/ReLU layers with the given widths, e.g. {5, 7, 3}: Linear(5,7) ReLU Linear(7,3).
inline nn::ModulePtr make_mlp(const std::vector<int64_t>& widths) {
  auto mlp = std::make_shared<nn::Sequential>();
  for (size_t i = 0; i + 1 < widths.size(); ++i) {
    if (i > 0) mlp->push_back(std::make_shared<nn::ReLU>());
    mlp->push_back(std::make_shared<nn::Linear>(widths[i], widths[i + 1]));
  }
  return mlp;
}

// |a - b| <= rtol * max(|a|, |b|) + atol, element for element, naming what differs.
inline void require_close(const Tensor& a, const Tensor& b, const std::string& what,
                          double rtol, double atol) {
  REQUIRE(a.defined());
  REQUIRE(b.defined());
  REQUIRE(a.shape() == b.shape());
  const std::vector<float> x = a.to_vector<float>();
  const std::vector<float> y = b.to_vector<float>();
  for (size_t i = 0; i < x.size(); ++i) {
    const double diff = std::fabs(double(x[i]) - double(y[i]));
    const double bound = rtol * std::max(std::fabs(double(x[i])), std::fabs(double(y[i]))) + atol;
    INFO(fmt::format("{}: element {} differs: {} vs {}", what, i, x[i], y[i]));
    REQUIRE(diff <= bound);
  }
}

// One model, two copies: `plain` runs the whole batch on `devices[0]`, `wrapped` is the
// same values under DataParallel over `devices`. `steps` SGD steps (lr 0.1, written by
// hand) on random batches; after each backward the loss and every gradient must match,
// and at the end every parameter.
inline void check_data_parallel_matches_plain(const std::vector<int64_t>& widths, int64_t batch,
                                              const std::vector<Device>& devices, int steps = 3,
                                              double rtol = 1e-5, double atol = 1e-6) {
  INFO(fmt::format("widths {}, batch {}, devices {}", fmt::join(widths, "-"), batch,
                   parallel::device_list_str(devices)));
  const Device device = devices[0];
  nn::ModulePtr plain = make_mlp(widths);
  plain->to(device);
  nn::ModulePtr copy = plain->clone(device);
  auto wrapped = std::make_shared<parallel::DataParallel>(copy, devices);

  const auto plain_params = plain->named_parameters();
  const auto wrapped_params = wrapped->named_parameters();
  REQUIRE(plain_params.size() == wrapped_params.size());
  const double lr = 0.1;

  for (int step = 0; step < steps; ++step) {
    const Tensor x = randn({batch, widths.front()}, device);
    const Tensor targets = randint(0, widths.back(), {batch}, device);

    const Tensor plain_loss = cross_entropy(plain->forward(x), targets);
    const Tensor out = wrapped->forward(x);
    REQUIRE(out.shape() == Shape{batch, widths.back()});
    REQUIRE(out.device() == device);
    const Tensor wrapped_loss = cross_entropy(out, targets);
    require_close(plain_loss, wrapped_loss, fmt::format("loss at step {}", step), rtol, atol);

    plain->zero_grad();
    wrapped->zero_grad();
    plain_loss.backward();
    wrapped_loss.backward();
    for (size_t k = 0; k < plain_params.size(); ++k) {
      const Tensor& p = plain_params[k].second;
      const Tensor& q = wrapped_params[k].second;
      REQUIRE(wrapped_params[k].first == "module." + plain_params[k].first);
      REQUIRE(q.is_leaf());
      REQUIRE(q.device() == device);  // gradients land on device_ids[0]
      require_close(p.grad(), q.grad(),
                    fmt::format("grad of {} at step {}", plain_params[k].first, step), rtol, atol);
    }

    NoGradGuard no_grad;
    for (size_t k = 0; k < plain_params.size(); ++k) {
      Tensor p = plain_params[k].second;
      Tensor q = wrapped_params[k].second;
      p.add_(p.grad(), -lr);
      q.add_(q.grad(), -lr);
    }
  }
  for (size_t k = 0; k < plain_params.size(); ++k)
    require_close(plain_params[k].second, wrapped_params[k].second,
                  fmt::format("{} after {} steps", plain_params[k].first, steps), rtol, atol);
}

}  // namespace mg::testing
