#include <minigrad/core/cpu/cpu_backend.h>

namespace mg {

CpuBackend& cpu_backend() {
  static CpuBackend instance;
  return instance;
}

}  // namespace mg
