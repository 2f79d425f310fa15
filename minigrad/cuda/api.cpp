// mg::cuda's functions, written against core's backend table only, so that this file
// builds (and explains itself) with and without the CUDA toolkit. In a build without
// CUDA the table's CUDA entry reports no devices and throws "minigrad was built without
// CUDA" for anything else; memory statistics come from the allocators through the
// CUDA-free DeviceMemoryStats interface.
#include <minigrad/cuda/cuda.h>

#include <atomic>

#include <minigrad/core/backend.h>
#include <minigrad/cuda/memory_stats.h>

namespace mg::cuda {
namespace {

Backend& cuda_table() { return backend(DeviceType::CUDA); }

int resolve(int device) { return device < 0 ? cuda_table().current_device() : device; }

DeviceMemoryStats& stats(int device, const char* op) {
  Allocator& allocator = cuda_table().allocator(resolve(device));
  auto* memory_stats = dynamic_cast<DeviceMemoryStats*>(&allocator);
  MG_CHECK(memory_stats != nullptr, "cuda::{}: the allocator of cuda:{} keeps no statistics", op,
           resolve(device));
  return *memory_stats;
}

std::atomic<bool>& tf32_allowed() {
  static std::atomic<bool> allowed{false};
  return allowed;
}

}  // namespace

int device_count() { return cuda_table().device_count(); }
bool is_available() { return device_count() > 0; }

bool is_built() {
#ifdef MINIGRAD_WITH_CUDA
  return true;
#else
  return false;
#endif
}

int current_device() { return cuda_table().current_device(); }
void set_device(int device) { cuda_table().set_device(device); }

void synchronize(int device) { cuda_table().synchronize(resolve(device)); }

void set_allow_tf32(bool allow) { tf32_allowed().store(allow, std::memory_order_relaxed); }
bool allow_tf32() { return tf32_allowed().load(std::memory_order_relaxed); }

std::size_t memory_allocated(int device) {
  return stats(device, "memory_allocated").allocated_bytes();
}
std::size_t max_memory_allocated(int device) {
  return stats(device, "max_memory_allocated").peak_allocated_bytes();
}
std::size_t memory_reserved(int device) { return stats(device, "memory_reserved").reserved_bytes(); }
void reset_peak_memory_stats(int device) { stats(device, "reset_peak_memory_stats").reset_peak(); }

Stream current_stream(int device) { return cuda_table().current_stream(resolve(device)); }
Stream compute_stream(int device) { return cuda_table().compute_stream(resolve(device)); }
Stream copy_stream(int device) { return cuda_table().copy_stream(resolve(device)); }

}  // namespace mg::cuda
