// The GPT's activation arithmetic, shared by gpt-parallel-bench and gpt-fsdp-bench: the
// floats per token that nanoGPT's pre-LN block and its head keep for backward, derived
// for this model (float32, dropout 0 so no masks, exact GELU, the fused attention keeping
// its output and one log-sum-exp per head and row, never the T x T probabilities).
// t = tensor-parallel ways, a = n_head, C = n_embd, V = vocab.
#pragma once

namespace mg::bench {

// One block: ln_1's and ln_2's inputs and their mean/rstd (4C + 4, replicated; with
// sequence parallelism the LayerNorms' inputs are sharded but the column layers keep their
// all-gathered inputs whole: 2C/t + 2C + 4/t), c_attn's and c_fc's inputs (ln outputs,
// counted above), q, k, v, the attention output and its contiguous copy for c_proj, c_fc's
// output and GELU's (13C/t), the log-sum-exp of every local head (a/t).
inline double gpt_block_activation_floats(double C, double a, double t = 1.0, bool sp = false) {
  return (sp ? 2 * C / t + 2 * C + 4 / t : 4 * C + 4) + 13 * C / t + a / t;
}

// The head after forward: ln_f's input and output and its mean/rstd (2C + 2; with SP
// 2C/t + C + 2/t) and the logits the fused cross-entropy keeps (V/t; its backward
// recomputes the softmax from them), measured by gpt-fsdp-bench. Its backward adds two
// V/t more at once (the logits' gradient and the head matmul's working copy).
inline double gpt_head_activation_floats(double C, double V, double t = 1.0, bool sp = false) {
  return (sp ? 2 * C / t + C + 2 / t : 2 * C + 2) + V / t;
}

}  // namespace mg::bench
