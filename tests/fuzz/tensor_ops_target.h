// What one fuzz input does to the tensor API (tests/fuzz/tensor_ops_fuzzer.cpp, and the
// Catch2 test that replays the seeds and past crashes, tests/core/tensor_ops_fuzz_replay_test.cpp).
//
// The input is a little program: a sequence of operations on a pool of up to kPool
// tensors, each taking its operands, shapes, starts, lengths, dims, dtypes and scalar
// values from the next bytes. The contract under test is the library's promise to any
// caller: every call either returns a well-formed result or throws mg::Error. Any other
// exception escapes and aborts; an out-of-bounds read or write, an undefined behaviour
// (signed overflow, a float-to-int conversion out of range) or a leak is an ASan/UBSan
// report; a SIGFPE is a crash. Broken invariants of a result abort (MG_FUZZ_ASSERT).
//
// The encoding (make_tensor_ops_corpus.py writes seeds in it):
//   op       one byte, modulo kNumOps (the Op enum below)
//   pick     one byte, modulo the pool size: which tensor an op takes
//   number   an int64: a byte b < 0x80 is the small value (b & 15) - 2, in [-2, 13];
//            0x80 <= b < 0xc0 picks kEdges[b & 15] (INT64_MAX, INT64_MIN, ...);
//            b >= 0xc0 is followed by 8 bytes, the value little-endian
//   scalar   a double: b < 0x40 is the whole number (b % 21) - 10; b < 0x80 is
//            (b - 0x60) / 8; b < 0xc0 picks kSpecials[b & 15] (NaN, inf, 1e300, ...);
//            b >= 0xc0 is followed by the 8 bytes of a double
//   shape    a byte, modulo 6, for the number of dims, then that many numbers
//   flag     a byte's lowest bit
// Bytes past the end read as 0, so every input is a complete program.
//
// The harness keeps the work small without hiding bad input from the library: shapes
// with a negative size or an element count past int64 are passed on (the library must
// refuse them), but it never asks for a valid tensor of more than kMaxElements
// elements (that would be a legitimate allocation of gigabytes), and it runs ops that
// allocate or visit in proportion to their operands' sizes only on operands whose sizes
// multiply (0 counted as 1) to at most kMaxElements. Views of any size
// (expand to INT64_MAX elements) are made and kept: their arithmetic is the point.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include <minigrad/autograd/functions.h>
#include <minigrad/autograd/grad_mode.h>
#include <minigrad/autograd/version_counter.h>
#include <minigrad/core/error.h>
#include <minigrad/core/ops.h>
#include <minigrad/core/tensor.h>

