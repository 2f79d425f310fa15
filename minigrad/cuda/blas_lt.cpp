// CudaBackend::addmm: out = a @ b + bias (Linear's forward) as one cublasLtMatmul whose
// epilogue adds the bias, as PyTorch does, instead of a GEMM followed by a broadcast add
// (a second read and write of the whole output). addmm_relu (a Linear followed by a
// ReLU) runs the same BIAS epilogue and then minigrad's ReLU kernel in place, not
// CUBLASLT_EPILOGUE_RELU_BIAS: cuBLASLt documents that epilogue as x := max(x, 0), and
// CUDA's max of a NaN and 0 is 0 (fmaxf), where PyTorch's relu(NaN) is NaN. A Linear
// whose output is NaN must not train on silently, so the ReLU costs a pass of its own.
//
// The operands are laid out by the same plan as matmul (cuda/gemm_plan.h): cuBLASLt's
// column-major D is out^T, [n, m], so the bias (one value per output feature, per row of
// D) has D's row count n, which is what CUBLASLT_EPILOGUE_BIAS requires.
//
// A heuristic query costs far more than a small GEMM, so its choice is cached with the
// descriptors, per problem (shape, transposes, leading dimensions, TF32, pointer
// alignments, workspace): a training step of a small model asks once per layer.
//
// cuBLASLt may refuse a problem (no algorithm for the alignments, CUBLAS_STATUS_NOT_
// SUPPORTED); then, for a bias that is not 16-byte aligned, and for k == 0, the bias is copied into out and cublasGemmEx adds
// the product with beta = 1, which is always available.
#include <minigrad/cuda/blas_lt.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>

#include <minigrad/core/ops.h>
#include <minigrad/cuda/backend.h>
#include <minigrad/cuda/blas.h>
#include <minigrad/cuda/check.h>
#include <minigrad/cuda/gemm_plan.h>

namespace mg::cuda {
namespace {

// cuBLASLt's alignment preferences cover A, B, C and D but not the epilogue's bias
// vector: the heuristic may offer a kernel that loads the bias 16 bytes at a time, which
// faults with a misaligned address on a bias view that starts between two 16-byte
// boundaries (seen by PyTorch and Marian). Such a bias takes the fallback.
constexpr uint32_t kMinBiasAlignmentBytes = 16;

// Distinct problems kept; beyond this (a program with endlessly varying shapes) new
// problems take the fallback instead of growing the cache without bound.
constexpr size_t kMaxCachedProblems = 4096;

// Everything cuBLASLt's choice of algorithm depends on. a, b, c are cuBLASLt's operands
// (a = the memory of the product's right operand, b = its left one, c = out).
struct ProblemKey {
  int device = 0;
  int64_t m = 0, n = 0, k = 0;  // the column-major GEMM's dims: n features, m rows, k
  bool transpose_a = false, transpose_b = false;
  int64_t lda = 0, ldb = 0, ldc = 0;
  cublasComputeType_t compute = CUBLAS_COMPUTE_32F;
  cudaDataType_t type = CUDA_R_32F;  // of A, B, C, D and the bias (float32, bfloat16, float16)
  uint32_t align_a = 0, align_b = 0, align_c = 0, align_bias = 0;
  size_t workspace_bytes = 0;
  cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_BIAS;  // the only one used (see the top)

