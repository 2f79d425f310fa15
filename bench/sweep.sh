#!/usr/bin/env bash
# How step time grows with work: mnist_mlp at batch sizes 32, 64, ... up to --max-batch,
# for both frameworks, in eager mode, DataParallel with 1..R replicas and (on a GPU)
# CUDA-graph replay; the JSON lines go to a file and bench/plot_sweep.py draws them as
# one log-log SVG chart of step time against batch size.
#
#   bench/sweep.sh                         # CPU, one thread each, batches 32..16384
#   bench/sweep.sh --device cuda           # GPU: + graph; DataParallel over 1..N GPUs
#
# Builds nothing (see compare.sh). Fewer steps are timed at large batches so that the
# whole sweep stays within minutes on a CPU.
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/.." && pwd)"

device=cpu
threads=1
build="$root/build"
max_batch=16384
replicas=""
out=""
svg=""

while [[ $# -gt 0 ]]; do
  case "$1" in
    --device) device="$2"; shift 2 ;;
    --threads) threads="$2"; shift 2 ;;
    --build) build="$2"; shift 2 ;;
    --max-batch) max_batch="$2"; shift 2 ;;
    --replicas) replicas="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --svg) svg="$2"; shift 2 ;;
    -h|--help)
      sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'
      echo "options: --device cpu|cuda  --threads N  --build DIR  --max-batch N (default 16384)"
      echo "         --replicas R (DataParallel up to R replicas; default: CPU 2, GPU every GPU)"
      echo "         --out FILE.jsonl  --svg FILE.svg (default bench/results/sweep-<device>-<date>.*)"
      exit 0 ;;
    *) echo "sweep.sh: unknown option '$1' (try --help)" >&2; exit 2 ;;
  esac
done

# shellcheck source=bench/bench_env.sh
source "$here/bench_env.sh"
bench_find_tools "$build"

stamp="$(date -u +%Y%m%dT%H%M%SZ)"
mkdir -p "$here/results"
out="${out:-$here/results/sweep-$device-$stamp.jsonl}"
svg="${svg:-${out%.jsonl}.svg}"
bench_check_output --out "$out"
bench_check_output --svg "$svg"
[[ "$device" == cpu ]] && bench_check_output --svg "${svg%.svg}-cputime.svg"
: > "$out"

gpus=1
if [[ "$device" == cuda ]]; then
  gpus=$(bench_all_gpus | tr ',' '\n' | wc -l)
  replicas="${replicas:-$gpus}"
else
  replicas="${replicas:-2}"
fi

# Replica lists: distinct GPUs first, then around again (minigrad runs several replicas on
# one device; PyTorch's DataParallel wants distinct GPUs, so it only gets those).
ids_for() {
  local r="$1" ids="" i
  for ((i = 0; i < r; i++)); do ids+="${ids:+,}$((i % gpus))"; done
  echo "$ids"
}

export OPENBLAS_NUM_THREADS="$threads" OMP_NUM_THREADS="$threads" MKL_NUM_THREADS="$threads"
echo "sweep.sh: $device mnist_mlp batches 32..$max_batch, replicas 1..$replicas -> $out" >&2
for ((batch = 32; batch <= max_batch; batch *= 2)); do
  # About 50 steps at batch 32, down to 5 at the largest batches.
  steps=$(( 1600 / batch )); (( steps < 5 )) && steps=5; (( steps > 50 )) && steps=50
  warmup=$(( steps / 5 )); (( warmup < 2 )) && warmup=2
  common=(--work mnist_mlp --device "$device" --batch "$batch" --steps "$steps" --warmup "$warmup")
  runs=("eager")
  [[ "$device" == cuda ]] && runs+=("graph")
  for ((r = 1; r <= replicas; r++)); do runs+=("dataparallel --device-ids $(ids_for "$r")"); done
  for run in "${runs[@]}"; do
    echo "  batch $batch: $run" >&2
    # shellcheck disable=SC2086  # $run is a mode and its flags
    "$MINIGRAD_BENCH" "${common[@]}" --mode $run >> "$out" || true
    if [[ "$run" == dataparallel* && "$device" == cuda ]]; then
      r_ids="${run#dataparallel --device-ids }"
      # Only distinct GPUs for PyTorch.
      [[ $(echo "$r_ids" | tr ',' '\n' | sort -u | wc -l) -eq $(echo "$r_ids" | tr ',' '\n' | wc -l) ]] || continue
    fi
    # shellcheck disable=SC2086
    "$TORCH_PYTHON" "$here/torch_reference.py" "${common[@]}" --mode $run --threads "$threads" >> "$out" || true
  done
done

"$TORCH_PYTHON" "$here/plot_sweep.py" "$out" "$svg"
echo "sweep.sh: chart -> $svg" >&2
if [[ "$device" == cpu ]]; then
  # On a machine shared with other work the CPU time per step is the steadier picture.
  "$TORCH_PYTHON" "$here/plot_sweep.py" "$out" "${svg%.svg}-cputime.svg" --metric median_cpu_ms
  echo "sweep.sh: CPU-time chart -> ${svg%.svg}-cputime.svg" >&2
fi
