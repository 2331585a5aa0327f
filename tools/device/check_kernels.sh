#!/usr/bin/env bash
# Parse and compile the embedded CUDA kernels with clang (apt-get install
# clang-14) on a machine without the CUDA toolkit: catches syntax and type
# errors before a device call. NVRTC on the device stays the judge.
set -euo pipefail
cd "$(dirname "$0")/../.."
K=src/backend/cuda/kernels
tmp=$(mktemp -d)
cat $K/common.cuh $K/matvec.cu $K/elementwise.cu $K/attention.cu $K/delta.cu $K/moe.cu $K/tensor.cu $K/prep.cu >"$tmp/all.cu"
clang-14 -x cuda --cuda-gpu-arch=sm_80 -nocudainc -nocudalib --cuda-device-only \
    -Xclang -target-feature -Xclang +ptx70 -O2 -S \
    -include tools/device/clang_shim.h "$tmp/all.cu" -o "$tmp/all.ptx"
echo "kernels OK: $(grep -c '^.visible .entry' "$tmp/all.ptx") entries"
rm -rf "$tmp"
