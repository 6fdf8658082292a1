#!/usr/bin/env bash
# `cargo build ARGS...`, then a check that every kernel cubin this build embeds is whole: a
# build without ptxas embeds an empty one, and a GPU would then JIT-compile the PTX at every
# cold start. Cargo names the build scripts' output folders (fresh ones too), so only this
# build's cubins are looked at, not older folders' in the target directory.
#
#     scripts/build-checked.sh --release -p clusterfuse-examples --bins
set -euo pipefail
out_dirs=$(cargo build "$@" --message-format=json-render-diagnostics \
    | python3 -c 'import json, sys; print("\n".join(m["out_dir"] for m in map(json.loads, sys.stdin) if m.get("reason") == "build-script-executed"))')
while read -r dir; do
    cubin=$dir/clusterfuse.cubin
    if [ -e "$cubin" ] && [ ! -s "$cubin" ]; then
        echo "build-checked: $cubin is empty (built without ptxas): run scripts/setup.sh, then this again" >&2
        exit 1
    fi
done <<<"$out_dirs"
