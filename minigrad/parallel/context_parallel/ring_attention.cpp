// Ring attention, forward and backward: see ring_attention.h; docs/context-parallel.md
// walks through the ring, the layout and the arithmetic.
//
// The unit of work is one (query chunk, key chunk) pair: a rank holds two query chunks,
// and each block it receives holds two key chunks, so every step is at most four calls of
// the fused attention kernel (Backend::attention, FlashAttention's online softmax; on the
// GPU its CUDA twin), each on whole chunks. Under the causal mask a pair is full, causal
// (the diagonal) or empty purely by the chunks' global indices, and empty pairs are
// skipped: that is where the load-balanced layout pays.
#include <minigrad/parallel/context_parallel/ring_attention.h>

#include <cmath>

#include <minigrad/autograd/functions.h>
#include <minigrad/autograd/grad_mode.h>
#include <minigrad/autograd/node.h>
#include <minigrad/autograd/saved_tensor.h>
#include <minigrad/core/fault_injection.h>
#include <minigrad/core/ops.h>
#include <minigrad/parallel/context_parallel/sequence_layout.h>
#include <minigrad/parallel/context_parallel/wire.h>

namespace mg::parallel::context_parallel {

namespace {

enum class BlockMask { Full, Causal, Empty };

// How query chunk `q_chunk` sees key chunk `k_chunk` (global chunk indices).
BlockMask block_mask(int64_t q_chunk, int64_t k_chunk, bool is_causal) {
  if (!is_causal || q_chunk > k_chunk) return BlockMask::Full;  // every key is earlier
  if (q_chunk == k_chunk) return BlockMask::Causal;             // the diagonal: j <= i
  // parity fault: the future chunks attended as if they were the past (fault_injection.h).
  if (testing::fault_is_on(testing::Fault::RingAttentionFutureBlocksSeen)) return BlockMask::Full;
  return BlockMask::Empty;  // every key is later than every query: nothing to do
}

// Chunk `a` (0 or 1) of a local [B, H, 2c, ...] tensor, contiguous for the kernel.
Tensor local_chunk(const Tensor& t, int64_t a) {
  const int64_t c = t.size(2) / 2;
  return ops::contiguous(ops::narrow(t, 2, a * c, c));
}

// [B, H, c] -> [B, H, c, 1], to scale the rows of an output [B, H, c, D].
Tensor rows(const Tensor& lse) {
  std::vector<int64_t> shape = lse.shape().sizes();
  shape.push_back(1);
  return ops::view(lse, Shape(shape));
}

// One query chunk's attention so far: the output over the keys seen, and the log-sum-exp
// of their scores. Merging a new partial (o2, lse2) is the online softmax:
//   lse = log(e^lse1 + e^lse2) = m + log(e^(lse1 - m) + e^(lse2 - m)),  m = max(lse1, lse2)
//   out = out1 e^(lse1 - lse) + out2 e^(lse2 - lse)
// (each partial output is normalised over its own keys; the factors re-weigh them by the
// share of the softmax's denominator their keys hold).
struct Partial {
  Tensor out, lse;

  void merge(const Tensor& o2, const Tensor& lse2) {
    if (!out.defined()) {
      out = o2;
      lse = lse2;
      return;
    }
    using ops::binary;
    using ops::unary;
    const Tensor m = binary(BinaryOp::Maximum, lse, lse2);
    const Tensor sum = binary(BinaryOp::Add, unary(UnaryOp::Exp, binary(BinaryOp::Sub, lse, m)),
                              unary(UnaryOp::Exp, binary(BinaryOp::Sub, lse2, m)));
    const Tensor merged = binary(BinaryOp::Add, m, unary(UnaryOp::Log, sum));
    const Tensor w1 = unary(UnaryOp::Exp, binary(BinaryOp::Sub, lse, merged));
    const Tensor w2 = unary(UnaryOp::Exp, binary(BinaryOp::Sub, lse2, merged));
    out = binary(BinaryOp::Add, binary(BinaryOp::Mul, out, rows(w1)),
                 binary(BinaryOp::Mul, o2, rows(w2)));
    lse = merged;
  }
};

// The blocks that travel: a rank's keys and values, [B, H, 2c, D] each, split in its
// two chunks. Posting the next block's transfer before computing on this one lets the
// network work while the kernel does (the tensors are only read meanwhile).
struct RingStep {
  std::shared_ptr<Work> send, recv;
  std::vector<Tensor> incoming;

