// The host-side logic of the CUDA backend, checked on every machine (no GPU, no CUDA
// toolkit needed): the GEMM plan that maps row-major strided matmuls onto cuBLAS's
// column-major call (cuda/gemm_plan.h), the strided indexer every elementwise, copy and
// reduction kernel uses (cuda/kernels/indexing.h), and the Philox generator that CPU and
// CUDA random numbers share (core/philox.h). A GPU run (tests/cuda) then only has to
// confirm that the kernels and cuBLAS do what these plans say.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "catch_compat.h"

#include <minigrad/core/generator.h>
#include <minigrad/core/ops.h>
#include <minigrad/core/philox.h>
#include <minigrad/cuda/gemm_plan.h>
#include <minigrad/cuda/kernels/indexing.h>

using namespace mg;

namespace {

// ---- GEMM plan ----

// A row-major operand [rows, cols] seen through strides, over a buffer of small integers
// (so every product and sum below is exact and the comparison can be exact).
struct Operand {
  std::vector<float> buffer;
  int64_t offset = 0;
  int64_t rows = 0, cols = 0, rs = 0, cs = 0;
  float at(int64_t i, int64_t j) const {
    return buffer.at(static_cast<size_t>(offset + i * rs + j * cs));
  }
};

std::vector<float> small_integers(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<float> v(n);
  for (float& x : v) x = static_cast<float>(static_cast<int>(rng() % 7) - 3);
  return v;
}

// Every layout a matmul operand of shape [rows, cols] can arrive in.
std::vector<Operand> layouts(int64_t rows, int64_t cols, uint32_t seed) {
  std::vector<Operand> out;
  const auto make = [&](int64_t extent, int64_t offset, int64_t rs, int64_t cs) {
    Operand o;
    o.buffer = small_integers(static_cast<size_t>(extent), seed++);
    o.offset = offset;
    o.rows = rows;
    o.cols = cols;
    o.rs = rs;
    o.cs = cs;
    out.push_back(o);
  };
  make(rows * cols, 0, cols, 1);                              // contiguous
  make(rows * cols, 0, 1, rows);                              // x.t() of a [cols, rows] tensor
  make(rows * (cols + 5), 2, cols + 5, 1);                    // a column block: ld > cols
  make((rows + 4) * cols, 3, 1, rows + 4);                    // a row block of a transposed view
  make(cols, 0, 0, 1);                                        // a row expanded (stride 0)
  make(rows, 0, 1, 0);                                        // a column expanded (stride 0)
  make(rows * cols * 2, 1, cols * 2, 2);                      // every other column: packed
  make(rows * cols * 3 + 1000, 0, 999 * (rows == 1), 1);      // size-1 rows: stride ignored
  make(rows * cols * 3 + 1000, 0, 1, 777 * (cols == 1));      // size-1 cols: stride ignored
  // Drop the odd-stride variants where the size is not 1 (they would overlap rows).
  if (rows != 1) out.erase(out.end() - 2);
  if (cols != 1) out.pop_back();
  return out;
}

// The contiguous copy the backend makes of an operand the plan marks for packing.
Operand packed(const Operand& o) {
  Operand p;
  p.rows = o.rows;
  p.cols = o.cols;
  p.rs = o.cols;
  p.cs = 1;
  for (int64_t i = 0; i < o.rows; ++i)
    for (int64_t j = 0; j < o.cols; ++j) p.buffer.push_back(o.at(i, j));
  return p;
}

// cublasSgemm's definition, with its argument checks: C (m x n, column-major, ldc) =
// op(A) (m x k) op(B) (k x n); reads go through the operands' buffers, bounds-checked.
std::vector<float> column_major_gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                                     const Operand& a, int64_t lda, const Operand& b,
                                     int64_t ldb, int64_t ldc) {
  REQUIRE(lda >= std::max<int64_t>(1, trans_a ? k : m));
  REQUIRE(ldb >= std::max<int64_t>(1, trans_b ? n : k));
  REQUIRE(ldc >= std::max<int64_t>(1, m));
  const auto read = [](const Operand& o, int64_t index) {
    return o.buffer.at(static_cast<size_t>(o.offset + index));
  };
  std::vector<float> c(static_cast<size_t>(ldc * n), 0.0f);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      float total = 0.0f;
      for (int64_t l = 0; l < k; ++l) {
        const float x = trans_a ? read(a, l + i * lda) : read(a, i + l * lda);
        const float y = trans_b ? read(b, j + l * ldb) : read(b, l + j * ldb);
        total += x * y;
      }
      c[static_cast<size_t>(i + j * ldc)] = total;
    }
  }
  return c;
}