  auto tied() const {
    return std::tie(device, m, n, k, transpose_a, transpose_b, lda, ldb, ldc, compute, type,
                    align_a, align_b, align_c, align_bias, workspace_bytes, epilogue);
  }
  bool operator<(const ProblemKey& other) const { return tied() < other.tied(); }
};

// What one problem runs with. Built once and never destroyed (like the handle pools):
// calls in flight on other threads may be using it.
struct ProblemPlan {
  // False when cuBLASLt offered no algorithm or refused to run the one it offered.
  std::atomic<bool> fused{false};
  // The descriptor holds the bias pointer, which differs per call: the mutex covers
  // setting it through the enqueue of the call that uses it (host work only).
  std::mutex call_mutex;
  cublasLtMatmulDesc_t operation = nullptr;
  cublasLtMatrixLayout_t a_layout = nullptr, b_layout = nullptr, c_layout = nullptr;
  cublasLtMatmulAlgo_t algo{};
};

struct PlanCache {
  std::mutex mutex;
  std::map<ProblemKey, std::unique_ptr<ProblemPlan>> plans;
};

PlanCache& plan_cache() {
  static PlanCache* cache = new PlanCache();  // never destroyed (see ProblemPlan)
  return *cache;
}

std::atomic<uint64_t> fused_calls{0};
std::atomic<uint64_t> fallback_calls{0};

template <typename T>
void set_operation_attribute(cublasLtMatmulDesc_t operation, cublasLtMatmulDescAttributes_t which,
                             const T& value) {
  MG_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(operation, which, &value, sizeof(value)));
}

template <typename T>
void set_preference(cublasLtMatmulPreference_t preference,
                    cublasLtMatmulPreferenceAttributes_t which, const T& value) {
  MG_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(preference, which, &value, sizeof(value)));
}

// A column-major matrix layout: `rows` x `cols` as stored (before any transpose).
cublasLtMatrixLayout_t matrix_layout(cudaDataType_t type, int64_t rows, int64_t cols, int64_t ld) {
  cublasLtMatrixLayout_t layout = nullptr;
  MG_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&layout, type, static_cast<uint64_t>(rows),
                                             static_cast<uint64_t>(cols), ld));
  return layout;
}

// Descriptors for `key` and the heuristic's first choice; `bias` is a pointer with the
// key's bias alignment (the heuristic reads the alignment from it).
std::unique_ptr<ProblemPlan> make_plan(const ProblemKey& key, cublasLtHandle_t lt_handle,
                                       const void* bias) {
  auto plan = std::make_unique<ProblemPlan>();
  MG_CUBLAS_CHECK(cublasLtMatmulDescCreate(&plan->operation, key.compute, CUDA_R_32F));
  const auto op = [](bool transpose) {
    return static_cast<int32_t>(transpose ? CUBLAS_OP_T : CUBLAS_OP_N);
  };
  set_operation_attribute(plan->operation, CUBLASLT_MATMUL_DESC_TRANSA, op(key.transpose_a));
  set_operation_attribute(plan->operation, CUBLASLT_MATMUL_DESC_TRANSB, op(key.transpose_b));
  set_operation_attribute(plan->operation, CUBLASLT_MATMUL_DESC_EPILOGUE,
                          static_cast<uint32_t>(key.epilogue));
  set_operation_attribute(plan->operation, CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias);
  // Stored shapes: op(A) is m x k, op(B) is k x n, C = D is m x n. The scale type (alpha,
  // beta) is float32 for every operand type; the bias takes D's type (cuBLASLt's default).
  plan->a_layout = key.transpose_a ? matrix_layout(key.type, key.k, key.m, key.lda)
                                   : matrix_layout(key.type, key.m, key.k, key.lda);
  plan->b_layout = key.transpose_b ? matrix_layout(key.type, key.n, key.k, key.ldb)
                                   : matrix_layout(key.type, key.k, key.n, key.ldb);
  plan->c_layout = matrix_layout(key.type, key.m, key.n, key.ldc);

  cublasLtMatmulPreference_t preference = nullptr;
  MG_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&preference));
  set_preference(preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                 static_cast<uint64_t>(key.workspace_bytes));
  // The defaults assume 256-byte aligned matrices; views start at any element.
  set_preference(preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, key.align_a);
  set_preference(preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, key.align_b);
  set_preference(preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, key.align_c);
  // D is out too; the bias is written along D's columns, so D is told the weaker of the
  // two (as PyTorch does).
  set_preference(preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES,
                 std::min(key.align_c, key.align_bias));
  cublasLtMatmulHeuristicResult_t result{};
  int returned = 0;
  const cublasStatus_t heuristic_status = cublasLtMatmulAlgoGetHeuristic(
      lt_handle, plan->operation, plan->a_layout, plan->b_layout, plan->c_layout, plan->c_layout,
      preference, 1, &result, &returned);
  MG_CUBLAS_CHECK(cublasLtMatmulPreferenceDestroy(preference));
  if (heuristic_status == CUBLAS_STATUS_NOT_SUPPORTED) return plan;  // fused stays false
  MG_CUBLAS_CHECK(heuristic_status);
  if (returned > 0 && result.state == CUBLAS_STATUS_SUCCESS) {
    plan->algo = result.algo;
    plan->fused.store(true);
  }
  return plan;
}

