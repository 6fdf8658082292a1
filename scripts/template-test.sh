#!/usr/bin/env bash
# The user's path, checked: a crate made by scripts/new-crate.sh in a temporary directory,
# outside this workspace, builds its kernels to PTX, runs them (on the emulator without a
# GPU) and passes its own compile-fail tests.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
"$repo/scripts/new-crate.sh" "$tmp/my-kernels"
cd "$tmp/my-kernels"
# A target directory of its own (kept between runs), apart from the workspace's.
export CARGO_TARGET_DIR="$repo/target/template"
cargo run
cargo test
