#!/usr/bin/env bash
# Pack binaries of target/devbin/ for a device call, compressed (the
# call's `carry` holds 64 MiB in all, the tree included):
#   tools/device/pack.sh [NAME...]     (default: every file in devbin)
# writes target/devpack/bins.tar.xz; carry "target/devpack", then on the
# device: mkdir -p target && tar -C target -xJf target/devpack/bins.tar.xz
set -euo pipefail
cd "$(dirname "$0")/../../target"
names=("$@")
if [ ${#names[@]} -eq 0 ]; then
    mapfile -t names < <(cd devbin && ls)
fi
rm -rf devpack
mkdir devpack
# One xz stream with a 64 MiB dictionary: builds of one program share
# most of their bytes (13 binaries of 4 builds: 8 MiB, against 29 in
# independent blocks), at ~45 s here.
tar -cf - "${names[@]/#/devbin/}" | xz -T1 -9 >devpack/bins.tar.xz
du -h devpack/bins.tar.xz
