#include <minigrad/cuda/check.h>

#include <fmt/format.h>

#include <minigrad/core/error.h>

namespace mg::cuda::detail {

[[noreturn]] void throw_library_error(const char* library, const char* expression,
                                      const char* message, int code, const char* file,
                                      int line) {
  // The location is part of the message here (unlike MG_CHECK's user errors): a failing
  // library call is a bug or an environment problem, and where it happened matters.
  throw Error(fmt::format("{} error {} ({}) in `{}` at {}:{}", library, code, message,
                          expression, file, line));
}

[[noreturn]] void throw_cuda_error(cudaError_t status, const char* expression, const char* file,
                                   int line) {
  (void)cudaGetLastError();
  std::string message = cudaGetErrorString(status);
  if (status == cudaErrorNoDevice || status == cudaErrorInsufficientDriver) {
    message += "; check the NVIDIA driver and CUDA_VISIBLE_DEVICES";
  } else if (status == cudaErrorStreamCaptureUnsupported ||
             status == cudaErrorStreamCaptureInvalidated) {
    message += "; run one eager step before capturing a CUDA graph so that streams, "
               "handles and workspaces already exist";
  }
  throw_library_error("CUDA", expression, message.c_str(), static_cast<int>(status), file, line);
}

[[noreturn]] void throw_cublas_error(cublasStatus_t status, const char* expression,
                                     const char* file, int line) {
  throw_library_error("cuBLAS", expression, cublasGetStatusString(status),
                      static_cast<int>(status), file, line);
}

}  // namespace mg::cuda::detail
