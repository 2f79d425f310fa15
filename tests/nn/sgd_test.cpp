// optim::SGD against its formula (computed here in double) and against torch.optim.SGD
// (numbers from tests/nn/reference/sgd_reference.py), plus options, zero_grad, skipping,
// and checkpointing the momentum buffers.
#include "catch_compat.h"

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include <minigrad/minigrad.h>
#include <minigrad/nn/optim/sgd.h>
#include <minigrad/nn/serialize.h>

namespace nn = mg::nn;
namespace optim = mg::optim;
using mg::Shape;
using mg::Tensor;

namespace {

// The problem of sgd_reference.py: gradient g = c * p + d at every step.
const std::vector<float> kP0{0.5f, -1.25f, 2.0f, 0.75f};
const std::vector<float> kC{1.0f, 0.5f, -0.25f, 2.0f};
const std::vector<float> kD{0.1f, -0.2f, 0.3f, 0.0f};
constexpr int kSteps = 5;

struct Case {
  const char* name;
  double lr, momentum, dampening, weight_decay;
  bool nesterov;
  std::vector<float> torch_after_5_steps;  // printed by sgd_reference.py (torch 1.13.1)
};

const std::vector<Case> kCases{
    {"plain", 0.1, 0.0, 0.0, 0.0, false,
     {0.254294008f, -0.876738608f, 2.10512662f, 0.245760009f}},
    {"momentum", 0.1, 0.9, 0.0, 0.0, false,
     {-0.117496014f, -0.288307399f, 2.2787087f, -0.435314983f}},
    {"dampening", 0.1, 0.9, 0.5, 0.0, false,
     {0.0518108904f, -0.587430716f, 2.17848468f, -0.213839948f}},
    {"weight_decay", 0.1, 0.0, 0.0, 0.01, false,
     {0.252738744f, -0.871839106f, 2.09442472f, 0.244227856f}},
    {"momentum_weight_decay", 0.1, 0.9, 0.0, 0.01, false,
     {-0.121062465f, -0.276121438f, 2.2502563f, -0.437967092f}},
    {"nesterov", 0.1, 0.9, 0.0, 0.0, true,
     {-0.162748992f, -0.121304892f, 2.37232327f, -0.311788142f}},
    {"nesterov_weight_decay", 0.05, 0.8, 0.0, 0.1, true,
     {0.127091944f, -0.648219705f, 2.0f, 0.0115685621f}},
};

optim::SGDOptions options_of(const Case& c) {
  return optim::SGDOptions(c.lr, c.momentum, c.dampening, c.weight_decay, c.nesterov);
}

// torch.optim.SGD's documented rule, step by step, in double.
std::vector<std::vector<double>> expected_trajectory(const Case& c) {
  std::vector<double> p(kP0.begin(), kP0.end());
  std::vector<double> buf(p.size());
  std::vector<std::vector<double>> out;
  for (int step = 0; step < kSteps; ++step) {
    for (size_t i = 0; i < p.size(); ++i) {
      double d_p = double(kC[i]) * p[i] + double(kD[i]);
      d_p += c.weight_decay * p[i];
      if (c.momentum != 0) {
        buf[i] = step == 0 ? d_p : c.momentum * buf[i] + (1 - c.dampening) * d_p;
        d_p = c.nesterov ? d_p + c.momentum * buf[i] : buf[i];
      }
      p[i] -= c.lr * d_p;
    }
    out.push_back(p);
  }
  return out;
}

void set_problem_grad(const Tensor& p) {
  const auto v = p.to_vector<float>();
  std::vector<float> g(v.size());
  for (size_t i = 0; i < v.size(); ++i) g[i] = kC[i] * v[i] + kD[i];
  p.set_grad(mg::from_vector(g, p.shape()));
}

Tensor problem_parameter() { return mg::from_vector(kP0, Shape{4}).set_requires_grad(true); }

// A fresh directory for files, removed at the end of the test.
struct TempDir {
  std::filesystem::path path;
  TempDir() {
    path = std::filesystem::temp_directory_path() / ("minigrad-sgd-test-" + std::to_string(::getpid()));
    std::filesystem::remove_all(path);
    std::filesystem::create_directories(path);
  }
  ~TempDir() { std::filesystem::remove_all(path); }
  std::string file(const std::string& name) const { return (path / name).string(); }
};

}  // namespace

