#!/usr/bin/env bash
# Build a branch (or any commit) for the device machine beside the tree's
# own build, without touching this checkout:
#   tools/device/prepare_branch.sh REV NAME
# puts target/devbin/moeflux-NAME, moe_step_bench-NAME and the CUDA test binaries as
# target/devbin/TEST-NAME (stripped). The build runs in a git worktree
# at /work/branch-wt (removed after) with its own target directory
# (target/branches, kept between calls, so a second branch rebuilds only
# what differs). Then, on the device: BUILDS="base NAME"
# tools/device/ab.sh ROUNDS "ARGS"...; the tests find their fixtures
# through the worktree's path and convert them with the branch's moeflux
# at target/branches/release/moeflux: tools/device/branch_tests.sh NAME...
# does that setup and runs each build's cuda_golden and batch tests.
set -euo pipefail
cd "$(dirname "$0")/../.."
rev=$1
name=$2
root=$(pwd)
wt=/work/branch-wt
git worktree add --force --detach "$wt" "$rev" >/dev/null
trap 'git -C "$root" worktree remove --force "$wt"' EXIT
export CARGO_TARGET_DIR=$root/target/branches
(cd "$wt" && cargo build --release --locked && cargo build --release --locked --example moe_step_bench)
mkdir -p target/devbin
strip -o "target/devbin/moeflux-$name" "$CARGO_TARGET_DIR/release/moeflux"
strip -o "target/devbin/moe_step_bench-$name" "$CARGO_TARGET_DIR/release/examples/moe_step_bench"
for t in backend_ops batch cuda_golden; do
    exe=$(cd "$wt" && cargo test --release --locked --no-run --test "$t" --message-format=json 2>/dev/null |
        grep '"kind":\["test"\]' | grep -o '"executable":"[^"]*"' | cut -d'"' -f4 | tail -1)
    strip -o "target/devbin/$t-$name" "$exe"
done
ls -la target/devbin/*-"$name"
