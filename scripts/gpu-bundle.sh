#!/usr/bin/env bash
# Builds the GPU test and benchmark binaries (PTX embedded) and gathers them in .gpu/,
# ready to carry to a GPU machine and run there with scripts/gpu-run.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
cargo build --release -p clusterfuse-examples --bins
cargo build --release -p clusterfuse-host --bin clusterfuse-trace
mkdir -p .gpu
for bin in clusterfuse-trace clusterfuse-examples launch-overhead cluster-bench norms-bench tklqt-sweep gemm-bench decode-bench bert-bench llama-bench moe-bench profile-step; do
    cp "target/release/$bin" .gpu/
done
# The GPU checks of graphs and the launch recorder, a test binary ("Executable ... (path)").
test_bin=$(cargo test --release -p clusterfuse-examples --test launch_tools --no-run 2>&1 \
    | sed -n 's/.*Executable .*(\(target\/release\/deps\/launch_tools-[0-9a-f]*\)).*/\1/p')
cp "$test_bin" .gpu/launch-tools-test
ls -l .gpu
