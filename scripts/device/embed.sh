#!/usr/bin/env bash
# `embed` on the lent H200, in one go, from the repo root:
#   1. parity on the GPU: our release binary embeds the fixture sentences of
#      samples/fixtures/embed; the lowest cosine to sentence-transformers'
#      vectors is reported (must be >= 0.99999);
#   2. speed: sentences per second at batch sizes 1, 32 and 256, our `embed`
#      on the GPU (Vulkan) against sentence-transformers on CUDA, same
#      sentences, same run (scripts/bench/embed_bench.py);
#   3. the same on the host's CPUs, ours with --cpu against
#      sentence-transformers on the CPU (skip with EMBED_SKIP_CPU=1).
# Needs: target/release/embed (or EMBED_BIN), samples/models/all-minilm-l6-v2,
# python3 with torch, sentence-transformers, numpy, safetensors.
# EMBED_SAME_WEIGHTS=1: the model holds weights without gold vectors (random
# ones of the real shapes, scripts/device/random_encoder.py), so the parity
# step compares our vectors with sentence-transformers' on the benchmark's
# sentences instead. EMBED_NO_COOP=1 adds a GPU run with
# LFM_NO_COOP_MATRIX=1 (the portable GEMM on the same GPU). EMBED_PROFILE=1
# adds `embed --profile` over the benchmark's 4096 sentences at batch 32 and
# 256 (host phases and per-kernel device time; embed_profile_B.txt).
# Results go to $OUT (embed_gpu.md, embed_cpu.md, logs), and to stdout.
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-$(mktemp -d)}
BIN=${EMBED_BIN:-target/release/embed}
mkdir -p "$OUT"
[[ -x $BIN ]] || { echo "embed.sh: no $BIN (cargo build --release --bin embed)" >&2; exit 1; }
[[ -f samples/models/all-minilm-l6-v2/model.safetensors ]] || { echo "embed.sh: model missing (scripts/setup)" >&2; exit 1; }

{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true; } > "$OUT/gpu.txt" 2>&1
echo "commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)" >> "$OUT/gpu.txt"
cat "$OUT/gpu.txt"

check=--parity
[[ -n ${EMBED_SAME_WEIGHTS:-} ]] && check=--same-weights
echo "== embed: GPU (ours, Vulkan) vs sentence-transformers (CUDA)"
python3 scripts/bench/embed_bench.py --binary "$BIN" --st-device cuda \
    --batch-sizes 1,32,256 --sentences 4096 --sentences-batch1 512 --repeats 5 \
    $check --out "$OUT/embed_gpu.md" 2> >(tee "$OUT/embed_gpu.log" >&2)
if [[ -n ${EMBED_NO_COOP:-} ]]; then
    echo "== embed: GPU with LFM_NO_COOP_MATRIX=1 (portable GEMM)"
    LFM_NO_COOP_MATRIX=1 python3 scripts/bench/embed_bench.py --binary "$BIN" --st-device cuda \
        --batch-sizes 1,32,256 --sentences 4096 --sentences-batch1 512 --repeats 5 \
        $check --out "$OUT/embed_gpu_nocoop.md" 2> >(tee "$OUT/embed_gpu_nocoop.log" >&2)
fi

if [[ -n ${EMBED_PROFILE:-} ]]; then
    echo "== embed --profile (GPU), the benchmark's sentences"
    python3 -c 'import sys; sys.path.insert(0, "scripts/bench"); import embed_bench as e; print("\n".join(e.sentences(4096)))' \
        > "$OUT/sentences.txt"
    for b in 32 256; do
        "$BIN" --input "$OUT/sentences.txt" --batch-size "$b" --format npy --output "$OUT/profile.npy" \
            --force --profile 2>&1 | tee "$OUT/embed_profile_$b.txt"
    done
fi

if [[ -z ${EMBED_SKIP_CPU:-} ]]; then
    echo "== embed: CPU (ours --cpu vs sentence-transformers on the CPU)"
    python3 scripts/bench/embed_bench.py --binary "$BIN" --ours-args=--cpu --st-device cpu \
        --batch-sizes 1,32,256 --sentences 1024 --sentences-batch1 128 --repeats 3 \
        $check --out "$OUT/embed_cpu.md" 2> >(tee "$OUT/embed_cpu.log" >&2)
fi
echo "embed.sh: results in $OUT"
