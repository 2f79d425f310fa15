// The central check of the pipeline, shared by tests/parallel (CPU devices) and
// tests/cuda (a repeated GPU): a Pipe gives the same loss, the same parameter gradients
// and, after several SGD steps, the same parameters as the plain module on the whole
// batch. The comparison reports the first difference instead of failing at once, so a
// test can also show that a deliberately wrong variant is caught.
#pragma once

#include <cmath>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "parallel/dp_check.h"

#include <minigrad/minigrad.h>

namespace mg::testing {

// The first element where |a - b| > rtol * max(|a|, |b|) + atol, described; or nothing.
inline std::optional<std::string> first_difference(const Tensor& a, const Tensor& b,
                                                   const std::string& what, double rtol = 1e-5,
                                                   double atol = 1e-6) {
  if (!a.defined() || !b.defined()) return what + ": undefined";
  if (a.shape() != b.shape())
    return fmt::format("{}: shapes {} and {}", what, a.shape(), b.shape());
  const std::vector<float> x = a.to_vector<float>(), y = b.to_vector<float>();
  for (size_t i = 0; i < x.size(); ++i) {
    const double diff = std::fabs(double(x[i]) - double(y[i]));
    if (diff > rtol * std::max(std::fabs(double(x[i])), std::fabs(double(y[i]))) + atol)
      return fmt::format("{}: element {} is {} in the pipe, {} in the plain module", what, i,
                         x[i], y[i]);
  }
  return std::nullopt;
}

struct PipeCase {
  std::vector<int64_t> widths;  // of the MLP (make_mlp)
  int stages = 2;
  int64_t chunks = 1;
  int64_t batch = 8;
  parallel::Schedule schedule = parallel::Schedule::GPipe;
  parallel::Checkpoint checkpoint = parallel::Checkpoint::Never;
  bool through_forward = false;  // forward() + loss.backward() instead of train_step
  int steps = 3;
  Device device = Device::cpu();  // every stage's (a repeated device)
  double rtol = 1e-5, atol = 1e-6;

  std::string str() const {
    return fmt::format("widths {}, {} stages, chunks {}, batch {}, {}, checkpoint {}, {}",
                       fmt::join(widths, "-"), stages, chunks, batch,
                       parallel::schedule_name(schedule), parallel::checkpoint_name(checkpoint),
                       through_forward ? "forward()+backward()" : "train_step");
  }
};

// Runs `c.steps` SGD steps (lr 0.1, by hand) of the plain module and of a Pipe over a
// copy of it, on the same random batches. `pipe_loss` is the Pipe's per-micro-batch
// loss (the right one is cross_entropy). Returns the first difference in the loss, a
// gradient, or a parameter after the steps.
inline std::optional<std::string> compare_pipe_with_plain(
    const PipeCase& c, const parallel::PipeLoss& pipe_loss = parallel::cross_entropy_loss) {
  nn::ModulePtr plain = make_mlp(c.widths);
  plain->to(c.device);
  nn::ModulePtr copy = plain->clone(c.device);
  parallel::PipeOptions options;
  options.chunks = c.chunks;
  options.schedule = c.schedule;
  options.checkpoint = c.checkpoint;
  auto pipe = std::make_shared<parallel::Pipe>(copy, std::vector<Device>(static_cast<size_t>(c.stages), c.device), options);
  const auto plain_params = plain->named_parameters();
  const auto pipe_params = pipe->named_parameters();
  if (plain_params.size() != pipe_params.size()) return std::string("parameter counts differ");
  const double lr = 0.1;
  for (int step = 0; step < c.steps; ++step) {
    const Tensor x = randn({c.batch, c.widths.front()}, c.device);
    const Tensor y = randint(0, c.widths.back(), {c.batch}, c.device);
    plain->zero_grad();
    pipe->zero_grad();
    const Tensor plain_loss = cross_entropy(plain->forward(x), y);
    plain_loss.backward();
    Tensor pipe_loss_value;
    if (c.through_forward) {
      const Tensor out = pipe->forward(x);
      pipe_loss_value = pipe_loss(out, y);
      pipe_loss_value.backward();
    } else {
      pipe_loss_value = pipe->train_step(x, y, pipe_loss).loss;
    }
    if (auto d = first_difference(pipe_loss_value, plain_loss, fmt::format("loss at step {}", step),
                                  c.rtol, c.atol))
      return d;
    for (size_t k = 0; k < plain_params.size(); ++k) {
      if (pipe_params[k].first != "module." + plain_params[k].first)
        return "parameter names differ: " + pipe_params[k].first;
      if (auto d = first_difference(pipe_params[k].second.grad(), plain_params[k].second.grad(),
                                    fmt::format("grad of {} at step {}", plain_params[k].first, step),
                                    c.rtol, c.atol))
        return d;
    }
    NoGradGuard no_grad;
    for (size_t k = 0; k < plain_params.size(); ++k) {
      Tensor p = plain_params[k].second, q = pipe_params[k].second;
      p.add_(p.grad(), -lr);
      q.add_(q.grad(), -lr);
    }
  }
  for (size_t k = 0; k < plain_params.size(); ++k)
    if (auto d = first_difference(pipe_params[k].second, plain_params[k].second,
                                  fmt::format("{} after {} steps", plain_params[k].first, c.steps),
                                  c.rtol, c.atol))
      return d;
  return std::nullopt;
}

}  // namespace mg::testing
