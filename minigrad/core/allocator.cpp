#include <minigrad/core/allocator.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <cstdlib>
#include <mutex>
#include <unordered_map>
#include <vector>

#include <fmt/format.h>

#include <minigrad/core/error.h>

namespace mg {
namespace {

// Host memory, 64-byte aligned, with a cache of large freed blocks.
//
// Why a cache: a training step allocates the same activation and gradient sizes every
// iteration. glibc returns large blocks to the kernel when they are freed (munmap, or a
// heap trim), so each step would page-fault its activations back in, zeroed by the
// kernel: about 6% of an mnist_mlp step. Blocks of at least kMinCachedBytes are kept by
// exact (rounded) size and handed out again; smaller ones go straight back to malloc,
// whose own free lists serve them well. The cache holds at most kMaxCachedBytes.
class CpuAllocator final : public Allocator {
 public:
  static constexpr std::size_t kAlignment = 64;
  static constexpr std::size_t kMinCachedBytes = std::size_t{64} << 10;   // 64 KiB
  static constexpr std::size_t kMaxCachedBytes = std::size_t{1} << 30;    // 1 GiB

  void* allocate(std::size_t nbytes) override {
    if (nbytes == 0) return nullptr;
    void* ptr = allocate_block(nbytes);
    count_allocated(nbytes);
    if (recording_.load(std::memory_order_relaxed)) record_allocation(ptr, nbytes);
    return ptr;
  }

  void deallocate(void* ptr, std::size_t nbytes) override {
    if (ptr == nullptr) return;
    if (recording_.load(std::memory_order_relaxed)) record_free(ptr);
    allocated_.fetch_sub(nbytes, std::memory_order_relaxed);
    free_block(ptr, nbytes);
  }

  std::size_t allocated() const { return allocated_.load(std::memory_order_relaxed); }
  std::size_t peak() const { return peak_.load(std::memory_order_relaxed); }
  void reset_peak() {
    peak_.store(allocated(), std::memory_order_relaxed);
    std::lock_guard<std::mutex> lock(history_mutex_);
    recorded_peak_ = recorded_;
    at_peak_ = live_sizes_;
  }

  void record_history(bool enabled) {
    std::lock_guard<std::mutex> lock(history_mutex_);
    recording_.store(enabled, std::memory_order_relaxed);
    if (enabled) return;
    live_.clear();
    live_sizes_.clear();
    recorded_ = recorded_peak_ = 0;
  }

  std::map<std::size_t, int64_t> blocks_at_peak() {
    std::lock_guard<std::mutex> lock(history_mutex_);
    return at_peak_;
  }

 private:
  // Recording: the blocks counted (so a free of one made before recording is ignored), the
  // live ones by size, and a copy of that at the highest total seen (a few hundred sizes at
  // most in a training step, so copying at each new high is cheap).
  void record_allocation(void* ptr, std::size_t nbytes) {
    std::lock_guard<std::mutex> lock(history_mutex_);
    live_[ptr] = nbytes;
    ++live_sizes_[nbytes];
    recorded_ += nbytes;
    if (recorded_ > recorded_peak_) {
      recorded_peak_ = recorded_;
      at_peak_ = live_sizes_;
    }
  }

  void record_free(void* ptr) {
    std::lock_guard<std::mutex> lock(history_mutex_);
    const auto it = live_.find(ptr);
    if (it == live_.end()) return;
    recorded_ -= it->second;
    if (--live_sizes_[it->second] == 0) live_sizes_.erase(it->second);
    live_.erase(it);
  }

  void count_allocated(std::size_t nbytes) {
    const std::size_t now = allocated_.fetch_add(nbytes, std::memory_order_relaxed) + nbytes;
    std::size_t peak = peak_.load(std::memory_order_relaxed);
    while (now > peak && !peak_.compare_exchange_weak(peak, now, std::memory_order_relaxed)) {
    }
  }

  void* allocate_block(std::size_t nbytes) {
    const std::size_t rounded = round_up(nbytes);
    if (rounded >= kMinCachedBytes) {
      std::lock_guard<std::mutex> lock(mutex_);
      auto it = free_blocks_.find(rounded);
      if (it != free_blocks_.end() && !it->second.empty()) {
        void* ptr = it->second.back();
        it->second.pop_back();
        cached_bytes_ -= rounded;
        return ptr;
      }
    }
    void* ptr = std::aligned_alloc(kAlignment, rounded);
    MG_CHECK(ptr != nullptr, "cpu allocator: out of memory allocating {} bytes", nbytes);
    return ptr;
  }

  void free_block(void* ptr, std::size_t nbytes) {
    const std::size_t rounded = round_up(nbytes);
    if (rounded >= kMinCachedBytes) {
      std::lock_guard<std::mutex> lock(mutex_);
      if (cached_bytes_ + rounded <= kMaxCachedBytes) {
        free_blocks_[rounded].push_back(ptr);
        cached_bytes_ += rounded;
        return;
      }
    }
    std::free(ptr);
  }

  static std::size_t round_up(std::size_t nbytes) {
    return (nbytes + kAlignment - 1) / kAlignment * kAlignment;
  }

  std::mutex mutex_;  // DataParallel's replicas allocate from worker threads
  std::unordered_map<std::size_t, std::vector<void*>> free_blocks_;
  std::size_t cached_bytes_ = 0;
  std::atomic<std::size_t> allocated_{0};
  std::atomic<std::size_t> peak_{0};

  std::atomic<bool> recording_{false};
  std::mutex history_mutex_;
  std::unordered_map<void*, std::size_t> live_;
  std::map<std::size_t, int64_t> live_sizes_, at_peak_;
  std::size_t recorded_ = 0, recorded_peak_ = 0;
};

CpuAllocator& the_cpu_allocator() {
  // Never destroyed: storages freed during static destruction still find their allocator.
  static CpuAllocator* allocator = new CpuAllocator();
  return *allocator;
}

}  // namespace

Allocator& cpu_allocator() { return the_cpu_allocator(); }

std::size_t cpu_memory_allocated() { return the_cpu_allocator().allocated(); }
std::size_t cpu_max_memory_allocated() { return the_cpu_allocator().peak(); }
void cpu_reset_peak_memory_stats() { the_cpu_allocator().reset_peak(); }

void cpu_record_memory_history(bool enabled) { the_cpu_allocator().record_history(enabled); }

std::vector<LiveBlocks> cpu_live_blocks_at_peak() {
  std::vector<LiveBlocks> blocks;
  for (const auto& [bytes, count] : the_cpu_allocator().blocks_at_peak()) blocks.push_back({bytes, count});
  std::stable_sort(blocks.begin(), blocks.end(), [](const LiveBlocks& a, const LiveBlocks& b) {
    return a.bytes * static_cast<std::size_t>(a.count) > b.bytes * static_cast<std::size_t>(b.count);
  });
  return blocks;
}

std::string format_bytes(std::size_t bytes) {
  constexpr const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double value = static_cast<double>(bytes);
  int unit = 0;
  while (value >= 1024.0 && unit < 4) {
    value /= 1024.0;
    ++unit;
  }
  return unit == 0 ? fmt::format("{} B", bytes) : fmt::format("{:.2f} {}", value, units[unit]);
}

}  // namespace mg
