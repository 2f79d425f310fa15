#include <minigrad/parallel/coalesce.h>

#include <minigrad/core/ops.h>

namespace mg::parallel {

Tensor flatten_dense_tensors(const std::vector<Tensor>& tensors) {
  MG_CHECK(!tensors.empty(), "flatten_dense_tensors: expected at least one tensor");
  const Tensor& first = tensors[0];
  int64_t total = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& t = tensors[i];
    MG_CHECK(t.device() == first.device() && t.dtype() == first.dtype(),
             "flatten_dense_tensors: tensor {} is {} on {}, but tensor 0 is {} on {} (one flat "
             "buffer holds one dtype on one device)",
             i, t.dtype(), t.device(), first.dtype(), first.device());
    total += t.numel();
  }
  if (tensors.size() == 1 && first.is_contiguous()) return ops::view(first, Shape{total});
  Tensor flat = empty(Shape{total}, first.dtype(), first.device());
  int64_t offset = 0;
  for (const Tensor& t : tensors) {
    const int64_t n = t.numel();
    // A contiguous view of the slot, shaped like t, so the backend copies with t's strides.
    ops::copy_(ops::view(ops::narrow(flat, 0, offset, n), t.shape()), t);
    offset += n;
  }
  return flat;
}

std::vector<Tensor> unflatten_dense_tensors(const Tensor& flat, const std::vector<Tensor>& like) {
  std::vector<Tensor> out;
  out.reserve(like.size());
  int64_t offset = 0;
  for (const Tensor& t : like) {
    const int64_t n = t.numel();
    MG_CHECK(offset + n <= flat.numel(),
             "unflatten_dense_tensors: the flat buffer has {} elements, too few for the "
             "tensors it should hold",
             flat.numel());
    out.push_back(ops::view(ops::narrow(flat, 0, offset, n), t.shape()));
    offset += n;
  }
  MG_CHECK(offset == flat.numel(),
           "unflatten_dense_tensors: the flat buffer has {} elements but the tensors hold {}",
           flat.numel(), offset);
  return out;
}

std::vector<std::vector<size_t>> group_by_dtype(const std::vector<Tensor>& tensors) {
  std::vector<std::vector<size_t>> groups;
  std::vector<DType> dtypes;
  for (size_t i = 0; i < tensors.size(); ++i) {
    size_t g = 0;
    while (g < dtypes.size() && dtypes[g] != tensors[i].dtype()) ++g;
    if (g == dtypes.size()) {
      dtypes.push_back(tensors[i].dtype());
      groups.emplace_back();
    }
    groups[g].push_back(i);
  }
  return groups;
}

}  // namespace mg::parallel