// out = a @ b through the plan and the column-major GEMM, as cuda/blas.cpp calls cuBLAS.
std::vector<float> matmul_through_plan(const Operand& a, const Operand& b) {
  const int64_t m = a.rows, k = a.cols, n = b.cols;
  const cuda::GemmPlan plan = cuda::gemm_plan(m, k, n, a.rs, a.cs, b.rs, b.cs);
  const Operand a_used = plan.rhs.pack ? packed(a) : a;
  const Operand b_used = plan.lhs.pack ? packed(b) : b;
  REQUIRE((plan.gemm_m == n && plan.gemm_n == m && plan.gemm_k == k));
  const std::vector<float> c =
      column_major_gemm(plan.lhs.transpose, plan.rhs.transpose, plan.gemm_m, plan.gemm_n,
                        plan.gemm_k, b_used, plan.lhs.ld, a_used, plan.rhs.ld, plan.ldc);
  // C is out^T column-major with ldc = n: out row-major.
  REQUIRE(plan.ldc == n);
  return std::vector<float>(c.begin(), c.begin() + m * n);
}

std::vector<float> naive_matmul(const Operand& a, const Operand& b) {
  std::vector<float> out;
  for (int64_t i = 0; i < a.rows; ++i) {
    for (int64_t j = 0; j < b.cols; ++j) {
      float total = 0.0f;
      for (int64_t l = 0; l < a.cols; ++l) total += a.at(i, l) * b.at(l, j);
      out.push_back(total);
    }
  }
  return out;
}

// ---- strided indexer ----

// The element offsets of `linear` in each operand, by unravelling over the full shape.
template <int N>
std::array<int64_t, N> naive_offsets(const std::vector<int64_t>& sizes,
                                     const std::array<std::vector<int64_t>, N>& strides,
                                     int64_t linear) {
  std::array<int64_t, N> out{};
  for (int64_t d = static_cast<int64_t>(sizes.size()) - 1; d >= 0; --d) {
    const int64_t coord = linear % sizes[static_cast<size_t>(d)];
    linear /= sizes[static_cast<size_t>(d)];
    for (int t = 0; t < N; ++t) out[static_cast<size_t>(t)] += coord * strides[t][static_cast<size_t>(d)];
  }
  return out;
}

template <int N>
cuda::kernels::StridedIndexer<N> indexer(const std::vector<int64_t>& sizes,
                                         const std::array<std::vector<int64_t>, N>& strides,
                                         bool expect_fits = true) {
  const int64_t* pointers[N];
  for (int t = 0; t < N; ++t) pointers[t] = strides[t].data();
  cuda::kernels::StridedIndexer<N> layout;
  REQUIRE(cuda::kernels::make_indexer<N>(sizes.data(), static_cast<int>(sizes.size()), pointers,
                                         layout) == expect_fits);
  return layout;
}

// Every element's offsets, through the 64-bit and (when allowed) the 32-bit index.
template <int N>
void check_indexer(const std::vector<int64_t>& sizes,
                   const std::array<std::vector<int64_t>, N>& strides) {
  const auto layout = indexer<N>(sizes, strides);
  int64_t numel = 1;
  for (int64_t s : sizes) numel *= s;
  const bool fits = layout.fits_int32(numel);
  for (int64_t i = 0; i < numel; ++i) {
    const auto expected = naive_offsets<N>(sizes, strides, i);
    int64_t wide[N];
    layout.offsets(i, wide);
    for (int t = 0; t < N; ++t) REQUIRE(wide[t] == expected[static_cast<size_t>(t)]);
    if (fits) {
      uint32_t narrow[N];
      layout.offsets(static_cast<uint32_t>(i), narrow);
      for (int t = 0; t < N; ++t) REQUIRE(narrow[t] == expected[static_cast<size_t>(t)]);
    }
    if (layout.all_contiguous())
      for (int t = 0; t < N; ++t) REQUIRE(expected[static_cast<size_t>(t)] == i);
  }
}