TEST_CASE("SGD: every step follows the formula, for each option") {
  for (const Case& c : kCases) {
    INFO("case " << c.name);
    Tensor p = problem_parameter();
    optim::SGD sgd({p}, options_of(c));
    const auto expected = expected_trajectory(c);
    for (int step = 0; step < kSteps; ++step) {
      set_problem_grad(p);
      sgd.step();
      const auto got = p.to_vector<float>();
      INFO("after step " << step + 1);
      for (size_t i = 0; i < got.size(); ++i)
        CHECK(got[i] == Approx(expected[static_cast<size_t>(step)][i]).margin(2e-6));
    }
  }
}

TEST_CASE("SGD: matches torch.optim.SGD after 5 steps (sgd_reference.py)") {
  for (const Case& c : kCases) {
    INFO("case " << c.name);
    Tensor p = problem_parameter();
    optim::SGD sgd({p}, options_of(c));
    for (int step = 0; step < kSteps; ++step) {
      set_problem_grad(p);
      sgd.step();
    }
    const auto got = p.to_vector<float>();
    // PyTorch's CPU add_ uses a fused multiply-add; we round twice. A few ulps apart.
    for (size_t i = 0; i < got.size(); ++i)
      CHECK(got[i] == Approx(c.torch_after_5_steps[i]).margin(5e-7));
  }
}

TEST_CASE("SGD: the momentum buffer is d_p at the first step, then momentum*buf+(1-dampening)*d_p") {
  Tensor p = problem_parameter();
  optim::SGD sgd({p}, optim::SGDOptions(0.1).momentum(0.5).dampening(0.25));
  CHECK_FALSE(sgd.momentum_buffer(0).defined());
  set_problem_grad(p);
  const auto g1 = p.grad().to_vector<float>();
  sgd.step();
  REQUIRE(sgd.momentum_buffer(0).defined());
  CHECK(sgd.momentum_buffer(0).to_vector<float>() == g1);  // a copy of d_p, not dampened
  CHECK_FALSE(sgd.momentum_buffer(0).is_same(p.grad()));

  set_problem_grad(p);
  const auto g2 = p.grad().to_vector<float>();
  sgd.step();
  const auto buf = sgd.momentum_buffer(0).to_vector<float>();
  for (size_t i = 0; i < buf.size(); ++i) CHECK(buf[i] == Approx(0.5 * g1[i] + 0.75 * g2[i]));
  REQUIRE_THROWS_WITH(sgd.momentum_buffer(1), MG_CONTAINS("index 1 out of range for 1"));
}

TEST_CASE("SGD: a training step through backward updates p by -lr * grad, grads untouched") {
  mg::manual_seed(11);
  nn::Linear model(3, 2);
  const Tensor x = mg::randn(Shape{4, 3});
  const Tensor y = mg::from_vector(std::vector<int64_t>{0, 1, 1, 0}, Shape{4});
  optim::SGD sgd(model.parameters(), optim::SGDOptions(0.5).weight_decay(0.1));
  nn::CrossEntropyLoss criterion;
  criterion(model.forward(x), y).backward();

  std::vector<std::vector<float>> before, grads;
  for (const Tensor& p : model.parameters()) {
    before.push_back(p.to_vector<float>());
    grads.push_back(p.grad().to_vector<float>());
  }
  sgd.step();
  const auto params = model.parameters();
  for (size_t k = 0; k < params.size(); ++k) {
    const auto after = params[k].to_vector<float>();
    CHECK(params[k].grad().to_vector<float>() == grads[k]);  // weight decay left grad alone
    for (size_t i = 0; i < after.size(); ++i)
      CHECK(after[i] ==
            Approx(before[k][i] - 0.5 * (grads[k][i] + 0.1 * before[k][i])).margin(1e-7));
  }
  CHECK(params[0].is_leaf());
  CHECK(params[0].requires_grad());
}

TEST_CASE("SGD: parameters without a gradient are skipped") {
  Tensor a = problem_parameter();
  Tensor b = problem_parameter();
  optim::SGD sgd({a, b}, optim::SGDOptions(0.1, 0.9));
  set_problem_grad(a);
  sgd.step();
  CHECK(b.to_vector<float>() == kP0);
  CHECK_FALSE(sgd.momentum_buffer(1).defined());
  CHECK(a.to_vector<float>() != kP0);
}

TEST_CASE("SGD: zero_grad clears gradients, or zeroes them in place") {
  Tensor a = problem_parameter();
  Tensor b = problem_parameter();
  optim::SGD sgd({a, b}, optim::SGDOptions(0.1));
  set_problem_grad(a);
  set_problem_grad(b);
  const Tensor grad_a = a.grad();
  sgd.zero_grad(/*set_to_none=*/false);
  CHECK(a.grad().is_same(grad_a));
  CHECK(grad_a.to_vector<float>() == std::vector<float>(4, 0.0f));
  sgd.zero_grad();
  CHECK_FALSE(a.grad().defined());
  CHECK_FALSE(b.grad().defined());
}

