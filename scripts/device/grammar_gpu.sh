#!/usr/bin/env bash
# Grammar cost on the lent GPU (issue 20), after scripts/device/unpack.sh put
# the binaries and samples/models/smollm2 there: SmolLM2-135M Q4_1 (or
# MODEL=path, e.g. Gemma-3-270m's 262k vocabulary) on the GPU, greedy and
# top-k 40 at T 0.8 (seed 5), each without and with
# --json-schema samples/fixtures/grammar/get_weather.json (the tool-call
# schema of tests/generate_constrained.rs), REPS (default 3) rounds of the
# four arms interleaved in one run; decode tok/s from --json. Also checks
# that every constrained output parses as JSON and that the reps of an arm
# give the same text. Results as JSON lines in $OUT/grammar_gpu.jsonl, a
# table on stdout, and the grammar's overhead as a share of a free step's
# time (schema ms/token over free ms/token, minus 1; the target is <= 10%).
set -uo pipefail
cd "$(dirname "$0")/../.."
export VK_DRIVER_FILES=${VK_DRIVER_FILES:-/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json}
: "${OUT:?set OUT}"
G=target/release/generate
M=${MODEL:-samples/models/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf}
SCHEMA=${SCHEMA:-samples/fixtures/grammar/get_weather.json}
REPS=${REPS:-3}
J=$OUT/grammar_gpu.jsonl
: >"$J"
W="The weather request for Paris as JSON:"
run() { # label, args...
    local label=$1
    shift
    "$G" -m "$M" --gpu --json -p "$W" -n 64 "$@" 2>"$OUT/stderr.txt" | python3 -c '
import json, sys
d = json.load(sys.stdin); d["label"] = sys.argv[1]; print(json.dumps(d))' "$label" >>"$J" ||
        { echo "$label failed:"; tail -5 "$OUT/stderr.txt"; }
}
for r in $(seq "$REPS"); do
    run "free greedy" --temperature 0
    run "schema greedy" --temperature 0 --json-schema "$SCHEMA"
    run "free top-k 40" --temperature 0.8 --top-k 40 --seed 5
    run "schema top-k 40" --temperature 0.8 --top-k 40 --seed 5 --json-schema "$SCHEMA"
done
python3 - "$J" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
by = {}
for r in rows:
    by.setdefault(r["label"], []).append(r)
print("| arm | generated | decode tok/s (each rep) | median | vs free | step time vs free | same text each rep | JSON parses |")
print("|---|---:|---|---:|---:|---:|---|---|")
for label, rs in by.items():
    rates = [r["timings"]["decode_tok_per_s"] for r in rs]
    free = by.get(label.replace("schema", "free"), rs)
    base = statistics.median(r["timings"]["decode_tok_per_s"] for r in free)
    med = statistics.median(rates)
    same = all(r["text"] == rs[0]["text"] for r in rs)
    ok = "-"
    if label.startswith("schema"):
        try:
            [json.loads(r["text"]) for r in rs]
            ok = "yes"
        except ValueError:
            ok = "**no**"
    print(f"| {label} | {rs[0]['timings']['generated_tokens']} | "
          f"{', '.join(f'{x:.0f}' for x in rates)} | {med:.0f} | {100 * (med / base - 1):+.0f}% | "
          f"{100 * (base / med - 1):+.1f}% | {same} | {ok} |")
for arm in ("greedy", "top-k 40"):
    free, schema = by.get("free " + arm), by.get("schema " + arm)
    if free and schema:
        f = statistics.median(r["timings"]["decode_tok_per_s"] for r in free)
        c = statistics.median(r["timings"]["decode_tok_per_s"] for r in schema)
        print(f"grammar overhead, {arm}: {100 * (f / c - 1):+.1f}% of a free step "
              f"({1e3 / f:.3f} -> {1e3 / c:.3f} ms/token)")
PY
