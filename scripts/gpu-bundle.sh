#!/usr/bin/env bash
# Builds the GPU test and benchmark binaries (PTX embedded) and gathers them in .gpu/,
# ready to carry to a GPU machine and run there with scripts/gpu-run.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build-checked.sh --release -p clusterfuse-examples --bins
cargo build --release -p clusterfuse-host --bin clusterfuse-trace
# Cargo's own account of where things are (a target directory set elsewhere included).
target=$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])')
mkdir -p .gpu
for bin in clusterfuse-trace clusterfuse-examples launch-overhead cluster-bench norms-bench tklqt-sweep gemm-bench decode-bench bert-bench llama-bench moe-bench profile-step; do
    cp "$target/release/$bin" .gpu/
done
# The GPU checks of graphs and the launch recorder, a test binary.
test_bin=$(cargo test --release -p clusterfuse-examples --test launch_tools --no-run --message-format=json \
    | python3 -c 'import json, sys; print("".join(m.get("executable") or "" for m in map(json.loads, sys.stdin) if m.get("target", {}).get("name") == "launch_tools"))')
[ -n "$test_bin" ] || { echo "gpu-bundle: cargo named no launch_tools test binary" >&2; exit 1; }
cp "$test_bin" .gpu/launch-tools-test
ls -l .gpu
