#!/usr/bin/env bash
# Speculative decoding and grammar cost on the lent GPU (issue 20), after
# scripts/device/unpack.sh put the binaries and samples/models/smollm2 there:
#   1. SmolLM2-135M Q4_1 greedy on a rewriting prompt (PROMPT, default
#      .dev/rewrite.txt: "Repeat the following passage word for word." and
#      700 characters of samples/corpus/alice-ch1-4.txt), plain, --lookup
#      (8 drafted) and --lookup --draft 4, three runs each, on the GPU and on
#      the host's CPUs; prints decode tok/s, acceptance and whether the text
#      equals plain greedy's on the same device;
#   2. the same model under a JSON schema (SCHEMA, default .dev/tool.json)
#      against the same prompt unconstrained, greedy and top-k 40 at T 0.8,
#      on the GPU: the grammar's cost there, full-logit read-back included.
# Results as JSON lines in $OUT/speculative.jsonl, a table on stdout.
set -uo pipefail
cd "$(dirname "$0")/../.."
export VK_DRIVER_FILES=${VK_DRIVER_FILES:-/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json}
: "${OUT:?set OUT}"
G=target/release/generate
M=samples/models/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
PROMPT=${PROMPT:-.dev/rewrite.txt}
SCHEMA=${SCHEMA:-.dev/tool.json}
J=$OUT/speculative.jsonl
: >"$J"
run() { # label, args...
    local label=$1
    shift
    for r in 1 2 3; do
        "$G" -m "$M" --json "$@" 2>/dev/null | python3 -c '
import json, sys
d = json.load(sys.stdin); d["label"] = sys.argv[1]; print(json.dumps(d))' "$label" >>"$J"
    done
}
for dev in gpu cpu; do
    for arm in plain lookup8 lookup4; do
        case $arm in
            plain) extra=() ;;
            lookup8) extra=(--lookup) ;;
            lookup4) extra=(--lookup --draft 4) ;;
        esac
        run "$dev $arm" "--$dev" -f "$PROMPT" --temperature 0 -n 96 "${extra[@]}"
    done
done
W="The weather request for Paris as JSON:"
run "gpu free greedy" --gpu -p "$W" --temperature 0 -n 64
run "gpu schema greedy" --gpu -p "$W" --temperature 0 -n 64 --json-schema "$SCHEMA"
run "gpu free top-k" --gpu -p "$W" --temperature 0.8 --top-k 40 --seed 5 -n 64
run "gpu schema top-k" --gpu -p "$W" --temperature 0.8 --top-k 40 --seed 5 -n 64 --json-schema "$SCHEMA"
python3 - "$J" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
by = {}
for r in rows:
    by.setdefault(r["label"], []).append(r)
print("| arm | generated | decode tok/s (3 runs) | acceptance | tokens / forward | text equals plain |")
print("|---|---:|---|---:|---:|---|")
for label, rs in by.items():
    t = [r["timings"] for r in rs]
    s = rs[0].get("speculative")
    dev = label.split()[0]
    plain = by.get(f"{dev} plain", [None])[0]
    same = "-" if not s or not plain else str(all(r["text"] == plain["text"] for r in rs))
    acc = f'{s["acceptance_rate"]:.0%}' if s else "-"
    per = f'{t[0]["generated_tokens"] / max(1, s["target_forwards"]):.2f}' if s else "1"
    rates = ", ".join(f'{x["decode_tok_per_s"]:.0f}' for x in t)
    print(f"| {label} | {t[0]['generated_tokens']} | {rates} | {acc} | {per} | {same} |")
PY
