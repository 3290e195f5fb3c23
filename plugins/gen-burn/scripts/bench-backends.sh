#!/usr/bin/env bash
# The CPU-backend table of docs/benchmarks.md: training and decoding tokens/s of the default
# model on each CPU backend burn 0.22 offers here, at 1 thread and at one per core:
#   flex (the default), ndarray, and ndarray on Debian's OpenBLAS (libopenblas-dev, installed
#   with apt as root or through sudo).
# burn's `openblas` feature builds OpenBLAS from downloaded sources and cannot build offline;
# its `cpu` backend (cubecl + LLVM) and `tch` (libtorch) download at build time too.
# Each feature set builds the burn stack again (~5 min on 2 cores), in its own target folder.
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/../../.." && pwd)"
cd "$ROOT"
TARGET="${CARGO_TARGET_DIR:-$ROOT/target}/backends"

if ! dpkg-query -W -f='${Status}' libopenblas-dev 2>/dev/null | grep -q "install ok installed"; then
    echo "bench-backends: installing libopenblas-dev"
    SUDO=""
    [[ $(id -u) -eq 0 ]] || SUDO="sudo"
    install() { $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$@" >/dev/null; }
    install libopenblas-dev || { $SUDO apt-get update -q >/dev/null && install libopenblas-dev; }
fi

# flex with the workspace's own build; each other backend's rows from a build with its feature
cargo run --release --locked -q -p areal-gen-burn --example throughput
for feature in ndarray openblas; do
    CARGO_TARGET_DIR="$TARGET/$feature" cargo run --release --locked -q -p areal-gen-burn \
        --example throughput --features "$feature" | grep '^| ndarray'
done