  void start(ProcessGroup& group, const std::vector<Tensor>& outgoing, int tag) {
    const int next = (group.rank() + 1) % group.size();
    const int prev = (group.rank() + group.size() - 1) % group.size();
    for (const Tensor& t : outgoing) incoming.push_back(empty_like(t));
    recv = recv_any(group, incoming, prev, tag);
    send = send_any(group, outgoing, next, tag);
  }
  std::vector<Tensor> finish() {
    send->wait();
    recv->wait();
    return incoming;
  }
};

void check_inputs(const Tensor& q, const Tensor& k, const Tensor& v,
                  const std::shared_ptr<ProcessGroup>& group) {
  MG_CHECK(group != nullptr, "ring_attention: the context-parallel group is null");
  MG_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4 && q.shape() == k.shape() &&
               k.shape() == v.shape(),
           "ring_attention: expected q, k, v of one shape [B, H, 2c, D] (this rank's two "
           "sequence chunks), got q {}, k {}, v {}",
           q.shape(), k.shape(), v.shape());
  MG_CHECK(q.size(2) % 2 == 0 && q.size(2) > 0,
           "ring_attention: a rank holds two equal sequence chunks, but its q has {} "
           "positions (shape {}); shard with context_parallel::shard_sequence",
           q.size(2), q.shape());
  MG_CHECK(q.dtype() == DType::Float32 || q.dtype() == DType::Float64 || is_reduced_float(q.dtype()),
           "ring_attention: expected floating-point q, k, v, got {}", q.dtype());
  MG_CHECK(k.dtype() == q.dtype() && v.dtype() == q.dtype(), "ring_attention: q, k, v are {}, {}, {}; expected one dtype",
           q.dtype(), k.dtype(), v.dtype());
  MG_CHECK(q.device() == group->device(),
           "ring_attention: q, k, v are on {}, but the group works on {}", q.device(),
           group->device());
  ops::check_attention(q, k, v);
}

// {out, lse} of this rank's queries against the whole sequence.
std::vector<Tensor> ring_forward(const Tensor& q, const Tensor& k, const Tensor& v,
                                 ProcessGroup& group, bool is_causal, double scale) {
  const int cp = group.size(), rank = group.rank();
  const std::vector<int64_t> mine = chunks_of_rank(rank, cp);
  const Tensor q_chunks[2] = {local_chunk(q, 0), local_chunk(q, 1)};
  std::vector<Tensor> block = {local_chunk(k, 0), local_chunk(k, 1), local_chunk(v, 0),
                               local_chunk(v, 1)};
  Partial partial[2];
  for (int step = 0; step < cp; ++step) {
    const std::vector<int64_t> theirs = chunks_of_rank((rank - step + cp) % cp, cp);
    RingStep transfer;
    if (step + 1 < cp) transfer.start(group, block, kRingTagForward);
    for (int a = 0; a < 2; ++a) {
      for (int b = 0; b < 2; ++b) {
        const BlockMask mask = block_mask(mine[a], theirs[b], is_causal);
        if (mask == BlockMask::Empty) continue;
        const std::vector<Tensor> r =
            ops::attention(q_chunks[a], block[b], block[2 + b], scale,
                           mask == BlockMask::Causal, 0.0, 0, 0);
        partial[a].merge(r[0], r[1]);
      }
    }
    if (step + 1 < cp) block = transfer.finish();
  }
  NoGradGuard no_grad;
  return {cat({partial[0].out, partial[1].out}, 2), cat({partial[0].lse, partial[1].lse}, 2)};
}

// {dq, dk, dv}: the blocks go round again, each carrying the gradients of its keys and
// values, to which every rank adds its queries' share.
std::vector<Tensor> ring_backward(const Tensor& grad_out, const Tensor& q, const Tensor& k,
                                  const Tensor& v, const Tensor& out, const Tensor& lse,
                                  ProcessGroup& group, bool is_causal, double scale) {
  const int cp = group.size(), rank = group.rank();
  const std::vector<int64_t> mine = chunks_of_rank(rank, cp);
  const Tensor q_chunks[2] = {local_chunk(q, 0), local_chunk(q, 1)};
  const Tensor go[2] = {local_chunk(grad_out, 0), local_chunk(grad_out, 1)};
  const Tensor o[2] = {local_chunk(out, 0), local_chunk(out, 1)};
  const Tensor l[2] = {local_chunk(lse, 0), local_chunk(lse, 1)};
  Tensor dq[2] = {zeros_like(q_chunks[0]), zeros_like(q_chunks[1])};
  std::vector<Tensor> block = {local_chunk(k, 0), local_chunk(k, 1), local_chunk(v, 0),
                               local_chunk(v, 1)};
  // dk of the block's two chunks, then dv of them: they travel with the block.
  std::vector<Tensor> grads = {zeros_like(block[0]), zeros_like(block[1]),
                               zeros_like(block[2]), zeros_like(block[3])};
  const auto add = [](const Tensor& a, const Tensor& b) { return ops::binary(BinaryOp::Add, a, b); };
  for (int step = 0; step < cp; ++step) {
    const std::vector<int64_t> theirs = chunks_of_rank((rank - step + cp) % cp, cp);
    RingStep transfer;
    if (step + 1 < cp) transfer.start(group, block, kRingTagBackward);
    for (int a = 0; a < 2; ++a) {
      for (int b = 0; b < 2; ++b) {
        const BlockMask mask = block_mask(mine[a], theirs[b], is_causal);
        if (mask == BlockMask::Empty) continue;
        // Given the merged out and lse, the kernel's backward is exactly this pair's
        // share: P = exp(S - lse) is the final probability of these keys, and
        // rowsum(dO * O) is the whole row's.
        const std::vector<Tensor> r = ops::attention_backward(
            go[a], q_chunks[a], block[b], block[2 + b], o[a], l[a], scale,
            mask == BlockMask::Causal, 0.0, 0, 0);
        dq[a] = add(dq[a], r[0]);
        grads[b] = add(grads[b], r[1]);
        grads[2 + b] = add(grads[2 + b], r[2]);
      }
    }
    // The gradients follow their block to the next rank; the last hop takes them home
    // (after cp steps the block a rank holds is its next neighbour's own).
    if (cp > 1) {
      RingStep gradient_transfer;
      gradient_transfer.start(group, grads, kRingTagGradients);
      grads = gradient_transfer.finish();
    }
    if (step + 1 < cp) block = transfer.finish();
  }
  NoGradGuard no_grad;
  return {cat({dq[0], dq[1]}, 2), cat({grads[0], grads[1]}, 2), cat({grads[2], grads[3]}, 2)};
}

}  // namespace

