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

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <minigrad/core/error.h>
#include <minigrad/core/ops.h>
#include <minigrad/data/idx.h>
#include <minigrad/data/token_file.h>
#include <minigrad/nn/layers.h>
#include <minigrad/nn/serialize.h>
#include <minigrad/parallel/c10d/store/store_protocol.h>

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

// data/token_file.h: parse_token_file on the bytes, read_token_file on them as a file. A
// token file that reads has a sorted vocabulary and only tokens inside it.
inline void check_token_file(const data::TokenFile& file) {
  const std::vector<uint8_t>& vocab = file.tokenizer.vocab();
  MG_FUZZ_ASSERT(!vocab.empty() && vocab.size() <= 256);
  for (std::size_t i = 1; i < vocab.size(); ++i) MG_FUZZ_ASSERT(vocab[i] > vocab[i - 1]);
  for (const uint8_t t : file.tokens) MG_FUZZ_ASSERT(t < vocab.size());
}

inline void token_file_one_input(const uint8_t* data, std::size_t size) {
  try {
    const data::TokenFile parsed = data::parse_token_file(data, size, "fuzz input");
    check_token_file(parsed);
    MG_FUZZ_ASSERT(data::kTokenFileHeaderBytes + parsed.tokenizer.vocab().size() +
                       parsed.tokens.size() == size);
  } catch (const mg::Error&) {
  }
  const MemoryFile file(data, size);
  try {
    check_token_file(data::read_token_file(file.path()));
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
      if (tensor.dtype() == DType::Float32 || is_reduced_float(tensor.dtype()))
        for (float v : mg::ops::to_dtype(tensor, DType::Float32).to_vector<float>()) MG_FUZZ_ASSERT(std::isfinite(v));
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

// parallel/c10d/store/store_protocol.h: the TCPStore's message parser, on what a client
// may send. The first byte seeds how the rest, a byte stream, is cut into reads (1 to 256
// bytes each, as recv might return them); the limits are small so that inputs reach them.
//   - parse_message over the whole stream, message after message: each complete one has
//     the one encoding (re-encoding it gives back its bytes), within the limits; the end
//     is a partial message or one verdict of malformed.
//   - MessageBuffer, fed the stream in those reads (as the server is), gives the same
//     messages and the same verdict, and never holds more than one message plus a read.
inline void store_one_input(const uint8_t* data, std::size_t size) {
  namespace store = mg::parallel::store;
  if (size == 0) return;
  store::Limits limits;
  limits.max_message_bytes = 4096;
  limits.max_args = 64;
  const char* bytes = reinterpret_cast<const char*>(data) + 1;
  const std::size_t n = size - 1;

  std::vector<store::Message> messages;
  std::string verdict;  // the malformed message's error, if the stream has one
  for (std::size_t pos = 0;;) {
    store::Parsed p = store::parse_message(bytes + pos, n - pos, limits);
    if (p.status == store::ParseStatus::NeedMore) {
      MG_FUZZ_ASSERT(p.size > n - pos);
      MG_FUZZ_ASSERT(p.size <= limits.max_message_bytes);
      break;
    }
    if (p.status == store::ParseStatus::Malformed) {
      MG_FUZZ_ASSERT(!p.error.empty());
      verdict = p.error;
      break;
    }
    MG_FUZZ_ASSERT(p.size >= store::kHeaderBytes && p.size <= n - pos);
    MG_FUZZ_ASSERT(p.size <= limits.max_message_bytes);
    MG_FUZZ_ASSERT(p.message.args.size() <= limits.max_args);
    MG_FUZZ_ASSERT(store::message_size(p.message.args) == p.size);
    MG_FUZZ_ASSERT(store::encode_message(p.message.code, p.message.args) == std::string(bytes + pos, p.size));
    (void)store::check_request(p.message);  // any message gets a verdict, never a crash
    pos += p.size;
    messages.push_back(std::move(p.message));
  }

  store::MessageBuffer buffer(limits);
  constexpr std::size_t kMaxRead = 256;
  std::size_t fed = 0, taken = 0;
  uint32_t cut = data[0];
  for (;;) {
    store::Message m;
    std::string error;
    const store::ParseStatus status = buffer.next(m, error);
    if (status == store::ParseStatus::Complete) {
      MG_FUZZ_ASSERT(taken < messages.size());
      MG_FUZZ_ASSERT(m.code == messages[taken].code && m.args == messages[taken].args);
      ++taken;
      continue;
    }
    if (status == store::ParseStatus::Malformed) {
      MG_FUZZ_ASSERT(taken == messages.size() && error == verdict && !verdict.empty());
      return;
    }
    MG_FUZZ_ASSERT(buffer.buffered() < limits.max_message_bytes + kMaxRead);
    if (fed == n) break;
    cut = cut * 1103515245u + 12345u;
    const std::size_t length = std::min<std::size_t>(1 + (cut >> 16) % kMaxRead, n - fed);
    buffer.append(bytes + fed, length);
    fed += length;
  }
  MG_FUZZ_ASSERT(taken == messages.size() && verdict.empty());
}

}  // namespace mg::fuzz
