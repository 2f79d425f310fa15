// The load-balanced sequence layout of context parallelism: see sequence_layout.h.
#include <minigrad/parallel/context_parallel/sequence_layout.h>

#include <minigrad/autograd/functions.h>
#include <minigrad/autograd/grad_mode.h>
#include <minigrad/core/ops.h>
#include <minigrad/parallel/context_parallel/wire.h>

namespace mg::parallel::context_parallel {

std::vector<int64_t> chunks_of_rank(int rank, int cp) {
  MG_CHECK(cp >= 1 && rank >= 0 && rank < cp,
           "context parallel: rank {} is not one of a group of {}", rank, cp);
  return {rank, 2 * cp - 1 - rank};
}

int64_t chunk_length(int64_t T, int cp, const char* what) {
  MG_CHECK(cp >= 1, "{}: the context-parallel group has {} ranks", what, cp);
  MG_CHECK(T > 0 && T % (2 * static_cast<int64_t>(cp)) == 0,
           "{}: a sequence of length {} does not cut into 2 * cp = {} equal chunks (cp = {}); "
           "each rank holds two chunks, so the length must be a multiple of {}",
           what, T, 2 * cp, cp, 2 * cp);
  return T / (2 * static_cast<int64_t>(cp));
}

namespace {
int64_t checked_dim(const Tensor& x, int64_t dim, const char* what) {
  const int64_t d = dim < 0 ? dim + x.dim() : dim;
  MG_CHECK(d >= 0 && d < x.dim(), "{}: dim {} is not a dimension of a tensor of shape {}", what,
           dim, x.shape());
  return d;
}
}  // namespace

Tensor shard_sequence(const Tensor& x, int rank, int cp, int64_t dim) {
  const int64_t d = checked_dim(x, dim, "shard_sequence");
  const int64_t c = chunk_length(x.size(d), cp, "shard_sequence");
  const std::vector<int64_t> mine = chunks_of_rank(rank, cp);
  return cat({narrow(x, d, mine[0] * c, c), narrow(x, d, mine[1] * c, c)}, d);
}

Tensor gather_sequence(const Tensor& local, ProcessGroup& group, int64_t dim) {
  const int64_t d = checked_dim(local, dim, "gather_sequence");
  const int cp = group.size();
  MG_CHECK(local.size(d) % 2 == 0,
           "gather_sequence: a rank's shard holds two equal chunks, but its length is {} "
           "(shape {})", local.size(d), local.shape());
  const int64_t c = local.size(d) / 2, n = local.numel();
  const Tensor all = all_gather_any(local, group);
  std::vector<Tensor> chunks(static_cast<size_t>(2 * cp));
  for (int r = 0; r < cp; ++r) {
    const Tensor shard = ops::view(ops::narrow(all, 0, r * n, n), local.shape());
    const std::vector<int64_t> held = chunks_of_rank(r, cp);
    chunks[static_cast<size_t>(held[0])] = ops::narrow(shard, d, 0, c);
    chunks[static_cast<size_t>(held[1])] = ops::narrow(shard, d, c, c);
  }
  NoGradGuard no_grad;
  return cat(chunks, d);
}

Tensor sequence_positions(int64_t T, int rank, int cp, Device device) {
  const int64_t c = chunk_length(T, cp, "sequence_positions");
  std::vector<int64_t> positions;
  for (int64_t chunk : chunks_of_rank(rank, cp))
    for (int64_t j = 0; j < c; ++j) positions.push_back(chunk * c + j);
  return from_vector(positions, Shape{2 * c}, device);
}

}  // namespace mg::parallel::context_parallel
