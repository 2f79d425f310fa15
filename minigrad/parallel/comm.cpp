#include <minigrad/parallel/comm.h>

#include <fmt/ranges.h>

#include <minigrad/core/checked_math.h>
#include <minigrad/core/ops.h>
#include <minigrad/core/profiler.h>
#include <minigrad/core/stream.h>
#include <minigrad/parallel/coalesce.h>
#include <minigrad/parallel/devices/communicator.h>
#include <minigrad/parallel/devices/device_list.h>
#include <minigrad/parallel/devices/transfer.h>

namespace mg::parallel::comm {

std::vector<int64_t> chunk_sizes(int64_t size, int64_t chunks) {
  MG_CHECK(chunks > 0, "chunk_sizes: number of chunks must be positive, got {}", chunks);
  MG_CHECK(size >= 0, "chunk_sizes: size must be >= 0, got {}", size);
  const int64_t piece = ceil_div(size, chunks);
  std::vector<int64_t> sizes;
  for (int64_t start = 0; start < size; start += std::min(piece, size - start))
    sizes.push_back(std::min(piece, size - start));
  return sizes;
}

std::vector<Tensor> scatter(const Tensor& tensor, const std::vector<Device>& devices,
                            const std::vector<int64_t>& sizes, int64_t dim) {
  dim = wrap_dim(dim, tensor.dim(), "scatter");
  MG_CHECK(sizes.size() <= devices.size(),
           "scatter: {} pieces for {} devices (at most one piece per device)", sizes.size(),
           devices.size());
  int64_t total = 0;
  for (int64_t s : sizes) {
    MG_CHECK(s >= 0, "scatter: chunk sizes must be >= 0, got {}", s);
    total = checked_add(total, s, "scatter");
  }
  MG_CHECK(total == tensor.size(dim),
           "scatter: chunk sizes add up to {}, but dimension {} of the tensor (shape {}) has {}",
           total, dim, tensor.shape(), tensor.size(dim));
  profiler::Span span("scatter");
  if (span.active())
    span.category("data_parallel").arg("rows", fmt::format("{}", fmt::join(sizes, ", ")));
  std::vector<Tensor> pieces;
  pieces.reserve(sizes.size());
  int64_t start = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    const Tensor piece = ops::narrow(tensor, dim, start, sizes[i]);
    pieces.push_back(piece.device() == devices[i] ? piece : copy_to_device(piece, devices[i]));
    start += sizes[i];
  }
  return pieces;
}

Tensor gather(const std::vector<Tensor>& tensors, Device destination, int64_t dim) {
  MG_CHECK(!tensors.empty(), "gather: expected at least one tensor");
  profiler::Span span("gather");
  span.category("data_parallel").arg("pieces", tensors.size()).arg("to", destination);
  const Tensor& first = tensors[0];
  dim = wrap_dim(dim, first.dim(), "gather");
  std::vector<int64_t> sizes = first.shape().sizes();
  int64_t total = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& t = tensors[i];
    MG_CHECK(t.dtype() == first.dtype(), "gather: tensor {} is {} but tensor 0 is {}", i,
             t.dtype(), first.dtype());
    bool same = t.dim() == first.dim();
    for (int64_t d = 0; same && d < t.dim(); ++d) same = d == dim || t.size(d) == first.size(d);
    MG_CHECK(same,
             "gather: the outputs must have equal sizes except in dimension {}, but output {} "
             "(on {}) has shape {} and output 0 (on {}) has shape {}",
             dim, i, t.device(), t.shape(), first.device(), first.shape());
    total += t.size(dim);
  }
  sizes[static_cast<size_t>(dim)] = total;
  Tensor out;
  {
    DeviceGuard guard(destination);  // allocated on the destination's current stream
    out = empty(Shape(sizes), first.dtype(), destination);
  }
  int64_t offset = 0;
  for (const Tensor& t : tensors) {
    ordered_copy_(ops::narrow(out, dim, offset, t.size(dim)), t);
    offset += t.size(dim);
  }
  return out;
}

