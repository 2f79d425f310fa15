// Copies between devices, ordered by events rather than by waiting on the host.
//
// DataParallel moves tensors between devices at every step: the input pieces out to the
// replicas, the parameters out to them, the outputs and gradients back. Each move here
// follows the same recipe (PyTorch does the same in its scatter/gather):
//
//   1. the destination is allocated on the destination device's current stream (the
//      stream-ordered allocator then frees it on that stream too);
//   2. the device's copy stream waits, with events, for the stream that produced the
//      source and for the stream the destination was allocated on;
//   3. the copy runs on the copy stream (StreamGuard), so it can overlap compute;
//   4. an event recorded after the copy makes the destination's current stream wait
//      before anything reads the result, and makes the source's stream wait before it
//      can reuse the source's memory.
//
// On the CPU every stream and event is a no-op and this is a plain copy. The CUDA
// backend is expected to enqueue a copy on the current stream of the GPU involved (the
// destination's for GPU to GPU); to be safe whichever it picks, a copy between two GPUs
// makes the copy streams of both devices current and orders both.
#pragma once

#include <minigrad/core/stream.h>
#include <minigrad/core/tensor.h>

namespace mg::parallel {

// dst = src (same shape and dtype, any devices), ordered as above. `dst` may be a view
// (gather copies each piece straight into its slice of the output).
void ordered_copy_(const Tensor& dst, const Tensor& src);

// The same with the two streams named: `src_stream` produced `src` and frees its memory,
// `dst_stream` will read `dst`. A pipeline stage receiving a tensor from another stage's
// thread needs this form: the producer's stream is not the current one of the thread
// doing the copy (and, with both stages on one GPU, neither is the same stream).
void ordered_copy_(const Tensor& dst, const Tensor& src, const Stream& src_stream,
                   const Stream& dst_stream);

// A new contiguous copy of `src` on `device`, ordered as above. Always copies, even on
// the same device (each replica owns its copy, as it would on a device of its own).
Tensor copy_to_device(const Tensor& src, Device device);

}  // namespace mg::parallel
