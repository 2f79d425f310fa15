#!/usr/bin/env bash
# The timelines of the walkthroughs, made again from CPU runs traced with --trace and
# drawn by bench/timeline.py:
#   docs/trace-data-parallel.svg   DataParallel over 2 CPU replicas (train_fashion_mnist)
#   docs/trace-ddp.svg             DDP over 2 Gloo ranks, 1 MB buckets (ddp-bench)
#   docs/trace-pipeline.svg        a 2-stage 1F1B pipeline of 4 micro-batches on CPU devices
#   docs/trace-zero3.svg           FSDP (ZeRO-3) over 2 Gloo ranks (train_fashion_mnist --zero 3)
#
#   bench/timelines.sh                 # with the programs of build/
#   bench/timelines.sh --build build-cpu
#
# It builds nothing: build first (cmake --build build --target train_fashion_mnist
# minigrad-run ddp-bench). train_fashion_mnist reads Fashion-MNIST from its default
# --data-dir (scripts/install-deps.sh installs it). Each picture is one traced step after
# warm-up; on a loaded machine the spans stretch, their order does not change.
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/.." && pwd)"
build="$root/build"
while [ $# -gt 0 ]; do
  case "$1" in
    --build) build="$(cd "$2" && pwd)"; shift 2 ;;
    -h|--help) sed -n '2,15p' "$0"; exit 0 ;;
    *) echo "timelines.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
bin="$build/bin"
for program in train_fashion_mnist minigrad-run ddp-bench; do
  [ -x "$bin/$program" ] || { echo "timelines.sh: $bin/$program is not built" >&2; exit 1; }
done
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
draw() { python3 "$here/timeline.py" "$@"; }
traced="--trace-warmup 2 --trace-steps 1"  # step 3 of each run

"$bin/train_fashion_mnist" --devices cpu,cpu --epochs 1 --trace "$work/dp.json" $traced >/dev/null
draw "$work/dp.json" --step 3 -o "$root/docs/trace-data-parallel.svg" \
  --title "DataParallel over 2 CPU replicas: one training step of train_fashion_mnist (batch 64)"

"$bin/minigrad-run" --nproc-per-node 2 "$bin/ddp-bench" --bucket-cap-mb 1 --warmup 2 \
  --steps 1 --trace "$work/ddp.json" $traced >/dev/null
draw "$work/ddp.json" --step 3 -o "$root/docs/trace-ddp.svg" \
  --title "DDP over 2 Gloo ranks (ddp-bench, MLP 784-1024-1024-1024-10, 1 MB buckets): one step"

"$bin/train_fashion_mnist" --devices cpu,cpu --pipeline 2 --chunks 4 --schedule 1f1b \
  --epochs 1 --trace "$work/pipe.json" $traced >/dev/null
draw "$work/pipe.json" --step 3 -o "$root/docs/trace-pipeline.svg" \
  --title "A 2-stage 1F1B pipeline of 4 micro-batches on CPU devices: one step of train_fashion_mnist"

(cd "$work" && "$bin/minigrad-run" --nproc-per-node 2 "$bin/train_fashion_mnist" --distributed \
  --devices cpu --zero 3 --optimizer adamw --epochs 1 --trace "$work/zero3.json" $traced >/dev/null)
draw "$work/zero3.json" --step 3 -o "$root/docs/trace-zero3.svg" \
  --title "FSDP (ZeRO-3) over 2 Gloo ranks: one step of train_fashion_mnist --zero 3 (AdamW)"

echo "timelines.sh: wrote docs/trace-data-parallel.svg, trace-ddp.svg, trace-pipeline.svg and trace-zero3.svg"
