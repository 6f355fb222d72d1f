#!/usr/bin/env bash
# A long recording on the lent H200: peak memory and speed of `transcribe`
# on the five LibriVox clips concatenated to about an hour (REPEAT, default
# 120: ~60 min, a 115 MB WAV written to /tmp), tiny.en, greedy, on the GPU.
# Without --vad the file is streamed (decoded twice, piece by piece), so
# the peak RSS should not grow with the length: the same run on REPEAT=8
# (~4 min) comes first for comparison. Holding the samples whole would cost
# 16 kHz x 4 bytes = 230 MB an hour on top.
#
# Needs, carried with the repository: target/release/transcribe,
# samples/models/whisper-tiny.en, samples/models/whisper-mel, and the clips
# (CLIPS_DIR, see scripts/device/transcribe.sh). Results under $OUT.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/transcribe-long}
mkdir -p "$OUT"
exec > >(tee "$OUT/log.txt") 2>&1
echo "== machine"; nvidia-smi -L || true; git log -1 --format='commit %H %s' 2>/dev/null || true
if [[ ! -d /usr/share/pocketsphinx/test/data/librivox && -d samples/librivox ]]; then
    export CLIPS_DIR=samples/librivox
fi
for repeat in 8 "${REPEAT:-120}"; do
    wav=/tmp/librivox-x$repeat.wav
    python3 - "$wav" "$repeat" <<'PY'
import sys
sys.path.insert(0, "scripts/bench")
from transcribe import build_recording
print(f"audio: {build_recording(sys.argv[1], int(sys.argv[2])):.1f} s")
PY
    echo "== x$repeat"
    # Peak RSS of the child through getrusage (no /usr/bin/time needed).
    python3 - "$wav" "$OUT/x$repeat" <<'PY'
import resource, subprocess, sys, time
wav, out = sys.argv[1:]
t0 = time.time()
with open(out + ".txt", "w") as o, open(out + ".err", "w") as e:
    rc = subprocess.call(["target/release/transcribe", "-m", "samples/models/whisper-tiny.en", wav],
                         stdout=o, stderr=e)
peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
print(f"exit {rc}, wall {time.time() - t0:.1f} s, peak RSS {peak:.0f} MB")
print(open(out + ".err").read().strip().splitlines()[-1])
PY
    wc -w "$OUT/x$repeat.txt"
    rm -f "$wav"
done
echo "== done; results in $OUT"
