#include <minigrad/parallel/c10d/same_model.h>

#include <algorithm>

#include <minigrad/parallel/coalesce.h>

namespace mg::parallel {

namespace {

// [count, then per tensor: dim, sizes..., dtype]: what must agree across ranks.
std::vector<int64_t> shape_signature(const std::vector<nn::NamedTensor>& tensors) {
  std::vector<int64_t> sig{static_cast<int64_t>(tensors.size())};
  for (const auto& [name, t] : tensors) {
    sig.push_back(t.dim());
    for (int64_t s : t.shape()) sig.push_back(s);
    sig.push_back(static_cast<int64_t>(t.dtype()));
  }
  return sig;
}

// Reads one entry of a signature at `pos`; false when it runs past the end.
bool read_entry(const std::vector<int64_t>& sig, size_t& pos, Shape& shape, int64_t& dtype) {
  if (pos >= sig.size()) return false;
  const int64_t dim = sig[pos++];
  if (dim < 0 || pos + static_cast<size_t>(dim) + 1 > sig.size()) return false;
  std::vector<int64_t> sizes(sig.begin() + static_cast<std::ptrdiff_t>(pos),
                             sig.begin() + static_cast<std::ptrdiff_t>(pos + static_cast<size_t>(dim)));
  pos += static_cast<size_t>(dim);
  dtype = sig[pos++];
  shape = Shape(std::move(sizes));
  return true;
}

}  // namespace

void check_same_shapes_across_ranks(ProcessGroup& pg, const std::vector<nn::NamedTensor>& tensors,
                                    const std::string& who) {
  const int rank = pg.rank();
  const std::vector<int64_t> mine = shape_signature(tensors);
  Tensor length = from_vector(std::vector<int64_t>{static_cast<int64_t>(mine.size())}, Shape{1})
                      .to(pg.device());
  pg.broadcast(length, 0)->wait();
  const int64_t root_length = length.to(Device::cpu()).item<int64_t>();
  std::vector<int64_t> padded(static_cast<size_t>(root_length), -1);
  std::copy_n(mine.begin(), std::min(mine.size(), padded.size()), padded.begin());
  Tensor root_sig_tensor = from_vector(padded, Shape{root_length}).to(pg.device());
  pg.broadcast(root_sig_tensor, 0)->wait();
  const std::vector<int64_t> root_sig = root_sig_tensor.to(Device::cpu()).to_vector<int64_t>();

  std::string problem;
  if (root_sig != mine) {
    if (root_sig.empty() || root_sig[0] != mine[0]) {
      problem = fmt::format("rank {} has {} parameters and buffers but rank 0 has {}", rank,
                            mine[0], root_sig.empty() ? 0 : root_sig[0]);
    } else {
      size_t my_pos = 1, root_pos = 1;
      for (const auto& [name, t] : tensors) {
        Shape shape, root_shape;
        int64_t dtype = 0, root_dtype = 0;
        read_entry(mine, my_pos, shape, dtype);
        if (!read_entry(root_sig, root_pos, root_shape, root_dtype)) {
          problem = fmt::format("rank {}'s '{}' has no counterpart on rank 0", rank, name);
          break;
        }
        if (shape != root_shape || dtype != root_dtype) {
          problem = fmt::format("rank {}'s '{}' is {} {} but rank 0's is {} {}", rank, name,
                                t.dtype(), shape, static_cast<DType>(root_dtype), root_shape);
          break;
        }
      }
      if (problem.empty()) problem = fmt::format("rank {}'s parameters differ from rank 0's", rank);
    }
  }
  Tensor mismatches = from_vector(std::vector<int64_t>{problem.empty() ? 0 : 1}, Shape{1})
                          .to(pg.device());
  pg.allreduce(mismatches, ReduceOp::Sum)->wait();
  const int64_t count = mismatches.to(Device::cpu()).item<int64_t>();
  MG_CHECK(problem.empty(), "{}: {}; every rank must build the same model before wrapping it",
           who, problem);
  MG_CHECK(count == 0,
           "{}: {} rank(s) have parameters or buffers whose shapes differ from rank 0's (their "
           "own errors say which); every rank must build the same model",
           who, count);
}

void broadcast_from_rank0(ProcessGroup& group, const std::vector<Tensor>& tensors) {
  if (tensors.empty()) return;
  for (const std::vector<size_t>& indices : group_by_dtype(tensors)) {
    std::vector<Tensor> same_dtype;
    for (size_t i : indices) same_dtype.push_back(tensors[i]);
    group.broadcast(same_dtype, 0)->wait();
  }
}

void sync_module_states(ProcessGroup& group, const nn::Module& module, const std::string& who) {
  std::vector<nn::NamedTensor> state = module.named_parameters();
  for (auto& b : module.named_buffers()) state.push_back(std::move(b));
  check_same_shapes_across_ranks(group, state, who);
  std::vector<Tensor> values;
  for (const auto& [name, t] : state) values.push_back(t);
  broadcast_from_rank0(group, values);
}

}  // namespace mg::parallel
