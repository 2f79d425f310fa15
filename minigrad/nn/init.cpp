#include <minigrad/nn/init.h>

#include <cmath>

#include <minigrad/autograd/grad_mode.h>

namespace mg::nn::init {

int64_t fan_in(const Tensor& weight) {
  MG_CHECK(weight.dim() >= 2, "fan_in: expected a weight with at least 2 dimensions, got {}",
           weight.shape());
  int64_t receptive = 1;
  for (int64_t d = 2; d < weight.dim(); ++d) receptive *= weight.size(d);
  return weight.size(1) * receptive;
}

void uniform_(Tensor& t, double low, double high) {
  NoGradGuard no_grad;
  t.uniform_(low, high);
}

void normal_(Tensor& t, double mean, double stddev) {
  NoGradGuard no_grad;
  t.normal_(mean, stddev);
}

void zeros_(Tensor& t) {
  NoGradGuard no_grad;
  t.zero_();
}

void ones_(Tensor& t) {
  NoGradGuard no_grad;
  t.fill_(1.0);
}

void kaiming_uniform_(Tensor& t, double a) {
  const double gain = std::sqrt(2.0 / (1.0 + a * a));
  const double bound = gain * std::sqrt(3.0 / static_cast<double>(fan_in(t)));
  uniform_(t, -bound, bound);
}

}  // namespace mg::nn::init
