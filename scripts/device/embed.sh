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

echo "== embed: GPU (ours, Vulkan) vs sentence-transformers (CUDA)"
python3 scripts/bench/embed_bench.py --binary "$BIN" --st-device cuda \
    --batch-sizes 1,32,256 --sentences 4096 --sentences-batch1 512 --repeats 5 \
    --parity --out "$OUT/embed_gpu.md" 2> >(tee "$OUT/embed_gpu.log" >&2)

if [[ -z ${EMBED_SKIP_CPU:-} ]]; then
    echo "== embed: CPU (ours --cpu vs sentence-transformers on the CPU)"
    python3 scripts/bench/embed_bench.py --binary "$BIN" --ours-args=--cpu --st-device cpu \
        --batch-sizes 1,32,256 --sentences 1024 --sentences-batch1 128 --repeats 3 \
        --parity --out "$OUT/embed_cpu.md" 2> >(tee "$OUT/embed_cpu.log" >&2)
fi
echo "embed.sh: results in $OUT"
