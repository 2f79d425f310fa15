// The host's free memory, as the kernel estimates it: MemAvailable (what can be
// allocated without swapping, page cache included) and MemTotal from /proc/meminfo.
#include <cstdio>
#include <cstring>

#include <minigrad/core/cpu/cpu_backend.h>

namespace mg {

MemoryInfo CpuBackend::memory_info(int) {
  MemoryInfo info;
  std::FILE* file = std::fopen("/proc/meminfo", "r");
  if (file == nullptr) return info;  // not Linux: unknown
  bool have_free = false, have_total = false;
  char line[256];
  while (std::fgets(line, sizeof line, file) != nullptr) {
    unsigned long long kib = 0;
    if (std::sscanf(line, "MemAvailable: %llu kB", &kib) == 1) {
      info.free_bytes = static_cast<std::size_t>(kib) * 1024;
      have_free = true;
    } else if (std::sscanf(line, "MemTotal: %llu kB", &kib) == 1) {
      info.total_bytes = static_cast<std::size_t>(kib) * 1024;
      have_total = true;
    }
  }
  std::fclose(file);
  info.known = have_free && have_total;
  return info;
}

}  // namespace mg
