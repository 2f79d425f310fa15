// VocabParallelEmbedding and vocab_parallel_cross_entropy (vocab_parallel.h): which rows
// a rank owns, and the few per-row numbers the ranks exchange.
#include <minigrad/parallel/tensor_parallel/vocab_parallel.h>

#include <algorithm>
#include <limits>

#include <minigrad/autograd/functions.h>
#include <minigrad/autograd/grad_mode.h>
#include <minigrad/core/fault_injection.h>
#include <minigrad/core/ops.h>
#include <minigrad/parallel/tensor_parallel/functions.h>
#include <minigrad/parallel/tensor_parallel/sequence_parallel.h>

namespace mg::nn {

VocabParallelEmbedding::VocabParallelEmbedding(const Embedding& full,
                                               parallel::TensorParallelGroupPtr group)
    : Cloneable<VocabParallelEmbedding>("VocabParallelEmbedding"),
      num_embeddings_(full.num_embeddings()),
      embedding_dim_(full.embedding_dim()),
      vocab_start_(0),
      group_(std::move(group)) {
  MG_CHECK(group_ != nullptr, "VocabParallelEmbedding: the tensor-parallel group is null");
  const int64_t part = parallel::shard_size(
      num_embeddings_, group_->size(), "VocabParallelEmbedding: the vocabulary size");
  vocab_start_ = group_->rank() * part;
  NoGradGuard no_grad;
  Tensor rows = ops::clone(ops::narrow(full.parameter("weight"), 0, vocab_start_, part));
  register_parameter("weight", rows.device() == group_->device() ? rows
                                                                  : ops::copy_to(rows, group_->device()));
  parallel::record_placement(weight(), "", full.parameter("weight").shape(),
                             parallel::tensor_parallel_placement(*group_, parallel::Placement::shard(0)));
}

Tensor VocabParallelEmbedding::forward(const Tensor& idx) {
  MG_CHECK(idx.defined() && idx.dtype() == DType::Int64,
           "VocabParallelEmbedding: expected int64 token indices, got {} ({})",
           idx.defined() ? idx.shape().str() : "undefined", group_->describe());
  // Which tokens this rank owns, worked out on the host: the indices are small ([B, T]).
  const std::vector<int64_t> tokens = ops::copy_to(idx, Device::cpu()).to_vector<int64_t>();
  std::vector<int64_t> local(tokens.size()), outside(tokens.size());
  const int64_t part = vocab_per_rank();
  for (size_t i = 0; i < tokens.size(); ++i) {
    MG_CHECK(tokens[i] >= 0 && tokens[i] < num_embeddings_,
             "VocabParallelEmbedding: token {} is outside the vocabulary [0, {}) ({})", tokens[i],
             num_embeddings_, group_->describe());
    const bool mine = tokens[i] >= vocab_start_ && tokens[i] < vocab_start_ + part;
    local[i] = mine ? tokens[i] - vocab_start_ : 0;  // any row: it is zeroed below
    outside[i] = mine ? 0 : 1;
  }
  std::vector<int64_t> mask_shape = idx.shape().sizes();
  mask_shape.push_back(1);  // broadcast over C
  const Device device = weight().device();
  const Tensor rows = embedding(weight(), ops::copy_to(from_vector(local, idx.shape()), device));
  const Tensor mine = masked_fill(rows, ops::copy_to(from_vector(outside, Shape(mask_shape)), device), 0.0);
  // Exactly one rank looked up each token's row; the others contributed zeros.
  return sequence_parallel_ ? parallel::reduce_scatter_to_sequence_parallel(mine, group_)
                            : parallel::reduce_from_parallel(mine, group_);
}

std::string VocabParallelEmbedding::extra_repr() const {
  return fmt::format("{}, {} (rows {}..{} on rank {} of {})", num_embeddings_, embedding_dim_,
                     vocab_start_, vocab_start_ + vocab_per_rank(), group_->rank(),
                     group_->size());
}

}  // namespace mg::nn

