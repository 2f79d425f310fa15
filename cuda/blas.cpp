// Matrix multiply through cuBLAS, and the handles it needs.
//
// cuBLAS is column-major and minigrad row-major. A row-major [r, c] matrix with row
// stride ld is, to cuBLAS, the column-major [c, r] matrix (its transpose) with leading
// dimension ld. So out = a @ b is computed as out^T = b^T @ a^T: cuBLAS gets b first,
// then a, and writes out^T, i.e. out in row-major order, with no copies. A transposed
// view (column-major storage) is passed with a transpose flag instead; only views that
// are neither (e.g. every other column) are packed contiguously first.
#include <minigrad/cuda/blas.h>

#include <climits>
#include <memory>
#include <mutex>
#include <vector>

#include <minigrad/core/ops.h>
#include <minigrad/cuda/backend.h>
#include <minigrad/cuda/check.h>
#include <minigrad/cuda/cuda.h>
#include <minigrad/cuda/device.h>

namespace mg::cuda {
namespace {

// cuBLAS's recommendation for Hopper; given explicitly so cuBLAS never allocates its own
// workspace in the middle of a CUDA graph capture.
constexpr std::size_t kWorkspaceBytes = 32u << 20;

struct PooledHandle {
  cublasHandle_t handle = nullptr;
  void* workspace = nullptr;
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
  MG_CUDA_CHECK(cudaMalloc(&h.workspace, kWorkspaceBytes));
  MG_CUBLAS_CHECK(cublasSetWorkspace(h.handle, h.workspace, kWorkspaceBytes));
  return h;
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

// How cuBLAS reads one operand (see the top of the file).
struct GemmOperand {
  cublasOperation_t op = CUBLAS_OP_N;
  int ld = 1;
  const float* data = nullptr;
  Tensor packed;  // holds a contiguous copy when the view needed one
};

int checked_int(int64_t value, const char* what) {
  MG_CHECK(value <= INT_MAX, "matmul on CUDA: {} {} exceeds cuBLAS's 32-bit limit", what, value);
  return static_cast<int>(value);
}

GemmOperand gemm_operand(const Tensor& t) {
  const int64_t rows = t.size(0), cols = t.size(1);
  const int64_t rs = t.stride(0), cs = t.stride(1);
  GemmOperand operand;
  // A size-1 dimension's stride is meaningless; any valid leading dimension works.
  if (cs == 1 && (rs >= cols || rows == 1)) {  // row-major: cuBLAS sees t^T as is
    operand.op = CUBLAS_OP_N;
    operand.ld = checked_int(std::max<int64_t>({rs, cols, 1}), "leading dimension");
    operand.data = static_cast<const float*>(t.data_ptr());
  } else if (rs == 1 && (cs >= rows || cols == 1)) {  // column-major: a transposed view
    operand.op = CUBLAS_OP_T;
    operand.ld = checked_int(std::max<int64_t>({cs, rows, 1}), "leading dimension");
    operand.data = static_cast<const float*>(t.data_ptr());
  } else {
    operand.packed = ops::clone(t);
    operand.op = CUBLAS_OP_N;
    operand.ld = checked_int(std::max<int64_t>(cols, 1), "leading dimension");
    operand.data = static_cast<const float*>(operand.packed.data_ptr());
  }
  return operand;
}

}  // namespace

cublasHandle_t blas_handle(int device, cudaStream_t stream) {
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
  return h.handle;
}

void CudaBackend::matmul(const Tensor& out, const Tensor& a, const Tensor& b) {
  MG_CHECK(out.is_contiguous() && out.dtype() == DType::Float32,
           "matmul on CUDA: expected a contiguous float32 output");
  const int64_t m = a.size(0), k = a.size(1), n = b.size(1);
  if (m == 0 || n == 0) return;
  if (k == 0) {  // an empty sum: cuBLAS would leave `out` untouched
    fill(out, 0.0);
    return;
  }
  OpScope scope(out);
  const GemmOperand lhs = gemm_operand(a);
  const GemmOperand rhs = gemm_operand(b);
  const float alpha = 1.0f, beta = 0.0f;
  // TF32 (10-bit mantissa products, 8x the fp32 rate on tensor cores) only when asked,
  // as in PyTorch: the default keeps full fp32 results that match the CPU.
  const cublasComputeType_t compute =
      allow_tf32() ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  cublasHandle_t handle = blas_handle(scope.device(), scope.stream());
  MG_CUBLAS_CHECK(cublasGemmEx(handle, rhs.op, lhs.op, checked_int(n, "n"), checked_int(m, "m"),
                               checked_int(k, "k"), &alpha, rhs.data, CUDA_R_32F, rhs.ld,
                               lhs.data, CUDA_R_32F, lhs.ld, &beta, out.data_ptr(), CUDA_R_32F,
                               checked_int(n, "n"), compute, CUBLAS_GEMM_DEFAULT));
}

}  // namespace mg::cuda