std::vector<std::vector<Tensor>> broadcast_coalesced(const std::vector<Tensor>& tensors,
                                                     const std::vector<Device>& devices) {
  MG_CHECK(!devices.empty(), "broadcast_coalesced: expected at least one device");
  std::vector<std::vector<Tensor>> out(devices.size(), std::vector<Tensor>(tensors.size()));
  out[0] = tensors;
  if (devices.size() == 1 || tensors.empty()) return out;
  for (size_t k = 0; k < tensors.size(); ++k)
    MG_CHECK(tensors[k].device() == devices[0],
             "broadcast_coalesced: tensor {} is on {}, but the source device (devices[0]) is {}",
             k, tensors[k].device(), devices[0]);

  profiler::Span span("broadcast");
  span.category("data_parallel").arg("devices", devices.size());
  const std::shared_ptr<Communicator> communicator = communicator_for(devices);
  for (const std::vector<size_t>& group : group_by_dtype(tensors)) {
    std::vector<Tensor> members;
    for (size_t k : group) members.push_back(tensors[k]);
    const Tensor flat = flatten_dense_tensors(members);
    const std::vector<std::vector<Tensor>> copies = communicator->broadcast({flat}, 0);
    for (size_t i = 1; i < devices.size(); ++i) {
      const std::vector<Tensor> views = unflatten_dense_tensors(copies[i][0], members);
      for (size_t m = 0; m < group.size(); ++m) out[i][group[m]] = views[m];
    }
  }
  return out;
}

Tensor reduce_add(const std::vector<Tensor>& tensors, const std::vector<Device>& devices,
                  size_t root) {
  std::vector<std::vector<Tensor>> per_device;
  for (const Tensor& t : tensors) per_device.push_back({t});
  return reduce_add_coalesced(per_device, devices, root).at(0);
}

std::vector<Tensor> reduce_add_coalesced(const std::vector<std::vector<Tensor>>& per_device,
                                         const std::vector<Device>& devices, size_t root) {
  MG_CHECK(!devices.empty() && per_device.size() == devices.size(),
           "reduce_add: got tensors from {} devices for a device list of {} ({})",
           per_device.size(), devices.size(), device_list_str(devices));
  MG_CHECK(root < devices.size(), "reduce_add: root {} is not an index into {}", root,
           device_list_str(devices));
  const std::vector<Tensor>& reference = per_device[root];
  if (devices.size() == 1) return reference;

  profiler::Span span("reduce_add");
  span.category("data_parallel").arg("devices", devices.size()).arg("to", devices[root]);
  const std::shared_ptr<Communicator> communicator = communicator_for(devices);
  std::vector<Tensor> out(reference.size());
  for (const std::vector<size_t>& group : group_by_dtype(reference)) {
    std::vector<std::vector<Tensor>> flats(devices.size());
    std::vector<Tensor> like;
    for (size_t k : group) like.push_back(reference[k]);
    for (size_t i = 0; i < devices.size(); ++i) {
      MG_CHECK(per_device[i].size() == reference.size(),
               "reduce_add: device {} ({}) has {} tensors, device {} has {}", i, devices[i],
               per_device[i].size(), root, reference.size());
      std::vector<Tensor> members;
      for (size_t k : group) {
        const Tensor& t = per_device[i][k];
        MG_CHECK(t.device() == devices[i] && t.shape() == reference[k].shape() &&
                     t.dtype() == reference[k].dtype(),
                 "reduce_add: tensor {} of device {} is {} {} on {}, but device {} has {} {} "
                 "and expects it on {}",
                 k, i, t.dtype(), t.shape(), t.device(), root, reference[k].dtype(),
                 reference[k].shape(), devices[i]);
        members.push_back(t);
      }
      DeviceGuard guard(devices[i]);  // each device flattens on its own current stream
      flats[i] = {flatten_dense_tensors(members)};
    }
    const Tensor sum = communicator->reduce_add(flats, root).at(0);
    const std::vector<Tensor> views = unflatten_dense_tensors(sum, like);
    for (size_t m = 0; m < group.size(); ++m) out[group[m]] = views[m];
  }
  return out;
}

}  // namespace mg::parallel::comm
