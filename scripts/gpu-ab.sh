#!/usr/bin/env bash
# Builds named revisions side by side, for timings compared within one GPU call:
#
#     scripts/gpu-ab.sh base=main pdl=fused-pdl       # NAME=REV ...
#
# Each REV (a commit, branch or tag) is checked out in a scratch worktree and built in
# release, all sharing one target directory (target/ab); its binaries ($BINS, by default
# moe-bench and clusterfuse-examples) land in .gpu/ab/NAME/ beside a file REV naming the
# commit, and .gpu/ab/ is packed into .gpu/ab.tgz to carry to the GPU machine, where
# `tar -xzf .gpu/ab.tgz -C .gpu` restores it (no Rust needed there).
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -gt 0 ] || { echo "usage: scripts/gpu-ab.sh NAME=REV ..." >&2; exit 2; }
for pair in "$@"; do
    [[ $pair =~ ^[A-Za-z0-9_-]+=.+$ ]] || { echo "gpu-ab: '$pair' is not NAME=REV" >&2; exit 2; }
    git rev-parse --verify --quiet "${pair#*=}^{commit}" >/dev/null || { echo "gpu-ab: no commit '${pair#*=}'" >&2; exit 2; }
done
scripts/setup.sh
read -ra bins <<<"${BINS:-moe-bench clusterfuse-examples}"
root=$PWD target=$PWD/target/ab
rm -rf .gpu/ab .gpu/ab.tgz
mkdir -p .gpu/ab
for pair in "$@"; do
    name=${pair%%=*} rev=${pair#*=}
    tree=$(mktemp -d)
    git worktree add --detach "$tree" "$rev" >/dev/null
    trap 'git worktree remove --force "$tree"' EXIT  # a failed build leaves no worktree behind
    (cd "$tree" && CARGO_TARGET_DIR=$target "$root/scripts/build-checked.sh" --release -p clusterfuse-examples "${bins[@]/#/--bin=}")
    git worktree remove --force "$tree"
    trap - EXIT
    mkdir -p ".gpu/ab/$name"
    for bin in "${bins[@]}"; do
        cp "$target/release/$bin" ".gpu/ab/$name/"
    done
    git rev-parse "$rev" >".gpu/ab/$name/REV"
done
tar -czf .gpu/ab.tgz -C .gpu ab
ls -l .gpu/ab.tgz
