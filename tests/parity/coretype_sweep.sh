#!/usr/bin/env bash
# The parity table under one of OpenBLAS's x86-64 kernel sets:
#
#   tests/parity/coretype_sweep.sh Haswell build/bin/test_parity
#
# OpenBLAS picks its GEMM kernels by CPU (AVX2 machines get Haswell's, AVX-512 ones
# SkylakeX's or Cooperlake's), and a float32 result moves with them; OPENBLAS_CORETYPE
# chooses a set on any machine, so every set the CPU can run is tried here. A set it
# cannot run would die of SIGILL: skipped (exit 77, which CTest reports as skipped),
# decided by the instructions the set needs, read from the CPU's flags.
set -euo pipefail
core=$1
test_parity=$2

case $core in
  Nehalem) needs="ssse3 sse4_2" ;;
  Sandybridge) needs="avx" ;;
  Haswell | Zen) needs="avx2 fma" ;;
  SkylakeX) needs="avx512f avx512cd avx512bw avx512dq avx512vl" ;;
  Cooperlake) needs="avx512f avx512cd avx512bw avx512dq avx512vl avx512_bf16" ;;
  *) echo "coretype_sweep: no instruction list for the kernel set '$core'" >&2; exit 2 ;;
esac

if [[ $(uname -m) != x86_64 ]]; then
  echo "coretype_sweep: $core is an x86-64 kernel set and this is $(uname -m): skipping"
  exit 77
fi
flags=" $(grep -m1 '^flags' /proc/cpuinfo | cut -d: -f2) "
for flag in $needs; do
  if [[ $flags != *" $flag "* ]]; then
    echo "coretype_sweep: this CPU lacks $flag, which OpenBLAS's $core kernels need: skipping"
    exit 77
  fi
done

# The table's rows and the check that OpenBLAS took the set asked for.
OPENBLAS_CORETYPE=$core exec "$test_parity" '"parity table:*" ~[write-docs]'