// ---- Philox ----

// Philox4x32-10 as specified (Salmon et al. 2011), with a four-word counter.
std::array<uint32_t, 4> reference_philox(std::array<uint32_t, 4> c, std::array<uint32_t, 2> k) {
  for (int round = 0; round < 10; ++round) {
    const uint64_t p0 = uint64_t{0xD2511F53u} * c[0], p1 = uint64_t{0xCD9E8D57u} * c[2];
    c = {static_cast<uint32_t>(p1 >> 32) ^ c[1] ^ k[0], static_cast<uint32_t>(p1),
         static_cast<uint32_t>(p0 >> 32) ^ c[3] ^ k[1], static_cast<uint32_t>(p0)};
    k = {k[0] + 0x9E3779B9u, k[1] + 0xBB67AE85u};
  }
  return c;
}

std::array<uint32_t, 4> words(const philox::Uint4& r) { return {r.x, r.y, r.z, r.w}; }

}  // namespace

TEST_CASE("cuda gemm plan: every operand layout gives a @ b under cuBLAS's column-major rules") {
  const std::vector<std::array<int64_t, 3>> shapes = {{1, 1, 1}, {1, 5, 1}, {7, 1, 3}, {4, 6, 5},
                                                      {1, 4, 7}, {6, 3, 1}, {5, 2, 9}};
  uint32_t seed = 1;
  for (const auto& [m, k, n] : shapes) {
    for (const Operand& a : layouts(m, k, seed += 100)) {
      for (const Operand& b : layouts(k, n, seed += 100)) {
        CAPTURE(m, k, n, a.rs, a.cs, b.rs, b.cs);
        REQUIRE(matmul_through_plan(a, b) == naive_matmul(a, b));
      }
    }
  }
}

TEST_CASE("cuda gemm plan: transposed views go as transposes, not copies") {
  // x @ w.t(), the Linear layer's forward: w [out, in] row-major read as op T.
  const cuda::GemmPlan linear = cuda::gemm_plan(32, 784, 512, 784, 1, 1, 784);
  CHECK_FALSE(linear.lhs.pack);
  CHECK(linear.lhs.transpose);
  CHECK(linear.lhs.ld == 784);
  CHECK_FALSE(linear.rhs.transpose);
  CHECK(linear.rhs.ld == 784);
  // grad.t() @ x, the weight gradient: the left operand is a transposed view.
  const cuda::GemmPlan weight_grad = cuda::gemm_plan(512, 32, 784, 1, 512, 784, 1);
  CHECK(weight_grad.rhs.transpose);
  CHECK(weight_grad.rhs.ld == 512);
  CHECK_FALSE(weight_grad.lhs.transpose);
  CHECK(weight_grad.lhs.ld == 784);
  // Neither layout (every other column, a broadcast row): packed, ld = cols.
  const cuda::GemmOperandLayout every_other = cuda::gemm_operand_layout(5, 12, 40, 2);
  CHECK(every_other.pack);
  CHECK(every_other.ld == 12);
  const cuda::GemmOperandLayout broadcast_row = cuda::gemm_operand_layout(5, 12, 0, 1);
  CHECK(broadcast_row.pack);
  // One row whose row stride is smaller than its length (meaningless for one row), and
  // one column whose column stride is: read in place, ld raised to cuBLAS's minimum.
  const cuda::GemmOperandLayout one_row = cuda::gemm_operand_layout(1, 12, 5, 1);
  CHECK_FALSE(one_row.pack);
  CHECK_FALSE(one_row.transpose);
  CHECK(one_row.ld == 12);
  const cuda::GemmOperandLayout one_column = cuda::gemm_operand_layout(12, 1, 1, 3);
  CHECK_FALSE(one_column.pack);
  CHECK(one_column.transpose);
  CHECK(one_column.ld == 12);
}

