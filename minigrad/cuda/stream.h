// Each device's own streams, and the thread-local "current stream" every op runs on.
// Internal to cuda/; the device-neutral face is mg::Stream / mg::StreamGuard.
#pragma once

#include <cuda_runtime_api.h>

namespace mg::cuda {

// A device's compute stream (where ops run unless a thread picks another) and its copy
// stream (for transfers between devices, so they can overlap compute). Both are
// created non-blocking on first use: the legacy default stream, which serialises with
// everything, is never used.
struct DeviceStreams {
  cudaStream_t compute = nullptr;
  cudaStream_t copy = nullptr;
};
const DeviceStreams& device_streams(int index);

// Extra streams of device `index`, created non-blocking on first use of each slot and
// never destroyed (like the device's own streams): kPoolStreams per device, slot taken
// modulo that. Pipeline stages that share a GPU each get one, so their work overlaps.
constexpr int kPoolStreams = 8;
cudaStream_t pool_cuda_stream(int index, int slot);

// What ops on device `index` run on for this thread: its compute stream unless the
// thread made another current (StreamGuard).
cudaStream_t current_cuda_stream(int index);
void set_current_cuda_stream(int index, cudaStream_t stream);

}  // namespace mg::cuda
