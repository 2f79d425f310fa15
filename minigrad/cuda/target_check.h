// Invalid cross-entropy targets on the GPU.
//
// The CPU backend checks every target and throws. A kernel cannot throw, and checking
// on the host would cost a device-to-host copy and a synchronisation per loss: the
// very stall an asynchronous backend exists to avoid. PyTorch answers with a device-side
// assert, which kills the whole CUDA context. Here, instead, a row with a target
// outside [0, classes) gets a NaN loss (and NaN gradients), and the kernel records the
// first offending row and value in a small per-device flag in host-mapped memory. The
// next time the host waits for that device through minigrad (reading a value back:
// item(), to_vector(), .to(cpu); or cuda::synchronize()), it finds the flag and throws
// an mg::Error naming the row, the target and the number of classes, then clears it.
#pragma once

#include <minigrad/cuda/kernels/launch.h>

namespace mg::cuda {

// Where kernels on `device` report an invalid target now (allocated on first use, never
// freed; prepare_device() makes it before any CUDA graph capture could begin).
kernels::TargetErrorSink target_error_sink(int device);

// After a synchronisation: throws (and clears the flag) if a kernel on `device` saw an
// invalid target since the last check.
void throw_if_invalid_target_reported(int device);

}  // namespace mg::cuda
