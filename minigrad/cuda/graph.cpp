// mg::cuda::CUDAGraph over the runtime's stream capture. Always compiled: without the
// CUDA toolkit each method explains that the build has no CUDA.
#include <minigrad/cuda/graph.h>

#include <minigrad/core/error.h>

#if MINIGRAD_WITH_CUDA
#include <cuda_runtime_api.h>

#include <minigrad/cuda/backend.h>
#include <minigrad/cuda/blas.h>
#include <minigrad/cuda/check.h>
#include <minigrad/cuda/cuda.h>
#include <minigrad/cuda/device.h>
#include <minigrad/cuda/stream.h>
#endif

namespace mg::cuda {

#if MINIGRAD_WITH_CUDA

struct CUDAGraph::Impl {
  int device = -1;
  cudaStream_t stream = nullptr;
  bool capturing = false;
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;

  void destroy() {
    // Called from the destructor too: failures here cannot be reported, only skipped.
    if (exec != nullptr) (void)cudaGraphExecDestroy(exec);
    if (graph != nullptr) (void)cudaGraphDestroy(graph);
    exec = nullptr;
    graph = nullptr;
  }
};

CUDAGraph::CUDAGraph() : impl_(std::make_unique<Impl>()) {}

CUDAGraph::~CUDAGraph() {
  if (impl_->capturing) {
    // An exception left the capture open: close it and throw the partial graph away.
    ScopedDevice scoped(impl_->device);
    cudaGraph_t partial = nullptr;
    if (cudaStreamEndCapture(impl_->stream, &partial) == cudaSuccess && partial != nullptr)
      (void)cudaGraphDestroy(partial);
    (void)cudaGetLastError();
  }
  impl_->destroy();
}

void CUDAGraph::capture_begin(int device) {
  MG_CHECK(!impl_->capturing, "CUDAGraph::capture_begin: a capture is already in progress (on "
                              "cuda:{}); call capture_end() first",
           impl_->device);
  MG_CHECK(impl_->exec == nullptr,
           "CUDAGraph::capture_begin: this graph already holds a capture; call reset() first");
  const int index = device < 0 ? current_device() : device;
  MG_CHECK(index < device_count(), "CUDAGraph::capture_begin: cuda:{} is not a visible device "
                                   "({} visible)",
           index, device_count());
  ScopedDevice scoped(index);
  const cudaStream_t stream = current_cuda_stream(index);
  // What an op would otherwise make on its first use, with calls a capture forbids
  // (cudaMalloc, a stream synchronisation, cublasCreate): the device's pool and
  // invalid-target flag, this thread's cuBLAS handles and the stream's GEMM workspace.
  prepare_device(index);
  (void)blas_context(index, stream);
  // Thread-local mode: other threads' unsafe calls (a cudaMalloc elsewhere) do not break
  // this capture, and this thread's do, where they would silently go missing.
  MG_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  impl_->device = index;
  impl_->stream = stream;
  impl_->capturing = true;
}

void CUDAGraph::capture_end() {
  MG_CHECK(impl_->capturing, "CUDAGraph::capture_end: no capture is in progress");
  ScopedDevice scoped(impl_->device);
  impl_->capturing = false;
  cudaGraph_t graph = nullptr;
  const cudaError_t ended = cudaStreamEndCapture(impl_->stream, &graph);
  if (ended != cudaSuccess) {
    (void)cudaGetLastError();
    if (graph != nullptr) (void)cudaGraphDestroy(graph);
    MG_FAIL("CUDAGraph::capture_end: the capture on cuda:{} failed: {} ({}). An operation "
            "inside it could not be captured: a host synchronisation (item(), a copy to the "
            "CPU), or work on another stream that was not joined back",
            impl_->device, cudaGetErrorString(ended), cudaGetErrorName(ended));
  }
  impl_->graph = graph;
  const cudaError_t instantiated = cudaGraphInstantiate(&impl_->exec, graph, 0);
  if (instantiated != cudaSuccess) {
    (void)cudaGetLastError();
    impl_->exec = nullptr;
    impl_->destroy();
    MG_FAIL("CUDAGraph::capture_end: the graph captured on cuda:{} could not be instantiated: "
            "{} ({})",
            impl_->device, cudaGetErrorString(instantiated), cudaGetErrorName(instantiated));
  }
}

void CUDAGraph::replay() {
  MG_CHECK(impl_->exec != nullptr,
           "CUDAGraph::replay: nothing to replay{}",
           impl_->capturing ? " (the capture has not ended: call capture_end() first)"
                            : " (call capture_begin() and capture_end() first)");
  ScopedDevice scoped(impl_->device);
  MG_CUDA_CHECK(cudaGraphLaunch(impl_->exec, impl_->stream));
}

void CUDAGraph::reset() {
  MG_CHECK(!impl_->capturing, "CUDAGraph::reset: a capture is in progress; end it first");
  impl_->destroy();
}

bool CUDAGraph::is_capturing() const { return impl_->capturing; }
bool CUDAGraph::is_ready() const { return impl_->exec != nullptr; }

#else  // no CUDA toolkit

struct CUDAGraph::Impl {};

namespace {
[[noreturn]] void no_cuda(const char* op) {
  MG_FAIL("CUDAGraph::{}: minigrad was built without CUDA (rebuild with the CUDA toolkit "
          "installed and MINIGRAD_CUDA=AUTO or ON)",
          op);
}
}  // namespace

CUDAGraph::CUDAGraph() : impl_(std::make_unique<Impl>()) {}
CUDAGraph::~CUDAGraph() = default;
void CUDAGraph::capture_begin(int) { no_cuda("capture_begin"); }
void CUDAGraph::capture_end() { no_cuda("capture_end"); }
void CUDAGraph::replay() { no_cuda("replay"); }
void CUDAGraph::reset() {}
bool CUDAGraph::is_capturing() const { return false; }
bool CUDAGraph::is_ready() const { return false; }

#endif

}  // namespace mg::cuda
