// Philox 4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3").
// Counter-based: the i-th number depends only on (seed, i), so the CPU and every CUDA
// thread compute the same stream independently. Usable from host and device code.
#pragma once

#include <cmath>
#include <cstdint>

#if defined(__CUDACC__)
#define MG_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define MG_HOST_DEVICE inline
#endif

namespace mg::philox {

struct Uint4 {
  uint32_t x, y, z, w;
};

MG_HOST_DEVICE uint32_t mulhilo(uint32_t a, uint32_t b, uint32_t* hi) {
  const uint64_t product = static_cast<uint64_t>(a) * b;
  *hi = static_cast<uint32_t>(product >> 32);
  return static_cast<uint32_t>(product);
}

// Four 32-bit random words for `counter` under `seed`.
MG_HOST_DEVICE Uint4 philox4x32(uint64_t seed, uint64_t counter) {
  Uint4 c{static_cast<uint32_t>(counter), static_cast<uint32_t>(counter >> 32), 0u, 0u};
  uint32_t k0 = static_cast<uint32_t>(seed), k1 = static_cast<uint32_t>(seed >> 32);
  for (int round = 0; round < 10; ++round) {
    uint32_t hi0, hi1;
    const uint32_t lo0 = mulhilo(0xD2511F53u, c.x, &hi0);
    const uint32_t lo1 = mulhilo(0xCD9E8D57u, c.z, &hi1);
    c = Uint4{hi1 ^ c.y ^ k0, lo1, hi0 ^ c.w ^ k1, lo0};
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return c;
}

// Uniform float in [0, 1) from 24 random bits (exactly representable).
MG_HOST_DEVICE float to_unit_float(uint32_t bits) {
  return static_cast<float>(bits >> 8) * (1.0f / 16777216.0f);
}

// Element i of a uniform tensor that starts at Philox block `block`: word i%4 of block
// block + i/4. A tensor of n uniforms uses ceil(n/4) blocks.
MG_HOST_DEVICE float uniform(uint64_t seed, uint64_t block, uint64_t index) {
  const Uint4 r = philox4x32(seed, block + index / 4);
  const uint32_t words[4] = {r.x, r.y, r.z, r.w};
  return to_unit_float(words[index % 4]);
}

// Element i of a standard-normal tensor starting at block `block`: Box-Muller on the
// first two words of block block + i/2 (even i the cosine branch, odd i the sine).
// A tensor of n normals uses ceil(n/2) blocks.
MG_HOST_DEVICE float normal(uint64_t seed, uint64_t block, uint64_t index) {
  const Uint4 r = philox4x32(seed, block + index / 2);
  const float u1 = (static_cast<float>(r.x >> 8) + 1.0f) * (1.0f / 16777216.0f);  // (0, 1]
  const float u2 = to_unit_float(r.y);
  const float radius = sqrtf(-2.0f * logf(u1));
  const float angle = 6.2831853071795864f * u2;
  return (index % 2 == 0) ? radius * cosf(angle) : radius * sinf(angle);
}

}  // namespace mg::philox
