#!/usr/bin/env bash
# Installs the toolchain (scripts/setup.sh), then runs the examples binary; arguments go to it.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
exec cargo run --release -p clusterfuse-examples --bin clusterfuse-examples -- "$@"
