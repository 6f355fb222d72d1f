#!/usr/bin/env bash
# Transcription speed on the lent H200, two parts:
#  1. the speed table: the five LibriVox clips concatenated 8 times (about
#     3.8 minutes), tiny.en and base (when carried), greedy and beam 5: lfm
#     on the GPU (encoder and decoder) and on the CPU, RTF, beside
#     faster-whisper's CPU path (int8, all cores) when its $WHEELS are
#     carried (its CUDA build needs cuBLAS 12, which the image lacks);
#  2. what word timestamps and voice activity detection cost:
#     scripts/bench/transcribe.py --features on the 57 s recording, tiny.en,
#     plain, with --word-timestamps and with --vad, beside faster-whisper
#     (CUDA float16 when its CUDA build finds cuBLAS 12, else reported; and
#     the host CPU, float32, all cores).
# Results (markdown and JSON) go under $OUT.
#
# Needs, carried with the repository: target/release/transcribe,
# samples/models/whisper-tiny.en (and whisper-base), samples/models/whisper-mel,
# samples/models/silero-vad, and the clips (see scripts/device/transcribe.sh
# for CLIPS_DIR and the $WHEELS of faster-whisper, which also needs
# onnxruntime for its VAD: on the image).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/transcribe-features}
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
NV=$(python3 - <<'PY' 2>/dev/null
import glob, os, site
dirs = []
for s in site.getsitepackages():
    dirs += glob.glob(os.path.join(s, "nvidia", "*", "lib"))
print(":".join(dirs))
PY
)
[[ -n "$NV" ]] && export LD_LIBRARY_PATH="$NV:${LD_LIBRARY_PATH:-}"
python3 -c "import onnxruntime; print('onnxruntime', onnxruntime.__version__)" || echo "no onnxruntime: faster-whisper's VAD arm will fail"

for model in whisper-tiny.en whisper-base; do
    [[ -d samples/models/$model ]] || { echo "skip $model (not carried)"; continue; }
    for beam in 1 5; do
        echo "== speed: $model, beam $beam, clips x8; lfm GPU and CPU, faster-whisper cpu int8"
        python3 scripts/bench/transcribe.py --model "samples/models/$model" --reps 3 --repeat 8 \
            --beam-size "$beam" --fw-device cpu --fw-compute-type int8 --fw-threads "$(nproc)" \
            --json "$OUT/speed-$model-beam$beam.json" | tee "$OUT/speed-$model-beam$beam.md"
    done
done

first=1
for arm in "cuda float16" "cpu float32"; do
    read -r dev ct <<<"$arm"
    echo "== whisper-tiny.en, faster-whisper $dev $ct, with --features"
    python3 scripts/bench/transcribe.py --model samples/models/whisper-tiny.en --reps 5 --features \
        --fw-device "$dev" --fw-compute-type "$ct" --fw-threads "$(nproc)" \
        $([[ $first == 1 ]] || echo --no-cpu --no-gpu) \
        --json "$OUT/tiny.en-$dev.json" | tee "$OUT/tiny.en-$dev.md"
    first=0
done
echo "== done; results in $OUT"