TEST_CASE("SGDOptions: chainable setters, PyTorch argument order, and changes between steps") {
  const optim::SGDOptions chained = optim::SGDOptions(0.1).momentum(0.9).nesterov(true).weight_decay(1e-4);
  CHECK(chained.lr() == 0.1);
  CHECK(chained.momentum() == 0.9);
  CHECK(chained.dampening() == 0.0);
  CHECK(chained.weight_decay() == 1e-4);
  CHECK(chained.nesterov());
  const optim::SGDOptions braced{0.2, 0.8, 0.1, 0.01};
  CHECK(braced.momentum() == 0.8);
  CHECK(braced.dampening() == 0.1);
  CHECK(braced.weight_decay() == 0.01);
  CHECK_FALSE(braced.nesterov());

  // A new learning rate takes effect at the next step.
  Tensor p = mg::from_vector(std::vector<float>{1.0f}, Shape{1}).set_requires_grad(true);
  optim::SGD sgd({p}, 0.5);
  p.set_grad(mg::ones(Shape{1}));
  sgd.step();
  CHECK(p.item<float>() == 0.5f);
  sgd.set_options(optim::SGDOptions(0.25));
  sgd.step();
  CHECK(p.item<float>() == 0.25f);
  REQUIRE_THROWS_WITH(sgd.set_options(optim::SGDOptions(-1.0)),
                      MG_CONTAINS("invalid learning rate: -1"));
  CHECK(sgd.options().lr() == 0.25);
}

TEST_CASE("SGD: invalid options and parameters are refused with PyTorch's reasons") {
  Tensor p = problem_parameter();
  REQUIRE_THROWS_WITH(optim::SGD({p}, optim::SGDOptions(-0.1)),
                      MG_CONTAINS("SGD: invalid learning rate: -0.1 (must be >= 0)"));
  REQUIRE_THROWS_WITH(optim::SGD({p}, optim::SGDOptions(std::nan(""))),
                      MG_CONTAINS("invalid learning rate: nan"));
  REQUIRE_THROWS_WITH(optim::SGD({p}, optim::SGDOptions(0.1).momentum(-0.5)),
                      MG_CONTAINS("SGD: invalid momentum value: -0.5"));
  REQUIRE_THROWS_WITH(optim::SGD({p}, optim::SGDOptions(0.1).weight_decay(-1e-4)),
                      MG_CONTAINS("SGD: invalid weight_decay value: -0.0001"));
  REQUIRE_THROWS_WITH(optim::SGD({p}, optim::SGDOptions(0.1).nesterov(true)),
                      MG_CONTAINS("Nesterov momentum requires a momentum > 0 and zero dampening "
                                  "(got momentum=0, dampening=0)"));
  REQUIRE_THROWS_WITH(optim::SGD({p}, optim::SGDOptions(0.1, 0.9, 0.5, 0.0, true)),
                      MG_CONTAINS("(got momentum=0.9, dampening=0.5)"));
  REQUIRE_THROWS_WITH(optim::SGD({p, Tensor()}, 0.1),
                      MG_CONTAINS("SGD: parameter 1 is an undefined tensor"));
  REQUIRE_THROWS_WITH(optim::SGD({p * 2.0}, 0.1),
                      MG_CONTAINS("can't optimize a non-leaf tensor (parameter 0, shape [4])"));
  REQUIRE_THROWS_WITH(optim::SGD({p, p}, 0.1),
                      MG_CONTAINS("parameter 1 is the same tensor as parameter 0"));
  REQUIRE_THROWS_WITH(optim::SGD({mg::zeros(Shape{2}, mg::DType::Int64)}, 0.1),
                      MG_CONTAINS("parameter 0 (shape [2]) is int64, expected a floating-point tensor"));
}

