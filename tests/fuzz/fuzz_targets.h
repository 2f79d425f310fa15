// What one fuzz input does, shared by the libFuzzer harnesses (*_fuzzer.cpp, built with
// -DMINIGRAD_FUZZ=ON) and the Catch2 tests that replay the seed corpus and every input
// that once crashed (tests/fuzz/regressions/<target>/), so a fixed crash stays fixed in
// the regular suite.
//
// The contract under test: a reader given any bytes either returns a well-formed
// result or throws mg::Error. Any other exception escapes and terminates the process,
// and a bad read, an undefined behaviour or a leak is a sanitizer report; libFuzzer
// counts all of these as crashes. Broken invariants of a returned result abort.
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include <minigrad/core/error.h>
#include <minigrad/data/idx.h>
#include <minigrad/nn/layers.h>
#include <minigrad/nn/serialize.h>

namespace mg::fuzz {

// abort() with a message: a returned result that breaks what its reader promises.
#define MG_FUZZ_ASSERT(cond)                                                    \
  do {                                                                          \
    if (!(cond)) {                                                              \
      std::fprintf(stderr, "fuzz invariant failed: %s (%s:%d)\n", #cond, __FILE__, __LINE__); \
      std::abort();                                                             \
    }                                                                           \
  } while (0)

// The input as a file without touching the disk (memfd), so the readers' real entry
// points (open, fstat, gzopen) run on it: path() is /proc/self/fd/<n>.
class MemoryFile {
 public:
  MemoryFile(const uint8_t* data, std::size_t size) : fd_(memfd_create("minigrad-fuzz", MFD_CLOEXEC)) {
    MG_FUZZ_ASSERT(fd_ >= 0);
    std::size_t done = 0;
    while (done < size) {
      const ssize_t n = ::write(fd_, data + done, size - done);
      MG_FUZZ_ASSERT(n > 0);
      done += static_cast<std::size_t>(n);
    }
  }
  ~MemoryFile() { ::close(fd_); }
  MemoryFile(const MemoryFile&) = delete;
  MemoryFile& operator=(const MemoryFile&) = delete;
  std::string path() const { return "/proc/self/fd/" + std::to_string(fd_); }

 private:
  int fd_;
};

// data/idx.h: the in-memory parser with the label (1-D) and image (3-D) layouts, then
// the file reader, which also gunzips: it reads the header first and then no more than
// the values the header declares (a gzip bomb stops there), and read_maybe_gzipped with
// a limit below the fuzzer's -max_len, so that the limit is crossed as often as not.
inline void idx_one_input(const uint8_t* data, std::size_t size) {
  for (int ndims : {1, 3}) {
    try {
      const data::IdxArray array = data::parse_idx_ubyte(data, size, ndims, "fuzz input");
      MG_FUZZ_ASSERT(array.dims.size() == static_cast<std::size_t>(ndims));
      std::size_t count = 1;
      for (int64_t d : array.dims) count *= static_cast<std::size_t>(d);
      MG_FUZZ_ASSERT(count == array.values.size());
    } catch (const mg::Error&) {
    }
  }
  const MemoryFile file(data, size);
  for (int ndims : {1, 3}) {
    try {
      const data::IdxArray array = data::read_idx_ubyte(file.path(), ndims);
      MG_FUZZ_ASSERT(array.dims.size() == static_cast<std::size_t>(ndims));
      std::size_t count = 1;
      for (int64_t d : array.dims) count *= static_cast<std::size_t>(d);
      MG_FUZZ_ASSERT(count == array.values.size());
    } catch (const mg::Error&) {
    }
  }
  try {
    constexpr std::size_t kLimit = 4096;
    MG_FUZZ_ASSERT(data::read_maybe_gzipped(file.path(), kLimit).size() <= kLimit);
  } catch (const mg::Error&) {
  }
}

// nn/serialize.h: load_tensors (any tensors), with and without the refusal of non-finite
// values, then nn::load into a Linear(2, 3), which goes on to match names, shapes and
// dtypes against the module and copy the values.
inline void safetensors_one_input(const uint8_t* data, std::size_t size) {
  const MemoryFile file(data, size);
  try {
    const nn::Checkpoint checkpoint = nn::load_tensors(file.path());
    for (const auto& [name, tensor] : checkpoint.tensors)
      if (tensor.dtype() == DType::Float32)
        for (float v : tensor.to_vector<float>()) MG_FUZZ_ASSERT(std::isfinite(v));
  } catch (const mg::Error&) {
  }
  try {
    nn::LoadOptions options;
    options.allow_non_finite = true;
    const nn::Checkpoint checkpoint = nn::load_tensors(file.path(), options);
    for (const auto& [name, tensor] : checkpoint.tensors) {
      MG_FUZZ_ASSERT(tensor.defined() && tensor.device().is_cpu() && tensor.is_contiguous());
      MG_FUZZ_ASSERT(!name.empty());
      // Read every byte, so a tensor that claims more than it holds is an ASan report.
      const auto* bytes = static_cast<const unsigned char*>(tensor.data_ptr());
      unsigned sum = 0;
      for (std::size_t i = 0; i < tensor.nbytes(); ++i) sum += bytes[i];
      (void)sum;
    }
  } catch (const mg::Error&) {
  }
  try {
    nn::Linear model(2, 3);
    nn::load(model, file.path());
  } catch (const mg::Error&) {
  }
}

}  // namespace mg::fuzz
