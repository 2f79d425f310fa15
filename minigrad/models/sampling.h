// How a language model's next token is drawn from its last logits, nanoGPT's generate's way
// (softmax of logits / temperature over the top_k most likely, one uniform draw from a
// Philox generator, the inverse of the CDF), shared by GPT::generate and Llama::generate so
// that both draw alike.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <minigrad/core/generator.h>
#include <minigrad/core/tensor.h>

namespace mg::models {

// The checks of generate's arguments, as mg::Errors naming `who` ("GPT::generate"): idx int64
// [B, T] with T >= 1, max_new_tokens >= 0, temperature >= 0 and finite, top_k >= 0.
void check_generate_arguments(const char* who, const Tensor& idx, int64_t max_new_tokens, double temperature,
                              int64_t top_k);

// The last position's logits of each sequence: logits [B, T, V] -> B rows of V doubles.
std::vector<double> last_logits(const Tensor& logits);

// One token from `row` (V logits) at `temperature` (0: the argmax, the first of equal ones; no
// draw) among the top_k largest (0: all), one draw from `gen`. Logits that make no
// distribution (NaN, +inf, all -inf) are an mg::Error naming `who`, the step (1-based, of
// `steps`) and the sequence, as torch.multinomial refuses them.
int64_t sample_token(const double* row, int64_t V, double temperature, int64_t top_k, Generator& gen,
                     const char* who, int64_t step, int64_t steps, int64_t sequence);

}  // namespace mg::models
