#!/usr/bin/env bash
# Installs the toolchain (scripts/setup.sh), runs the whole workspace's tests, then checks the
# user's path: a crate made from template/ outside the workspace (scripts/template-test.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
cargo test --workspace --locked "$@" 2>&1
scripts/template-test.sh 2>&1