TEST_CASE("cuda gemm alignment: what cuBLASLt is told about views that start at an offset") {
  constexpr int64_t f = sizeof(float);
  // A fresh allocation (256-byte aligned) with a leading dimension of 64 floats.
  CHECK(cuda::gemm_alignment_bytes(0x7f0000000000u, 64, f) == 256);
  // Larger alignments are capped at 256, what cuBLASLt assumes by default.
  CHECK(cuda::gemm_alignment_bytes(0x7f0000001000u, 1024, f) == 256);
  // One float into the buffer (a narrowed view): 4 bytes, whatever the leading dimension.
  CHECK(cuda::gemm_alignment_bytes(0x7f0000000004u, 64, f) == 4);
  // Four floats in: 16 bytes.
  CHECK(cuda::gemm_alignment_bytes(0x7f0000000010u, 64, f) == 16);
  // An aligned start but an odd leading dimension (Linear(5, 2)'s input): later columns
  // start 20 bytes apart, so only 4-byte alignment holds for all of them.
  CHECK(cuda::gemm_alignment_bytes(0x7f0000000000u, 5, f) == 4);
  CHECK(cuda::gemm_alignment_bytes(0x7f0000000000u, 6, f) == 8);
  // A vector (ld 0): the pointer alone.
  CHECK(cuda::gemm_alignment_bytes(0x7f0000000008u, 0, f) == 8);
  CHECK(cuda::gemm_alignment_bytes(0x7f0000000000u, 0, f) == 256);
}

TEST_CASE("cuda kernel indexing: offsets match a naive walk for views, transposes and broadcasts") {
  // Contiguous: collapses to one dim.
  check_indexer<2>({3, 4, 5}, {{{20, 5, 1}, {20, 5, 1}}});
  CHECK(indexer<2>({3, 4, 5}, {{{20, 5, 1}, {20, 5, 1}}}).all_contiguous());
  // A transposed input, a narrowed input, a broadcast (stride 0) input.
  check_indexer<3>({4, 5}, {{{5, 1}, {1, 4}, {0, 1}}});
  check_indexer<3>({3, 7}, {{{7, 1}, {10, 1}, {1, 0}}});
  check_indexer<3>({2, 3, 4}, {{{12, 4, 1}, {0, 0, 1}, {4, 8, 0}}});
  // Size-1 dims with any stride (from narrow/expand), and a fully broadcast scalar.
  check_indexer<2>({1, 6, 1, 2}, {{{99, 2, 7, 1}, {0, 1, 5, 6}}});
  check_indexer<2>({5, 3}, {{{3, 1}, {0, 0}}});
  CHECK(indexer<2>({1, 6, 1, 2}, {{{99, 2, 7, 1}, {500, 2, 3, 1}}}).all_contiguous());
  // A single element (0-dim) and a permuted 4-D view.
  check_indexer<1>({}, {{{}}});
  check_indexer<2>({2, 3, 2, 5}, {{{30, 10, 5, 1}, {1, 2, 30, 6}}});
  CHECK_FALSE(indexer<2>({4, 5}, {{{5, 1}, {1, 4}}}).all_contiguous());
}

TEST_CASE("cuda kernel indexing: past 2^31 elements the index stays 64-bit") {
  // 2^32 elements: a contiguous output and a broadcast row.
  const std::vector<int64_t> sizes = {int64_t{1} << 20, int64_t{1} << 12};
  const auto big = indexer<2>(sizes, {{{int64_t{1} << 12, 1}, {0, 1}}});
  const int64_t numel = int64_t{1} << 32;
  CHECK_FALSE(big.fits_int32(numel));
  for (int64_t i : {int64_t{0}, int64_t{INT32_MAX}, int64_t{INT32_MAX} + 1, numel - 1}) {
    int64_t o[2];
    big.offsets(i, o);
    CHECK(o[0] == i);
    CHECK(o[1] == i % (int64_t{1} << 12));
  }
  // Few elements, but an offset (a stride times a size) past INT32_MAX.
  CHECK_FALSE(indexer<2>({2, 3}, {{{3, 1}, {int64_t{1} << 31, 1}}}).fits_int32(6));
  CHECK(indexer<2>({2, 3}, {{{3, 1}, {INT32_MAX - 2, 1}}}).fits_int32(6));
  // The largest element count the 32-bit path takes, and one more.
  const auto flat = indexer<1>({int64_t{INT32_MAX} + 1}, {{{1}}});
  CHECK(flat.fits_int32(INT32_MAX));
  CHECK_FALSE(flat.fits_int32(int64_t{INT32_MAX} + 1));
}

