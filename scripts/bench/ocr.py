#!/usr/bin/env python3
"""ocr-layout's text reading against RapidOCR (onnxruntime), same pages,
same run: character error rate against the PDF's own text layer
(pdftotext) and pages per second end to end.

Pages: PAGES of libtasn1's manual (Debian libtasn1-doc), rendered at DPI
with pdftoppm. CER: Levenshtein distance between the page's text (ours:
the "text" field, regions in reading order; RapidOCR: its lines in its
order) and pdftotext's, both with whitespace removed (so line breaks and
spacing do not count, reading order does), divided by pdftotext's length.

Usage: scripts/bench/ocr.py [--bin target/release/ocr-layout] [--pages 5-7] [--dpi 100]
Needs: rapidocr-onnxruntime==1.4.4 and poppler-utils.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

PDF = "/usr/share/doc/libtasn1-doc/libtasn1.pdf"


def levenshtein(a, b):
    prev = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        cur = [i] + [0] * len(b)
        for j, cb in enumerate(b, 1):
            cur[j] = min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (ca != cb))
        prev = cur
    return prev[-1]


def squeeze(text):
    return "".join(text.split())


def cer(got, want):
    want = squeeze(want)
    return levenshtein(squeeze(got), want) / max(1, len(want))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="target/release/ocr-layout")
    ap.add_argument("--pages", default="5-7")
    ap.add_argument("--dpi", type=int, default=100)
    ap.add_argument("--pdf", default=PDF)
    args = ap.parse_args()
    first, last = (int(x) for x in args.pages.split("-"))
    from rapidocr_onnxruntime import RapidOCR

    tmp = tempfile.mkdtemp()
    subprocess.run(["pdftoppm", "-r", str(args.dpi), "-f", str(first), "-l", str(last), "-png", args.pdf, f"{tmp}/p"], check=True)
    images = sorted(os.path.join(tmp, f) for f in os.listdir(tmp))
    truth = [
        subprocess.run(["pdftotext", "-f", str(p), "-l", str(p), args.pdf, "-"], check=True, capture_output=True, text=True).stdout
        for p in range(first, last + 1)
    ]

    engine = RapidOCR()
    engine(images[0])  # warm up
    t = time.perf_counter()
    theirs = []
    for img in images:
        res, _ = engine(img)
        theirs.append("\n".join(r[1] for r in (res or [])))
    rapid_s = time.perf_counter() - t

    t = time.perf_counter()
    out = subprocess.run([args.bin, "--cpu", "-q", *images], check=True, capture_output=True, text=True).stdout
    ours_s = time.perf_counter() - t
    ours = [json.loads(line)["text"] for line in out.splitlines()]

    n = len(images)
    print(f"pages {args.pdf} {first}-{last} at {args.dpi} dpi ({n} pages); cpu: {os.cpu_count()} threads; load average {os.getloadavg()[0]:.1f}")
    print()
    print("| engine | pages/s | CER vs pdftotext (per page) | mean CER |")
    print("|---|---|---|---|")
    for name, secs, texts in [("RapidOCR 1.4.4 (onnxruntime CPU)", rapid_s, theirs), ("ocr-layout --cpu", ours_s, ours)]:
        c = [cer(g, w) for g, w in zip(texts, truth)]
        print(f"| {name} | {n / secs:.3f} | {' '.join(f'{x:.3f}' for x in c)} | {sum(c) / len(c):.3f} |")
    print()
    print(f"speed ratio ocr-layout / RapidOCR: {rapid_s / ours_s:.2f}x (ocr-layout includes the layout model and process start)")


if __name__ == "__main__":
    sys.exit(main())
