#!/usr/bin/env bash
# transcribe on the lent H200, in one go from the repository root:
#   - our release binary (carried: target/release/transcribe) with the
#     encoder on the GPU (Vulkan) and, for reference, on the CPU;
#   - faster-whisper on CUDA (float16) and the host CPU (float32) on the same CTranslate2
#     files with the same decoding options, when its wheels are installed.
# Results (markdown tables and JSON) go under $OUT.
#
# Needs, carried with the repository: target/release/transcribe,
# samples/models/whisper-tiny.en, samples/models/whisper-mel (and
# samples/models/whisper-base for the second table), and the test clips of
# Debian's pocketsphinx-testdata (/usr/share/pocketsphinx/test/data/librivox,
# or a copy in samples/librivox, used through CLIPS_DIR).
# faster-whisper is not on the H200 image: put the wheels of ctranslate2
# 4.8.5, faster-whisper 1.2.1 and av 19.0.2 (Linux x86_64, CPython 3.12; the
# rest of their needs are on the image) in $WHEELS and they are installed
# offline first. ctranslate2's CUDA build loads cuBLAS 12 (nvidia-cublas-cu12,
# ~600 MB, over the device tool's carry limit); the image's are CUDA 13.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/transcribe-bench}
mkdir -p "$OUT"
exec > >(tee "$OUT/log.txt") 2>&1

echo "== machine"; nvidia-smi -L || true; git log -1 --format='commit %H %s' 2>/dev/null || true
if [[ ! -d /usr/share/pocketsphinx/test/data/librivox && -d samples/librivox ]]; then
    export CLIPS_DIR=samples/librivox
fi
if [[ -n "${WHEELS:-}" ]]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/fw-site "$WHEELS"/*.whl && export PYTHONPATH=/tmp/fw-site${PYTHONPATH:+:$PYTHONPATH} ||
        echo "faster-whisper wheels did not install"
fi
# ctranslate2's CUDA build finds cuBLAS/cuDNN through the loader: use the
# nvidia-* packages that torch brings, if any.
NV=$(python3 - <<'PY' 2>/dev/null
import glob, os, site
dirs = []
for s in site.getsitepackages():
    dirs += glob.glob(os.path.join(s, "nvidia", "*", "lib"))
print(":".join(dirs))
PY
)
[[ -n "$NV" ]] && export LD_LIBRARY_PATH="$NV:${LD_LIBRARY_PATH:-}"

echo "== lfm: one clip on the GPU and the CPU (the words must match)"
clip=${CLIPS_DIR:-/usr/share/pocketsphinx/test/data/librivox}/sense_and_sensibility_01_austen_64kb-0870.wav
target/release/transcribe -m samples/models/whisper-tiny.en "$clip"
target/release/transcribe --cpu -m samples/models/whisper-tiny.en "$clip"

# faster-whisper on CUDA where ctranslate2's CUDA 12 build finds cuBLAS 12
# (the H200 image of 2026-11 has CUDA 13's only: that arm then reports the
# missing library), and on the host's CPU with all its cores.
for model in whisper-tiny.en whisper-base; do
    [[ -d samples/models/$model ]] || { echo "skip $model (not carried)"; continue; }
    first=1
    for arm in "cuda float16" "cpu float32"; do
        read -r dev ct <<<"$arm"
        echo "== $model, faster-whisper $dev $ct"
        python3 scripts/bench/transcribe.py --model "samples/models/$model" --reps 5 \
            --fw-device "$dev" --fw-compute-type "$ct" --fw-threads "$(nproc)" \
            $([[ $first == 1 ]] || echo --no-cpu --no-gpu) \
            --json "$OUT/$model-$dev.json" | tee "$OUT/$model-$dev.md"
        first=0
    done
done
echo "== done; results in $OUT"
