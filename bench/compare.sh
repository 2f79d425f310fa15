#!/usr/bin/env bash
# Runs minigrad-bench and bench/torch_reference.py for every work and mode that applies
# to the device, in one go, writes their JSON lines to a file and prints the table of
# median step times with the ratio minigrad/PyTorch next to its target (bench/RESULTS.md).
#
#   bench/compare.sh                      # CPU: tutorial, mnist_mlp; one thread each
#   bench/compare.sh --device cuda        # GPU: every work, eager/graph/dataparallel, TF32
#   bench/compare.sh --device cpu --works "tutorial mnist_mlp wide_mlp"
#
# It builds nothing: build first (make build, or cmake --build build), or point
# --build at another build folder. PYTHON selects the interpreter that has torch.
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/.." && pwd)"

device=cpu
threads=1
build="$root/build"
works=""
steps=""
warmup=""
device_ids=""
out=""

usage() {
  sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'
  cat <<EOF
options:
  --device cpu|cuda     what to compare on (default cpu)
  --threads N           CPU threads for each framework (default 1: OPENBLAS_NUM_THREADS,
                        OMP_NUM_THREADS, torch.set_num_threads)
  --build DIR           the build folder holding bin/minigrad-bench (default build/)
  --works "W ..."       works to run (default: CPU tutorial mnist_mlp; GPU all three)
  --steps N / --warmup K  passed to both programs
  --device-ids LIST     GPUs for dataparallel (default: every visible GPU, and [0])
  --out FILE            the raw JSON lines (default bench/results/compare-<device>-<date>.jsonl)
EOF
}

while [[ $# -gt 0 ]]; do
  case "$1" in
    --device) device="$2"; shift 2 ;;
    --threads) threads="$2"; shift 2 ;;
    --build) build="$2"; shift 2 ;;
    --works) works="$2"; shift 2 ;;
    --steps) steps="$2"; shift 2 ;;
    --warmup) warmup="$2"; shift 2 ;;
    --device-ids) device_ids="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "compare.sh: unknown option '$1' (try --help)" >&2; exit 2 ;;
  esac
done
[[ "$device" == cpu || "$device" == cuda ]] || { echo "compare.sh: --device is cpu or cuda" >&2; exit 2; }

# shellcheck source=bench/bench_env.sh
source "$here/bench_env.sh"
bench_find_tools "$build"

if [[ -z "$works" ]]; then
  if [[ "$device" == cpu ]]; then works="tutorial mnist_mlp"; else works="tutorial mnist_mlp wide_mlp"; fi
fi
if [[ -z "$out" ]]; then
  mkdir -p "$here/results"
  out="$here/results/compare-$device-$(date -u +%Y%m%dT%H%M%SZ).jsonl"
fi
bench_check_output --out "$out"
: > "$out"

extra=()
[[ -n "$steps" ]] && extra+=(--steps "$steps")
[[ -n "$warmup" ]] && extra+=(--warmup "$warmup")

# One "mode [--tf32] [--device-ids L]" per line: the runs that apply to this device.
runs_for() {
  local work="$1"
  echo "eager"
  if [[ "$device" == cpu ]]; then
    # minigrad's DataParallel also runs CPU replicas; PyTorch's answers with an error row.
    echo "dataparallel --device-ids 0"
    return 0
  fi
  [[ "$work" == wide_mlp ]] && echo "eager --tf32"
  echo "graph"
  [[ "$work" == wide_mlp ]] && echo "graph --tf32"
  echo "dataparallel --device-ids 0"
  local all="${device_ids:-$(bench_all_gpus)}"
  [[ "$all" != 0 ]] && echo "dataparallel --device-ids $all"
  return 0
}

export OPENBLAS_NUM_THREADS="$threads" OMP_NUM_THREADS="$threads" MKL_NUM_THREADS="$threads"
echo "compare.sh: $device, works: $works; threads $threads; raw JSON -> $out" >&2
for work in $works; do
  while read -r mode rest; do
    read -r -a flags <<< "$rest"
    args=(--work "$work" --device "$device" --mode "$mode" "${flags[@]}" "${extra[@]}")
    echo "  $work $mode $rest" >&2
    "$MINIGRAD_BENCH" "${args[@]}" >> "$out" < /dev/null || true
    "$TORCH_PYTHON" "$here/torch_reference.py" "${args[@]}" --threads "$threads" >> "$out" < /dev/null || true
  done < <(runs_for "$work")
done

"$TORCH_PYTHON" "$here/report.py" table "$out"