// The cached plan for `key`, made on first use; nullptr when the cache is full.
ProblemPlan* find_or_make_plan(const ProblemKey& key, cublasLtHandle_t lt_handle,
                               const void* bias) {
  PlanCache& cache = plan_cache();
  std::lock_guard<std::mutex> lock(cache.mutex);
  const auto found = cache.plans.find(key);
  if (found != cache.plans.end()) return found->second.get();
  if (cache.plans.size() >= kMaxCachedProblems) return nullptr;
  std::unique_ptr<ProblemPlan> plan = make_plan(key, lt_handle, bias);
  ProblemPlan* made = plan.get();
  cache.plans.emplace(key, std::move(plan));
  return made;
}

// Whether cuBLASLt should be asked at all. As PyTorch does (CUDA >= 12.1): not for a
// weight with a dimension of 1 (k == 1, or one output feature), where cuBLASLt has had
// bugs; those small products take the fallback.
bool worth_asking(const GemmPlan& plan) { return plan.gemm_k > 1 && plan.gemm_m > 1; }

uint32_t alignment_of(const Tensor& t, int64_t ld) {
  return gemm_alignment_bytes(reinterpret_cast<uintptr_t>(t.data_ptr()), ld,
                              static_cast<int64_t>(element_size(t.dtype())));
}

// out = a @ b + bias (the `epilogue`) in one cublasLtMatmul; false (nothing done) when
// cuBLASLt refuses.
bool fused_addmm(const BlasContext& blas, int device, cudaStream_t stream, const GemmPlan& plan,
                 const Tensor& out, const Tensor& bias, const Tensor& a, const Tensor& b,
                 cublasLtEpilogue_t epilogue) {
  if (!worth_asking(plan)) return false;
  ProblemKey key;
  key.epilogue = epilogue;
  key.device = device;
  key.m = plan.gemm_m;
  key.n = plan.gemm_n;
  key.k = plan.gemm_k;
  key.transpose_a = plan.lhs.transpose;
  key.transpose_b = plan.rhs.transpose;
  key.lda = plan.lhs.ld;
  key.ldb = plan.rhs.ld;
  key.ldc = plan.ldc;
  key.compute = gemm_compute_type(out.dtype());
  key.type = cublas_data_type(out.dtype());
  key.align_a = alignment_of(b, plan.lhs.ld);
  key.align_b = alignment_of(a, plan.rhs.ld);
  key.align_c = alignment_of(out, plan.ldc);
  key.align_bias = alignment_of(bias, 0);
  if (key.align_bias < kMinBiasAlignmentBytes) return false;
  key.workspace_bytes = blas.workspace_bytes;
  const void* bias_pointer = bias.data_ptr();
  ProblemPlan* problem = find_or_make_plan(key, blas.lt_handle, bias_pointer);
  if (problem == nullptr || !problem->fused.load(std::memory_order_relaxed)) return false;

  const float alpha = 1.0f, beta = 0.0f;  // C is not read: the bias comes from the epilogue
  std::lock_guard<std::mutex> lock(problem->call_mutex);
  set_operation_attribute(problem->operation, CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias_pointer);
  const cublasStatus_t lt_matmul_status = cublasLtMatmul(
      blas.lt_handle, problem->operation, &alpha, b.data_ptr(), problem->a_layout, a.data_ptr(),
      problem->b_layout, &beta, out.data_ptr(), problem->c_layout, out.data_ptr(),
      problem->c_layout, &problem->algo, blas.workspace, blas.workspace_bytes, stream);
  if (lt_matmul_status == CUBLAS_STATUS_NOT_SUPPORTED) {
    problem->fused.store(false, std::memory_order_relaxed);  // not asked again
    return false;
  }
  MG_CUBLAS_CHECK(lt_matmul_status);
  return true;
}

}  // namespace