TEST_CASE("cuda kernel indexing: views with more than 8 uncollapsible dims are refused") {
  std::vector<int64_t> sizes(9, 2), strides(9);
  int64_t stride = 1;
  for (int d = 8; d >= 0; --d, stride *= 3) strides[static_cast<size_t>(d)] = stride;
  indexer<1>(sizes, {{strides}}, /*expect_fits=*/false);
  // The same dims laid out contiguously collapse into one.
  std::vector<int64_t> contiguous(9);
  stride = 1;
  for (int d = 8; d >= 0; --d, stride *= 2) contiguous[static_cast<size_t>(d)] = stride;
  CHECK(indexer<1>(sizes, {{contiguous}}).ndim == 1);
}

TEST_CASE("philox: the known-answer vectors of Philox4x32-10") {
  // Random123's kat_vectors for philox4x32 with 10 rounds.
  CHECK(reference_philox({0, 0, 0, 0}, {0, 0}) ==
        std::array<uint32_t, 4>{0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u});
  CHECK(reference_philox({0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu},
                         {0xffffffffu, 0xffffffffu}) ==
        std::array<uint32_t, 4>{0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu});
  CHECK(reference_philox({0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u},
                         {0xa4093822u, 0x299f31d0u}) ==
        std::array<uint32_t, 4>{0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u});
  // minigrad's generator (host and device share this code) is that function with the
  // 64-bit counter in the first two words and the 64-bit seed as the key.
  CHECK(words(philox::philox4x32(0, 0)) == reference_philox({0, 0, 0, 0}, {0, 0}));
  std::mt19937_64 rng(5);
  for (int i = 0; i < 1000; ++i) {
    const uint64_t seed = rng(), counter = rng();
    REQUIRE(words(philox::philox4x32(seed, counter)) ==
            reference_philox({static_cast<uint32_t>(counter), static_cast<uint32_t>(counter >> 32), 0, 0},
                             {static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)}));
  }
}

TEST_CASE("philox: uniform and normal values come from the documented words") {
  const uint64_t seed = 0x123456789abcdefULL, block = 41;
  for (uint64_t i = 0; i < 64; ++i) {
    const auto r = words(philox::philox4x32(seed, block + i / 4));
    const float u = philox::uniform(seed, block, i);
    CHECK(u == static_cast<float>(r[i % 4] >> 8) / 16777216.0f);
    CHECK((u >= 0.0f && u < 1.0f));
    const float z = philox::normal(seed, block, i);
    CHECK(std::isfinite(z));
  }
  // Even and odd indices share a block: the cosine and sine of one Box-Muller pair.
  const float z0 = philox::normal(seed, block, 10), z1 = philox::normal(seed, block, 11);
  const auto r = words(philox::philox4x32(seed, block + 5));
  const float u1 = (static_cast<float>(r[0] >> 8) + 1.0f) / 16777216.0f;
  CHECK(static_cast<double>(z0) * z0 + static_cast<double>(z1) * z1 ==
        Approx(-2.0 * std::log(static_cast<double>(u1))).epsilon(1e-5));
}

TEST_CASE("philox: the CPU rounds low + span * u as two operations, as the CUDA kernel does") {
  // The kernel computes __fadd_rn(low, __fmul_rn(span, u)): a product rounded to float,
  // then a sum rounded to float. A host build that fused them (FMA contraction) would
  // make CPU and GPU tensors differ in the last bit.
  manual_seed(2024);
  const Generator::State before = default_generator().state();
  Tensor t = empty({4097});
  t.uniform_(-0.5, 0.25);
  const float low = -0.5f, span = static_cast<float>(0.25 - -0.5);
  const std::vector<float> values = t.to_vector<float>();
  for (size_t i = 0; i < values.size(); ++i) {
    volatile float product = span * philox::uniform(before.seed, before.offset, i);
    const float expected = low + product;
    REQUIRE(values[i] == expected);
  }
}
