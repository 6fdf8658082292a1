#!/usr/bin/env bash
# Builds the GPU test and benchmark binaries (PTX embedded) and gathers them in .gpu/,
# ready to carry to a GPU machine and run there with scripts/gpu-run.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
cargo build --release -p clusterfuse-examples --bins
mkdir -p .gpu
for bin in clusterfuse-examples launch-overhead cluster-bench norms-bench decode-bench; do
    cp "target/release/$bin" .gpu/
done
ls -l .gpu
