// Matrix multiply through cuBLAS, and the handles it needs.
//
// cuBLAS is column-major and minigrad row-major: out = a @ b is computed as
// out^T = b^T @ a^T, with transposed views passed as transposes rather than copied. The
// operand swapping and the leading dimensions are worked out in cuda/gemm_plan.h (plain
// C++, checked by tests/core on machines without a GPU). addmm, through cuBLASLt, is in
// cuda/blas_lt.cpp.
#include <minigrad/cuda/blas.h>

#include <climits>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include <minigrad/core/ops.h>
#include <minigrad/cuda/backend.h>
#include <minigrad/cuda/check.h>
#include <minigrad/cuda/cuda.h>
#include <minigrad/cuda/device.h>
#include <minigrad/cuda/gemm_plan.h>

namespace mg::cuda {
namespace {

// cuBLAS's recommendation for Hopper; given explicitly so cuBLAS never allocates its own
// workspace in the middle of a CUDA graph capture.
constexpr std::size_t kWorkspaceBytes = 32u << 20;

struct PooledHandle {
  cublasHandle_t handle = nullptr;
  cublasLtHandle_t lt_handle = nullptr;
  // A workspace per stream the handle has run on. One per stream, not per handle: a
  // thread may switch streams (StreamGuard), and a pooled handle may move to a thread on
  // another stream, while GEMMs queued on the previous stream still use the workspace.
  // Reusing a stream's own workspace is safe: its earlier GEMMs come first in the stream.
  std::vector<std::pair<cudaStream_t, void*>> workspaces;
};

// Per device: handles not owned by a live thread. Never destroyed (see StreamTable).
struct HandlePool {
  std::mutex mutex;
  std::vector<PooledHandle> idle;
};
HandlePool& handle_pool(int device) {
  static std::vector<HandlePool>* pools =
      new std::vector<HandlePool>(static_cast<size_t>(visible_device_count()));
  return (*pools)[static_cast<size_t>(device)];
}

PooledHandle create_handle(int device) {
  ScopedDevice scoped(device);
  PooledHandle h;
  MG_CUBLAS_CHECK(cublasCreate(&h.handle));
  MG_CUBLAS_CHECK(cublasLtCreate(&h.lt_handle));
  return h;
}

// The handle's workspace for `stream`, made on the stream's first GEMM; nullptr when that
// first GEMM happens inside a graph capture, where cudaMalloc is not allowed (cuBLAS then
// uses its own workspace pool, which capture turns into graph memory nodes, and cuBLASLt
// runs without a workspace).
void* stream_workspace(PooledHandle& h, int device, cudaStream_t stream) {
  for (const auto& [s, workspace] : h.workspaces)
    if (s == stream) return workspace;
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  MG_CUDA_CHECK(cudaStreamIsCapturing(stream, &capture));
  if (capture != cudaStreamCaptureStatusNone) return nullptr;
  ScopedDevice scoped(device);
  void* workspace = nullptr;
  MG_CUDA_CHECK(cudaMalloc(&workspace, kWorkspaceBytes));
  h.workspaces.emplace_back(stream, workspace);
  return workspace;
}

// The handles this thread holds, returned to their pools when the thread ends.
struct ThreadHandles {
  std::vector<PooledHandle> by_device;
  ~ThreadHandles() {
    for (size_t d = 0; d < by_device.size(); ++d) {
      if (by_device[d].handle == nullptr) continue;
      HandlePool& pool = handle_pool(static_cast<int>(d));
      std::lock_guard<std::mutex> lock(pool.mutex);
      pool.idle.push_back(by_device[d]);
    }
  }
};

cublasOperation_t operation(const GemmOperandLayout& layout) {
  return layout.transpose ? CUBLAS_OP_T : CUBLAS_OP_N;
}

int checked_int(int64_t value, const char* op, const char* what) {
  MG_CHECK(value <= INT_MAX, "{} on CUDA: {} {} exceeds cuBLAS's 32-bit limit", op, what, value);
  return static_cast<int>(value);
}

}  // namespace

BlasContext blas_context(int device, cudaStream_t stream) {
  thread_local ThreadHandles mine;
  if (mine.by_device.empty()) mine.by_device.resize(static_cast<size_t>(visible_device_count()));
  PooledHandle& h = mine.by_device[static_cast<size_t>(device)];
  if (h.handle == nullptr) {
    HandlePool& pool = handle_pool(device);
    {
      std::lock_guard<std::mutex> lock(pool.mutex);
      if (!pool.idle.empty()) {
        h = pool.idle.back();
        pool.idle.pop_back();
      }
    }
    if (h.handle == nullptr) h = create_handle(device);
  }
  MG_CUBLAS_CHECK(cublasSetStream(h.handle, stream));
  // cublasSetStream also puts the handle back on cuBLAS's default workspace pool, so the
  // stream's own workspace is set again after it, every time.
  BlasContext context;
  context.handle = h.handle;
  context.lt_handle = h.lt_handle;
  context.workspace = stream_workspace(h, device, stream);
  if (context.workspace != nullptr) {
    MG_CUBLAS_CHECK(cublasSetWorkspace(h.handle, context.workspace, kWorkspaceBytes));
    context.workspace_bytes = kWorkspaceBytes;
  }
  return context;
}

cublasComputeType_t gemm_compute_type() {
  // TF32 (10-bit mantissa products, 8x the fp32 rate on tensor cores) only when asked,
  // as in PyTorch: the default keeps full fp32 results that match the CPU.
  return allow_tf32() ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
}

cublasComputeType_t gemm_compute_type(DType dtype) {
  if (dtype == DType::Float64) return CUBLAS_COMPUTE_64F;
  if (is_reduced_float(dtype)) return CUBLAS_COMPUTE_32F;
  return gemm_compute_type();
}

cudaDataType_t cublas_data_type(DType dtype) {
  switch (dtype) {
    case DType::Float32: return CUDA_R_32F;
    case DType::Float64: return CUDA_R_64F;
    case DType::BFloat16: return CUDA_R_16BF;
    case DType::Float16: return CUDA_R_16F;
    default: break;
  }
  MG_FAIL("matmul on CUDA: no cuBLAS type for {}", dtype);
}

void gemm_ex(cublasHandle_t handle, const GemmPlan& plan, const Tensor& out, const Tensor& a,
             const Tensor& b, float beta, const char* op) {
  // float64 computes in double (CUBLAS_COMPUTE_64F), with alpha and beta as doubles; the
  // others (float32, and the 16-bit floats with float32 compute) take float scalars.
  const bool is_double = out.dtype() == DType::Float64;
  const float alpha32 = 1.0f;
  const double alpha64 = 1.0, beta64 = beta;
  const void* alpha = is_double ? static_cast<const void*>(&alpha64) : &alpha32;
  const void* beta_ptr = is_double ? static_cast<const void*>(&beta64) : &beta;
  const cudaDataType_t type = cublas_data_type(out.dtype());
  MG_CUBLAS_CHECK(cublasGemmEx(
      handle, operation(plan.lhs), operation(plan.rhs), checked_int(plan.gemm_m, op, "n"),
      checked_int(plan.gemm_n, op, "m"), checked_int(plan.gemm_k, op, "k"), alpha, b.data_ptr(),
      type, checked_int(plan.lhs.ld, op, "leading dimension"), a.data_ptr(), type,
      checked_int(plan.rhs.ld, op, "leading dimension"), beta_ptr, out.data_ptr(), type,
      checked_int(plan.ldc, op, "n"), gemm_compute_type(out.dtype()), CUBLAS_GEMM_DEFAULT));
}

void CudaBackend::matmul(const Tensor& out, const Tensor& a, const Tensor& b) {
  MG_CHECK(out.is_contiguous() && is_floating_point(out.dtype()),
           "matmul on CUDA: expected a contiguous floating-point output");
  const int64_t m = a.size(0), k = a.size(1), n = b.size(1);
  if (m == 0 || n == 0) return;
  if (k == 0) {  // an empty sum: cuBLAS would leave `out` untouched
    fill(out, 0.0);
    return;
  }
  OpScope scope(out);
  const GemmPlan plan = gemm_plan(m, k, n, a.stride(0), a.stride(1), b.stride(0), b.stride(1));
  // Views that are neither row- nor column-major go to cuBLAS as contiguous copies.
  const Tensor a_operand = plan.rhs.pack ? ops::clone(a) : a;
  const Tensor b_operand = plan.lhs.pack ? ops::clone(b) : b;
  gemm_ex(blas_context(scope.device(), scope.stream()).handle, plan, out, a_operand, b_operand,
          0.0f, "matmul");
}

}  // namespace mg::cuda