Tensor ring_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                      const std::shared_ptr<ProcessGroup>& group, bool is_causal) {
  check_inputs(q, k, v, group);
  if (is_reduced_float(q.dtype())) {
    // bfloat16 or float16 (autocast, or 16-bit weights): the ring runs in float32, as the
    // single-device attention computes on widened copies -- the online softmax merges blocks
    // through float32 statistics -- and the output is rounded once into q's dtype. So the key
    // and value blocks travel the ring as float32 (twice the bytes of 16-bit messages).
    return to(ring_attention(to(q, DType::Float32), to(k, DType::Float32), to(v, DType::Float32), group, is_causal),
              q.dtype());
  }
  const double scale = 1.0 / std::sqrt(static_cast<double>(q.size(3)));
  const std::vector<Tensor> r = ring_forward(q, k, v, *group, is_causal, scale);
  const Tensor out = r[0];
  record_function("RingAttentionBackward", {q, k, v}, {out},
                  [q = SavedTensor(q), k = SavedTensor(k), v = SavedTensor(v),
                   out = SavedTensor(out), lse = SavedTensor(r[1]), group, is_causal,
                   scale](const BackwardArgs& g) {
                    return ring_backward(ops::contiguous(g.grad()), q.unpack(g), k.unpack(g),
                                         v.unpack(g), out.unpack(g), lse.unpack(g), *group,
                                         is_causal, scale);
                  });
  return out;
}

std::vector<RingStepWork> ring_attention_work(int rank, int cp, bool is_causal) {
  const std::vector<int64_t> mine = chunks_of_rank(rank, cp);
  std::vector<RingStepWork> steps(static_cast<size_t>(cp));
  for (int step = 0; step < cp; ++step) {
    const std::vector<int64_t> theirs = chunks_of_rank((rank - step + cp) % cp, cp);
    for (int64_t a : mine) {
      for (int64_t b : theirs) {
        const BlockMask mask = block_mask(a, b, is_causal);
        if (mask == BlockMask::Full) ++steps[static_cast<size_t>(step)].full;
        if (mask == BlockMask::Causal) ++steps[static_cast<size_t>(step)].causal;
      }
    }
  }
  return steps;
}

std::function<Tensor(const Tensor&, const Tensor&, const Tensor&, double)> ring_attention_function(
    std::shared_ptr<ProcessGroup> group, bool is_causal) {
  return [group = std::move(group), is_causal](const Tensor& q, const Tensor& k, const Tensor& v,
                                               double dropout_p) {
    MG_CHECK(dropout_p == 0.0,
             "ring_attention: no attention dropout under context parallelism, got dropout_p {} "
             "(set the GPT's dropout to 0, or call eval())",
             dropout_p);
    return ring_attention(q, k, v, group, is_causal);
  };
}

}  // namespace mg::parallel::context_parallel
