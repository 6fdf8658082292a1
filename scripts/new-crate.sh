#!/usr/bin/env bash
# Starts a kernel crate of your own outside this repository: copies template/ to DIR and
# points its clusterfuse dependencies at this checkout. Then `cd DIR && cargo run`.
#   scripts/new-crate.sh DIR [NAME]
set -euo pipefail
[ $# -ge 1 ] || { echo "usage: scripts/new-crate.sh DIR [NAME]" >&2; exit 2; }
repo="$(cd "$(dirname "$0")/.." && pwd)"
dir="$1"
name="${2:-$(basename "$dir")}"
[ ! -e "$dir" ] || [ -z "$(ls -A "$dir")" ] || { echo "$dir exists and is not empty" >&2; exit 1; }
mkdir -p "$dir"
cp -R "$repo/template/." "$dir/"
crate="${name//-/_}"
sed -i -e "s|CLUSTERFUSE|$repo|g" -e "s|^name = \"my-kernels\"|name = \"$name\"|" "$dir/Cargo.toml"
sed -i "s|my_kernels::|$crate::|" "$dir/src/main.rs"
# Start from the versions this repository is tested with.
cp "$repo/Cargo.lock" "$dir/Cargo.lock"
echo "created $name in $dir: cd $dir && cargo run"
