// Checked calls into the CUDA runtime, cuBLAS and NCCL. Every return code in minigrad
// goes through one of these macros, which turn a failure into an mg::Error naming the
// library, the failing expression, the library's own message, and the file and line.
//
// The header stays free of fmt and of minigrad's tensor headers so kernels (.cu files)
// can use MG_CUDA_CHECK too; the throwing lives out of line in check.cpp.
#pragma once

#include <cublas_api.h>
#include <cuda_runtime_api.h>

namespace mg::cuda::detail {

[[noreturn]] void throw_library_error(const char* library, const char* expression,
                                      const char* message, int code, const char* file,
                                      int line);

// A failed runtime call also becomes the thread's "last error", which a later
// cudaGetLastError() after a kernel launch would report again; clear it before throwing.
[[noreturn]] void throw_cuda_error(cudaError_t status, const char* expression, const char* file,
                                   int line);
[[noreturn]] void throw_cublas_error(cublasStatus_t status, const char* expression,
                                     const char* file, int line);

}  // namespace mg::cuda::detail

#define MG_CUDA_CHECK(expr)                                                           \
  do {                                                                                \
    const cudaError_t mg_cuda_status_ = (expr);                                       \
    if (mg_cuda_status_ != cudaSuccess)                                               \
      ::mg::cuda::detail::throw_cuda_error(mg_cuda_status_, #expr, __FILE__, __LINE__); \
  } while (0)

// After a kernel launch: launch-configuration errors surface here, asynchronous faults
// at the next synchronising call.
#define MG_CUDA_CHECK_LAUNCH() MG_CUDA_CHECK(cudaGetLastError())

#define MG_CUBLAS_CHECK(expr)                                                             \
  do {                                                                                    \
    const cublasStatus_t mg_cublas_status_ = (expr);                                      \
    if (mg_cublas_status_ != CUBLAS_STATUS_SUCCESS)                                       \
      ::mg::cuda::detail::throw_cublas_error(mg_cublas_status_, #expr, __FILE__, __LINE__); \
  } while (0)

// For the parallel layer. The caller includes <nccl.h> (it is calling NCCL anyway), so
// this header does not depend on NCCL being installed.
#define MG_NCCL_CHECK(expr)                                                                \
  do {                                                                                     \
    const ncclResult_t mg_nccl_status_ = (expr);                                           \
    if (mg_nccl_status_ != ncclSuccess)                                                    \
      ::mg::cuda::detail::throw_library_error("NCCL", #expr,                               \
                                              ncclGetErrorString(mg_nccl_status_),         \
                                              static_cast<int>(mg_nccl_status_), __FILE__, \
                                              __LINE__);                                   \
  } while (0)

// A non-blocking NCCL communicator may answer ncclInProgress: the call was accepted and
// completes in the background (the caller watches ncclCommGetAsyncError). Anything else
// but success is an error, reported as MG_NCCL_CHECK reports it.
#define MG_NCCL_CHECK_NONBLOCKING(expr)                                                     \
  do {                                                                                      \
    const ncclResult_t mg_nccl_result_ = (expr);                                            \
    if (mg_nccl_result_ != ncclSuccess && mg_nccl_result_ != ncclInProgress)                \
      ::mg::cuda::detail::throw_library_error("NCCL", #expr,                                \
                                              ncclGetErrorString(mg_nccl_result_),          \
                                              static_cast<int>(mg_nccl_result_), __FILE__, \
                                              __LINE__);                                    \
  } while (0)
