#!/usr/bin/env bash
# Installs the Debian packages minigrad needs, if any are missing.
# As root it runs apt-get; otherwise it prints the exact command and fails, so that
# `make test` / `make train` never half-work on a machine that lacks something.
#
# The CUDA toolkit (nvcc, cuBLAS, NCCL) is not a Debian package here: when present
# under /usr/local/cuda (or CUDA_HOME) it is used, and otherwise minigrad builds
# without its CUDA backend.
set -euo pipefail

packages=(
  cmake g++ make pkg-config
  libfmt-dev catch2 libopenblas-dev zlib1g-dev   # core build and tests
  libcli11-dev nlohmann-json3-dev                 # command lines, checkpoint headers
  libgloo-dev                                     # CPU process groups (DistributedDataParallel)
  openmpi-bin                                     # mpirun, one of the launchers tested
  dataset-fashion-mnist                           # the data `make train` trains on
  fortunes                                        # the text train_gpt trains on
  clang libclang-rt-14-dev                        # sanitizer and fuzzing builds
)

missing=()
for p in "${packages[@]}"; do
  status=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)
  [[ "$status" == "install ok installed" ]] || missing+=("$p")
done

if [[ ${#missing[@]} -eq 0 ]]; then
  echo "install-deps: all ${#packages[@]} packages present"
  exit 0
fi

echo "install-deps: missing: ${missing[*]}"
if [[ $(id -u) -ne 0 ]]; then
  echo "install-deps: not root; run this, then retry:"
  echo "  sudo apt-get update && sudo apt-get install -y ${missing[*]}"
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -q
apt-get install -y -q --no-install-recommends "${missing[@]}"
echo "install-deps: installed ${missing[*]}"
