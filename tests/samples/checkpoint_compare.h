// Two checkpoints' dicts compared, for the trainers' tests (train_gpt's splits and precisions,
// train_fashion_mnist's precisions): close up to float32 rounding, or identical bit for bit.
#pragma once

#include <cstdint>
#include <vector>

#include <minigrad/core/ops.h>
#include <minigrad/nn/serialize.h>

#include "catch_compat.h"

namespace mg::testing {

// Every tensor of two checkpoints' dicts (the model's or the optimizer's) equal up to float32
// rounding, AdamW's step counts exactly. The margin: seen 1e-6 after 4 steps under a split.
inline void require_close(const mg::nn::TensorDict& a, const mg::nn::TensorDict& b) {
  REQUIRE(!a.empty());
  REQUIRE(a.size() == b.size());
  for (const auto& [name, t] : a) {
    INFO(name);
    REQUIRE(b.count(name) == 1);
    if (t.dtype() == mg::DType::Int64) {  // AdamW's step counts
      REQUIRE(t.to_vector<int64_t>() == b.at(name).to_vector<int64_t>());
      continue;
    }
    const std::vector<float> x = t.to_vector<float>(), y = b.at(name).to_vector<float>();
    REQUIRE(x.size() == y.size());
    for (size_t i = 0; i < x.size(); ++i) REQUIRE(y[i] == Approx(x[i]).margin(1e-5));
  }
}

// Every tensor of two dicts equal bit for bit, dtypes included (16-bit values widen to float32
// exactly).
inline void require_identical(const mg::nn::TensorDict& a, const mg::nn::TensorDict& b) {
  REQUIRE(a.size() == b.size());
  for (const auto& [name, t] : a) {
    INFO(name);
    REQUIRE(b.count(name) == 1);
    REQUIRE(t.dtype() == b.at(name).dtype());
    if (t.dtype() == mg::DType::Int64) {
      REQUIRE(t.to_vector<int64_t>() == b.at(name).to_vector<int64_t>());
    } else {
      const std::vector<float> x = mg::ops::to_dtype(t, mg::DType::Float32).to_vector<float>();
      const std::vector<float> y = mg::ops::to_dtype(b.at(name), mg::DType::Float32).to_vector<float>();
      REQUIRE(x == y);
    }
  }
}

}  // namespace mg::testing
