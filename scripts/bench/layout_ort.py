#!/usr/bin/env python3
"""onnxruntime's speed on the layout model, next to ocr-layout's.

Usage: layout_ort.py [--markdown] MODEL PAGES_DIR

Prints one JSON object (or, with --markdown, one table row of
scripts/bench/layout.sh's table) per line and configuration:
  - "model": session.run alone on each page's preprocessed input, for every
    execution provider available (CUDA first when present, then CPU);
  - "end to end": rapid-layout (image loading, preprocessing, onnxruntime,
    post-processing), when the rapid_layout package is importable.
Inputs come from rapid-layout's own preprocessing when it is installed,
else from Pillow's bilinear resize, else random values of the same shape
(a CNN's speed does not depend on the pixels); "input" says which.
Two warm-up runs precede each timing.
"""
import glob
import json
import os
import sys
import time

import numpy as np
import onnxruntime as ort


def inputs_for(pages):
    try:
        from rapid_layout.model_handler.pp.pre_process import PPPreProcess
        from rapid_layout.utils.load_image import LoadImage

        pre, load = PPPreProcess(img_size=(800, 608)), LoadImage()
        return "rapid-layout", [pre(load(p)) for p in pages]
    except ImportError:
        pass
    try:
        from PIL import Image

        mean = np.array([0.485, 0.456, 0.406], dtype=np.float32)
        std = np.array([0.229, 0.224, 0.225], dtype=np.float32)
        out = []
        for p in pages:
            img = Image.open(p).convert("RGB").resize((608, 800), Image.BILINEAR)
            bgr = np.asarray(img, dtype=np.float32)[..., ::-1] / 255.0
            out.append(((bgr - mean) / std).transpose(2, 0, 1)[None].astype(np.float32))
        return "pillow", out
    except ImportError:
        rng = np.random.default_rng(0)
        return "random", [rng.standard_normal((1, 3, 800, 608), dtype=np.float32) for _ in pages]


def report(markdown, r):
    if markdown:
        e2e = r["pages_per_s"] if r["what"] == "end to end" else "-"
        model = r["pages_per_s"] if r["what"] == "model" else "-"
        print(f"| {r['engine']} | {r['provider']} (input: {r['input']}) | {r['pages']} | {e2e} | {model} |", flush=True)
    else:
        print(json.dumps(r), flush=True)


def main():
    args = sys.argv[1:]
    markdown = "--markdown" in args
    args = [a for a in args if a != "--markdown"]
    model, pages_dir = args
    pages = sorted(glob.glob(os.path.join(pages_dir, "*.png")))
    if not pages:
        sys.exit(f"no PNG pages in {pages_dir}")
    source, tensors = inputs_for(pages)
    available = ort.get_available_providers()
    for provider in [p for p in ("CUDAExecutionProvider", "CPUExecutionProvider") if p in available]:
        sess = ort.InferenceSession(model, providers=[provider])
        name = sess.get_inputs()[0].name
        for t in tensors[:2]:
            sess.run(None, {name: t})
        start = time.perf_counter()
        for t in tensors:
            sess.run(None, {name: t})
        secs = time.perf_counter() - start
        report(markdown, {
            "engine": f"onnxruntime {ort.__version__}",
            "provider": sess.get_providers()[0],
            "what": "model",
            "input": source,
            "pages": len(tensors),
            "seconds": round(secs, 3),
            "pages_per_s": round(len(tensors) / secs, 3),
        })
    try:
        from rapid_layout import RapidLayout
    except ImportError:
        return
    engine = RapidLayout(model_dir_or_path=model)
    for p in pages[:2]:
        engine(p)
    start = time.perf_counter()
    for p in pages:
        engine(p)
    secs = time.perf_counter() - start
    import importlib.metadata as md

    report(markdown, {
        "engine": f"rapid-layout {md.version('rapid-layout')} (onnxruntime {ort.__version__})",
        "provider": engine.session.session.get_providers()[0],
        "what": "end to end",
        "input": "png",
        "pages": len(pages),
        "seconds": round(secs, 3),
        "pages_per_s": round(len(pages) / secs, 3),
    })


if __name__ == "__main__":
    main()
