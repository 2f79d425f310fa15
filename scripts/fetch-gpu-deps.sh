#!/usr/bin/env bash
# Packs into .deps/ (git-ignored) what a GPU machine without network access may lack and
# cannot download:
#   - nlohmann-json3-dev (libminigrad's checkpoint code needs it: without it CMake stops)
#   - libcli11-dev (the samples and benchmarks parse their flags with it)
#   - the Fashion-MNIST files, for gpu-check's training run.
# Both packages are header-only (Architecture: all; headers, CMake config, pkg-config
# and docs, nothing to link), so Debian's copies work with Ubuntu 24.04's gcc 13; this
# script refuses a package that ships anything else. scripts/gpu-check.sh unpacks them
# with `dpkg-deb -x` when the machine has no copy of its own.
#
#   scripts/fetch-gpu-deps.sh
#   then copy the checkout, .deps/ included, to the GPU machine and run scripts/gpu-check.sh
set -euo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
deps="$root/.deps"
packages=(nlohmann-json3-dev libcli11-dev)
dataset="${FASHION_MNIST_ROOT:-/usr/share/datasets/fashion-mnist}"

mkdir -p "$deps"
cd "$deps"
rm -f ./*.deb
if ! apt-get download "${packages[@]}"; then
  echo "fetch-gpu-deps: apt-get download failed; run 'apt-get update' (as root) and retry" >&2
  exit 1
fi

for deb in ./*.deb; do
  name=$(dpkg-deb -f "$deb" Package)
  arch=$(dpkg-deb -f "$deb" Architecture)
  # Every file must be a header, CMake/pkg-config metadata or documentation.
  others=$(dpkg-deb -c "$deb" | awk '{print $NF}' | grep -vE '/$' |
           grep -vE '^\./usr/(include/|share/(cmake|pkgconfig|doc)/)' || true)
  if [[ "$arch" != "all" || -n "$others" ]]; then
    echo "fetch-gpu-deps: $name is not header-only (Architecture: $arch); files:" >&2
    echo "$others" >&2
    exit 1
  fi
  echo "fetch-gpu-deps: $name $(dpkg-deb -f "$deb" Version): header-only"
done

if [[ -d "$dataset" ]]; then
  rm -rf "$deps/fashion-mnist"
  mkdir -p "$deps/fashion-mnist"
  cp "$dataset"/*-ubyte.gz "$deps/fashion-mnist/"
  echo "fetch-gpu-deps: Fashion-MNIST from $dataset"
else
  echo "fetch-gpu-deps: no Fashion-MNIST in $dataset; gpu-check will skip its training run"
fi
echo "fetch-gpu-deps: $(du -sh "$deps" | cut -f1) in $deps "
