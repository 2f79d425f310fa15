// cuBLAS and cuBLASLt handles: one pair per (thread, device), bound to the thread's
// current stream before each call, with a workspace per stream. Internal to cuda/.
//
// Why per thread: a handle must not be used by two threads at once, and DataParallel
// runs one worker thread per replica (several may share a GPU). Handles of threads
// that end go back to a per-device pool for the next thread, so their number stays at
// the number of threads that ran at the same time.
#pragma once

#include <cstddef>

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <minigrad/core/tensor.h>
#include <minigrad/cuda/gemm_plan.h>

namespace mg::cuda {

struct BlasContext {
  cublasHandle_t handle = nullptr;      // set to run on the stream, with its workspace
  cublasLtHandle_t lt_handle = nullptr;  // cuBLASLt takes the stream and workspace per call
  // The stream's workspace, shared by both handles (their calls are ordered on the
  // stream); nullptr and 0 bytes when the stream's first GEMM happens inside a CUDA graph
  // capture, where it cannot be allocated.
  void* workspace = nullptr;
  std::size_t workspace_bytes = 0;
};

// This thread's handles for `device` (current), set to run on `stream`.
BlasContext blas_context(int device, cudaStream_t stream);

// CUBLAS_COMPUTE_32F, or its TF32 variant when set_allow_tf32(true) asked for it.
cublasComputeType_t gemm_compute_type();
// The compute type of a GEMM of `dtype` operands: CUBLAS_COMPUTE_64F for float64,
// gemm_compute_type() for float32, and CUBLAS_COMPUTE_32F for bfloat16 and float16 (16-bit
// inputs and outputs, products and sums in float32: PyTorch's default, and TF32 does not
// apply to them).
cublasComputeType_t gemm_compute_type(DType dtype);
// The cudaDataType_t of a GEMM operand of `dtype` (CUDA_R_32F, CUDA_R_64F, CUDA_R_16BF,
// CUDA_R_16F); mg::Error for int64.
cudaDataType_t cublas_data_type(DType dtype);

// out = a @ b + beta * out with one cublasGemmEx call laid out by `plan` (operands
// already packed where the plan says so; out contiguous, k > 0).
void gemm_ex(cublasHandle_t handle, const GemmPlan& plan, const Tensor& out, const Tensor& a,
             const Tensor& b, float beta, const char* op);

}  // namespace mg::cuda
