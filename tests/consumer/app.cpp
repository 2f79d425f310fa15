// A program outside the minigrad tree: one gradient step through the installed library.
#include <minigrad/minigrad.h>

int main() {
  mg::Tensor w = mg::from_vector(std::vector<float>{1, 2, 3}, {3}).set_requires_grad(true);
  mg::Tensor loss = (w * w).sum();
  loss.backward();
  const auto g = w.grad().to_vector<float>();
  const bool ok = g == std::vector<float>{2, 4, 6};
  fmt::print("consumer: grad {} -> {}\n", w.grad(), ok ? "ok" : "WRONG");
  return ok ? 0 : 1;
}
