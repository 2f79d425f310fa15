#!/usr/bin/env bash
# Where a training step's GPU time goes, kernel by kernel, for minigrad and PyTorch side
# by side: runs one step of a work (after one warm-up step) of each framework under
# Nsight Compute, collecting only each kernel's duration, and prints a table of the
# kernels grouped by name with their total time per step.
#
#   bench/profile_kernels.sh --work wide_mlp [--tf32] [--build DIR] [--out DIR]
#
# Needs ncu (Nsight Compute) and a GPU. ncu runs kernels one at a time, so the sum is
# the GPU's busy time per step without overlap or launch gaps: compare it with the
# step times of bench/compare.sh to see how much of a step is kernels and how much is
# waiting for the host.
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/.." && pwd)"
work=wide_mlp
build="$root/build"
out=""
extra=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --work) work="$2"; shift 2 ;;
    --tf32) extra+=(--tf32); shift ;;
    --build) build="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    -h|--help) sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "profile_kernels.sh: unknown option '$1'" >&2; exit 2 ;;
  esac
done
ncu=$(command -v ncu || true)
for candidate in /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu; do
  [[ -z "$ncu" && -x "$candidate" ]] && ncu="$candidate"
done
[[ -n "$ncu" ]] || { echo "profile_kernels.sh: ncu (Nsight Compute) not found" >&2; exit 1; }
# shellcheck source=bench/bench_env.sh
source "$here/bench_env.sh"
bench_find_tools "$build"
out="${out:-$here/results}"
mkdir -p "$out"

# Two steps (one warm-up, one timed) of each; the table keeps the last step's kernels.
args=(--work "$work" --device cuda --mode eager --steps 1 --warmup 1 "${extra[@]}")
profile() {
  "$ncu" --clock-control none --metrics gpu__time_duration.sum --csv --print-units base \
    --log-file "$out/ncu-$1-$work.csv" "${@:2}" > "$out/ncu-$1-$work.log" 2>&1
}
profile minigrad "$MINIGRAD_BENCH" "${args[@]}"
profile torch "$TORCH_PYTHON" "$here/torch_reference.py" "${args[@]}"
"$TORCH_PYTHON" "$here/kernel_table.py" "$work ${extra[*]}" \
  "$out/ncu-minigrad-$work.csv" "$out/ncu-torch-$work.csv"
