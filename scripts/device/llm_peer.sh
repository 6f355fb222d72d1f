#!/usr/bin/env bash
# generate's GPU engine on the lent H200, beside llama.cpp's CUDA build (issue
# 5's targets), in one go from the repo root there (about two minutes once the
# models exist), after scripts/device/llama-cpp.sh built llama-bench and
# llama-quantize:
#
#   1. random LFM2 with LFM2-350M's and LFM2-1.2B's shapes
#      (scripts/fixtures/lfm2_350m_random.py, tokenizer files from $TOK),
#      written to GGUF f16 by our gguf-write (tensors and keys byte-identical
#      to llama.cpp's convert_hf_to_gguf.py for this model, see
#      docs/quantization.md; the converter itself hangs on the offline device
#      reaching for the network), then llama-quantize to Q8_0 and Q4_0 (its
#      default mixes: the tied embedding goes to Q6_K): both engines run the
#      identical files;
#   2. GPU against the CPU reference (examples/llm_gpu_check: 16-token random
#      prompt, 8 greedy steps) on the random LFM2-350M in bf16 and Q4_0, and on
#      SmolLM2 Q4_1 when samples/models/smollm2 is there;
#   3. $WARM seconds (default 60) of prefill to bring the GPU to its clocks
#      (scripts/device/gpu_warm.sh), then
#      scoreboard -p 512 -n 128 -r $R with --llama-bench (-ngl 99) on every
#      file, tg128 at depth 4096 on LFM2-350M Q4_0, and SmolLM2 Q4_1.
#
# Environment: OUT (required), WORK (default /tmp/lfm-llm: checkpoints and
# GGUFs, kept across calls on a warm machine), TOK (default .dev/lfm2-tok, made here by
# scripts/device/smollm2_tokenizer.py),
# BIN (default target/release), R (default 3), WARM (default 60), CHECKS (0
# leaves out step 2). Every step runs under a hard
# time limit; a failed step is reported and the rest still run. Exit status:
# the number of failed steps. Results: $OUT/*.md, *.json, *.log.
set -uo pipefail
cd "$(dirname "$0")/../.."
: "${OUT:?set OUT to the folder for results}"
WORK=${WORK:-/tmp/lfm-llm}
TOK=${TOK:-.dev/lfm2-tok}
BIN=${BIN:-target/release}
R=${R:-3}
LB=peers/llama.cpp-cuda/build/bin
SMOL=samples/models/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
mkdir -p "$OUT" "$WORK"
for b in "$LB/llama-bench" "$LB/llama-quantize" "$BIN/scoreboard" "$BIN/gguf-write" "$BIN/examples/llm_gpu_check"; do
    [[ -x $b ]] || { echo "llm_peer.sh: $b missing" >&2; exit 1; }
done
failed=0

# step LIMIT NAME COMMAND...: stdout to $OUT/NAME, stderr to $OUT/NAME.log,
# killed after LIMIT seconds.
step() {
    local limit=$1 name=$2
    shift 2
    if ! timeout -s KILL "$limit" "$@" >"$OUT/$name" 2>"$OUT/$name.log"; then
        echo "llm_peer.sh: $name failed, see $OUT/$name.log" >&2
        tail -3 "$OUT/$name.log" >&2
        failed=$((failed + 1))
        return 1
    fi
}

# models SIZE TYPE...: the random checkpoint, its f16 GGUF and llama-quantize's
# TYPE files, as $WORK/lfm2-SIZE-random and $WORK/lfm2-SIZE-{f16,TYPE}.gguf.
models() {
    local size=$1 dir=$WORK/lfm2-$1-random
    shift
    [[ -f $dir/model.safetensors ]] ||
        step 300 "lfm2-$size-random.json" python3 scripts/fixtures/lfm2_350m_random.py "$dir" \
            --size "$size" --tokenizer "$TOK" || return 1
    [[ -f $WORK/lfm2-$size-f16.gguf ]] ||
        step 120 "gguf-write-$size.txt" "$BIN/gguf-write" "$dir" -t f16 -o "$WORK/lfm2-$size-f16.gguf" || return 1
    for t in "$@"; do
        [[ -f $WORK/lfm2-$size-$t.gguf ]] ||
            step 120 "quantize-$size-$t.txt" "$LB/llama-quantize" "$WORK/lfm2-$size-f16.gguf" \
                "$WORK/lfm2-$size-$t.gguf" "${t^^}" || return 1
    done
}
models 350m q8_0 q4_0
models 1.2b q4_0

if [[ ${CHECKS:-1} == 1 ]]; then
    step 120 check-lfm2-350m-bf16.json "$BIN/examples/llm_gpu_check" "$WORK/lfm2-350m-random"
    step 120 check-lfm2-350m-q4_0.json "$BIN/examples/llm_gpu_check" "$WORK/lfm2-350m-random" --type q4_0
    [[ -f $SMOL ]] && step 120 check-smollm2.json "$BIN/examples/llm_gpu_check" "$SMOL"
fi

# A freshly started GPU ran prefill at a quarter of its rate for its first
# tens of seconds (BENCHMARKS.md, forty-seventh session): hold it busy first;
# warm.md shows the ramp.
step 200 warm.md env BIN="$BIN" scripts/device/gpu_warm.sh "$WORK/lfm2-350m-q4_0.gguf" "${WARM:-60}"
peer=(--llama-bench "$LB/llama-bench" --llama-bench-args "-ngl 99")
step 300 scoreboard-lfm2-350m.md "$BIN/scoreboard" "$WORK"/lfm2-350m-{q4_0,q8_0,f16}.gguf \
    -b gpu -p 512 -n 128 -r "$R" "${peer[@]}"
step 200 scoreboard-lfm2-350m-d4096.md "$BIN/scoreboard" "$WORK/lfm2-350m-q4_0.gguf" \
    -b gpu -p 0 -n 128 -d 4096 -r "$R" "${peer[@]}"
step 200 scoreboard-lfm2-1.2b.md "$BIN/scoreboard" "$WORK/lfm2-1.2b-q4_0.gguf" \
    -b gpu -p 512 -n 128 -r "$R" "${peer[@]}"
[[ -f $SMOL ]] && step 200 scoreboard-smollm2.md "$BIN/scoreboard" "$SMOL" \
    -b gpu -p 512 -n 128 -r "$R" "${peer[@]}"

for f in "$OUT"/check-*.json; do [[ -s $f ]] && echo "$(basename "$f"): $(cat "$f")"; done
for f in "$OUT"/warm.md "$OUT"/scoreboard-*.md; do [[ -s $f ]] && cat "$f"; done
exit "$failed"
