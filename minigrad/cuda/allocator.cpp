#include <minigrad/cuda/allocator.h>

#include <cstdint>
#include <cstdio>
#include <memory>

#include <fmt/format.h>

#include <minigrad/core/error.h>
#include <minigrad/cuda/check.h>
#include <minigrad/cuda/device.h>
#include <minigrad/cuda/stream.h>

namespace mg::cuda {
namespace {

// The capture state of `stream`: 0 when it is not being captured, else the id of the
// capture in progress.
unsigned long long capture_id_of(cudaStream_t stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  unsigned long long id = 0;
  MG_CUDA_CHECK(cudaStreamGetCaptureInfo(stream, &status, &id));
  return status == cudaStreamCaptureStatusActive ? id : 0;
}

// During process exit the runtime refuses calls with these; memory goes with the context.
bool is_shutting_down(cudaError_t status) {
  return status == cudaErrorCudartUnloading || status == cudaErrorContextIsDestroyed;
}

// True when `nbytes` is more than the current device has in total.
bool exceeds_device(std::size_t nbytes) {
  std::size_t free_bytes = 0, total_bytes = 0;
  if (cudaMemGetInfo(&free_bytes, &total_bytes) != cudaSuccess) return false;
  return nbytes > total_bytes;
}

}  // namespace

cudaMemPool_t CudaAllocator::pool() {
  std::call_once(pool_once_, [&] {
    // The device's current pool: the one cudaMallocAsync draws from (the default pool,
    // unless someone installed another with cudaDeviceSetMemPool).
    cudaMemPool_t pool = nullptr;
    MG_CUDA_CHECK(cudaDeviceGetMemPool(&pool, device_));
    // Keep freed memory in the pool instead of returning it to the driver at every
    // synchronisation: this is what makes the pool a cache.
    uint64_t keep_everything = UINT64_MAX;
    MG_CUDA_CHECK(
        cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep_everything));
    pool_.store(pool);
  });
  return pool_.load();
}

void* CudaAllocator::allocate(std::size_t nbytes) {
  if (nbytes == 0) return nullptr;
  ScopedDevice device(device_);
  const cudaStream_t stream = current_cuda_stream(device_);
  (void)pool();  // configured before the first allocation
  const unsigned long long capture_id = capture_id_of(stream);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!deferred_.empty()) release_deferred_locked();
  }

  void* ptr = nullptr;
  // cudaMallocAsync (not ...FromPoolAsync) is the form stream capture turns into graph
  // memory nodes, which is what CUDA graphs of whole training steps need.
  cudaError_t status = cudaMallocAsync(&ptr, nbytes, stream);
  if (status == cudaErrorMemoryAllocation && capture_id == 0) {
    // Memory freed on other streams returns to the pool only once that work is done;
    // wait for it and try once more before giving up.
    (void)cudaGetLastError();
    MG_CUDA_CHECK(cudaDeviceSynchronize());
    status = cudaMallocAsync(&ptr, nbytes, stream);
  }
  if (status == cudaErrorMemoryAllocation || (status != cudaSuccess && exceeds_device(nbytes))) {
    // (A request larger than the whole device may come back as an invalid argument.)
    (void)cudaGetLastError();
    throw_out_of_memory(nbytes, stream);
  }
  MG_CUDA_CHECK(status);

  std::lock_guard<std::mutex> lock(mutex_);
  blocks_.emplace(ptr, Block{stream, nbytes, capture_id});
  allocated_ += nbytes;
  if (allocated_ > peak_) peak_ = allocated_;
  return ptr;
}