TEST_CASE("SGD: resuming from saved momentum buffers continues bit for bit") {
  TempDir dir;
  const Case& c = kCases[6];  // nesterov with weight decay: every term of the rule
  Tensor p = problem_parameter();
  optim::SGD sgd({p}, options_of(c));
  for (int step = 0; step < 3; ++step) {
    set_problem_grad(p);
    sgd.step();
  }
  // The checkpoint: parameter and optimizer state in one file.
  nn::Checkpoint ck;
  ck.put("model.", {{"p", p}});
  ck.put("optim.", sgd.state_dict());
  CHECK(sgd.state_dict().count("momentum_buffer.0") == 1);
  nn::save_tensors(ck, dir.file("ck.safetensors"));

  // The original run continues ...
  for (int step = 0; step < 2; ++step) {
    set_problem_grad(p);
    sgd.step();
  }
  // ... and a fresh optimizer resumed from the file takes the same path.
  const nn::Checkpoint loaded = nn::load_tensors(dir.file("ck.safetensors"));
  Tensor q = loaded.get("model.").at("p").set_requires_grad(true);
  optim::SGD resumed({q}, options_of(c));
  resumed.load_state_dict(loaded.get("optim."), dir.file("ck.safetensors"));
  for (int step = 0; step < 2; ++step) {
    set_problem_grad(q);
    resumed.step();
  }
  CHECK(q.to_vector<float>() == p.to_vector<float>());
  CHECK(resumed.momentum_buffer(0).to_vector<float>() == sgd.momentum_buffer(0).to_vector<float>());
}

TEST_CASE("SGD: load_state_dict reports every problem at once and changes nothing") {
  Tensor a = problem_parameter();
  Tensor b = mg::zeros(Shape{2, 3}).set_requires_grad(true);
  optim::SGD sgd({a, b}, optim::SGDOptions(0.1, 0.9));
  set_problem_grad(a);
  sgd.step();
  const auto buf_before = sgd.momentum_buffer(0).to_vector<float>();

  const std::map<std::string, Tensor> bad{
      {"momentum_buffer.0", mg::zeros(Shape{5})},
      {"momentum_buffer.1", mg::zeros(Shape{2, 3}, mg::DType::Int64)},
      {"momentum_buffer.7", mg::zeros(Shape{1})},
      {"step", mg::zeros(Shape{1})},
  };
  try {
    sgd.load_state_dict(bad, "ckpt.safetensors");
    FAIL("load_state_dict accepted a mismatched state");
  } catch (const mg::Error& e) {
    const std::string msg = e.what();
    CHECK_THAT(msg, MG_CONTAINS("ckpt.safetensors does not fit this optimizer (4 problems)"));
    CHECK_THAT(msg, MG_CONTAINS("'momentum_buffer.0' has shape [5] (float32), but parameter 0 "
                                "has shape [4] (float32)"));
    CHECK_THAT(msg, MG_CONTAINS("'momentum_buffer.1' has shape [2, 3] (int64), but parameter 1 "
                                "has shape [2, 3] (float32)"));
    CHECK_THAT(msg, MG_CONTAINS("'momentum_buffer.7' is for parameter 7, but the optimizer has 2"));
    CHECK_THAT(msg, MG_CONTAINS("unexpected key 'step'"));
  }
  CHECK(sgd.momentum_buffer(0).to_vector<float>() == buf_before);
  CHECK_FALSE(sgd.momentum_buffer(1).defined());

  // An empty state means "no buffers yet", as a fresh optimizer.
  sgd.load_state_dict({});
  CHECK_FALSE(sgd.momentum_buffer(0).defined());
}

// A training loop holds its optimizer as an optim::Optimizer (train_fashion_mnist does):
// through it, a learning-rate schedule and a checkpoint reach SGD's own state.
TEST_CASE("SGD through optim::Optimizer: set_lr is validated, steps and state are SGD's") {
  Tensor p = problem_parameter();
  Tensor q = problem_parameter();
  optim::SGD direct({q}, optim::SGDOptions(0.1, 0.9));
  std::unique_ptr<optim::Optimizer> opt =
      std::make_unique<optim::SGD>(std::vector<Tensor>{p}, optim::SGDOptions(0.1, 0.9));
  CHECK(opt->lr() == 0.1);
  opt->set_lr(0.05);
  optim::SGDOptions direct_options = direct.options();
  direct.set_options(direct_options.lr(0.05));
  CHECK(opt->lr() == 0.05);
  for (int step = 0; step < 3; ++step) {
    set_problem_grad(p);
    set_problem_grad(q);
    opt->step();
    direct.step();
  }
  CHECK(p.to_vector<float>() == q.to_vector<float>());
  CHECK(opt->state_dict().count("momentum_buffer.0") == 1);
  REQUIRE_THROWS_WITH(opt->set_lr(-1.0), MG_CONTAINS("SGD: invalid learning rate: -1"));
  CHECK(opt->lr() == 0.05);  // a refused value changes nothing
  REQUIRE_THROWS_WITH(opt->check_state_dict({{"step", mg::zeros(Shape{1})}}, "ck.safetensors"),
                      MG_CONTAINS("ck.safetensors does not fit this optimizer"));
  opt->zero_grad();
  CHECK_FALSE(p.grad().defined());
}
