#!/usr/bin/env bash
# Where generate's GPU decode step spends its time on the lent H200: a random
# LFM2-350M (scripts/fixtures/lfm2_350m_random.py, tokenizer from $TOK) in
# GGUF f16 by our gguf-write, then scoreboard with --profile (device
# timestamps after every dispatch, host time per step) at Q4_0, Q8_0 and F16,
# and at Q4_0 after 4096 tokens of context; with BIG=1 also LFM2-1.2B at Q4_0.
#
# Environment: OUT (required), WORK (default /tmp/lfm-llm, kept across calls
# on a warm machine), TOK (default .dev/lfm2-tok, made here by
# scripts/device/smollm2_tokenizer.py), BIN (default
# target/release), R (default 3), STEPS (profiled steps, default 64).
# Results: $OUT/profile-*.md (tables) and *.json.
set -uo pipefail
cd "$(dirname "$0")/../.."
: "${OUT:?set OUT to the folder for results}"
WORK=${WORK:-/tmp/lfm-llm}
TOK=${TOK:-.dev/lfm2-tok}
BIN=${BIN:-target/release}
R=${R:-3}
STEPS=${STEPS:-64}
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
mkdir -p "$OUT" "$WORK"
dir=$WORK/lfm2-350m-random
gguf=$WORK/lfm2-350m-f16.gguf
[[ -f $dir/model.safetensors ]] ||
    timeout -s KILL 300 python3 scripts/fixtures/lfm2_350m_random.py "$dir" --tokenizer "$TOK" \
        >"$OUT/random.log" 2>&1 || { echo "profile.sh: random LFM2 failed"; tail "$OUT/random.log"; exit 1; }
[[ -f $gguf ]] || timeout -s KILL 120 "$BIN/gguf-write" "$dir" -t f16 -o "$gguf" || exit 1
failed=0
for spec in "q4_0,q8_0,f16 0 -p,512" "q4_0 4096 -p,0"; do
    read -r types depth pp <<<"$spec"
    name=profile-350m-${types//,/-}-d$depth
    timeout -s KILL 300 "$BIN/scoreboard" "$gguf" -t "$types" -b gpu ${pp//,/ } -n 128 -d "$depth" \
        -r "$R" --profile "$STEPS" -o json >"$OUT/$name.json" 2>"$OUT/$name.md" ||
        { echo "profile.sh: $name failed"; failed=$((failed + 1)); }
    tail -n 40 "$OUT/$name.md"
done
if [[ ${BIG:-0} == 1 ]]; then
    big=$WORK/lfm2-1.2b-random
    [[ -f $big/model.safetensors ]] ||
        timeout -s KILL 300 python3 scripts/fixtures/lfm2_350m_random.py "$big" --size 1.2b \
            --tokenizer "$TOK" >"$OUT/random-1.2b.log" 2>&1 || { echo "profile.sh: random 1.2B failed"; exit 1; }
    [[ -f $WORK/lfm2-1.2b-f16.gguf ]] ||
        timeout -s KILL 120 "$BIN/gguf-write" "$big" -t f16 -o "$WORK/lfm2-1.2b-f16.gguf" || exit 1
    timeout -s KILL 300 "$BIN/scoreboard" "$WORK/lfm2-1.2b-f16.gguf" -t q4_0 -b gpu -p 512 -n 128 \
        -r "$R" --profile "$STEPS" -o json >"$OUT/profile-1.2b-q4_0-d0.json" 2>"$OUT/profile-1.2b-q4_0-d0.md" ||
        { echo "profile.sh: 1.2b failed"; failed=$((failed + 1)); }
    tail -n 20 "$OUT/profile-1.2b-q4_0-d0.md"
fi
exit $failed
