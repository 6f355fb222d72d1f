#!/usr/bin/env bash
# transcribe against faster-whisper on the same H200 (issue 22 item 4), in
# one call after scripts/device/unpack.sh, from the repository root:
#   - faster-whisper (ctranslate2 4.8.5's CUDA build, float16) from the
#     bundle of scripts/device/pack_fw.sh (.dev/fw-site.tar.xz, carried);
#   - our release binary on the GPU and on the host CPU;
#   - faster-whisper int8 on the host CPU, for the CPU column.
# Same audio (the LibriVox clips concatenated REPEAT times, default 4:
# ~119 s), same CTranslate2 files, same options (scripts/bench/transcribe.py),
# beam sizes BEAMS (default "1 5"), REPS runs each (default 3), for each
# model in MODELS that was carried (default whisper-tiny.en whisper-base).
# Then the batched pipelines (unless BATCHES is empty; default "8 32"): ours
# (--batch-size N) against faster-whisper's BatchedInferencePipeline on
# CUDA, the same 30 s clips of the clips concatenated BATCH_REPEAT times
# (default 16: ~476 s, 16 windows). Every lfm arm prints its profile line
# (encoder, decoder passes and their cost, host search, submissions, bytes
# read back): where its time goes. AHEADS (default "8") runs the GPU arm
# once for each value of LFM_GREEDY_AHEAD (greedy passes a submission; 1:
# one token a submission); NO_CPU=1 leaves out both CPU arms. BINARY names
# another build's transcribe for the lfm arms (an A/B against the default
# target/release/transcribe in the same call).
# First, when carried (pack.sh TESTS / EXAMPLES): the Whisper kernels'
# parity (gpu_parity: whisper_select_part, whisper_select, whisper_sample
# and attention_tiled), the GPU transcription tests (transcribe_gpu), and
# the decoder step's kernels timed with device timestamps
# (whisper_profile: 1, 8, 32 windows greedy, 1 window with 5 beams, 1
# with 5 samples at T 0.2).
#
# ctranslate2's wheel opens libcublas.so.12 at run time; the image has
# CUDA 13's cuBLAS (torch's nvidia-cublas), and cuDNN 9 (libcudnn.so.9,
# which ctranslate2 takes from any CUDA 12+ build). The script first tries
# the libraries as they are, then a shim folder where libcublas.so.12 and
# libcublasLt.so.12 point at the CUDA 13 ones (ctranslate2 looks its cuBLAS
# functions up by name), and says which one ran; the text of every arm is
# printed so a wrong answer shows. If neither loads, the CUDA 12 cuBLAS
# itself (nvidia-cublas-cu12, ~550 MB) would have to travel in chunks.
# Results (log, markdown, JSON) in /tmp/transcribe-fw, tarred into $OUT at
# the end when it is set (the device tool brings back a few files only).
set -uo pipefail
cd "$(dirname "$0")/../.."
R=/tmp/transcribe-fw
mkdir -p "$R"
exec > >(tee "$R/log.txt") 2>&1
echo "== machine"; nvidia-smi -L || true; nproc
git log -1 --format='commit %H %s' 2>/dev/null || true
if [[ ! -d /usr/share/pocketsphinx/test/data/librivox && -d samples/librivox ]]; then
    export CLIPS_DIR=samples/librivox
fi
[[ -z ${CLIPS_DIR:-} && -d /tmp/lfm-stash/librivox ]] && export CLIPS_DIR=/tmp/lfm-stash/librivox
SITE=/tmp/fw-site
if [[ -f .dev/fw-site.tar.xz ]]; then
    rm -rf "$SITE" && mkdir -p "$SITE" && tar xJf .dev/fw-site.tar.xz -C "$SITE"
