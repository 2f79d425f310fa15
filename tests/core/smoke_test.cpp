#include "catch_compat.h"

#include <minigrad/minigrad.h>

TEST_CASE("smoke: grad of sum of squares") {
  mg::Tensor w = mg::from_vector(std::vector<float>{1, 2, 3}, {3}).set_requires_grad(true);
  mg::Tensor loss = (w * w).sum();
  loss.backward();
  REQUIRE(w.grad().to_vector<float>() == std::vector<float>{2, 4, 6});
}
