#!/usr/bin/env bash
# Speculative decoding and grammar cost on the lent GPU (issue 20), after
# scripts/device/unpack.sh put the binaries and samples/models/smollm2 there:
#   1. SmolLM2-135M Q4_1 greedy on a rewriting prompt (PROMPT, default
#      .dev/rewrite.txt: "Repeat the following passage word for word." and
#      700 characters of samples/corpus/alice-ch1-4.txt): plain, --lookup
#      (8 drafted), --lookup --draft 4, and --draft-model with the same
#      model requantised to Q4_0 (real weights: the acceptance to expect of
#      a close draft; as large as the model, so no speed-up), three runs
#      each, on the GPU and on the host's CPUs;
#   2. speed on the GPU with a larger target: a random SmolLM2-1.7B shape
#      (scripts/device/random_decoder.py, Q4_0; SmolLM2's vocabulary, so
#      SmolLM2-135M can draft for it) on the same prompt's ids: plain,
#      --lookup, --draft-model SmolLM2-135M (4 and 8 drafted; a random
#      target rarely agrees, so this is the cost of drafting and checking
#      when drafts fail), and --draft-model the target itself (every draft
#      accepted: 9 tokens per check cost 8 draft steps and one check, so
#      the check's cost in decode steps is 9 / speed-up - 8);
#   3. the SmolLM2 under a JSON schema (SCHEMA, default .dev/tool.json)
#      against the same prompt unconstrained, greedy and top-k 40 at T 0.8,
#      on the GPU: the grammar's cost there, full-logit read-back included.
# Prints decode tok/s, acceptance, tokens per check and whether the ids
# equal plain greedy's on the same device and model (they must: the GPU
# checks drafts in one batched forward, bit-equal to decode steps).
# Environment: OUT (required), WORK (default /tmp/lfm-spec: the requantised
# and random models, kept across calls on a warm machine). Results as JSON
# lines in $OUT/speculative.jsonl, a table on stdout.
set -uo pipefail
cd "$(dirname "$0")/../.."
export VK_DRIVER_FILES=${VK_DRIVER_FILES:-/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json}
: "${OUT:?set OUT}"
WORK=${WORK:-/tmp/lfm-spec}
mkdir -p "$WORK"
G=target/release/generate
Q=target/release/quantize
M=samples/models/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
PROMPT=${PROMPT:-.dev/rewrite.txt}
SCHEMA=${SCHEMA:-.dev/tool.json}
J=$OUT/speculative.jsonl
: >"$J"
run() { # label, model, args...
    local label=$1 model=$2
    shift 2
    for r in 1 2 3; do
        "$G" -m "$model" --json "$@" 2>>"$OUT/speculative.log" | python3 -c '
import json, sys
d = json.load(sys.stdin); d["label"] = sys.argv[1]; print(json.dumps(d))' "$label" >>"$J"
    done
}
DRAFT=$WORK/smollm2-135m-q4_0.gguf
[[ -f $DRAFT ]] || "$Q" "$M" -o "$DRAFT" --to q4_0 --allow-requantize --quiet ||
    echo "speculative: requantising $M failed" >&2
for dev in gpu cpu; do
    for arm in plain lookup8 lookup4 draft-q4_0; do
        case $arm in
            plain) extra=() ;;
            lookup8) extra=(--lookup) ;;
            lookup4) extra=(--lookup --draft 4) ;;
            draft-q4_0) extra=(--draft-model "$DRAFT" --draft 4) ;;
        esac
        run "smollm2 $dev $arm" "$M" "--$dev" -f "$PROMPT" --temperature 0 -n 96 "${extra[@]}"
    done
done

BIG=$WORK/smollm2-1.7b-random-q4_0.gguf
if [[ ! -f $BIG ]]; then
    python3 scripts/device/random_decoder.py smollm2-1.7b "$WORK/smollm2-1.7b-random" &&
        "$Q" "$WORK/smollm2-1.7b-random" -o "$BIG" --to q4_0 --quiet ||
        echo "speculative: making the random SmolLM2-1.7B failed" >&2
fi
IDS=$(python3 -c '
import json, sys
for l in open(sys.argv[1]):
    d = json.loads(l)
    if d["label"] == "smollm2 gpu plain":
        print(",".join(map(str, d["prompt_ids"]))); break' "$J")
if [[ -f $BIG && -n $IDS ]]; then
    for arm in plain lookup8 draft4 draft8 self8; do
        case $arm in
            plain) extra=() ;;
            lookup8) extra=(--lookup) ;;
            draft4) extra=(--draft-model "$M" --draft 4) ;;
            draft8) extra=(--draft-model "$M" --draft 8) ;;
            self8) extra=(--draft-model "$BIG" --draft 8) ;;
        esac
        run "random-1.7b gpu $arm" "$BIG" --gpu --prompt-ids "$IDS" --temperature 0 -n 128 "${extra[@]}"
    done
fi

W="The weather request for Paris as JSON:"
run "smollm2 gpu free greedy" "$M" --gpu -p "$W" --temperature 0 -n 64
run "smollm2 gpu schema greedy" "$M" --gpu -p "$W" --temperature 0 -n 64 --json-schema "$SCHEMA"
run "smollm2 gpu free top-k" "$M" --gpu -p "$W" --temperature 0.8 --top-k 40 --seed 5 -n 64
run "smollm2 gpu schema top-k" "$M" --gpu -p "$W" --temperature 0.8 --top-k 40 --seed 5 -n 64 --json-schema "$SCHEMA"
python3 - "$J" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
by = {}
for r in rows:
    by.setdefault(r["label"], []).append(r)
print("| arm | generated | decode tok/s (3 runs) | acceptance | tokens / check | ids equal plain |")
print("|---|---:|---|---:|---:|---|")
for label, rs in by.items():
    t = [r["timings"] for r in rs]
    s = rs[0].get("speculative")
    model, dev = label.split()[:2]
    plain = by.get(f"{model} {dev} plain", [None])[0]
    same = "-" if not s or not plain else str(all(r["generated_ids"] == plain["generated_ids"] for r in rs))
    acc = f'{s["acceptance_rate"]:.0%}' if s else "-"
    per = f'{t[0]["generated_tokens"] / max(1, s["target_forwards"]):.2f}' if s else "1"
    rates = ", ".join(f'{x["decode_tok_per_s"]:.0f}' for x in t)
    print(f"| {label} | {t[0]['generated_tokens']} | {rates} | {acc} | {per} | {same} |")
PY
