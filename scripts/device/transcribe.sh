#!/usr/bin/env bash
# transcribe on the lent H200, in one go from the repository root:
#   - our release binary (carried: target/release/transcribe) with the
#     encoder on the GPU (Vulkan) and, for reference, on the CPU;
#   - faster-whisper on CUDA (float16 and float32) on the same CTranslate2
#     files with the same decoding options, when its wheels are installed.
# Results (markdown tables and JSON) go under $OUT.
#
# Needs, carried with the repository: target/release/transcribe,
# samples/models/whisper-tiny.en, samples/models/whisper-mel (and
# samples/models/whisper-base for the second table), and the test clips of
# Debian's pocketsphinx-testdata (/usr/share/pocketsphinx/test/data/librivox,
# or a copy in samples/librivox, used through CLIPS_DIR).
# faster-whisper is not on the H200 image: put these wheels (Linux x86_64,
# Python 3) in $WHEELS and they are installed offline first:
#   ctranslate2 (4.x; its manylinux wheel carries the CUDA 12 build),
#   faster-whisper, av, tokenizers, huggingface-hub, tqdm, filelock, fsspec,
#   packaging, pyyaml, requests, typing-extensions (and their deps);
#   CUDA libraries: nvidia-cublas-cu12, nvidia-cudnn-cu12 (torch's copies are
#   used when present).
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
    python3 -m pip install --no-index --find-links "$WHEELS" faster-whisper ctranslate2 || echo "faster-whisper wheels did not install"
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

for model in whisper-tiny.en whisper-base; do
    [[ -d samples/models/$model ]] || { echo "skip $model (not carried)"; continue; }
    for ct in float16 float32; do
        echo "== $model, faster-whisper cuda $ct"
        python3 scripts/bench/transcribe.py --model "samples/models/$model" --reps 5 \
            --fw-device cuda --fw-compute-type "$ct" \
            $([[ $ct == float32 ]] && echo --no-cpu --no-gpu) \
            --json "$OUT/$model-$ct.json" | tee "$OUT/$model-$ct.md"
    done
done
echo "== done; results in $OUT"
