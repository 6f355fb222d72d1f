#!/usr/bin/env bash
# Speed of `speak` next to onnxruntime running the same Piper voice on the same
# phoneme ids, in the same run. Runs from the repo root on any machine: the lent
# H200 (our binary on the GPU through Vulkan, its CPU path, onnxruntime with every
# execution provider it has) or a developer's machine (lavapipe, CPU).
#
# Needs: the release binary (target/release/speak, built with
# `cargo build --release --bin speak`), samples/models/piper-joe/, python3 with
# numpy and onnxruntime. espeak-ng is not needed: the paragraph's phoneme ids
# come from samples/fixtures/speak/bench.json (made by scripts/fixtures/piper_gold.py).
#
# Usage: scripts/device/speak.sh            (results under $OUT, default /tmp/speak-bench)
#   SPEAK_BIN=path/to/speak: another binary; REPS=1: fewer repetitions (default 3);
#   PYTHON=...: the interpreter with onnxruntime; NO_GPU=1: skip our GPU row (lavapipe is slow)
# Writes $OUT/speak-bench.json, $OUT/speak-bench.md and the WAVs it timed.
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/speak-bench}
mkdir -p "$OUT"
BIN=${SPEAK_BIN:-target/release/speak}
[[ -x $BIN ]] || { echo "speak.sh: $BIN missing: cargo build --release --bin speak" >&2; exit 1; }
PY=${PYTHON:-python3}

"$PY" - "$BIN" "$OUT" <<'PYEOF'
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort

BIN, OUT = sys.argv[1], Path(sys.argv[2])
MODEL = "samples/models/piper-joe/en_US-joe-medium.onnx"
REPS = int(os.environ.get("REPS", "3"))
bench = json.loads(Path("samples/fixtures/speak/bench.json").read_text())
sentences = bench["sentences"]
cfg = json.loads(Path(MODEL + ".json").read_text())
rate = cfg["audio"]["sample_rate"]
scales = [cfg["inference"]["noise_scale"], cfg["inference"]["length_scale"], cfg["inference"]["noise_w"]]


def summarise(name, runs, ttfa):
    """runs: list of lists of (seconds, audio_seconds) per sentence; ttfa:
    time to first audio per run, from process start (ours) or session
    creation (onnxruntime) to the first sentence's samples."""
    totals = [sum(s for s, _ in r) for r in runs]
    audio = sum(a for _, a in runs[0])
    # Steady state: every sentence but the first (which pays shader
    # compilation / session warm-up in a fresh process).
    steady = [sum(s for s, _ in r[1:]) / sum(a for _, a in r[1:]) for r in runs]
    first = [r[0][0] for r in runs]
    return {
        "name": name,
        "audio_seconds": audio,
        "synthesis_seconds_median": statistics.median(totals),
        "rtf_median": statistics.median(totals) / audio,
        "rtf_steady_median": statistics.median(steady),
        "rtf_steady_sd": statistics.stdev(steady) if len(steady) > 1 else 0.0,
        "first_sentence_seconds_median": statistics.median(first),
        "time_to_first_audio_median": statistics.median(ttfa),
        "reps": len(runs),
    }


