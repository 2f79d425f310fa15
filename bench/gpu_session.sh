#!/usr/bin/env bash
# The GPU measurements in one command, on a machine with an NVIDIA GPU:
# builds minigrad-bench with CUDA (Release) into build-gpu/, then runs
#   compare  bench/compare.sh --device cuda   (every work and mode, the table of ratios)
#   sweep    bench/sweep.sh --device cuda     (mnist_mlp batch 32..16384, the SVG chart)
# and leaves the tables, the raw JSON lines and the chart in $OUT (when set: a folder
# collected after the run) or else bench/results/.
#
#   bench/gpu_session.sh            # build, compare, sweep (about 6-8 minutes on an H200)
#   bench/gpu_session.sh compare    # build and compare only
#   bench/gpu_session.sh sweep      # build and sweep only
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/.." && pwd)"
what="${1:-all}"
build="${BUILD:-$root/build-gpu}"
dest="${OUT:-$here/results}"
mkdir -p "$dest"

{
  echo "== $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(hostname)"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null || echo "nvidia-smi: not available"
  nproc
} | tee "$dest/machine.txt"

cmake -S "$root" -B "$build" -DMINIGRAD_CUDA=ON -DMINIGRAD_BUILD_TESTS=OFF \
      -DCMAKE_BUILD_TYPE=Release > "$dest/configure.log" 2>&1 || { tail -30 "$dest/configure.log"; exit 1; }
cmake --build "$build" -j"$(nproc)" --target minigrad-bench > "$dest/build.log" 2>&1 || { tail -40 "$dest/build.log"; exit 1; }
echo "gpu_session: built $build/bin/minigrad-bench"

if [[ "$what" == all || "$what" == compare ]]; then
  "$here/compare.sh" --device cuda --build "$build" --out "$dest/compare-cuda.jsonl" | tee "$dest/compare-cuda.md"
fi
if [[ "$what" == all || "$what" == sweep ]]; then
  "$here/sweep.sh" --device cuda --build "$build" --out "$dest/sweep-cuda.jsonl" --svg "$dest/sweep-cuda.svg"
fi
