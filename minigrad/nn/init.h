// Parameter initialisation, as torch.nn.init. All draw from the default generator.
#pragma once

#include <minigrad/core/tensor.h>

namespace mg::nn::init {

// fan_in = size(1) * (receptive field) for weights of shape [out, in, ...].
int64_t fan_in(const Tensor& weight);
void uniform_(Tensor& t, double low, double high);
void normal_(Tensor& t, double mean = 0.0, double stddev = 1.0);
void zeros_(Tensor& t);
void ones_(Tensor& t);
// Kaiming-uniform with leaky-ReLU slope `a` (fan_in mode): bound = gain * sqrt(3 / fan_in),
// gain = sqrt(2 / (1 + a^2)). nn::Linear uses a = sqrt(5), giving bound = 1 / sqrt(fan_in).
void kaiming_uniform_(Tensor& t, double a = 0.0);

}  // namespace mg::nn::init
