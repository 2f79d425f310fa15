// The GPT's tensor parallelism (models/gpt_tensor_parallel.h) in one process, in float64:
// rank r is a thread driving the handle InProcessGroup::rank(r) on the CPU
// (tests/distributed/test_gpt_tensor_parallel.cpp proves the same across processes with
// float32 tolerances); here the sums are exact enough that the gradients and the
// parameters after 3 AdamW steps agree with the single-device GPT to ~1e-12. The steps are
// torch's AdamW written out below on the host (from before minigrad's AdamW took float64).
// With sequence parallelism this also runs the in-process group's reduce_scatter.
#include "catch_compat.h"

#include <cmath>
#include <thread>

#include <minigrad/autograd/grad_mode.h>
#include <minigrad/core/ops.h>
#include <minigrad/models/gpt.h>
#include <minigrad/models/gpt_tensor_parallel.h>
#include <minigrad/parallel/tensor_parallel/in_process_group.h>

using namespace mg;

namespace {

// torch.optim.AdamW(lr, betas (0.9, 0.999), eps 1e-8, weight_decay 1e-2) on float64
// parameters, on the host.
class AdamW64 {
 public:
  explicit AdamW64(std::vector<Tensor> params) : params_(std::move(params)) {
    for (const Tensor& p : params_) {
      m_.emplace_back(static_cast<size_t>(p.numel()), 0.0);
      v_.emplace_back(static_cast<size_t>(p.numel()), 0.0);
    }
  }
  void zero_grad() {
    for (Tensor& p : params_) p.set_grad(Tensor());
  }
  void step() {
    NoGradGuard no_grad;
    const double lr = 1e-3, b1 = 0.9, b2 = 0.999, eps = 1e-8, wd = 1e-2;
    ++t_;
    for (size_t k = 0; k < params_.size(); ++k) {
      std::vector<double> w = params_[k].to_vector<double>();
      const std::vector<double> g = ops::contiguous(params_[k].grad()).to_vector<double>();
      for (size_t i = 0; i < w.size(); ++i) {
        w[i] *= 1 - lr * wd;
        m_[k][i] = b1 * m_[k][i] + (1 - b1) * g[i];
        v_[k][i] = b2 * v_[k][i] + (1 - b2) * g[i] * g[i];
        const double mhat = m_[k][i] / (1 - std::pow(b1, t_)), vhat = v_[k][i] / (1 - std::pow(b2, t_));
        w[i] -= lr * mhat / (std::sqrt(vhat) + eps);
      }
      ops::copy_(params_[k], from_vector(w, params_[k].shape()));
    }
  }

 private:
  std::vector<Tensor> params_;
  std::vector<std::vector<double>> m_, v_;
  int t_ = 0;
};

double max_abs(const Tensor& t) {
  return ops::copy_to(ops::to_dtype(ops::abs_max(t), DType::Float64), Device::cpu()).item<double>();
}

// Worst [loss, gradient, parameter] disagreement over the ranks.
std::vector<double> float64_against_single_device(int n, bool sequence_parallel) {
  models::GPTConfig c;
  c.block_size = 8;
  c.vocab_size = 24;
  c.n_layer = 2;
  c.n_head = 4;
  c.n_embd = 16;
  manual_seed(21);
  models::GPT gpt(c);
  gpt.to(DType::Float64);
  const Tensor x = randint(0, c.vocab_size, {3, 8});
  std::vector<int64_t> yv = randint(0, c.vocab_size, {3, 8}).to_vector<int64_t>();
  yv[5] = -1;
  const Tensor y = from_vector(yv, Shape{3, 8});

  auto ref = std::static_pointer_cast<models::GPT>(gpt.clone());
  std::vector<std::shared_ptr<models::TensorParallelGPT>> ranks;
  parallel::InProcessGroup group(std::vector<Device>(static_cast<size_t>(n), Device::cpu()));
  models::TensorParallelGPTOptions options;
  options.sequence_parallel = sequence_parallel;
  for (int r = 0; r < n; ++r)
    ranks.push_back(std::make_shared<models::TensorParallelGPT>(gpt, group.rank(r), options));

  AdamW64 ref_opt(ref->parameters());
  std::vector<double> ref_losses;
  std::vector<std::vector<double>> worst(static_cast<size_t>(n), std::vector<double>(3, 0.0));
  std::vector<nn::TensorDict> ref_grads(1);
  for (int step = 0; step < 3; ++step) {
    ref_opt.zero_grad();
    const Tensor loss = models::GPT::loss(ref->forward(x), y);
    loss.backward();
    ref_losses.push_back(loss.item<double>());
    if (step == 0)
      for (const auto& [name, p] : ref->named_parameters()) ref_grads[0][name] = ops::clone(p.grad());
    ref_opt.step();
  }
  std::vector<std::thread> threads;
  std::vector<std::string> errors(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      try {
        auto& model = *ranks[static_cast<size_t>(r)];
        auto& w = worst[static_cast<size_t>(r)];
        AdamW64 opt(model.parameters());
        for (int step = 0; step < 3; ++step) {
          opt.zero_grad();
          const Tensor loss = model.loss(model.forward(x), y);
          loss.backward();
          model.finish_gradients();
          w[0] = std::max(w[0], std::abs(loss.item<double>() - ref_losses[static_cast<size_t>(step)]));
          if (step == 0)
            for (const auto& [name, p] : model.named_parameters())
              w[1] = std::max(w[1], max_abs(p.grad() - model.shard_of(name, ref_grads[0].at(name))));
          opt.step();
        }
        NoGradGuard no_grad;
        for (const auto& [name, p] : model.named_parameters())
          w[2] = std::max(w[2], max_abs(p - model.shard_of(name, ref->parameter(name))));
      } catch (const std::exception& e) {
        errors[static_cast<size_t>(r)] = e.what();
        group.abort(e.what());
      }
    });
  }
  for (auto& t : threads) t.join();
  for (const std::string& e : errors) REQUIRE(e.empty());
  std::vector<double> out(3, 0.0);
  for (const auto& w : worst)
    for (size_t k = 0; k < 3; ++k) out[k] = std::max(out[k], w[k]);
  return out;
}

}  // namespace

TEST_CASE("GPT tensor parallel in one process, float64, equals the single-device GPT",
          "[gpt_tp]") {
  for (bool sp : {false, true}) {
    for (int n : {2, 4}) {
      const std::vector<double> e = float64_against_single_device(n, sp);
      INFO("tp " << n << (sp ? " + sequence parallel" : "") << ": loss " << e[0] << ", gradient "
                 << e[1] << ", parameter " << e[2]);
      CHECK(e[0] <= 1e-12);
      CHECK(e[1] <= 1e-12);
      CHECK(e[2] <= 1e-12);
    }
  }
}
