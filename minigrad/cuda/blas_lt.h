// What the fused addmm of cuda/blas_lt.cpp did, for the GPU tests. Plain C++ (no CUDA
// headers); defined only in builds with the CUDA backend.
#pragma once

#include <cstdint>

namespace mg::cuda {

// Process-wide counts of CudaBackend::addmm and addmm_relu calls: `fused` ran one
// cublasLtMatmul with the bias in its epilogue (addmm_relu then runs its ReLU kernel);
// `fallback` copied the bias into the output and ran
// cublasGemmEx with beta = 1 (cuBLASLt refused the problem, the bias is not 16-byte
// aligned, k == 0, or the plan cache was full). Lets a test check that Linear's forward really takes the fused path.
struct AddmmPathCounts {
  uint64_t fused = 0;
  uint64_t fallback = 0;
};
AddmmPathCounts addmm_path_counts();

}  // namespace mg::cuda
