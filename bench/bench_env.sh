# shellcheck shell=bash
# Sourced by bench/compare.sh and bench/sweep.sh: finds the two programs to run.
#   MINIGRAD_BENCH  build/bin/minigrad-bench (or the --build folder's); never built here
#   TORCH_PYTHON    $PYTHON, else the first of python3, /usr/bin/python3 that imports torch
# and checks the files they will write before any benchmark runs (bench_check_output).

# Exits naming the option and the path unless `path` can take the results: a regular file
# (a symbolic link to one is written through) or nothing yet, in a writable directory.
# A FIFO would block the first write, and a device such as /dev/null would swallow the
# results, so neither is taken.
bench_check_output() {
  local option="$1" path="$2" dir
  dir="$(dirname -- "$path")"
  if [[ -e "$path" && ! -f "$path" ]]; then
    echo "bench: $option $path: it exists and is not a regular file; refusing to write there" >&2
    exit 2
  fi
  if [[ ! -d "$dir" || ! -w "$dir" ]]; then
    echo "bench: $option $path: the directory $dir does not exist or cannot be written" >&2
    exit 2
  fi
}

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
