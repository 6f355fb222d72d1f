#!/usr/bin/env bash
# generate's GPU engine on the lent H200, in one call (a few minutes): GPU
# against the CPU reference on the first steps, and prefill / decode speed,
# for SmolLM2-135M (Q4_1 GGUF) and for randomly initialised LFM2 with the
# real LFM2-350M shapes in f16 and Q4_0. Run from the repo root there:
#
#   here:   cargo build --release --bin generate --bin scoreboard --example llm_gpu_check
#           mkdir -p target/release/examples && strip the three into
#           target/release/{generate,scoreboard,examples/llm_gpu_check}
#           (stripped they are ~33 MB; with line tables ~220 MB, over the
#           64 MiB carry), and carry target/release plus, if it fits,
#           samples/models/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf (98 MB;
#           without it the SmolLM2 steps are skipped and say so)
#   there:  OUT=... scripts/device/llm.sh
#
# Needs there: the NVIDIA Vulkan driver; python3 with torch and transformers
# (the device image has them) to write the random LFM2 checkpoint
# (scripts/device/lfm2_random.py, ~700 MB of f16 under $WORK). Q4_0 is our
# own conversion on load (scoreboard -t, llm_gpu_check --type), exactly what
# `Tensor::quantize_f32` (ggml's quantize_row_q4_0_ref) gives.
#
# Environment: OUT (required), BIN (default target/release), WORK (default
# /tmp/lfm-llm), PP / TG / DEPTH (default 512 / 128 / 4096 tokens), SMALL=1
# (a small LFM2 instead of the 350M shapes; with e.g. PP=16 TG=4 DEPTH=32
# this tries the script on a machine without a GPU, where lavapipe is slow).
#
# Writes under $OUT: env.txt; check-*.json (llm_gpu_check: logit errors,
# greedy agreement, dispatches per token); scoreboard-*.md (pp512 / tg128,
# 3 repetitions, tok/s and roofline share); generate-*.json
# (one real chat prompt through the CLI, with its timings); summary.md;
# a *.log per step. A step that fails is recorded and the script goes on;
# the exit status is the number of failed steps.
set -uo pipefail
cd "$(dirname "$0")/../.."
: "${OUT:?set OUT to the folder for results}"
BIN=${BIN:-target/release}
PP=${PP:-512}
TG=${TG:-128}
DEPTH=${DEPTH:-4096}
WORK=${WORK:-/tmp/lfm-llm}
SMOL=samples/models/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
LFM2=$WORK/lfm2-350m-random
mkdir -p "$OUT" "$WORK"
failed=0
summary=$OUT/summary.md

# step NAME LIMIT_SECONDS COMMAND...: runs it with stdout to $OUT/NAME, stderr
# to $OUT/NAME.log, and records the outcome.
step() {
    local name=$1 limit=$2
    shift 2
    local t0=$SECONDS
    timeout "$limit" "$@" >"$OUT/$name" 2>"$OUT/$name.log"
    local rc=$?
    local took=$((SECONDS - t0))
    if [[ $rc -eq 0 ]]; then
        echo "| $name | ok | ${took} s |" >>"$summary"
    else
        echo "| $name | FAILED (rc $rc) | ${took} s |" >>"$summary"
        echo "llm.sh: $name failed (rc $rc), see $OUT/$name.log" >&2
        tail -5 "$OUT/$name.log" >&2
        failed=$((failed + 1))
    fi
    return 0
}

for b in generate scoreboard examples/llm_gpu_check; do
    [[ -x $BIN/$b ]] || { echo "llm.sh: $BIN/$b missing (build it here, see the header)" >&2; exit 1; }
done

{
    date -u
    git rev-parse HEAD 2>/dev/null || true
    nvidia-smi 2>/dev/null || true
    vulkaninfo --summary 2>/dev/null | head -40 || true
    nproc
    "$BIN/generate" --version
} >"$OUT/env.txt" 2>&1
echo "| step | outcome | time |" >"$summary"
echo "|---|---|---|" >>"$summary"
if [[ -f $SMOL ]]; then
    have_smol=1
else
    have_smol=
    echo "| SmolLM2 steps | skipped: $SMOL not carried | - |" >>"$summary"
fi

# The random LFM2 checkpoint (kept in $WORK across calls on a warm machine).
if [[ ! -f $LFM2/model.safetensors ]]; then
    step lfm2-random.txt 300 python3 scripts/device/lfm2_random.py "$LFM2" ${SMALL:+--small}
fi
cp "$LFM2/config.json" "$OUT/lfm2-config.json" 2>/dev/null

# GPU against the CPU reference: prefill of 16 random tokens, then 8 steps.
[[ $have_smol ]] && step check-smollm2.json 180 "$BIN/examples/llm_gpu_check" "$SMOL"
step check-lfm2-f16.json 300 "$BIN/examples/llm_gpu_check" "$LFM2"
step check-lfm2-q4_0.json 300 "$BIN/examples/llm_gpu_check" "$LFM2" --type q4_0

# Speed, llama-bench style (prefill pp512, decode tg128, at depth 0), and
# decode at depth 4096 where attention splits over the KV length.
[[ $have_smol ]] && step scoreboard-smollm2.md 180 "$BIN/scoreboard" "$SMOL" -p "$PP" -n "$TG" -r 3
step scoreboard-lfm2.md 300 "$BIN/scoreboard" "$LFM2" -t f16,q4_0 -p "$PP" -n "$TG" -r 3
step scoreboard-lfm2-depth.md 240 "$BIN/scoreboard" "$LFM2" -t q4_0 -p 0 -n "$TG" -d "$DEPTH" -r 3

# One real prompt through the CLI, greedy, on the GPU and on the CPU.
[[ $have_smol ]] && step generate-gpu.json 120 "$BIN/generate" -m "$SMOL" --temperature 0 -n 64 --json \
    --prompt "What is the capital of France? Answer in one sentence, then name three rivers of France."
[[ $have_smol ]] && step generate-cpu.json 300 "$BIN/generate" -m "$SMOL" --cpu --temperature 0 -n 64 --json \
    --prompt "What is the capital of France? Answer in one sentence, then name three rivers of France."
if command -v python3 >/dev/null && [[ -s $OUT/generate-gpu.json && -s $OUT/generate-cpu.json ]]; then
    python3 - "$OUT" >>"$summary" <<'PY'
import json, sys
out = sys.argv[1]
g = json.load(open(f"{out}/generate-gpu.json"))
c = json.load(open(f"{out}/generate-cpu.json"))
same = g["generated_ids"] == c["generated_ids"]
print(f"\ngenerate, SmolLM2, greedy: GPU and CPU tokens {'identical' if same else 'DIFFER'}")
for name, r in (("gpu", g), ("cpu", c)):
    t = r["timings"]
    print(f"- {name}: prefill {t['prompt_tokens']} tok at {t['prefill_tok_per_s']:.0f} tok/s, "
          f"decode {t['generated_tokens']} tok at {t['decode_tok_per_s']:.0f} tok/s")
PY
fi
for f in "$OUT"/check-*.json; do
    [[ -s $f ]] && { echo; echo "$(basename "$f"): $(cat "$f")"; } >>"$summary"
done
for f in "$OUT"/scoreboard-*.md; do
    [[ -s $f ]] && { echo; cat "$f"; } >>"$summary"
done
cat "$summary"
exit "$failed"
