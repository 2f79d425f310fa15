#!/usr/bin/env bash
# The GPU check: on a machine with an NVIDIA GPU, configure (sm_90 by default), build
# with all cores, run the whole test suite with the GPU tests, run the benchmarks and a
# short Fashion-MNIST training run on the GPU when they are there. Logs go to $OUT
# when it is set (a folder whose files are collected after the run), else to
# build-gpu/gpu-check/.
#
#   scripts/gpu-check.sh                 # everything
#   BUILD_DIR=build-x CUDA_ARCH=80 scripts/gpu-check.sh
#   SKIP_BENCH=1 SKIP_TRAIN=1 scripts/gpu-check.sh
#   SKIP_PROFILE=1 SKIP_SWEEP=1 SKIP_SANITIZER=1 SKIP_DDP_BENCH=1 scripts/gpu-check.sh
#
# In order, each inside what is left of the budget: build; the whole test suite;
# bench/compare.sh (both frameworks, the table of ratios); bench/profile_kernels.sh (a
# wide_mlp step's kernels under Nsight Compute, both frameworks); bench/sweep.sh (mnist_mlp
# batch 32..16384, the SVG chart); a short training run; the NCCL checks; ddp-bench;
# bench/pipeline.sh and tp-bench on {0,0} and a traced DataParallel step on {0,0};
# compute-sanitizer memcheck and racecheck with what time remains.
#
# A GPU machine without network access reaches no package registry: run
# scripts/fetch-gpu-deps.sh on a machine with one first and copy .deps/ along with the
# checkout; the header-only packages found there are
# unpacked under $DEPS_PREFIX (default /opt/deps) when the machine lacks them, and the
# Fashion-MNIST files there feed the training run.
#
# Stays inside a time budget (GPU_CHECK_BUDGET_S, default 540 s, for a machine held ten
# minutes at a time): the benchmarks and the training run are skipped, and say so, when too
# little of it is left, so that the logs and the summary always come back.
# Exits non-zero when the build fails, a test fails, a GPU test was skipped (the GPU
# was not seen), or the benchmark or training binary fails.
set -uo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root" || exit 1
build="${BUILD_DIR:-build-gpu}"
arch="${CUDA_ARCH:-90}"
jobs="${JOBS:-$(nproc)}"
[[ "$jobs" -gt 16 ]] && jobs=16
# Few files of $OUT may be collected (8): the logs are written to a folder of their own and packed into $OUT/gpu-check-logs.tar.gz (with the summary, the
# comparison table, the kernel profile and the sweep chart beside it) when the script
# ends, however it ends.
if [[ -n "${OUT:-}" ]]; then
  logs="$(mktemp -d /tmp/gpu-check.XXXXXX)"
  pack_logs() {
    tar czf "$OUT/gpu-check-logs.tar.gz" -C "$logs" . 2>/dev/null
    # The results a reader wants first, beside the tarball (at most 8 files come back).
    for f in summary.txt compare.md compare.jsonl profile.md sweep-cuda.svg; do
      [[ -f "$logs/$f" ]] && cp "$logs/$f" "$OUT/$f"
    done
  }
  trap pack_logs EXIT
  trap 'exit 143' TERM INT
else
  logs="$root/$build/gpu-check"
fi
mkdir -p "$logs"
failures=()

say() { echo "gpu-check: $*" | tee -a "$logs/summary.txt"; }
fail() { failures+=("$1"); say "FAILED: $1"; }

# ---- the machine ----
{
  date -u
  uname -a
  nvidia-smi || echo "nvidia-smi: not available"
  nvcc --version 2>/dev/null || /usr/local/cuda/bin/nvcc --version 2>/dev/null || echo "nvcc: not on PATH"
  cmake --version | head -1
} > "$logs/machine.txt" 2>&1
say "logs in $logs"
budget="${GPU_CHECK_BUDGET_S:-540}"
time_left() { echo $((budget - SECONDS)); }

