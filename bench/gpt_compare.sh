#!/usr/bin/env bash
# A GPT training step, minigrad (build/bin/gpt-bench) beside PyTorch eager
# (bench/torch_gpt.py), at 1 and 2 threads, on nanoGPT's small CPU config unless other
# flags are given (passed to both). One JSON line per run; bench/RESULTS.md has the table.
#
#   bench/gpt_compare.sh [--build DIR] [--steps N] [--n-layer N ...]
set -euo pipefail
build=build
if [[ "${1:-}" == "--build" ]]; then build=$2; shift 2; fi
here=$(cd "$(dirname "$0")" && pwd)
for threads in 1 2; do
  OPENBLAS_NUM_THREADS=$threads OMP_NUM_THREADS=$threads "$build/bin/gpt-bench" "$@" |
    sed "s/^{/{\"threads\":$threads,/"
  OMP_NUM_THREADS=$threads /usr/bin/python3 "$here/torch_gpt.py" --threads "$threads" "$@"
done
