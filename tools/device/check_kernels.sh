#!/usr/bin/env bash
# Parse and type-check the embedded CUDA kernels with clang (apt-get install
# clang-14) on a machine without the CUDA toolkit, every template
# instantiated (-fsyntax-only: about a second; generating PTX at -O2 took
# over ten minutes): catches syntax and type errors before a device call.
# NVRTC on the device stays the judge.
set -euo pipefail
cd "$(dirname "$0")/../.."
K=src/backend/cuda/kernels
tmp=$(mktemp -d)
check() {
    local out=$1
    shift
    (cd $K && cat "$@") >"$tmp/$out.cu"
    clang-14 -x cuda --cuda-gpu-arch=sm_80 -nocudainc -nocudalib --cuda-device-only \
        -Xclang -target-feature -Xclang +ptx70 -fsyntax-only \
        -include tools/device/clang_shim.h "$tmp/$out.cu"
}
# The modules of cuda/compile.rs: the base module, the attention module, the
# chunked GatedDeltaNet module.
check all common.cuh matvec.cu matvec_q.cu elementwise.cu attention.cu delta.cu moe.cu moe_routed.cu mma.cuh tensor.cu matvec_tc.cu moe_mt.cu prep.cu
check attention common.cuh mma.cuh flash.cu
check delta common.cuh delta_chunk.cu
echo "kernels OK: $(cat "$tmp"/*.cu | grep -c 'extern "C" __global__') entries"
rm -rf "$tmp"