# ---- dependencies carried from the CPU machine (scripts/fetch-gpu-deps.sh) ----
# Unpacked, not installed: CMake finds them through CMAKE_PREFIX_PATH. A package whose
# header the machine already has is left alone, so the machine's own copy wins.
prefix_args=()
if compgen -G "$root/.deps/*.deb" > /dev/null; then
  deps_prefix="${DEPS_PREFIX:-/opt/deps}"
  unpacked=0
  for deb in "$root"/.deps/*.deb; do
    name=$(dpkg-deb -f "$deb" Package)
    case "$name" in
      nlohmann-json3-dev) header=/usr/include/nlohmann/json.hpp ;;
      libcli11-dev) header=/usr/include/CLI/CLI.hpp ;;
      *) header="" ;;
    esac
    if [[ -n "$header" && -e "$header" ]]; then
      say "deps: $name not unpacked: the machine has $header"
      continue
    fi
    mkdir -p "$deps_prefix" 2>/dev/null || deps_prefix="$root/.deps/prefix"
    if dpkg-deb -x "$deb" "$deps_prefix"; then
      say "deps: $name $(dpkg-deb -f "$deb" Version) unpacked into $deps_prefix"
      unpacked=1
    else
      say "deps: could not unpack $deb"
    fi
  done
  [[ $unpacked -eq 1 ]] && prefix_args=(-DCMAKE_PREFIX_PATH="$deps_prefix/usr")
fi

# ---- configure ----
# The samples and benchmarks need CLI11, which a machine may lack, so a failed configure
# is retried without them. (nlohmann-json the library itself needs: carry it.)
configure() {
  cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES="$arch" \
        -DMINIGRAD_CUDA=ON "${prefix_args[@]}" "$@" > "$logs/configure.log" 2>&1
}
if ! configure -DMINIGRAD_BUILD_SAMPLES=ON; then
  say "configure with samples failed (see configure.log); retrying without samples and benchmarks"
  cp "$logs/configure.log" "$logs/configure-with-samples.log"
  if ! configure -DMINIGRAD_BUILD_SAMPLES=OFF; then
    fail "configure"
    tail -40 "$logs/configure.log"
    exit 1
  fi
fi
grep "minigrad:" "$logs/configure.log" | tee -a "$logs/summary.txt"

# ---- build ----
start=$SECONDS
if ! cmake --build "$build" -j"$jobs" > "$logs/build.log" 2>&1; then
  fail "build"
  grep -E "error|Error" "$logs/build.log" | head -40
  exit 1
fi
say "built in $((SECONDS - start)) s; warnings: $(grep -c 'warning' "$logs/build.log" || true)"

# ---- tests: all of them, GPU tests included ----
start=$SECONDS
ctest --test-dir "$build" --output-on-failure -j"$jobs" --timeout "${CTEST_TIMEOUT:-240}" \
      --output-junit "$logs/ctest.xml" > "$logs/ctest.log" 2>&1
ctest_status=$?
say "ctest finished in $((SECONDS - start)) s: $(grep -E 'tests passed|tests failed' "$logs/ctest.log" | tail -1)"
[[ $ctest_status -eq 0 ]] || { fail "ctest (see ctest.log)"; grep -E '\*\*\*Failed|\(Failed\)|Timeout' "$logs/ctest.log" | head -40; }
# On a GPU machine a skipped CUDA test means the GPU was not seen: that is a failure.
skipped_gpu=$(grep -cE '^\s*[0-9]+ - cuda:.*\(Skipped\)' "$logs/ctest.log")
if [[ "$skipped_gpu" -gt 0 ]]; then
  fail "$skipped_gpu CUDA tests were skipped: no GPU visible to the tests"
fi

# ---- benchmarks ----
bench="$build/bin/minigrad-bench"
if [[ -z "${SKIP_BENCH:-}" && -x "$bench" && $(time_left) -lt 240 ]]; then
  say "benchmarks: skipped, $(time_left) s of the ${budget} s budget left"
elif [[ -z "${SKIP_BENCH:-}" && -x "$bench" && -x bench/compare.sh ]] && python3 -c "import torch" 2>/dev/null; then
  # Side by side with PyTorch (installed on the GPU machine): every work and mode of
  # both frameworks in one go, and the table of ratios.
  timeout $(( $(time_left) - 60 )) bench/compare.sh --device cuda --build "$build" \
    --out "$logs/compare.jsonl" > "$logs/compare.md" 2> "$logs/compare.log"
  say "bench/compare.sh: exit $?; $(grep -c . "$logs/compare.jsonl") results"
  cat "$logs/compare.md"
  bench_errors=$(grep '"framework": *"minigrad"' "$logs/compare.jsonl" | grep -c '"error"')
  [[ "$bench_errors" -eq 0 ]] || fail "$bench_errors minigrad benchmark runs reported an error (see compare.jsonl)"
elif [[ -z "${SKIP_BENCH:-}" && -x "$bench" ]]; then
  : > "$logs/bench.jsonl"
  for run in "--work tutorial --mode eager" "--work mnist_mlp --mode eager" \
             "--work mnist_mlp --mode graph" "--work wide_mlp --mode eager" \
             "--work wide_mlp --mode eager --tf32"; do
    if [[ $(time_left) -lt 90 ]]; then
      say "minigrad-bench $run: skipped, $(time_left) s of the budget left"
      continue
    fi
    # shellcheck disable=SC2086
    if ! timeout $(( $(time_left) < 330 ? $(time_left) - 30 : 300 )) "$bench" --device cuda $run \
         >> "$logs/bench.jsonl" 2>> "$logs/bench.log"; then
      fail "minigrad-bench --device cuda $run (see bench.log)"
    fi
  done
  say "benchmarks: $(wc -l < "$logs/bench.jsonl") results in bench.jsonl"
  # minigrad-bench reports a failed run as a JSON line with an "error" field.
  bench_errors=$(grep -c '"error"' "$logs/bench.jsonl")
  [[ "$bench_errors" -eq 0 ]] || fail "$bench_errors benchmark runs reported an error (see bench.jsonl)"
  # Side by side with PyTorch when it is installed (it is on the GPU machine).
  if [[ $(time_left) -lt 150 ]]; then
    say "bench/compare.sh: skipped, $(time_left) s of the budget left"
  elif [[ -x bench/compare.sh ]] && python3 -c "import torch" 2>/dev/null; then
    timeout $(($(time_left) - 90)) bench/compare.sh --device cuda --build "$build" --out "$logs/compare.jsonl" \
      > "$logs/compare.log" 2>&1 || say "bench/compare.sh failed (see compare.log); not counted"
  fi
else
  say "benchmarks: skipped ($bench not built or SKIP_BENCH set)"
fi

# ---- where a wide_mlp step's GPU time goes, kernel by kernel, both frameworks ----
profile=1
[[ -n "${SKIP_PROFILE:-}${SKIP_BENCH:-}" ]] && profile=""
if [[ -n "$profile" && -x "$bench" && $(time_left) -lt 150 ]]; then
  say "kernel profile: skipped, $(time_left) s of the budget left"
elif [[ -n "$profile" && -x "$bench" ]]; then
  timeout $(( $(time_left) - 100 )) bench/profile_kernels.sh --work "${PROFILE_WORK:-wide_mlp}" \
    --build "$build" --out "$logs" > "$logs/profile.md" 2> "$logs/profile.log"
  say "kernel profile: exit $?; $(grep -E 'of GPU time per step' "$logs/profile.md" | tr '\n' ' ')"
fi

# ---- the batch-size sweep of mnist_mlp, both frameworks, and its chart ----
sweep=1
[[ -n "${SKIP_SWEEP:-}${SKIP_BENCH:-}" ]] && sweep=""
if [[ -n "$sweep" && -x "$bench" && $(time_left) -lt 120 ]]; then
  say "sweep: skipped, $(time_left) s of the budget left"
elif [[ -n "$sweep" && -x "$bench" ]]; then
  timeout $(( $(time_left) - 60 )) bench/sweep.sh --device cuda --build "$build" --replicas "${SWEEP_REPLICAS:-2}" \
    --out "$logs/sweep-cuda.jsonl" --svg "$logs/sweep-cuda.svg" > "$logs/sweep.md" 2> "$logs/sweep.log"
  say "sweep: exit $?; $(grep -c . "$logs/sweep-cuda.jsonl") results"
fi

# ---- a short training run on GPU 0 ----
train="$build/bin/train_fashion_mnist"
dataset="${FASHION_MNIST_ROOT:-/usr/share/datasets/fashion-mnist}"
[[ -d "$dataset" || ! -d "$root/.deps/fashion-mnist" ]] || dataset="$root/.deps/fashion-mnist"
if [[ -z "${SKIP_TRAIN:-}" && -x "$train" && -d "$dataset" && $(time_left) -lt 60 ]]; then
  say "training: skipped, $(time_left) s of the budget left"
elif [[ -z "${SKIP_TRAIN:-}" && -x "$train" && -d "$dataset" ]]; then
  if timeout $(($(time_left) - 20)) "$train" --devices 0 --epochs 1 --data-dir "$dataset" \
       > "$logs/train.log" 2>&1; then
    say "train_fashion_mnist --devices 0 --epochs 1: $(tail -1 "$logs/train.log")"
  else
    fail "train_fashion_mnist --devices 0 --epochs 1 (see train.log)"
  fi
else
  say "training: skipped ($train not built, $dataset missing, or SKIP_TRAIN set)"
fi

# ---- distributed (owner: parallel/ddp and parallel/c10d): DDP over real NCCL, and its benchmark ----
# The NCCL tests (tests/cuda/distributed_nccl_test.cpp) ran in ctest above: 2 and 4
# ranks on this GPU, started by minigrad-run, each process its own NCCL "host"
# (NCCL_HOSTID) on loopback.
# They must have run, not skipped. Then ddp-bench measures DDP's overhead and the share
# of its all-reduce hidden behind backward on the CPU (Gloo), with 1 and 2 ranks.
nccl_passed=$(grep -cE 'cuda: ?NCCL: .*Passed' "$logs/ctest.log")
nccl_skipped=$(grep -cE '[0-9]+ - cuda: ?NCCL: .*\(Skipped\)' "$logs/ctest.log")
say "distributed NCCL tests: $nccl_passed passed, $nccl_skipped skipped"
[[ "$nccl_skipped" -eq 0 ]] || fail "$nccl_skipped distributed NCCL tests were skipped"
[[ "$nccl_passed" -ge 2 ]] || fail "the distributed NCCL tests did not pass (see ctest.log)"
ddp_bench="$build/bin/ddp-bench"
launcher="$build/bin/minigrad-run"
ddp_time_left=$(( ${GPU_CHECK_BUDGET_S:-540} - SECONDS ))
if [[ -n "${SKIP_DDP_BENCH:-}" ]]; then
  say "ddp-bench: skipped (SKIP_DDP_BENCH set)"
elif [[ -z "${SKIP_BENCH:-}" && -x "$ddp_bench" && -x "$launcher" && $ddp_time_left -lt 90 ]]; then
  say "ddp-bench: skipped, $ddp_time_left s of the budget left"
elif [[ -z "${SKIP_BENCH:-}" && -x "$ddp_bench" && -x "$launcher" ]]; then
  {
    timeout 60 "$ddp_bench" --steps 30 | tail -3
    for cap in 25 1; do
      timeout 60 "$launcher" --nproc-per-node 2 "$ddp_bench" --steps 30 --bucket-cap-mb "$cap" \
        | grep '^\[rank 0\] |' | tail -1 | sed 's/^\[rank 0\] //'
    done
  } > "$logs/ddp-bench.md" 2> "$logs/ddp-bench.log" || fail "ddp-bench (see ddp-bench.log)"
  say "ddp-bench: $(wc -l < "$logs/ddp-bench.md") rows in ddp-bench.md"
fi

# ---- the other forms of parallelism on this one GPU, and a trace ----
# A pipeline of two stages on {0,0} (two streams of one GPU) beside the naive split,
# tensor parallelism over {0,0} against the unsharded model, and a DataParallel step on
# {0,0} traced (CUDA tracks per stream) and drawn. Their correctness ran in ctest above.
if [[ -n "${SKIP_PARALLEL_BENCH:-}${SKIP_BENCH:-}" ]]; then
  say "pipeline/tensor-parallel benchmarks and the GPU trace: skipped (SKIP_PARALLEL_BENCH or SKIP_BENCH set)"
elif [[ -x "$bench" && $(time_left) -lt 150 ]]; then
  say "pipeline/tensor-parallel benchmarks and the GPU trace: skipped, $(time_left) s of the budget left"
elif [[ -x "$bench" ]]; then
  timeout 60 bench/pipeline.sh --build "$build" --devices 0,0 --device cuda --steps 10 \
    > "$logs/pipeline-gpu.md" 2>&1 || say "bench/pipeline.sh on 0,0 failed (see pipeline-gpu.md)"
  timeout 30 "$build/bin/tp-bench" --devices 0,0 > "$logs/tp-gpu.md" 2>&1 \
    || say "tp-bench on 0,0 failed (see tp-gpu.md)"
  if [[ -x "$train" && -d "$dataset" ]]; then
    if timeout 60 "$train" --devices 0,0 --epochs 1 --data-dir "$dataset" \
         --trace "$logs/trace-gpu.json" > "$logs/trace-gpu.log" 2>&1 &&
       python3 bench/timeline.py "$logs/trace-gpu.json" --step 3 -o "$logs/trace-gpu.svg" \
         >> "$logs/trace-gpu.log" 2>&1; then
      say "trace of DataParallel on 0,0: trace-gpu.json, trace-gpu.svg"
    else
      fail "a traced DataParallel run on 0,0 (see trace-gpu.log)"
    fi
  fi
  say "pipeline on 0,0: $(grep -E '^\| pipeline \| 1f1b \| 8' "$logs/pipeline-gpu.md" | head -1)"
fi

# ---- compute-sanitizer: the GPU tests under memcheck and racecheck ----
# memcheck: out-of-bounds, misaligned and freed device memory accessed by a kernel, in
# every GPU test but the multi-process NCCL ones (their ranks are processes of their own).
# API errors are not reported here: the library checks every CUDA return code itself,
# and some tests provoke errors on purpose (running out of memory).
# racecheck: shared-memory hazards, in the tests of the kernels that use shared memory
# (reductions, argmax, log_softmax, cross_entropy: cuda/kernels/reduce.cu, softmax.cu).
# Each run is bounded by what is left of the budget; a run cut short says so and is not
# counted as a pass. To leave the section time: SKIP_BENCH=1 SKIP_TRAIN=1 scripts/gpu-check.sh;
# SKIP_SANITIZER=1 skips it.
sanitizer=$(command -v compute-sanitizer || true)
for candidate in /usr/local/cuda/bin/compute-sanitizer /usr/local/cuda/compute-sanitizer/compute-sanitizer; do
  [[ -z "$sanitizer" && -x "$candidate" ]] && sanitizer="$candidate"
done
test_cuda="$build/bin/test_cuda"
# run_sanitizer <tool> <Catch2 test spec> <at most this many seconds>
run_sanitizer() {
  local tool=$1 spec=$2 seconds=$3 log="$logs/compute-sanitizer-$1.log" status
  timeout "$seconds" "$sanitizer" --tool "$tool" --report-api-errors no --error-exitcode 86 \
    "$test_cuda" "$spec" > "$log" 2>&1
  status=$?
  local summary
  summary=$(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$log" | tail -1 | sed 's/^========= //')
  case $status in
    0) say "compute-sanitizer $tool: clean; ${summary:-no summary line} ($(grep -E '^All tests passed|^test cases:' "$log" | tail -1))" ;;
    86) fail "compute-sanitizer $tool found errors: $summary (see compute-sanitizer-$tool.log)"
        grep -m 20 -E '^========= (Invalid|Error|Race|Warning)' "$log" ;;
    124) say "compute-sanitizer $tool: INCOMPLETE, stopped after $seconds s of the budget (see compute-sanitizer-$tool.log)" ;;
    *) fail "tests failed under compute-sanitizer $tool (exit $status; see compute-sanitizer-$tool.log)"
       grep -m 20 -E 'FAILED|failed|ERROR' "$log" ;;
  esac
}
if [[ -n "${SKIP_SANITIZER:-}" ]]; then
  say "compute-sanitizer: skipped (SKIP_SANITIZER set)"
elif [[ -z "$sanitizer" ]]; then
  say "compute-sanitizer: not found (PATH, /usr/local/cuda); GPU tests not run under it"
elif [[ ! -x "$test_cuda" ]]; then
  say "compute-sanitizer: $test_cuda not built; skipped"
elif [[ $(time_left) -lt 90 ]]; then
  say "compute-sanitizer: skipped, $(time_left) s of the ${budget} s budget left"
else
  say "compute-sanitizer: $("$sanitizer" --version | tail -1)"
  # Two thirds of what is left for memcheck (every GPU test), the rest for racecheck.
  run_sanitizer memcheck '~NCCL:*' $(( ($(time_left) - 30) * 2 / 3 ))
  if [[ $(time_left) -lt 45 ]]; then
    say "compute-sanitizer racecheck: skipped, $(time_left) s of the budget left"
  else
    run_sanitizer racecheck '*sum*,*argmax*,*softmax*,*cross_entropy*' $(( $(time_left) - 20 ))
  fi
fi

if [[ ${#failures[@]} -gt 0 ]]; then
  say "${#failures[@]} failure(s): ${failures[*]}"
  exit 1
fi
say "all passed"
