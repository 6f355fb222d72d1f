#!/usr/bin/env python3
"""onnxruntime (CPU provider) on the paragraph of samples/fixtures/speak/bench.json,
the same phoneme ids and default scales `speak --phoneme-ids` gets: one process,
session creation + every sentence, so a whole-process timer can pair it with
`speak --cpu`. Prints the synthesis seconds and the audio seconds.

Usage: /work/pyenv/bin/python scripts/bench/speak_ort.py [MODEL]
"""
import json
import sys
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort

model = sys.argv[1] if len(sys.argv) > 1 else "samples/models/piper-joe/en_US-joe-medium.onnx"
cfg = json.loads(Path(model + ".json").read_text())
inf = cfg["inference"]
scales = np.array([inf["noise_scale"], inf["length_scale"], inf["noise_w"]], dtype=np.float32)
sentences = json.loads(Path("samples/fixtures/speak/bench.json").read_text())["sentences"]
sess = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
t0 = time.perf_counter()
samples = 0
for ids in sentences:
    feed = {
        "input": np.array([ids], dtype=np.int64),
        "input_lengths": np.array([len(ids)], dtype=np.int64),
        "scales": scales,
    }
    samples += sess.run(None, feed)[0].size
synth = time.perf_counter() - t0
audio = samples / cfg["audio"]["sample_rate"]
print(f"synthesis {synth:.3f} s for {audio:.2f} s of audio (RTF {synth / audio:.4f})")
