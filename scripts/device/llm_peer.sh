#!/usr/bin/env bash
# Issue 5's targets on the lent H200: scoreboard (our GPU path, Vulkan) beside
# llama.cpp's CUDA llama-bench (-ngl 99, default flags) on the same GGUF files
# in the same run. From the repo root, after scripts/device/llama-cpp.sh built
# llama-bench and llama-quantize:
#
#   1. random LFM2 with LFM2-350M's and LFM2-1.2B's shapes
#      (scripts/fixtures/lfm2_350m_random.py, tokenizer files from $TOK),
#   2. converted by llama.cpp's own convert_hf_to_gguf.py at f16, then
#      llama-quantize to Q8_0 and Q4_0 (its default mixes: the tied
#      embedding goes to Q6_K),
#   3. scoreboard -p 512 -n 128 -r $R on every file with --llama-bench, and
#      tg128 at depth 4096 on LFM2-350M Q4_0; SmolLM2 Q4_1 too when
#      samples/models/smollm2 is there.
#
# Environment: OUT (required), WORK (default /tmp/lfm-llm: checkpoints and
# GGUFs, kept across calls on a warm machine), TOK (default .dev/lfm2-tok),
# BIN (default target/release), R (default 5). Writes $OUT/scoreboard*.md and
# .json, the models' notes and the conversion logs.
set -uo pipefail
cd "$(dirname "$0")/../.."
: "${OUT:?set OUT to the folder for results}"
WORK=${WORK:-/tmp/lfm-llm}
TOK=${TOK:-.dev/lfm2-tok}
BIN=${BIN:-target/release}
R=${R:-5}
LC=peers/llama.cpp-cuda
LB=$LC/build/bin
SMOL=samples/models/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
mkdir -p "$OUT" "$WORK"
for b in "$LB/llama-bench" "$LB/llama-quantize" "$BIN/scoreboard"; do
    [[ -x $b ]] || { echo "llm_peer.sh: $b missing" >&2; exit 1; }
done
export PYTHONPATH=$LC/gguf-py${PYTHONPATH:+:$PYTHONPATH}

# models SIZE TYPE...: the random checkpoint, llama.cpp's f16 GGUF of it, and
# llama-quantize's TYPE files.
models() {
    local size=$1 dir=$WORK/lfm2-$1-random
    shift
    if [[ ! -f $dir/model.safetensors ]]; then
        python3 scripts/fixtures/lfm2_350m_random.py "$dir" --size "$size" --tokenizer "$TOK" \
            >"$OUT/lfm2-$size-random.json" 2>"$OUT/lfm2-$size-random.log" ||
            { tail -5 "$OUT/lfm2-$size-random.log" >&2; return 1; }
    fi
    local f16=$WORK/lfm2-$size-f16.gguf
    if [[ ! -f $f16 ]]; then
        python3 "$LC/convert_hf_to_gguf.py" "$dir" --outtype f16 --outfile "$f16" \
            >"$OUT/convert-$size.log" 2>&1 || { tail -5 "$OUT/convert-$size.log" >&2; return 1; }
    fi
    for t in "$@"; do
        [[ -f $WORK/lfm2-$size-$t.gguf ]] ||
            "$LB/llama-quantize" "$f16" "$WORK/lfm2-$size-$t.gguf" "${t^^}" \
                >"$OUT/quantize-$size-$t.log" 2>&1 || { tail -5 "$OUT/quantize-$size-$t.log" >&2; return 1; }
    done
}
models 350m q8_0 q4_0 || exit 1
models 1.2b q4_0 || exit 1

# board NAME ARGS...: one scoreboard run: JSON, and the dated markdown section
# it would append to BENCHMARKS.md.
board() {
    local name=$1
    shift
    "$BIN/scoreboard" "$@" -b gpu -r "$R" --llama-bench "$LB/llama-bench" --llama-bench-args "-ngl 99" \
        -o json --append "$OUT/$name.md" >"$OUT/$name.json" 2>"$OUT/$name.log" ||
        { tail -5 "$OUT/$name.log" >&2; return 1; }
    cat "$OUT/$name.md"
}
failed=0
board scoreboard-lfm2 "$WORK"/lfm2-350m-{q4_0,q8_0,f16}.gguf "$WORK/lfm2-1.2b-q4_0.gguf" -p 512 -n 128 ||
    failed=$((failed + 1))
board scoreboard-lfm2-depth "$WORK/lfm2-350m-q4_0.gguf" -p 0 -n 128 -d 4096 || failed=$((failed + 1))
if [[ -f $SMOL ]]; then
    board scoreboard-smollm2 "$SMOL" -p 512 -n 128 || failed=$((failed + 1))
fi
exit "$failed"
