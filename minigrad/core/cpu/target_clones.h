// MG_AVX2_CLONES: a performance trick, signposted. The library is built for the baseline
// x86-64 (SSE2), so a loop vectorises 4 floats wide. GCC's target_clones compiles a
// function twice, for AVX2 (8 wide) and for the baseline, and picks one when the library
// loads, by what the CPU has. Only for loops of plain float arithmetic, where both clones
// give the same bits (AVX2 alone brings no fused multiply-add). Elsewhere (other
// compilers, other machines) it is nothing and the baseline loop runs.
#pragma once

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#define MG_AVX2_CLONES [[gnu::target_clones("avx2", "default")]]
#else
#define MG_AVX2_CLONES
#endif