namespace mg::fuzz {

#ifndef MG_FUZZ_ASSERT
#define MG_FUZZ_ASSERT(cond)                                                    \
  do {                                                                          \
    if (!(cond)) {                                                              \
      std::fprintf(stderr, "fuzz invariant failed: %s (%s:%d)\n", #cond, __FILE__, __LINE__); \
      std::abort();                                                             \
    }                                                                           \
  } while (0)
#endif

namespace tensor_ops {

constexpr size_t kPool = 8;
constexpr int64_t kMaxElements = 4096;
constexpr int64_t kMaxOps = 512;

enum Op : uint8_t {
  kCreate,       // kind, dtype, shape (+ value)
  kNarrow,       // pick, dim, start, length
  kExpand,       // pick, shape
  kView,         // pick, flag (view or reshape), shape
  kTranspose,    // pick, dim0, dim1
  kChunk,        // pick, flag (chunk or split), count or sizes, dim, which piece
  kCat,          // pick, pick, dim
  kCopyOut,      // pick, kind: contiguous, clone, detach, to(cpu)
  kUnary,        // pick, kind: neg, exp, log, relu
  kBinary,       // pick, pick, kind: + - * /
  kScalar,       // pick, kind, scalar
  kInPlace,      // pick, kind, flag (no grad), operands
  kReduce,       // pick, kind: sum, sum(dims), mean, mean(dims), argmax; dims, flag
  kMatmul,       // pick, pick, kind: matmul, linear, linear_relu
  kLoss,         // pick, kind: log_softmax(dim) or cross_entropy(targets, options)
  kRequireGrad,  // pick
  kBackward,     // pick, flag (retain_graph)
  kRead,         // pick: to_vector, str
  kPreserve,     // pick: an in-place write under UnsafePreserveVersionCounter
  kAsStrided,    // pick, shape, strides, offset
  kNumOps
};

constexpr const char* kOpNames[kNumOps] = {
    "create", "narrow", "expand", "view", "transpose", "chunk", "cat", "copy_out", "unary",
    "binary", "scalar", "in_place", "reduce", "matmul", "loss", "require_grad", "backward",
    "read", "preserve", "as_strided"};

constexpr int64_t kEdges[16] = {
    std::numeric_limits<int64_t>::max(),     std::numeric_limits<int64_t>::min(),
    std::numeric_limits<int64_t>::max() - 1, std::numeric_limits<int64_t>::min() + 1,
    std::numeric_limits<int64_t>::max() - 254, std::numeric_limits<int64_t>::max() - 998,
    int64_t{1} << 31, int64_t{1} << 32, int64_t{1} << 62, -(int64_t{1} << 62),
    1000, -1000, 4096, 255, 256, -100};

inline double special(int i) {
  const double specials[16] = {std::numeric_limits<double>::quiet_NaN(),
                               std::numeric_limits<double>::infinity(),
                               -std::numeric_limits<double>::infinity(),
                               -0.0,
                               1e300,
                               -1e300,
                               9223372036854775808.0,
                               -9223372036854775808.0,
                               9.3e18,
                               0.5,
                               1e-30,
                               -1e19,
                               3.4e38,
                               1.5,
                               1e19,
                               9007199254740993.0};
  return specials[i & 15];
}

class Reader {
 public:
  Reader(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  bool done() const { return pos_ >= size_; }
  uint8_t byte() { return pos_ < size_ ? data_[pos_++] : 0; }
  bool flag() { return (byte() & 1) != 0; }
  int64_t number() {
    const uint8_t b = byte();
    if (b < 0x80) return static_cast<int64_t>(b & 15) - 2;
    if (b < 0xc0) return kEdges[b & 15];
    uint64_t v = 0;
    for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(byte()) << (8 * i);
    return static_cast<int64_t>(v);
  }
  double scalar() {
    const uint8_t b = byte();
    if (b < 0x40) return static_cast<double>(b % 21) - 10.0;
    if (b < 0x80) return (static_cast<double>(b) - 96.0) / 8.0;
    if (b < 0xc0) return special(b & 15);
    uint64_t bits = 0;
    for (int i = 0; i < 8; ++i) bits |= static_cast<uint64_t>(byte()) << (8 * i);
    double v;
    std::memcpy(&v, &bits, sizeof v);
    return v;
  }
  std::vector<int64_t> sizes() {
    const int n = byte() % 6;
    std::vector<int64_t> out;
    for (int i = 0; i < n; ++i) out.push_back(number());
    return out;
  }
  Shape shape() { return Shape(sizes()); }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
};

// The element count of `sizes` when every size is >= 0 and the product fits, else -1
// (the library must refuse such a shape; the harness never checks a value it computed
// itself with overflow).
inline int64_t safe_numel(const std::vector<int64_t>& sizes) {
  int64_t n = 1;
  for (int64_t s : sizes) {
    if (s < 0 || __builtin_mul_overflow(n, s, &n)) return -1;
  }
  return n;
}

// What an op on t may allocate or visit: the product of its sizes with each 0 counted
// as 1, not its element count. A sum over dim 0 of an empty [0, 2^40] tensor makes a
// [1, 2^40] output (4 TiB: a legitimate allocation failure, which ASan reports as a crash
// rather than returning null), and matmul, cat and broadcasting grow the same way.
inline bool small(const Tensor& t) {
  if (!t.defined()) return false;
  int64_t extent = 1;
  for (int64_t s : t.shape())
    if (__builtin_mul_overflow(extent, std::max<int64_t>(s, 1), &extent) || extent > kMaxElements)
      return false;
  return true;
}

// What every tensor a call returns must satisfy.
inline void check_result(const Tensor& t) {
  MG_FUZZ_ASSERT(t.defined());
  MG_FUZZ_ASSERT(static_cast<int64_t>(t.strides().size()) == t.dim());
  for (int64_t s : t.shape()) MG_FUZZ_ASSERT(s >= 0);
  MG_FUZZ_ASSERT(t.numel() >= 0);
}

// Reads every element of a small tensor: ASan sees any view that reaches past its storage.
inline void touch(const Tensor& t) {
  if (!small(t)) return;
  if (t.dtype() == DType::Float32) {
    const std::vector<float> v = t.to_vector<float>();
    MG_FUZZ_ASSERT(static_cast<int64_t>(v.size()) == t.numel());
  } else {
    const std::vector<int64_t> v = t.to_vector<int64_t>();
    MG_FUZZ_ASSERT(static_cast<int64_t>(v.size()) == t.numel());
  }
}

class Program {
 public:
  Program(const uint8_t* data, size_t size) : in_(data, size) {}

  // With MINIGRAD_FUZZ_TRACE set, each op and each refusal is printed to stderr: what a
  // seed or a saved crash does, step by step.
  void run() {
    const bool trace = std::getenv("MINIGRAD_FUZZ_TRACE") != nullptr;
    for (int64_t step = 0; step < kMaxOps && !in_.done(); ++step) {
      const auto op = static_cast<Op>(in_.byte() % kNumOps);
      if (trace) std::fprintf(stderr, "op %lld: %s\n", static_cast<long long>(step), kOpNames[op]);
      try {
        run_op(op);
      } catch (const mg::Error& e) {
        // A refused call is a correct answer to bad input.
        if (trace) std::fprintf(stderr, "  mg::Error: %s\n", e.what());
      }
    }
  }

 private:
  void keep(const Tensor& t) {
    check_result(t);
    touch(t);
    note_graph(t);
    if (pool_.size() < kPool) {
      pool_.push_back(t);
    } else {
      pool_[next_slot_++ % kPool] = t;
    }
  }

  bool has_any() const { return !pool_.empty(); }
  Tensor& pick() {
    Tensor& t = pool_[in_.byte() % pool_.size()];
    note_graph(t);
    return t;
  }

  // backward allocates a gradient for every tensor in the graph behind the loss, not
  // only for the loss: narrow(expand(leaf, [12, 2^50, 3])).sum().backward() asks for a
  // gradient of the expanded shape (an allocation of petabytes, which ASan reports as a
  // crash rather than returning null). Every tensor an op takes or returns passes here;
  // once one in a graph is not small, this program runs no more backward passes.
  void note_graph(const Tensor& t) {
    if (t.requires_grad() && !small(t)) big_graph_ = true;
  }

  void run_op(Op op) {
    if (op == kCreate) return create();
    if (!has_any()) return;
    switch (op) {
      case kNarrow: {
        const Tensor& t = pick();
        const int64_t dim = in_.number(), start = in_.number(), length = in_.number();
        const Tensor n = t.narrow(dim, start, length);
        // The view lies inside t: its length is what was asked, at a dim t has.
        MG_FUZZ_ASSERT(n.size(dim) == length && length <= t.size(dim));
        keep(n);
        break;
      }
      case kExpand: {
        const Tensor& t = pick();
        keep(t.expand(in_.shape()));
        break;
      }
      case kView: {
        const Tensor& t = pick();
        const bool reshape = in_.flag();
        const Shape shape = in_.shape();
        if (reshape && !small(t)) return;  // reshape may copy
        const Tensor v = reshape ? t.reshape(shape) : t.view(shape);
        MG_FUZZ_ASSERT(v.numel() == t.numel());
        keep(v);
        break;
      }
      case kTranspose: {
        const Tensor& t = pick();
        keep(t.transpose(in_.number(), in_.number()));
        break;
      }
      case kChunk: {
        const Tensor& t = pick();
        const bool split_sizes = in_.flag();
        std::vector<Tensor> pieces;
        if (split_sizes) {
          const std::vector<int64_t> sizes = in_.sizes();
          pieces = split(t, sizes, in_.number());
        } else {
          const int64_t chunks = in_.number();
          const int64_t dim = in_.number();
          // chunk makes min(chunks, size) pieces: keep the list small.
          if (chunks > 64 && (t.dim() == 0 || t.size(dim) > 64)) return;
          pieces = chunk(t, chunks, dim);
        }
        if (pieces.empty()) return;
        keep(pieces[in_.byte() % pieces.size()]);
        break;
      }
      case kCat: {
        const Tensor a = pick();
        const Tensor b = pick();
        if (!small(a) || !small(b)) return;
        keep(cat({a, b}, in_.number()));
        break;
      }
      case kCopyOut: {
        const Tensor& t = pick();
        const int kind = in_.byte() % 4;
        if (kind == 2) return keep(t.detach());
        if (!small(t)) return;
        if (kind == 0) return keep(t.contiguous());
        if (kind == 1) return keep(ops::clone(t));
        keep(t.to(Device::cpu()));
        break;
      }
      case kUnary: {
        const Tensor& t = pick();
        const int kind = in_.byte() % 4;
        if (!small(t)) return;
        const Tensor out = kind == 0 ? neg(t) : kind == 1 ? exp(t) : kind == 2 ? log(t) : relu(t);
        if (kind == 3 && out.dtype() == DType::Float32) {
          // relu: never negative, NaN exactly where the input is NaN.
          const std::vector<float> x = t.to_vector<float>(), y = out.to_vector<float>();
          for (size_t i = 0; i < y.size(); ++i) {
            MG_FUZZ_ASSERT(std::isnan(y[i]) == std::isnan(x[i]));
            MG_FUZZ_ASSERT(std::isnan(y[i]) || y[i] >= 0.0f);
          }
        }
        keep(out);
        break;
      }
      case kBinary: {
        const Tensor a = pick();
        const Tensor b = pick();
        const int kind = in_.byte() % 4;
        if (!small(a) || !small(b)) return;
        const Shape shape = broadcast_shapes(a.shape(), b.shape(), "fuzz");
        if (shape.numel() > 4 * kMaxElements) return;
        keep(kind == 0 ? a + b : kind == 1 ? a - b : kind == 2 ? a * b : a / b);
        break;
      }
      case kScalar: {
        const Tensor& t = pick();
        const int kind = in_.byte() % 5;
        const double s = in_.scalar();
        if (!small(t)) return;
        if (kind == 0) return keep(t + s);
        if (kind == 1) return keep(t - s);
        if (kind == 2) return keep(t * s);
        if (kind == 3) return keep(t / s);
        keep(ops::binary_scalar(BinaryOp::Div, t, s));
        break;
      }
      case kInPlace: return in_place();
      case kReduce: {
        const Tensor& t = pick();
        const int kind = in_.byte() % 5;
        if (!small(t)) return;
        std::vector<int64_t> dims = in_.sizes();
        const bool keepdim = in_.flag();
        Tensor out;
        if (kind == 0) out = t.sum();
        if (kind == 1) out = t.sum(dims, keepdim);
        if (kind == 2) out = t.mean();
        if (kind == 3) out = t.mean(dims, keepdim);
        if (kind == 4) {
          const int64_t dim = in_.number();
          out = t.argmax(dim);
          const int64_t size = t.dim() == 0 ? 1 : t.size(dim);
          for (int64_t i : out.to_vector<int64_t>()) MG_FUZZ_ASSERT(i >= 0 && i < size);
        }
        keep(out);
        break;
      }
      case kMatmul: {
        const Tensor a = pick();
        const Tensor b = pick();
        const int kind = in_.byte() % 3;
        if (!small(a) || !small(b)) return;
        // Each operand has at most kMaxElements, so these products cannot overflow.
        if (a.dim() == 2 && b.dim() == 2 &&
            a.size(0) * std::max(b.size(0), b.size(1)) > 4 * kMaxElements)
          return;
        if (kind == 0) return keep(matmul(a, b));
        const Tensor bias = b.dim() >= 1 ? ops::sum(b, {b.dim() - 1}, false) : Tensor();
        if (kind == 1) return keep(linear(a, b, bias));
        keep(linear_relu(a, b, bias));
        break;
      }
      case kLoss: {
        const Tensor& x = pick();
        const int kind = in_.byte() % 2;
        if (!small(x)) return;
        if (kind == 0) return keep(log_softmax(x, in_.number()));
        const Tensor& targets = pick();
        CrossEntropyOptions options;
        options.ignore_index(in_.number()).label_smoothing(in_.scalar());
        options.reduction(static_cast<Reduction>(in_.byte() % 3));
        if (!small(targets)) return;
        keep(cross_entropy(x, targets, options));
        break;
      }
      case kRequireGrad: {
        Tensor& t = pick();
        t.set_requires_grad(true);
        break;
      }
      case kBackward: {
        const Tensor& t = pick();
        const bool retain = in_.flag();
        if (!small(t) || !t.requires_grad() || big_graph_) return;
        const Tensor loss = t.sum();
        loss.backward(Tensor(), retain);
        for (const Tensor& leaf : pool_) {
          if (leaf.defined() && leaf.is_leaf() && leaf.grad().defined())
            MG_FUZZ_ASSERT(leaf.grad().shape() == leaf.shape());
        }
        break;
      }
      case kRead: {
        const Tensor& t = pick();
        if (!small(t)) return;
        touch(t);
        (void)t.str();
        break;
      }
      case kPreserve: {
        Tensor& t = pick();
        if (!small(t)) return;
        const uint64_t before = t.version();
        {
          autograd::UnsafePreserveVersionCounter keep_version(t);
          NoGradGuard no_grad;
          t.fill_(in_.scalar());
        }
        MG_FUZZ_ASSERT(t.version() == before);
        break;
      }
      case kAsStrided: {
        const Tensor& t = pick();
        const Shape shape = in_.shape();
        std::vector<int64_t> strides;
        for (int64_t d = 0; d < shape.dim(); ++d) strides.push_back(in_.number());
        const int64_t offset = in_.number();
        keep(ops::as_strided(t, shape, strides, offset));
        break;
      }
      default: break;
    }
  }

  void create() {
    const int kind = in_.byte() % 8;
    const DType dtype = in_.flag() ? DType::Int64 : DType::Float32;
    const std::vector<int64_t> sizes = in_.sizes();
    const Shape shape(sizes);
    const int64_t n = safe_numel(sizes);
    // Valid but large: a real allocation, not a bug. Invalid: passed on, must be refused.
    if (n > kMaxElements) return;
    // (An empty tensor with huge sizes is cheap to make and is kept; small() keeps ops
    // that would allocate in proportion to those sizes away from it.)
    switch (kind) {
      case 0: return keep(zeros(shape, dtype));
      case 1: return keep(ones(shape, dtype));
      case 2: return keep(full(shape, in_.scalar(), dtype));
      case 3: {
        const double start = in_.scalar(), end = in_.scalar(), step = in_.scalar();
        // Only ranges that are short (or invalid) reach the library.
        if (std::isfinite(start) && std::isfinite(end) && std::isfinite(step) && step != 0.0 &&
            std::abs((end - start) / step) > static_cast<double>(kMaxElements) &&
            std::abs((end - start) / step) < 9e18)
          return;
        return keep(arange(start, end, step, dtype));
      }
      case 4: return keep(dtype == DType::Float32 ? rand(shape) : randint(in_.number(), in_.number(), shape));
      case 5: return keep(randn(shape));
      case 6: {
        if (n < 0) {
          const std::vector<float> one{1.0f};
          return keep(from_vector(one, shape));
        }
        std::vector<float> values(static_cast<size_t>(n));
        for (float& v : values) v = static_cast<float>(in_.scalar());
        return keep(from_vector(values, shape));
      }
      default: {
        if (n < 0) return keep(empty(shape, dtype));
        std::vector<int64_t> values(static_cast<size_t>(n));
        for (int64_t& v : values) v = in_.number();
        return keep(from_vector(values, shape));
      }
    }
  }

  void in_place() {
    Tensor& t = pick();
    const int kind = in_.byte() % 8;
    const bool no_grad = in_.flag();
    AutoGradMode mode(!no_grad && GradMode::is_enabled());
    if (!small(t)) return;  // a broadcast view of 2^62 elements is 2^62 writes
    const uint64_t before = t.version();
    switch (kind) {
      case 0: t.fill_(in_.scalar()); break;
      case 1: t.zero_(); break;
      case 2: {
        const Tensor& other = pick();
        if (!small(other)) return;
        t.add_(other, in_.scalar());
        break;
      }
      case 3: t.mul_(in_.scalar()); break;
      case 4: {
        const Tensor& other = pick();
        if (!small(other)) return;
        t.mul_(other);
        break;
      }
      case 5: {
        const Tensor& other = pick();
        if (!small(other)) return;
        t.copy_(other);
        break;
      }
      case 6: t.uniform_(in_.scalar(), in_.scalar()); break;
      default: t.normal_(in_.scalar(), in_.scalar()); break;
    }
    // Exactly one bump per in-place op that returned.
    MG_FUZZ_ASSERT(t.version() == before + 1);
    touch(t);
  }

  Reader in_;
  std::vector<Tensor> pool_;
  size_t next_slot_ = 0;
  bool big_graph_ = false;  // see note_graph
};

}  // namespace tensor_ops

inline void tensor_ops_one_input(const uint8_t* data, std::size_t size) {
  tensor_ops::Program(data, size).run();
}

}  // namespace mg::fuzz
