#include <minigrad/models/sampling.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>

#include <minigrad/core/ops.h>
#include <minigrad/core/philox.h>

namespace mg::models {

void check_generate_arguments(const char* who, const Tensor& idx, int64_t max_new_tokens, double temperature,
                              int64_t top_k) {
  MG_CHECK(idx.dim() == 2 && idx.dtype() == DType::Int64 && idx.size(1) >= 1,
           "{}: expected token indices int64 [B, T] with T >= 1, got {} ({})", who, idx.shape(), idx.dtype());
  MG_CHECK(max_new_tokens >= 0, "{}: max_new_tokens must be >= 0, got {}", who, max_new_tokens);
  MG_CHECK(std::isfinite(temperature) && temperature >= 0.0,
           "{}: temperature must be >= 0 and finite (0: always the most likely token), got {}", who, temperature);
  MG_CHECK(top_k >= 0, "{}: top_k must be >= 0 (0: all tokens), got {}", who, top_k);
}

std::vector<double> last_logits(const Tensor& logits) {
  const int64_t T = logits.size(1);
  // In double whatever the model's dtype (a float32 logit converts exactly).
  return ops::to_dtype(ops::copy_to(ops::contiguous(ops::narrow(logits, 1, T - 1, 1)), Device::cpu()), DType::Float64)
      .to_vector<double>();
}

int64_t sample_token(const double* row, int64_t V, double temperature, int64_t top_k, Generator& gen,
                     const char* who, int64_t step, int64_t steps, int64_t sequence) {
  // What torch.multinomial refuses (nanoGPT samples with it): a NaN or +inf logit makes the
  // softmax NaN ("probability tensor contains either inf, nan or element < 0"), and so does a
  // row of -inf alone. Said here, naming the step, rather than sampled from as if it were a
  // distribution.
  double max = -std::numeric_limits<double>::infinity();
  for (int64_t v = 0; v < V; ++v) {
    MG_CHECK(!std::isnan(row[v]) && row[v] != std::numeric_limits<double>::infinity(),
             "{}: step {} of {}, sequence {}: the logit of token {} is {}, so the probabilities are not finite "
             "(torch.multinomial: \"probability tensor contains either inf, nan or element < 0\"); the model's "
             "weights or its input are not finite",
             who, step, steps, sequence, v, row[v]);
    max = std::max(max, row[v]);
  }
  MG_CHECK(max > -std::numeric_limits<double>::infinity(),
           "{}: step {} of {}, sequence {}: every logit is -inf, so the probabilities are not finite "
           "(torch.multinomial: \"probability tensor contains either inf, nan or element < 0\")",
           who, step, steps, sequence);
  int64_t choice = 0;
  if (temperature == 0.0) {
    // The limit of temperature -> 0: all the probability on the largest logit (the first of
    // equal ones, as argmax). No draw from the generator.
    while (row[choice] != max) ++choice;
    return choice;
  }
  // top_k: the k-th largest logit is the cut (ties with it stay, as torch's topk cut).
  double cut = -std::numeric_limits<double>::infinity();
  if (top_k > 0 && top_k < V) {
    std::vector<double> sorted(row, row + V);
    std::nth_element(sorted.begin(), sorted.begin() + (top_k - 1), sorted.end(), std::greater<double>());
    cut = sorted[static_cast<size_t>(top_k - 1)];
  }
  // softmax((logit - max) / temperature): the largest term is exp(0) = 1 for any temperature,
  // however small (logit / temperature alone would overflow to inf).
  std::vector<double> probs(static_cast<size_t>(V));
  double total = 0.0;
  for (int64_t v = 0; v < V; ++v) {
    probs[static_cast<size_t>(v)] = row[v] >= cut ? std::exp((row[v] - max) / temperature) : 0.0;
    total += probs[static_cast<size_t>(v)];
  }
  // One uniform draw from the generator (Philox), then the inverse of the CDF.
  const Generator::Draw draw = gen.reserve(1);
  const double u = philox::uniform(draw.seed, draw.offset, 0) * total;
  choice = V - 1;
  double acc = 0.0;
  for (int64_t v = 0; v < V; ++v) {
    acc += probs[static_cast<size_t>(v)];
    if (u < acc) {
      choice = v;
      break;
    }
  }
  while (probs[static_cast<size_t>(choice)] == 0.0 && choice > 0) --choice;  // rounding at the end
  return choice;
}

}  // namespace mg::models
