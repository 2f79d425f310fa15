#!/usr/bin/env bash
# The accounting of issues 22/23 on this machine: gpt-parallel-bench (bench/gpt_parallel_bench.cpp)
# under minigrad-run for the eight configurations of bench/RESULTS.md's section, each rank's
# table and JSON lines into $OUT (default bench/results/gpt-parallel). It builds nothing:
#   cmake --build build --target gpt-parallel-bench minigrad-run && bench/gpt_parallel.sh
set -euo pipefail
BIN=${BIN:-build/bin}
OUT=${OUT:-bench/results/gpt-parallel}
ARGS=${ARGS:-"--steps 3 --json"}
mkdir -p "$OUT"
while read -r name n flags; do
  echo "== $name ($n ranks): $flags"
  # shellcheck disable=SC2086
  "$BIN/minigrad-run" --nproc-per-node "$n" "$BIN/gpt-parallel-bench" $flags $ARGS | tee "$OUT/$name.txt"
done <<'CONFIGS'
dp2 2 --dp 2
tp2 2 --tp 2
tp2+sp 2 --tp 2 --sequence-parallel
cp2 2 --cp 2
dp2xtp2 4 --dp 2 --tp 2
tp2xcp2 4 --tp 2 --cp 2
pp2 2 --pp 2
dp2xtp2xpp2 8 --dp 2 --tp 2 --pp 2
CONFIGS
