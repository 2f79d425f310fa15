// cuBLAS handles: one per (thread, device), bound to the thread's current stream before
// each call. Internal to cuda/.
//
// Why per thread: a handle must not be used by two threads at once, and DataParallel
// runs one worker thread per replica (several may share a GPU). Handles of threads
// that end go back to a per-device pool for the next thread, so their number stays at
// the number of threads that ran at the same time.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

namespace mg::cuda {

// This thread's handle for `device` (current), set to run on `stream`.
cublasHandle_t blas_handle(int device, cudaStream_t stream);

}  // namespace mg::cuda
