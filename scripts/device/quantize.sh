#!/usr/bin/env bash
# The KLD evidence of docs/quantization.md that needs the lent H200, from the
# repository root there:
#
#   scripts/device/quantize.sh cpu   every format of the random LFM2-350M on
#                                    the CPU against its f32 reference (the
#                                    LFM2 table; 16 cores make it minutes);
#   scripts/device/quantize.sh gpu   1. every format the GPU reads, on the
#                                    GPU, against the f32 reference on the
#                                    CPU, and 2. each of them on the GPU
#                                    against the same format on the CPU (the
#                                    GPU-vs-CPU drift: what the GPU kernels
#                                    alone change), for SmolLM2 (when
#                                    samples/models/smollm2 is there) and the
#                                    random LFM2-350M.
#
# The random LFM2 is scripts/fixtures/lfm2_350m_random.py's checkpoint (bf16
# HF directory) at $LFM2 (default /tmp/lfm-llm/lfm2-350m-random, where
# scripts/device/llm_peer.sh writes it). Needs target/release/kld. Writes
# markdown (kld's tables), errors and summary.md under $OUT. A run that fails
# is recorded with its error line and the script goes on.
set -uo pipefail
cd "$(dirname "$0")/../.."
: "${OUT:?set OUT to the folder for results}"
STAGE=${1:?usage: quantize.sh cpu|gpu}
mkdir -p "$OUT"
KLD=target/release/kld
CORPUS=samples/corpus/alice-ch1-4.txt
SMOL=samples/models/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
LFM2=${LFM2:-/tmp/lfm-llm/lfm2-350m-random}
# Every format quantize writes, and the ones GPU kernels read
# (gpu::llm_ops::format_defines; kld refuses a GPU arm whose matrices,
# fallbacks included, would be converted to f16).
CPU_TYPES=f16,bf16,q8_0,q6_k,q5_k,q5_1,q5_0,q4_k,q4_1,q4_0,q3_k,q2_k,q1_0
GPU_TYPES=(f32 f16 bf16 q8_0 q6_k q5_0 q4_k q4_1 q4_0)
[[ -x $KLD ]] || { echo "quantize.sh: build $KLD first" >&2; exit 1; }

{
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
    echo "cpu: $(nproc) threads, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
    git rev-parse HEAD
} >"$OUT/env-$STAGE.txt" 2>&1

gpu_rows() {
    local name=$1 model=$2 ctx=$3 chunks=$4
    [[ -e $model ]] || { echo "$name: $model missing, skipped" | tee -a "$OUT/summary.md"; return; }
    local common=(--model "$model" --corpus "$CORPUS" --ctx "$ctx" --chunks "$chunks")
    local gpu_arms
    gpu_arms=$(printf '%s@gpu,' "${GPU_TYPES[@]}")
    echo "## $name: every format on the GPU against f32 on the CPU" >>"$OUT/summary.md"
    "$KLD" "${common[@]}" --ref f32@cpu --arm "${gpu_arms%,}" \
        >"$OUT/$name-gpu-vs-f32.md" 2>"$OUT/$name-gpu-vs-f32.err" &&
        echo ok >>"$OUT/summary.md" || tail -1 "$OUT/$name-gpu-vs-f32.err" >>"$OUT/summary.md"
    echo "## $name: each format, GPU against CPU" >>"$OUT/summary.md"
    for t in "${GPU_TYPES[@]}"; do
        "$KLD" "${common[@]}" --ref "$t@cpu" --arm "$t@gpu" >"$OUT/$name-$t-gpu-vs-cpu.md" \
            2>"$OUT/$name-$t-gpu-vs-cpu.err"
        echo "$t: exit $?; $(grep '@gpu |' "$OUT/$name-$t-gpu-vs-cpu.md" | head -1)$(tail -1 "$OUT/$name-$t-gpu-vs-cpu.err")" \
            >>"$OUT/summary.md"
    done
}

start=$SECONDS
case $STAGE in
cpu)
    [[ -e $LFM2 ]] || { echo "quantize.sh: $LFM2 missing" >&2; exit 1; }
    "$KLD" --cpu --model "$LFM2" --corpus "$CORPUS" --ctx 256 --chunks 4 --ref f32 --arm "$CPU_TYPES" \
        >"$OUT/lfm2-cpu.md" 2>"$OUT/lfm2-cpu.err"
    echo "lfm2 cpu table: exit $? in $((SECONDS - start)) s" >>"$OUT/summary.md"
    ;;
gpu)
    gpu_rows smollm2 "$SMOL" 512 4
    gpu_rows lfm2-350m-random "$LFM2" 256 4
    echo "gpu rows took $((SECONDS - start)) s" >>"$OUT/summary.md"
    ;;
*) echo "usage: quantize.sh cpu|gpu" >&2; exit 2 ;;
esac
cat "$OUT/summary.md"