AddmmPathCounts addmm_path_counts() {
  AddmmPathCounts counts;
  counts.fused = fused_calls.load();
  counts.fallback = fallback_calls.load();
  return counts;
}

namespace {

// addmm and addmm_relu: one fused cublasLtMatmul when cuBLASLt takes the problem, else
// the bias copied into out and cublasGemmEx with beta = 1; then (relu) a ReLU in place,
// which keeps NaN as PyTorch's does (see the top of this file).
void addmm_cuda(CudaBackend& backend, const Tensor& out, const Tensor& bias, const Tensor& a,
                const Tensor& b, bool relu) {
  const int64_t m = a.size(0), k = a.size(1), n = b.size(1);
  MG_CHECK(out.is_contiguous() && (out.dtype() == DType::Float32 || is_reduced_float(out.dtype())) &&
               bias.is_contiguous() && bias.dim() == 1 && bias.size(0) == n,
           "{} on CUDA: expected a contiguous float32, bfloat16 or float16 output and a "
           "contiguous bias of shape [{}], got {} and {}",
           relu ? "addmm_relu" : "addmm", n, out.shape(), bias.shape());
  if (m == 0 || n == 0) return;
  OpScope scope(out);
  if (k > 0) {
    const GemmPlan plan = gemm_plan(m, k, n, a.stride(0), a.stride(1), b.stride(0), b.stride(1));
    // Views that are neither row- nor column-major go to cuBLAS as contiguous copies.
    const Tensor a_operand = plan.rhs.pack ? ops::clone(a) : a;
    const Tensor b_operand = plan.lhs.pack ? ops::clone(b) : b;
    const BlasContext blas = blas_context(scope.device(), scope.stream());
    if (fused_addmm(blas, scope.device(), scope.stream(), plan, out, bias, a_operand, b_operand,
                    CUBLASLT_EPILOGUE_BIAS)) {
      fused_calls.fetch_add(1, std::memory_order_relaxed);
      if (relu) backend.unary(UnaryOp::Relu, out, out);
      return;
    }
    backend.copy(out, ops::expand(bias, out.shape()));
    gemm_ex(blas.handle, plan, out, a_operand, b_operand, 1.0f, relu ? "addmm_relu" : "addmm");
  } else {
    backend.copy(out, ops::expand(bias, out.shape()));  // an empty sum: every row is the bias
  }
  if (relu) backend.unary(UnaryOp::Relu, out, out);
  fallback_calls.fetch_add(1, std::memory_order_relaxed);
}

}  // namespace

// float64 takes the unfused default (a double GEMM, then the bias add); cuBLASLt's
// epilogues here are set up for float32, bfloat16 and float16 (float32 compute).
void CudaBackend::addmm(const Tensor& out, const Tensor& bias, const Tensor& a, const Tensor& b) {
  if (out.dtype() == DType::Float64) return Backend::addmm(out, bias, a, b);
  addmm_cuda(*this, out, bias, a, b, /*relu=*/false);
}

void CudaBackend::addmm_relu(const Tensor& out, const Tensor& bias, const Tensor& a,
                             const Tensor& b) {
  if (out.dtype() == DType::Float64) return Backend::addmm_relu(out, bias, a, b);
  addmm_cuda(*this, out, bias, a, b, /*relu=*/true);
}

}  // namespace mg::cuda
