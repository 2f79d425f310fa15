// mg::cuda: the user-facing CUDA API (torch.cuda's names). Plain C++, usable in every
// build: without CUDA (or without a GPU) device_count() is 0, is_available() is false,
// and anything that needs a device throws an mg::Error that says why.
#pragma once

#include <cstddef>

#include <minigrad/core/stream.h>

namespace mg::cuda {

// Devices visible to this process (CUDA_VISIBLE_DEVICES applies). 0 when minigrad was
// built without CUDA, or there is no driver or GPU.
int device_count();
bool is_available();
// Whether this minigrad was built with the CUDA backend (torch.backends.cuda.is_built()):
// tells "built without CUDA" from "no GPU on this machine" when device_count() is 0.
bool is_built();

// This thread's current device, and setting it (as cudaSetDevice / torch.cuda.set_device).
int current_device();
void set_device(int device);

// Waits for all work queued on `device` (-1: the current device). Also where an invalid
// cross-entropy target seen on the GPU is reported (see cuda/target_check.h).
void synchronize(int device = -1);

// Whether float32 matmuls may use TF32 tensor cores (faster, ~1e-3 relative error).
// Off by default, as in PyTorch. A process-wide setting.
void set_allow_tf32(bool allow);
bool allow_tf32();

// Memory held by live tensors on `device` (-1: current), its high-water mark, and what
// the allocator holds from the driver (cached for reuse included), in bytes.
std::size_t memory_allocated(int device = -1);
std::size_t max_memory_allocated(int device = -1);
std::size_t memory_reserved(int device = -1);
// Starts a new high-water mark from the current allocation.
void reset_peak_memory_stats(int device = -1);

// Streams and events are the device-neutral ones of core/stream.h; these names are
// here so CUDA code reads like torch.cuda.
using Stream = mg::Stream;
using Event = mg::Event;
using StreamGuard = mg::StreamGuard;
using DeviceGuard = mg::DeviceGuard;
Stream current_stream(int device = -1);  // what ops on `device` use on this thread
Stream compute_stream(int device = -1);  // the device's own compute stream
Stream copy_stream(int device = -1);     // the device's stream for transfers

}  // namespace mg::cuda
