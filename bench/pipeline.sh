#!/usr/bin/env bash
# The pipeline benchmark in one go: minigrad-bench's pipe_mlp work (eight equal layers,
# split in two halves) as the naive model-parallel split and under parallel::Pipe, one
# BLAS thread per stage, and the tables:
#   1. naive split vs GPipe and 1F1B at --chunks (default 8): step time and speed-up
#      (theory for two stages: 2m/(m+1), 1.78 at m = 8), and the stages' summed CPU
#      time over the step time: how much of the work ran in parallel, which the theory
#      bounds (the speed-up vs naive also counts that micro-batches of 512 rows run
#      faster per row than the naive split's 4096, and may pass the theory);
#   2. the measured bubble (1 - the stages' mean busy fraction, from Pipe's timeline)
#      against (p-1)/(m+p-1) for m = 2, 4, 8, 16;
#   3. peak memory of a step, GPipe vs 1F1B (the allocator's high-water mark above the
#      parameters: gradients, activations, temporaries).
#
#   bench/pipeline.sh                       # two CPU stages: --devices cpu,cpu
#   bench/pipeline.sh --devices 0,0 --device cuda
#
# It builds nothing: build first (cmake --build build --target minigrad-bench), or
# point --build at another build folder. Timings need a quiet machine: two stages want
# two idle cores. On a GPU the busy fractions and the bubble are the stages' host
# threads' (the time they spend queueing kernels), not the GPU's; the step times and
# the memory are the GPU's.
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/.." && pwd)"
build="$root/build"
devices="cpu,cpu"
device="cpu"
chunks=8
steps=20
warmup=3
out=""

while [[ $# -gt 0 ]]; do
  case "$1" in
    --build) build="$2"; shift 2 ;;
    --devices) devices="$2"; shift 2 ;;
    --device) device="$2"; shift 2 ;;
    --chunks) chunks="$2"; shift 2 ;;
    --steps) steps="$2"; shift 2 ;;
    --warmup) warmup="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | grep '^#' | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "pipeline.sh: unknown option '$1' (try --help)" >&2; exit 2 ;;
  esac
done
bench="$build/bin/minigrad-bench"
[[ -x "$bench" ]] || { echo "pipeline.sh: $bench not found; build it first (or --build DIR)" >&2; exit 1; }
out="${out:-$here/results/pipeline-$device-$(date -u +%Y%m%d-%H%M%S).jsonl}"
mkdir -p "$(dirname "$out")"
: > "$out"

# One BLAS thread per stage: each stage's thread is its own core's worth of work.
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 MKL_NUM_THREADS=1

run() {
  "$bench" --work pipe_mlp --device "$device" --devices "$devices" --steps "$steps" \
           --warmup "$warmup" "$@" | tee -a "$out" >/dev/null
}
run --mode model_parallel
sweep="2 4 8 16"
[[ " $sweep " == *" $chunks "* ]] || sweep="$sweep $chunks"
for m in $sweep; do
  for schedule in gpipe 1f1b; do
    run --mode pipeline --chunks "$m" --schedule "$schedule" --checkpoint never
  done
done
echo "raw results: $out"

python3 - "$out" "$chunks" <<'PY'
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
chunks = int(sys.argv[2])
for r in rows:
    if "error" in r:
        sys.exit(f"pipeline.sh: {r['mode']}: {r['error']}")
naive = next(r for r in rows if r["mode"] == "model_parallel")
pipes = {}
for r in rows:
    if r["mode"] == "pipeline":
        pipes[(r["schedule"], r["chunks"])] = r
mib = lambda b: b / (1 << 20)
print(f"\npipe_mlp ({naive['batch']} rows, {naive['devices']}, BLAS threads {naive.get('blas_threads', '?')}), host {naive['host']}, {naive['date']}\n")
print("| mode | schedule | chunks | median ms | CPU ms | speed-up vs naive | CPU ms / median ms | theory 2m/(m+1) |")
print("|---|---|---:|---:|---:|---:|---:|---:|")
print(f"| model_parallel (naive) | | | {naive['median_ms']:.1f} | {naive['median_cpu_ms']:.1f} | 1.00 | "
      f"{naive['median_cpu_ms'] / naive['median_ms']:.2f} | |")
for schedule in ("gpipe", "1f1b"):
    r = pipes[(schedule, chunks)]
    m, p = r["micro_batches"], len(r["busy_fraction"])
    theory = p * m / (m + p - 1)
    print(f"| pipeline | {schedule} | {chunks} | {r['median_ms']:.1f} | {r['median_cpu_ms']:.1f} | "
          f"{naive['median_ms'] / r['median_ms']:.2f} | {r['median_cpu_ms'] / r['median_ms']:.2f} | "
          f"{theory:.2f} |")
print("\n| schedule | chunks | busy per stage | bubble measured | bubble (p-1)/(m+p-1) | median ms |")
print("|---|---:|---|---:|---:|---:|")
for (schedule, m), r in sorted(pipes.items()):
    busy = ", ".join(f"{b:.2f}" for b in r["busy_fraction"])
    print(f"| {schedule} | {m} | {busy} | {r['bubble_fraction']:.3f} | {r['ideal_bubble_fraction']:.3f} | {r['median_ms']:.1f} |")
print("\n| chunks | GPipe peak MiB | 1F1B peak MiB | activations alive per stage (GPipe / 1F1B) |")
print("|---:|---:|---:|---|")
for m in sorted({m for (_, m) in pipes}):
    g, o = pipes[("gpipe", m)], pipes[("1f1b", m)]
    print(f"| {m} | {mib(g['peak_mem_bytes']):.1f} | {mib(o['peak_mem_bytes']):.1f} | "
          f"{g['max_stashed']} / {o['max_stashed']} |")
print(f"\nnaive split peak: {mib(naive['peak_mem_bytes']):.1f} MiB")
PY
