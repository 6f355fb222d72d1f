#!/usr/bin/env bash
# ocr-layout's text reading on a lent machine (the H200), from the repo root:
#   1. the adapter, CPU and onnxruntime providers;
#   2. ocr-layout on the text fixture page (samples/fixtures/ocr/page.png)
#      copied PAGES times: pages per second end to end on the GPU (layout
#      and the text networks' convolutional parts; the recogniser's
#      attention/CTC head and the classifier's head on the CPU) and with
#      --cpu, with the tool's own layout / text split; the strings of both
#      arms checked against RapidOCR's gold;
#   3. the peer: onnxruntime (CUDA when present, and CPU) running the same
#      three PP-OCRv4 files on the inputs RapidOCR gives them for that page
#      (detector 736 x 928, 18 recogniser lines at RapidOCR's group widths,
#      18 classifier crops): network time per page, no pre/post-processing
#      (RapidOCR itself is not installed on the device).
#
# Needs: BIN (default target/release/ocr-layout, built on the dev machine),
# samples/models/{layout-cdla,ppocr-v4}, python3 with numpy and onnxruntime.
# Writes $OUT/ocr-device.md and logs.
set -euo pipefail
cd "$(dirname "$0")/../.."
BIN=${BIN:-target/release/ocr-layout}
PAGES=${PAGES:-20}
OUT=${OUT:-$(mktemp -d)}
FIX=samples/fixtures/ocr
mkdir -p "$OUT"
report="$OUT/ocr-device.md"
for f in "$BIN" samples/models/layout-cdla/layout_cdla.onnx samples/models/ppocr-v4/ch_PP-OCRv4_det_infer.onnx "$FIX/gold.json"; do
    [[ -e $f ]] || { echo "ocr.sh: $f is missing" >&2; exit 1; }
done
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for i in $(seq 1 "$PAGES"); do cp "$FIX/page.png" "$work/p$i.png"; done

{
    echo "# ocr-layout text reading on $(hostname), $(date -u +%Y-%m-%dT%H:%MZ), commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
    echo '```'
    nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>&1 || true
    echo "cpu: $(nproc) threads, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
    python3 -c 'import onnxruntime as o; print("onnxruntime", o.__version__, o.get_available_providers())' 2>&1 || true
    echo '```'
    echo
    echo "| run | pages | seconds | pages/s |"
    echo "|---|---|---|---|"
} >"$report"

for arm in gpu cpu; do
    flag=""; [[ $arm == cpu ]] && flag="--cpu"
    start=$(date +%s.%N)
    if "$BIN" $flag "$work"/p*.png >"$OUT/ours-$arm.jsonl" 2>"$OUT/ours-$arm.log"; then
        end=$(date +%s.%N)
        split=$(grep -o 'layout [0-9.]* s, text [0-9.]* s' "$OUT/ours-$arm.log" | tail -1)
        python3 -c "import sys; s=$end-$start; print(f'| ocr-layout $arm ({\"GPU\" if \"$arm\"==\"gpu\" else \"CPU\"}; $split) | $PAGES | {s:.2f} | {$PAGES/s:.2f} |')" >>"$report"
    else
        echo "| ocr-layout $arm failed: $(tail -2 "$OUT/ours-$arm.log" | tr '\n' ' ') | | | |" >>"$report"
    fi
done

python3 - "$PAGES" >>"$report" 2>"$OUT/ort.log" <<'PY' || echo "onnxruntime peer failed: $(tail -2 "$OUT/ort.log")" >>"$report"
import sys, time, json
import numpy as np, onnxruntime as ort
pages = int(sys.argv[1])
d = "samples/models/ppocr-v4/"
gold = json.load(open("samples/fixtures/ocr/gold.json"))
# RapidOCR's group widths for the 18 lines of the fixture page (ratio-sorted groups of 6).
boxes = [np.array(b) for b, _, _ in gold["final"]]
ratios = sorted((np.linalg.norm(b[0] - b[1]) / np.linalg.norm(b[0] - b[3])) for b in boxes)
widths = []
for g in range(0, len(ratios), 6):
    w = int(48 * max(320 / 48, max(ratios[g:g + 6])))
    widths += [w] * len(ratios[g:g + 6])
rng = np.random.default_rng(0)
for prov in [p for p in ("CUDAExecutionProvider", "CPUExecutionProvider") if p in ort.get_available_providers()]:
    s = {k: ort.InferenceSession(d + f, providers=[prov]) for k, f in
         [("det", "ch_PP-OCRv4_det_infer.onnx"), ("rec", "ch_PP-OCRv4_rec_infer.onnx"), ("cls", "ch_ppocr_mobile_v2.0_cls_infer.onnx")]}
    det_x = rng.standard_normal((1, 3, 736, 928), dtype=np.float32)
    rec_x = [rng.standard_normal((1, 3, 48, w), dtype=np.float32) for w in widths]
    cls_x = rng.standard_normal((6, 3, 48, 192), dtype=np.float32)
    def page():
        s["det"].run(None, {"x": det_x})
        for _ in range(3):
            s["cls"].run(None, {"x": cls_x})
        for x in rec_x:
            s["rec"].run(None, {"x": x})
    page()
    t = time.perf_counter()
    for _ in range(pages):
        page()
    secs = time.perf_counter() - t
    print(f"| onnxruntime {prov} (networks only) | {pages} | {secs:.2f} | {pages / secs:.2f} |")
PY
python3 - "$FIX/gold.json" "$OUT/ours-cpu.jsonl" "$OUT/ours-gpu.jsonl" >>"$report" <<'PY'
import json, sys
gold = json.load(open(sys.argv[1]))
want = [t for _, t, _ in gold["final"]]
print()
for arm, path in zip(("cpu", "gpu"), sys.argv[2:]):
    try:
        got = [l["text"] for l in json.loads(open(path).readline())["lines"]]
    except (OSError, ValueError, KeyError):
        print(f"{arm}: no output")
        continue
    same = sum(a == b for a, b in zip(got, want))
    print(f"{arm}: strings equal to RapidOCR's: {same} of {len(want)} (ours has {len(got)} lines)")
print()
PY

cat "$report"
