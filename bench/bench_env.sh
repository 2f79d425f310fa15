# shellcheck shell=bash
# Sourced by bench/compare.sh and bench/sweep.sh: finds the two programs to run.
#   MINIGRAD_BENCH  build/bin/minigrad-bench (or the --build folder's); never built here
#   TORCH_PYTHON    $PYTHON, else the first of python3, /usr/bin/python3 that imports torch

bench_find_tools() {
  local build="$1"
  MINIGRAD_BENCH="${MINIGRAD_BENCH:-$build/bin/minigrad-bench}"
  if [[ ! -x "$MINIGRAD_BENCH" ]]; then
    echo "bench: $MINIGRAD_BENCH not found; build first (make build, or" \
         "cmake --build <dir> --target minigrad-bench) or pass --build <dir>" >&2
    exit 1
  fi
  TORCH_PYTHON="${PYTHON:-}"
  if [[ -z "$TORCH_PYTHON" ]]; then
    for candidate in python3 /usr/bin/python3; do
      if command -v "$candidate" >/dev/null && "$candidate" -c "import torch" 2>/dev/null; then
        TORCH_PYTHON="$candidate"
        break
      fi
    done
  fi
  if [[ -z "$TORCH_PYTHON" ]]; then
    echo "bench: no python3 with torch found (Debian: apt-get install python3-torch;" \
         "or set PYTHON=/path/to/python)" >&2
    exit 1
  fi
  # Some machines set these so that old OpenBLAS builds pick a safe kernel; they apply
  # to both frameworks alike and are left as they are, but said, since they cost speed.
  local var
  for var in OPENBLAS_CORETYPE OPENBLAS_L2_SIZE; do
    [[ -n "${!var:-}" ]] && echo "bench: note: $var=${!var} is set (applies to both frameworks)" >&2
  done
  return 0
}

# "0,1,...,N-1" over the visible GPUs ("0" when none can be counted).
bench_all_gpus() {
  local n
  n=$("$TORCH_PYTHON" -c "import torch; print(torch.cuda.device_count())" 2>/dev/null || echo 0)
  [[ "$n" =~ ^[0-9]+$ && "$n" -gt 0 ]] || n=1
  seq -s, 0 $((n - 1))
}
