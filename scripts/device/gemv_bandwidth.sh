#!/usr/bin/env bash
# On the lent GPU machine: the decode GEMV bandwidth table
# (examples/gemv_bandwidth.rs), for the built-in kernels and for each trial
# kernel folder given (LFM_SHADER_DIR, with its rows per workgroup).
#   scripts/device/gemv_bandwidth.sh BIN [DIR:ROWS[:TOL] ...] -- [bench flags]
# BIN is the stripped example built here; results go to stdout.
set -uo pipefail
cd "$(dirname "$0")/../.."
for f in .gl/*.deb; do dpkg -x "$f" /; done
ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
bin=$1
shift
trials=()
while (($#)) && [[ $1 != -- ]]; do trials+=("$1"); shift; done
[[ ${1:-} == -- ]] && shift
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
echo "## built-in kernels"
"$bin" "$@"
for t in "${trials[@]}"; do
    IFS=: read -r dir rows tol <<<"$t"
    echo "## LFM_SHADER_DIR=$dir --rows-per-group $rows ${tol:+--tolerance $tol}"
    LFM_SHADER_DIR=$dir "$bin" "$@" --rows-per-group "$rows" ${tol:+--tolerance "$tol"}
done
