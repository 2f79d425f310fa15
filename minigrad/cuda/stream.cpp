#include <minigrad/cuda/stream.h>

#include <memory>
#include <mutex>
#include <vector>

#include <minigrad/cuda/check.h>
#include <minigrad/cuda/device.h>

namespace mg::cuda {
namespace {

struct StreamTable {
  std::unique_ptr<std::once_flag[]> created;
  std::unique_ptr<DeviceStreams[]> streams;
  explicit StreamTable(int count)
      : created(new std::once_flag[static_cast<size_t>(count)]),
        streams(new DeviceStreams[static_cast<size_t>(count)]) {}
};

// Never destroyed: streams must outlive every tensor and thread that could still use
// them, and destroying them during process exit races with the driver's own teardown.
StreamTable& stream_table() {
  static StreamTable* table = new StreamTable(visible_device_count());
  return *table;
}

}  // namespace

const DeviceStreams& device_streams(int index) {
  check_device_index(index, "cuda streams");
  StreamTable& table = stream_table();
  const auto i = static_cast<size_t>(index);
  std::call_once(table.created[i], [&] {
    ScopedDevice device(index);
    DeviceStreams s;
    MG_CUDA_CHECK(cudaStreamCreateWithFlags(&s.compute, cudaStreamNonBlocking));
    MG_CUDA_CHECK(cudaStreamCreateWithFlags(&s.copy, cudaStreamNonBlocking));
    table.streams[i] = s;
  });
  return table.streams[i];
}

cudaStream_t pool_cuda_stream(int index, int slot) {
  check_device_index(index, "stream_from_pool");
  struct Pool {
    std::mutex mutex;
    std::vector<cudaStream_t> streams;  // kPoolStreams per device, null until created
  };
  // Never destroyed, for the reason stream_table() gives.
  static Pool* pool = [] {
    auto* p = new Pool();
    p->streams.assign(static_cast<size_t>(visible_device_count() * kPoolStreams), nullptr);
    return p;
  }();
  const int wrapped = ((slot % kPoolStreams) + kPoolStreams) % kPoolStreams;
  std::lock_guard<std::mutex> lock(pool->mutex);
  cudaStream_t& stream = pool->streams[static_cast<size_t>(index * kPoolStreams + wrapped)];
  if (stream == nullptr) {
    ScopedDevice device(index);
    MG_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  }
  return stream;
}

namespace {
// Per thread, per device: the stream made current by a StreamGuard, or nullptr for
// "the device's compute stream".
std::vector<cudaStream_t>& thread_current_streams() {
  thread_local std::vector<cudaStream_t> current(static_cast<size_t>(visible_device_count()),
                                                 nullptr);
  return current;
}
}  // namespace

cudaStream_t current_cuda_stream(int index) {
  check_device_index(index, "current_stream");
  const cudaStream_t chosen = thread_current_streams()[static_cast<size_t>(index)];
  return chosen != nullptr ? chosen : device_streams(index).compute;
}

void set_current_cuda_stream(int index, cudaStream_t stream) {
  check_device_index(index, "set_current_stream");
  thread_current_streams()[static_cast<size_t>(index)] = stream;
}

}  // namespace mg::cuda