namespace mg::parallel {

Tensor vocab_parallel_cross_entropy(const Tensor& logits, const Tensor& targets,
                                    const TensorParallelGroupPtr& group, int64_t ignore_index,
                                    double divide_by) {
  MG_CHECK(group != nullptr, "vocab_parallel_cross_entropy: the tensor-parallel group is null");
  MG_CHECK(logits.defined() && targets.defined() && logits.dim() >= 1 &&
               targets.dtype() == DType::Int64 && targets.dim() == logits.dim() - 1 &&
               targets.numel() * logits.size(-1) == logits.numel(),
           "vocab_parallel_cross_entropy: expected logits [..., V/n] and int64 targets [...] of "
           "the same leading shape, got {} and {} ({})",
           logits.defined() ? logits.shape().str() : "undefined",
           targets.defined() ? targets.shape().str() : "undefined", group->describe());
  const int64_t N = targets.numel(), part = logits.size(-1), start = group->rank() * part;
  const int64_t V = part * group->size();
  const Device device = logits.device();
  const Tensor z = reshape(logits, {N, part});

  // m: the row maxima over the whole vocabulary. Any per-row constant shared by the ranks
  // gives the same loss (it cancels); the maximum keeps exp() in range. Not differentiated.
  Tensor m;
  {
    NoGradGuard no_grad;
    const Tensor zd = z.detach();
    const std::vector<int64_t> arg = ops::copy_to(ops::argmax(zd, 1), Device::cpu()).to_vector<int64_t>();
    std::vector<int64_t> flat(static_cast<size_t>(N));
    for (int64_t i = 0; i < N; ++i) flat[i] = i * part + arg[i];
    const Tensor local_max = ops::contiguous(ops::view(
        ops::embedding(ops::view(ops::contiguous(zd), Shape{N * part, 1}),
                       ops::copy_to(from_vector(flat, Shape{N}), device)),
        Shape{N}));
    const std::vector<double> all =
        ops::copy_to(ops::to_dtype(group->all_gather(local_max), DType::Float64), Device::cpu())
            .to_vector<double>();  // [n, N]
    std::vector<double> row_max(static_cast<size_t>(N), -std::numeric_limits<double>::infinity());
    for (int s = 0; s < group->size(); ++s)
      for (int64_t i = 0; i < N; ++i) row_max[i] = std::max(row_max[i], all[s * N + i]);
    m = ops::copy_to(ops::to_dtype(from_vector(row_max, Shape{N, 1}), logits.dtype()), device);
  }

  // Which targets this rank owns (host: N int64), and which rows count.
  const std::vector<int64_t> t = ops::copy_to(targets, Device::cpu()).to_vector<int64_t>();
  std::vector<int64_t> where(static_cast<size_t>(N));
  std::vector<double> owned(static_cast<size_t>(N)), counted(static_cast<size_t>(N));
  int64_t count = 0;
  for (int64_t i = 0; i < N; ++i) {
    const bool ignored = t[i] == ignore_index;
    MG_CHECK(ignored || (t[i] >= 0 && t[i] < V),
             "vocab_parallel_cross_entropy: target {} is outside the vocabulary [0, {}) and is "
             "not ignore_index {} ({})", t[i], V, ignore_index, group->describe());
    const bool mine = !ignored && t[i] >= start && t[i] < start + part;
    where[i] = i * part + (mine ? t[i] - start : 0);
    owned[i] = mine ? 1.0 : 0.0;
    counted[i] = ignored ? 0.0 : 1.0;
    count += ignored ? 0 : 1;
  }
  const auto on_device = [&](const std::vector<double>& v) {
    return ops::copy_to(ops::to_dtype(from_vector(v, Shape{N}), logits.dtype()), device);
  };

  const Tensor shifted = z - m;                                   // [N, V/n]
  const Tensor sum_exp_local = sum(exp(shifted), {1});            // [N]
  const Tensor target_local =                                     // [N], 0 where not owned
      reshape(embedding(reshape(shifted, {N * part, 1}),
                        ops::copy_to(from_vector(where, Shape{N}), device)),
              {N}) * on_device(owned);
  // One all-reduce of 2N numbers: S and the target's logit (g: backward is the identity,
  // each rank's part of a sum gets the sum's gradient).
  const Tensor both_local = cat({sum_exp_local, target_local}, 0);
  // parity fault: the sum over the vocabulary left to each rank's slice.
  const Tensor both = testing::fault_is_on(testing::Fault::VocabParallelLossNotReduced)
                          ? both_local
                          : reduce_from_parallel(both_local, group);
  const Tensor sum_exp = narrow(both, 0, 0, N), target_logit = narrow(both, 0, N, N);
  const Tensor per_row = (log(sum_exp) - target_logit) * on_device(counted);
  return sum(per_row) / (divide_by > 0 ? divide_by : static_cast<double>(count));
}

}  // namespace mg::parallel
