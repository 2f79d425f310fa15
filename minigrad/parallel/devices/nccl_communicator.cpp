// NcclCommunicator: the collectives over distinct GPUs with NCCL, all ranks driven
// from the calling thread. Compiled only when NCCL was found (CMake drops nccl_*.cpp
// otherwise); the rest of the parallel layer reaches it through communicator_for().
//
// Why ncclCommInitAll and ncclGroupStart/End: DataParallel is one process driving every
// GPU. ncclCommInitAll creates the communicators of all ranks at once, and a group lets
// one thread enqueue the collective on every device before NCCL launches it; without the
// group the first rank's call would wait for the others, which never come.
//
// Streams: each rank's call runs on its device's current stream, the stream that
// produced the inputs (the caller's; parallel_apply orders the replicas' compute streams
// with it), so no extra events are needed and outputs are allocated on that same
// stream for the stream-ordered allocator.
#include <minigrad/parallel/devices/communicator.h>

#include <map>
#include <mutex>

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <minigrad/core/ops.h>
#include <minigrad/core/stream.h>
#include <minigrad/cuda/check.h>
#include <minigrad/cuda/peer_access.h>
#include <minigrad/parallel/devices/device_list.h>

namespace mg::parallel {
namespace {

ncclDataType_t nccl_dtype(DType dtype) {
  switch (dtype) {
    case DType::Float32: return ncclFloat32;
    case DType::Float64: return ncclFloat64;
    case DType::Int64: return ncclInt64;
    // NCCL reduces 16-bit floats itself (a sum of bfloat16 in bfloat16, as torch's NCCL
    // process group: the caller widens first where that loses too much).
    case DType::BFloat16: return ncclBfloat16;
    case DType::Float16: return ncclFloat16;
  }
  MG_FAIL("NCCL: unsupported dtype {}", dtype);
}

cudaStream_t stream_of(Device device) {
  return static_cast<cudaStream_t>(current_stream(device).handle);
}

// Ends an NCCL group even when a call inside it threw, so NCCL is not left mid-group.
class Group {
 public:
  Group() { MG_NCCL_CHECK(ncclGroupStart()); }
  ~Group() {
    if (open_) (void)ncclGroupEnd();
  }
  void end() {
    open_ = false;
    MG_NCCL_CHECK(ncclGroupEnd());
  }
  Group(const Group&) = delete;
  Group& operator=(const Group&) = delete;

 private:
  bool open_ = true;
};

class NcclCommunicator final : public Communicator {
 public:
  explicit NcclCommunicator(const std::vector<Device>& devices)
      : Communicator(devices), comms_(devices.size(), nullptr) {
    std::vector<int> indices;
    for (const Device& d : devices) indices.push_back(d.index());
    // In one process NCCL reads and writes the other ranks' buffers directly over
    // NVLink/PCIe. Those buffers come from each device's stream-ordered pool, which (unlike
    // cudaMalloc memory) no peer may touch until it is granted access: without this the
    // first collective faults with an illegal address.
    for (size_t i = 0; i < indices.size(); ++i)
      for (size_t j = i + 1; j < indices.size(); ++j) cuda::enable_peer_access(indices[i], indices[j]);
    guarded("ncclCommInitAll", [&] {
      // ncclCommInitAll sets each rank's device current in turn; the caller keeps its own.
      DeviceGuard keep_current(devices.front());
      MG_NCCL_CHECK(
          ncclCommInitAll(comms_.data(), static_cast<int>(indices.size()), indices.data()));
    });
  }

  ~NcclCommunicator() override {
    for (ncclComm_t comm : comms_)
      if (comm != nullptr) (void)ncclCommDestroy(comm);
  }

  std::string name() const override { return "nccl"; }

  std::vector<std::vector<Tensor>> broadcast(const std::vector<Tensor>& tensors,
                                             size_t root) override {
    check_broadcast(tensors, root);
    std::lock_guard<std::mutex> lock(mutex_);
    std::vector<std::vector<Tensor>> out(size());
    // NCCL reads and writes flat memory: the root sends contiguous tensors, and every
    // other rank receives into a fresh buffer allocated on its current stream.
    for (size_t r = 0; r < size(); ++r) {
      DeviceGuard guard(devices()[r]);
      for (const Tensor& t : tensors)
        out[r].push_back(r == root ? ops::contiguous(t) : empty(t.shape(), t.dtype(), devices()[r]));
    }
    guarded("ncclBroadcast", [&] {
      Group group;
      for (size_t r = 0; r < size(); ++r) {
        for (size_t k = 0; k < tensors.size(); ++k) {
          const Tensor& buffer = out[r][k];
          if (buffer.numel() == 0) continue;
          const void* send = r == root ? buffer.data_ptr() : nullptr;
          MG_NCCL_CHECK(ncclBroadcast(send, buffer.data_ptr(), static_cast<size_t>(buffer.numel()),
                                      nccl_dtype(buffer.dtype()), static_cast<int>(root),
                                      comms_[r], stream_of(devices()[r])));
        }
      }
      group.end();
    });
    out[root] = tensors;  // the root's entries are the inputs themselves
    return out;
  }