fi
[[ -d $SITE/ctranslate2 ]] || { echo "no faster-whisper bundle (.dev/fw-site.tar.xz)"; exit 1; }
export PYTHONPATH=$SITE${PYTHONPATH:+:$PYTHONPATH}
NV=$(python3 - <<'PY' 2>/dev/null
import glob, os, site
dirs = []
for s in site.getsitepackages():
    dirs += glob.glob(os.path.join(s, "nvidia", "*", "lib")) + glob.glob(os.path.join(s, "nvidia", "*", "*", "lib"))
print(":".join(sorted(set(dirs))))
PY
)
export LD_LIBRARY_PATH="$NV${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
cuda_ok() {
    python3 - <<'PY'
import sys, numpy as np
import ctranslate2
from faster_whisper import WhisperModel
print("ctranslate2", ctranslate2.__version__, "CUDA devices", ctranslate2.get_cuda_device_count())
import glob
m = WhisperModel(sorted(glob.glob("samples/models/whisper-*/model.bin"))[0].rsplit("/", 1)[0],
                 device="cuda", compute_type="float16")
segs, _ = m.transcribe(np.zeros(16000, np.float32), language="en", beam_size=1)
list(segs)
print("faster-whisper on CUDA: ok")
PY
}
echo "== faster-whisper on CUDA, libraries as they are"
if ! cuda_ok; then
    shim=/tmp/cublas12-shim
    mkdir -p "$shim"
    for lib in libcublas libcublasLt; do
        src=$(IFS=:; for d in $LD_LIBRARY_PATH; do ls "$d/$lib.so.13" 2>/dev/null; done | head -1)
        [[ -n $src ]] && ln -sf "$src" "$shim/$lib.so.12"
    done
    ls -la "$shim"
    export LD_LIBRARY_PATH="$shim:$LD_LIBRARY_PATH"
    echo "== faster-whisper on CUDA through the cuBLAS 13 shim"
    cuda_ok || echo "faster-whisper's CUDA arm cannot run here: see the errors above"
fi
if [[ -x target/release/gpu_parity ]]; then
    echo "== gpu_parity: the Whisper decoder's kernels"
    LFM_PARITY_ONLY=whisper_select_part,whisper_select,whisper_sample,whisper_next,attention_tiled,attention_tiled_merge,matmul_thin,matmul_thin_norm,layer_norm \
        target/release/gpu_parity kernels_match_cpu --nocapture 2>&1 | tail -12
fi
if [[ -x target/release/transcribe_gpu ]]; then
    echo "== transcribe_gpu"
    target/release/transcribe_gpu --test-threads 1 2>&1 | tail -5
fi
if [[ -x target/release/whisper_profile ]]; then
    echo "== whisper_profile: a decoder step's kernels"
    for model in ${MODELS:-whisper-tiny.en whisper-base}; do
        [[ -d samples/models/$model ]] || continue
        target/release/whisper_profile --model "samples/models/$model" --windows 1,8,32 --steps 32 \
            --audio "${CLIPS_DIR:-/usr/share/pocketsphinx/test/data/librivox}/sense_and_sensibility_01_austen_64kb-0870.wav" |
            tee "$R/whisper-profile-$model.md"
    done
fi
for model in ${MODELS:-whisper-tiny.en whisper-base}; do
    [[ -d samples/models/$model ]] || { echo "skip $model (not carried)"; continue; }
    for beam in ${BEAMS:-1 5}; do
        for ahead in ${AHEADS:-8}; do
            echo "== $model, beam $beam: lfm GPU (LFM_GREEDY_AHEAD=$ahead)$([[ -n ${NO_CPU:-} ]] || echo ", lfm --cpu"), faster-whisper cuda float16"
            LFM_GREEDY_AHEAD=$ahead python3 scripts/bench/transcribe.py --model "samples/models/$model" \
                --reps "${REPS:-3}" --repeat "${REPEAT:-4}" --beam-size "$beam" ${NO_CPU:+--no-cpu} ${BINARY:+--binary "$BINARY"} \
                --fw-device cuda --fw-compute-type float16 \
                --json "$R/$model-b$beam-a$ahead-cuda.json" | tee "$R/$model-b$beam-a$ahead-cuda.md"
        done
        if [[ -z ${NO_CPU:-} ]]; then
            echo "== $model, beam $beam: faster-whisper cpu int8, $(nproc) threads"
            python3 scripts/bench/transcribe.py --model "samples/models/$model" --reps "${REPS:-3}" \
                --repeat "${REPEAT:-4}" --beam-size "$beam" --no-cpu --no-gpu --fw-device cpu \
                --fw-compute-type int8 --fw-threads "$(nproc)" \
                --json "$R/$model-b$beam-cpu.json" | tee "$R/$model-b$beam-cpu.md"
        fi
        if [[ -n ${BATCHES-8 32} ]]; then
            echo "== $model, beam $beam, batched ${BATCHES-8 32}: lfm GPU, faster-whisper cuda float16"
            python3 scripts/bench/transcribe.py --model "samples/models/$model" --reps "${REPS:-3}" \
                --repeat "${BATCH_REPEAT:-16}" --beam-size "$beam" --no-cpu --batched-only ${BINARY:+--binary "$BINARY"} \
                --batch-sizes "$(echo ${BATCHES-8 32} | tr ' ' ,)" --fw-device cuda --fw-compute-type float16 \
                --json "$R/$model-b$beam-batched.json" | tee "$R/$model-b$beam-batched.md"
        fi
    done
done
echo "== done; results in $R"
[[ -n ${OUT:-} ]] && tar czf "$OUT/transcribe-fw.tgz" -C /tmp transcribe-fw
