#!/usr/bin/env bash
# Installs the toolchain (scripts/setup.sh), then runs the whole workspace's tests.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
locked=()
[ -f Cargo.lock ] && locked=(--locked)
exec cargo test --workspace "${locked[@]}" "$@" 2>&1
