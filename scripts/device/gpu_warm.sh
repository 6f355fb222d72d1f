#!/usr/bin/env bash
# Brings the lent GPU to its working clocks before a measurement, and shows
# the ramp: runs `scoreboard MODEL -b gpu -p $P -n 0` over and over for
# SECONDS (default 60), one line each: seconds since the start, the SM and
# memory clocks and the performance state nvidia-smi reports just before,
# and the pp512 rate. On a freshly started machine the first tens of seconds
# of prefill ran at a quarter of the rate (BENCHMARKS.md, forty-seventh
# session), which made the forty-sixth session's LFM2-350M prefill look like
# a regression. From the repo root there, after scripts/device/unpack.sh:
#
#   scripts/device/gpu_warm.sh MODEL [SECONDS]
#
# MODEL: a GGUF or an HF directory (run as Q4_0 when it is not a GGUF).
# Environment: BIN (default target/release), P (prompt tokens, default
# 512).
set -uo pipefail
model=$1
seconds=${2:-60}
BIN=${BIN:-target/release}
export VK_DRIVER_FILES=${VK_DRIVER_FILES:-/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json}
type=()
[[ $model == *.gguf ]] || type=(-t q4_0)
P=${P:-512}
start=$(date +%s.%N)
echo "| s | SM MHz | memory MHz | pstate | pp$P tok/s |"
echo "|---:|---:|---:|---|---:|"
while :; do
    now=$(date +%s.%N)
    elapsed=$(awk -v a="$start" -v b="$now" 'BEGIN { printf "%.1f", b - a }')
    awk -v e="$elapsed" -v s="$seconds" 'BEGIN { exit !(e >= s) }' && break
    clocks=$(nvidia-smi --query-gpu=clocks.sm,clocks.mem,pstate --format=csv,noheader,nounits 2>/dev/null |
        head -1 | tr -d ' ' | tr ',' '|')
    rate=$(timeout -s KILL 120 "$BIN/scoreboard" "$model" "${type[@]}" -b gpu -p "$P" -n 0 -r 3 2>/dev/null |
        awk -F'|' -v t="pp$P" '$8 ~ " " t " " { gsub(/ /, "", $9); print $9 }')
    echo "| $elapsed | ${clocks:--|-|-} | ${rate:-failed} |"
done