  std::vector<Tensor> reduce_add(const std::vector<std::vector<Tensor>>& per_rank,
                                 size_t root) override {
    check_reduce_add(per_rank, root);
    std::lock_guard<std::mutex> lock(mutex_);
    const size_t count = per_rank[root].size();
    std::vector<std::vector<Tensor>> inputs(size());
    std::vector<Tensor> out;
    for (size_t r = 0; r < size(); ++r) {
      DeviceGuard guard(devices()[r]);
      for (const Tensor& t : per_rank[r]) inputs[r].push_back(ops::contiguous(t));
      if (r == root)
        for (const Tensor& t : per_rank[r]) out.push_back(empty(t.shape(), t.dtype(), devices()[r]));
    }
    guarded("ncclReduce", [&] {
      Group group;
      for (size_t r = 0; r < size(); ++r) {
        for (size_t k = 0; k < count; ++k) {
          const Tensor& send = inputs[r][k];
          if (send.numel() == 0) continue;
          void* receive = r == root ? out[k].data_ptr() : nullptr;  // only the root receives
          MG_NCCL_CHECK(ncclReduce(send.data_ptr(), receive, static_cast<size_t>(send.numel()),
                                   nccl_dtype(send.dtype()), ncclSum, static_cast<int>(root),
                                   comms_[r], stream_of(devices()[r])));
        }
      }
      group.end();
    });
    return out;
  }

  std::vector<Tensor> all_reduce(const std::vector<Tensor>& per_rank) override {
    check_one_per_rank("all_reduce", per_rank);
    std::lock_guard<std::mutex> lock(mutex_);
    std::vector<Tensor> inputs, out;
    for (size_t r = 0; r < size(); ++r) {
      DeviceGuard guard(devices()[r]);
      inputs.push_back(ops::contiguous(per_rank[r]));
      out.push_back(empty(per_rank[r].shape(), per_rank[r].dtype(), devices()[r]));
    }
    if (per_rank[0].numel() == 0) return out;
    guarded("ncclAllReduce", [&] {
      Group group;
      for (size_t r = 0; r < size(); ++r)
        MG_NCCL_CHECK(ncclAllReduce(inputs[r].data_ptr(), out[r].data_ptr(),
                                    static_cast<size_t>(inputs[r].numel()),
                                    nccl_dtype(inputs[r].dtype()), ncclSum, comms_[r],
                                    stream_of(devices()[r])));
      group.end();
    });
    return out;
  }

  std::vector<Tensor> all_gather(const std::vector<Tensor>& per_rank) override {
    check_one_per_rank("all_gather", per_rank);
    std::lock_guard<std::mutex> lock(mutex_);
    std::vector<int64_t> sizes{static_cast<int64_t>(size())};
    for (int64_t s : per_rank[0].shape().sizes()) sizes.push_back(s);
    std::vector<Tensor> inputs, out;
    for (size_t r = 0; r < size(); ++r) {
      DeviceGuard guard(devices()[r]);
      inputs.push_back(ops::contiguous(per_rank[r]));
      out.push_back(empty(Shape(sizes), per_rank[r].dtype(), devices()[r]));
    }
    if (per_rank[0].numel() == 0) return out;
    guarded("ncclAllGather", [&] {
      Group group;
      for (size_t r = 0; r < size(); ++r)
        MG_NCCL_CHECK(ncclAllGather(inputs[r].data_ptr(), out[r].data_ptr(),
                                    static_cast<size_t>(inputs[r].numel()),
                                    nccl_dtype(inputs[r].dtype()), comms_[r],
                                    stream_of(devices()[r])));
      group.end();
    });
    return out;
  }

 private:
  // Runs NCCL calls; a failure names the collective and the devices it spanned.
  template <typename F>
  void guarded(const char* what, F&& calls) {
    try {
      calls();
    } catch (const Error& e) {
      MG_FAIL("NcclCommunicator: {} over {} failed: {}", what, device_list_str(devices()),
              e.what());
    }
  }

  std::vector<ncclComm_t> comms_;
  std::mutex mutex_;  // an NCCL communicator is driven by one thread at a time
};

}  // namespace

std::shared_ptr<Communicator> nccl_communicator(const std::vector<Device>& devices) {
  MG_CHECK(nccl_available_for(devices),
           "nccl_communicator: NCCL needs two or more distinct CUDA devices, got {}",
           device_list_str(devices));
  // One communicator per device list, kept for the life of the process: creating one
  // costs milliseconds and sets up peer connections. Never destroyed, because
  // destroying NCCL communicators during process exit races with the driver's teardown.
  static auto* registry = new std::map<std::vector<int>, std::shared_ptr<Communicator>>();
  static std::mutex registry_mutex;
  std::vector<int> key;
  for (const Device& d : devices) key.push_back(d.index());
  std::lock_guard<std::mutex> lock(registry_mutex);
  auto it = registry->find(key);
  if (it == registry->end())
    it = registry->emplace(key, std::make_shared<NcclCommunicator>(devices)).first;
  return it->second;
}

}  // namespace mg::parallel
