#!/usr/bin/env bash
# Pages per second of ocr-layout on the CPU and the GPU, next to onnxruntime
# (and rapid-layout end to end) on the same pages in the same run. Pages are
# rendered from the real PDFs that scripts/setup installs.
#
# Usage: scripts/bench/layout.sh [PAGES]      (default 20 pages)
#   BIN=path/to/ocr-layout   release binary (default target/release/ocr-layout;
#                            build it with cargo build --release --bin ocr-layout)
#   PYTHON=python            with onnxruntime (and rapid-layout, optional)
#   NO_GPU=1                 skip the GPU run
# Prints a markdown table for BENCHMARKS.md.
set -euo pipefail
cd "$(dirname "$0")/../.."
pages_wanted=${1:-20}
BIN=${BIN:-target/release/ocr-layout}
PYTHON=${PYTHON:-python3}
MODEL=samples/models/layout-cdla/layout_cdla.onnx
[[ -x $BIN ]] || { echo "bench: $BIN not found (cargo build --release --bin ocr-layout, or set BIN)" >&2; exit 1; }

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir "$work/pages"
half=$(( (pages_wanted + 1) / 2 ))
pdftoppm -r 100 -png -f 1 -l "$half" /usr/share/doc/libtasn1-doc/libtasn1.pdf "$work/pages/tasn1"
pdftoppm -r 100 -png -f 1 -l $(( pages_wanted - half )) /usr/share/doc/shared-mime-info/shared-mime-info-spec.pdf "$work/pages/mime"
n=$(ls "$work/pages" | wc -l)

# ours ENGINE_ARGS...: one markdown row from ocr-layout's summary line.
ours() {
    local label=$1; shift
    "$BIN" --model "$MODEL" "$@" "$work/pages" >"$work/out.jsonl" 2>"$work/err.log" || { cat "$work/err.log" >&2; return 1; }
    local device summary
    device=$(sed -n 's/^ocr-layout: \(cpu:.*\|gpu:.*\)$/\1/p' "$work/err.log" | head -1)
    summary=$(grep 'page(s) in' "$work/err.log")
    # "N page(s) in S s (P pages/s; model M s)"
    read -r pages secs rate model <<<"$(sed -E 's/.*: ([0-9]+) page\(s\) in ([0-9.]+) s \(([0-9.]+) pages\/s; model ([0-9.]+) s\).*/\1 \2 \3 \4/' <<<"$summary")"
    local model_rate
    model_rate=$(awk -v p="$pages" -v m="$model" 'BEGIN { printf "%.2f", p / m }')
    echo "| ocr-layout $label | $device | $pages | $rate | $model_rate |"
}

echo "| engine | device | pages | pages/s end to end | pages/s model only |"
echo "|---|---|---|---|---|"
ours "--cpu" --cpu
[[ -n ${NO_GPU:-} ]] || ours "(GPU)"
"$PYTHON" scripts/bench/layout_ort.py --markdown "$MODEL" "$work/pages"
echo
echo "pages: $n rendered at 100 dpi from libtasn1.pdf and shared-mime-info-spec.pdf; $(nproc) CPU threads; commit $(git rev-parse --short HEAD)"