void CudaAllocator::throw_out_of_memory(std::size_t nbytes, cudaStream_t stream) {
  std::size_t free_bytes = 0, total_bytes = 0;
  const bool have_info = cudaMemGetInfo(&free_bytes, &total_bytes) == cudaSuccess;
  (void)cudaGetLastError();
  (void)stream;
  std::size_t allocated = 0;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    allocated = allocated_;
  }
  MG_FAIL("CUDA out of memory on cuda:{}: tried to allocate {} ({} bytes); {}; minigrad "
          "tensors hold {} and the pool reserves {}",
          device_, format_bytes(nbytes), nbytes,
          have_info ? fmt::format("{} free of {} total", format_bytes(free_bytes),
                                  format_bytes(total_bytes))
                    : std::string("free memory unknown"),
          format_bytes(allocated), format_bytes(reserved_bytes()));
}

void CudaAllocator::deallocate(void* ptr, std::size_t nbytes) {
  if (ptr == nullptr) return;
  try {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = blocks_.find(ptr);
    if (it == blocks_.end()) {
      std::fprintf(stderr, "minigrad: cuda:%d allocator: freeing unknown pointer %p (%zu bytes)\n",
                   device_, ptr, nbytes);
      return;
    }
    const Block block = it->second;
    blocks_.erase(it);
    allocated_ -= block.nbytes;
    if (!deferred_.empty()) release_deferred_locked();

    // A block made before a capture began cannot be freed inside that capture (the
    // graph would free memory it does not own on every replay); keep it until the
    // capture ends. Blocks made inside the capture are freed inside it, as graph nodes.
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    unsigned long long capture_id = 0;
    const cudaError_t status = cudaStreamGetCaptureInfo(block.stream, &capture, &capture_id);
    if (is_shutting_down(status)) {
      (void)cudaGetLastError();
      return;
    }
    MG_CUDA_CHECK(status);
    if (capture == cudaStreamCaptureStatusActive && capture_id != block.capture_id) {
      deferred_.emplace_back(ptr, block);
      return;
    }
    free_block(ptr, block);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "minigrad: cuda:%d allocator: failed to free %p: %s\n", device_, ptr,
                 e.what());
  }
}

void CudaAllocator::free_block(void* ptr, const Block& block) {
  // With the block's device current, as for every call on its stream; done by hand
  // because this runs from destructors and must not throw.
  int previous = device_;
  const bool switched = cudaGetDevice(&previous) == cudaSuccess && previous != device_ &&
                        cudaSetDevice(device_) == cudaSuccess;
  const cudaError_t status = cudaFreeAsync(ptr, block.stream);
  if (switched) (void)cudaSetDevice(previous);
  if (is_shutting_down(status)) {
    // Process exit: the driver is already tearing the context (and its memory) down.
    (void)cudaGetLastError();
    return;
  }
  MG_CUDA_CHECK(status);
}

void CudaAllocator::release_deferred_locked() {
  std::vector<std::pair<void*, Block>> still_waiting;
  for (const auto& [ptr, block] : deferred_) {
    if (capture_id_of(block.stream) != 0) {
      still_waiting.emplace_back(ptr, block);
    } else {
      free_block(ptr, block);
    }
  }
  deferred_.swap(still_waiting);
}

std::size_t CudaAllocator::allocated_bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return allocated_;
}

std::size_t CudaAllocator::peak_allocated_bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return peak_;
}

std::size_t CudaAllocator::reserved_bytes() const {
  const cudaMemPool_t pool = pool_.load();
  if (pool == nullptr) return 0;
  uint64_t reserved = 0;
  if (cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemCurrent, &reserved) !=
      cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return static_cast<std::size_t>(reserved);
}

void CudaAllocator::reset_peak() {
  std::lock_guard<std::mutex> lock(mutex_);
  peak_ = allocated_;
}

CudaAllocator& device_allocator(int index) {
  check_device_index(index, "cuda allocator");
  // Never destroyed: storages freed during static destruction still find their allocator.
  static std::vector<CudaAllocator*>* allocators = [] {
    auto* list = new std::vector<CudaAllocator*>();
    for (int i = 0; i < visible_device_count(); ++i) list->push_back(new CudaAllocator(i));
    return list;
  }();
  return *(*allocators)[static_cast<size_t>(index)];
}

}  // namespace mg::cuda
