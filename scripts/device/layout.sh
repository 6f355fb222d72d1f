#!/usr/bin/env bash
# ocr-layout on a lent GPU machine (the H200), in one go from the repo root:
#   1. the adapter, driver and onnxruntime providers on this machine;
#   2. correctness on this GPU: ocr-layout's boxes on the two fixture pages
#      against rapid-layout's (same count and classes, IoU >= 0.98);
#   3. speed: pages per second on the GPU and on the CPU, end to end and
#      model only, next to onnxruntime (CUDA when that provider exists,
#      and CPU) on the same pages in the same run.
# Pages: the two fixture pages (rendered from real PDFs), copied to make
# PAGES pages (the machine has no PDF renderer; a CNN's speed does not
# depend on the pixels).
#
# Needs: the release binary built on the dev machine (BIN, default
# target/release/ocr-layout), samples/models/layout-cdla/layout_cdla.onnx,
# python3 with numpy and onnxruntime. Writes $OUT/layout-device.md and logs.
set -euo pipefail
cd "$(dirname "$0")/../.."
BIN=${BIN:-target/release/ocr-layout}
MODEL=samples/models/layout-cdla/layout_cdla.onnx
FIX=samples/fixtures/layout
PAGES=${PAGES:-100}
CPU_PAGES=${CPU_PAGES:-20}
OUT=${OUT:-$(mktemp -d)}
mkdir -p "$OUT"
report="$OUT/layout-device.md"
for f in "$BIN" "$MODEL" "$FIX/layout.json"; do
    [[ -e $f ]] || { echo "layout.sh: $f is missing" >&2; exit 1; }
done

{
    echo "# ocr-layout on $(hostname), $(date -u +%Y-%m-%dT%H:%MZ), commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
    echo
    echo '```'
    nvidia-smi -L 2>&1 || true
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 || true
    echo "cpu: $(nproc) threads, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
    python3 -c 'import onnxruntime as o; print("onnxruntime", o.__version__, o.get_available_providers())' 2>&1 || true
    echo '```'
    echo
} >"$report"

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# 2. correctness on this adapter.
# A failing step is reported and the rest still runs.
"$BIN" --model "$MODEL" "$FIX"/page-*.png >"$OUT/fixture-gpu.jsonl" 2>"$OUT/fixture-gpu.log" ||
    echo "ocr-layout on the GPU failed: $(tail -3 "$OUT/fixture-gpu.log")" >>"$report"
"$BIN" --cpu --model "$MODEL" "$FIX"/page-*.png >"$OUT/fixture-cpu.jsonl" 2>"$OUT/fixture-cpu.log" ||
    echo "ocr-layout on the CPU failed: $(tail -3 "$OUT/fixture-cpu.log")" >>"$report"
python3 - "$FIX/layout.json" "$OUT/fixture-gpu.jsonl" "$OUT/fixture-cpu.jsonl" >>"$report" <<'EOF'
import json, os, sys
gold = json.load(open(sys.argv[1]))
def iou(a, b):
    ix = max(0.0, min(a["x1"], b["x1"]) - max(a["x0"], b["x0"]))
    iy = max(0.0, min(a["y1"], b["y1"]) - max(a["y0"], b["y0"]))
    inter = ix * iy
    area = lambda r: (r["x1"] - r["x0"]) * (r["y1"] - r["y0"])
    return inter / (area(a) + area(b) - inter)
print("## Boxes against rapid-layout (fixture pages)\n")
print("| engine | page | boxes (ours / gold) | same classes | min IoU |")
print("|---|---|---|---|---|")
ok = True
for path in sys.argv[2:]:
    engine = "gpu" if "gpu" in path else "cpu"
    for line in open(path):
        rec = json.loads(line)
        page = next(p for p in gold["pages"] if rec["image"].endswith(p["image"]))
        ours, want = rec["boxes"], page["boxes"]
        used, worst, classes = set(), 1.0, sorted(b["class"] for b in ours) == sorted(b["class"] for b in want)
        for w in want:
            cands = [(iou(o, w), i) for i, o in enumerate(ours) if o["class"] == w["class"] and i not in used]
            best = max(cands, default=(0.0, None))
            worst = min(worst, best[0])
            if best[1] is not None:
                used.add(best[1])
        good = len(ours) == len(want) and classes and worst >= 0.98
        ok &= good
        print(f"| {engine} | {page['image']} | {len(ours)} / {len(want)} | {classes} | {worst:.4f}{'' if good else ' FAIL'} |")
print(f"\nparity: {'PASS' if ok else 'FAIL'}\n")
EOF

# 3. speed.
mkdir "$work/pages" "$work/cpu-pages"
i=0
while ((i < PAGES)); do
    for p in "$FIX"/page-*.png; do
        ((i < PAGES)) || break
        cp "$p" "$work/pages/$(printf '%04d' "$i").png"
        ((i < CPU_PAGES)) && cp "$p" "$work/cpu-pages/$(printf '%04d' "$i").png"
        i=$((i + 1))
    done
done

ours() {
    local label=$1 dir=$2; shift 2
    "$BIN" --model "$MODEL" "$@" "$dir" >/dev/null 2>"$work/err.log" || { cat "$work/err.log" >>"$OUT/speed.log"; return 1; }
    cat "$work/err.log" >>"$OUT/speed.log"
    local device summary pages secs rate model
    device=$(sed -n 's/^ocr-layout: \(cpu:.*\|gpu:.*\)$/\1/p' "$work/err.log" | head -1)
    summary=$(grep 'page(s) in' "$work/err.log")
    read -r pages secs rate model <<<"$(sed -E 's/.*: ([0-9]+) page\(s\) in ([0-9.]+) s \(([0-9.]+) pages\/s; model ([0-9.]+) s\).*/\1 \2 \3 \4/' <<<"$summary")"
    echo "| ocr-layout $label | $device | $pages | $rate | $(awk -v p="$pages" -v m="$model" 'BEGIN { printf "%.2f", p / m }') |"
}

{
    echo "## Speed (pages per second)"
    echo
    echo "| engine | device | pages | end to end | model only |"
    echo "|---|---|---|---|---|"
    ours "(GPU)" "$work/pages" || echo "| ocr-layout (GPU) | failed: see speed.log | | | |"
    ours "--cpu" "$work/cpu-pages" --cpu || echo "| ocr-layout --cpu | failed: see speed.log | | | |"
    python3 scripts/bench/layout_ort.py --markdown "$MODEL" "$work/pages" 2>>"$OUT/speed.log" ||
        echo "| onnxruntime | failed: see speed.log | | | |"
    echo
    echo "End to end: PNG decoding, preprocessing, model, post-processing, JSON. Model only: ocr-layout's"
    echo "forward passes (device work and read-back) / onnxruntime's session.run, on preprocessed inputs."
} >>"$report"
cat "$report"
