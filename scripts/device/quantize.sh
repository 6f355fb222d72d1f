#!/usr/bin/env bash
# The GPU rows of docs/quantization.md, on the lent H200, in one go from the
# repository root:
#   1. every weight format on the GPU against the f32 reference on the CPU
#      (the GPU column of the KLD table), and
#   2. each format on the GPU against the same format on the CPU (the
#      GPU-vs-CPU drift row: what the GPU kernels alone change),
# for SmolLM2-135M-Instruct and, when present, the random LFM2-350M-shaped
# model (scripts/fixtures/lfm2_350m_random.py, then gguf-write -t bf16).
#
# Needs: target/release/kld (cargo build --release --bin kld), the SmolLM2
# GGUF under samples/models/smollm2/, optionally
# target/lfm2-350m-random-bf16.gguf. Writes JSON and markdown under $OUT.
# A run that fails (a format the GPU does not read for some tensor, no GPU)
# is recorded with its error line and the script goes on.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-target/device-quantize}
mkdir -p "$OUT"
KLD=target/release/kld
CORPUS=samples/corpus/alice-ch1-4.txt
# The formats GPU kernels read (gpu::llm_ops::format_defines); kld refuses a
# GPU arm whose matrices (fallbacks included) would be converted to f16.
TYPES=(f32 f16 bf16 q8_0 q6_k q5_0 q4_k q4_1 q4_0)
[[ -x $KLD ]] || { echo "quantize.sh: build $KLD first" >&2; exit 1; }

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$OUT/gpu.txt" 2>&1
git rev-parse HEAD > "$OUT/commit.txt" 2>/dev/null

run_model() {
    local name=$1 model=$2 ctx=$3 chunks=$4
    [[ -e $model ]] || { echo "$name: $model missing, skipped" | tee -a "$OUT/summary.md"; return; }
    local common=(--model "$model" --corpus "$CORPUS" --ctx "$ctx" --chunks "$chunks")
    local gpu_arms
    gpu_arms=$(printf '%s@gpu,' "${TYPES[@]}")
    echo "## $name: every format on the GPU against f32 on the CPU" >> "$OUT/summary.md"
    "$KLD" "${common[@]}" --ref f32@cpu --arm "${gpu_arms%,}" --json \
        > "$OUT/$name-gpu-vs-f32.json" 2> "$OUT/$name-gpu-vs-f32.err" \
        && echo ok >> "$OUT/summary.md" || tail -1 "$OUT/$name-gpu-vs-f32.err" >> "$OUT/summary.md"
    echo "## $name: each format, GPU against CPU" >> "$OUT/summary.md"
    for t in "${TYPES[@]}"; do
        "$KLD" "${common[@]}" --ref "$t@cpu" --arm "$t@gpu" > "$OUT/$name-$t-gpu-vs-cpu.md" \
            2> "$OUT/$name-$t-gpu-vs-cpu.err"
        echo "$t: exit $?; $(grep '@gpu |' "$OUT/$name-$t-gpu-vs-cpu.md" | head -1)$(tail -1 "$OUT/$name-$t-gpu-vs-cpu.err")" \
            >> "$OUT/summary.md"
    done
}

start=$SECONDS
run_model smollm2 samples/models/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf 512 8
run_model lfm2-350m-random target/lfm2-350m-random-bf16.gguf 256 4
echo "took $((SECONDS - start)) s" >> "$OUT/summary.md"
cat "$OUT/summary.md"