results = []
info = {
    "machine": platform.node(),
    "cpu_count": os.cpu_count(),
    "onnxruntime": ort.__version__,
    "onnxruntime_providers": ort.get_available_providers(),
}
try:
    info["nvidia"] = subprocess.run(
        ["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
        capture_output=True, text=True, check=True).stdout.strip()
except (OSError, subprocess.CalledProcessError):
    pass

# Ours: one process per repetition, default scales, fixed seed. The ids go
# through --phoneme-ids, so phonemisation is not timed for any engine.
engines = [("speak gpu", []), ("speak cpu", ["--cpu"])]
if os.environ.get("NO_GPU"):
    engines = engines[1:]
for label, extra in engines:
    runs, ttfa = [], []
    for rep in range(REPS):
        cmd = [BIN, "-o", str(OUT / f"{label.replace(' ', '-')}.wav"), "--force", "--seed", "1", "--json", *extra]
        for ids in sentences:
            cmd += ["--phoneme-ids", ",".join(map(str, ids))]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            print(f"{label}: failed: {r.stderr.strip()}", file=sys.stderr)
            break
        j = json.loads(r.stdout)
        info[f"{label} device"] = j["backend"]
        if rep == 0:
            print(r.stderr.strip(), file=sys.stderr)
        runs.append([(s["synthesis_seconds"], s["audio_seconds"]) for s in j["sentences"]])
        ttfa.append(j["time_to_first_audio_seconds"])
        # Where the time goes: --cpu, the prior (text encoder, duration
        # predictor, length regulation) against the flow and the generator;
        # GPU (one submission a sentence), the host's part (noise drawn,
        # the sentence recorded and submitted) against the wait from
        # submission to the audio back.
        prior = sum(s["prior_seconds"] for s in j["sentences"][1:])
        rest = sum(s["flow_and_decoder_seconds"] for s in j["sentences"][1:])
        info.setdefault(f"{label} prior share (sentences 2..n)", []).append(round(prior / (prior + rest), 3))
    if runs:
        results.append(summarise(f"{label} ({info[f'{label} device']})", runs, ttfa))
        print(results[-1], file=sys.stderr)

# onnxruntime on the same ids and scales, every provider it offers here. CUDA
# twice: with Piper's own options (`piper --cuda` asks for cuDNN's heuristic
# convolution algorithms), and with onnxruntime's defaults (an exhaustive
# search of every new input shape, and a sentence's length is a new shape).
providers = []
if "CUDAExecutionProvider" in ort.get_available_providers():
    providers.append(("CUDA (Piper's options)", ("CUDAExecutionProvider", {"cudnn_conv_algo_search": "HEURISTIC"})))
    providers.append(("CUDA (defaults)", "CUDAExecutionProvider"))
providers.append(("CPU", "CPUExecutionProvider"))
for label, provider in providers:
    t_load = time.perf_counter()
    sess = ort.InferenceSession(MODEL, providers=[provider])
    runs, ttfa = [], []
    for rep in range(REPS + 1):
        per = []
        for ids in sentences:
            feed = {
                "input": np.array([ids], dtype=np.int64),
                "input_lengths": np.array([len(ids)], dtype=np.int64),
                "scales": np.array(scales, dtype=np.float32),
            }
            t0 = time.perf_counter()
            audio = sess.run(None, feed)[0]
            per.append((time.perf_counter() - t0, audio.size / rate))
            if rep == 0 and len(per) == 1:
                # Session creation + the first sentence: the cold start an
                # assistant pays (ours includes process start and voice load).
                cold = time.perf_counter() - t_load
        if rep > 0:  # the first pass warms the session up
            runs.append(per)
            ttfa.append(cold)
    results.append(summarise(f"onnxruntime {label}", runs, ttfa))
    print(results[-1], file=sys.stderr)

(OUT / "speak-bench.json").write_text(json.dumps({"info": info, "results": results}, indent=1) + "\n")
lines = [
    f"paragraph: {len(sentences)} sentences, {results[0]['audio_seconds']:.1f} s of audio at {rate} Hz; "
    f"scales {scales}; {REPS} repetitions, medians",
    "",
    "| engine | RTF (whole run) | RTF (steady, sentences 2..n) | first sentence (s) | time to first audio, cold (s) |",
    "|---|---|---|---|---|",
]
for r in results:
    lines.append(
        f"| {r['name']} | {r['rtf_median']:.4f} | {r['rtf_steady_median']:.4f} +- {r['rtf_steady_sd']:.4f} "
        f"| {r['first_sentence_seconds_median']:.3f} | {r['time_to_first_audio_median']:.3f} |"
    )
lines.append("")
lines.append("RTF = synthesis time / audio duration (lower is faster). " + json.dumps(info))
(OUT / "speak-bench.md").write_text("\n".join(lines) + "\n")
print("\n".join(lines))
PYEOF
