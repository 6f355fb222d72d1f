#!/usr/bin/env python3
"""Sentences per second: our `embed` against sentence-transformers, same
machine, same sentences, same batch sizes, in one run.

Both sides are timed end to end over a list of sentences (tokenisation,
encoder, pooling, normalisation; model loading and, for
sentence-transformers, one warm-up call excluded). Our time is the one
`embed` prints on stderr, which excludes loading the model and compiling the
GPU pipelines. Each measurement is repeated; the table gives mean +- sd.

Usage (from the repo root):
  python3 scripts/bench/embed_bench.py --binary target/release/embed \
      [--ours-args=--cpu] [--st-device cpu|cuda] [--batch-sizes 1,32,256] \
      [--repeats 3] [--out FILE.md] [--parity]

--parity also embeds the gold sentences of samples/fixtures/embed with our
binary and reports the lowest cosine to sentence-transformers' vectors.
"""
import argparse
import json
import os
import platform
import random
import re
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODEL = os.path.join(ROOT, "samples", "models", "all-minilm-l6-v2")

WORDS = (
    "the a of and to in is that it was for on are as with his they at be this from have "
    "or by one had not but what all were when we there can an your which their said if do "
    "will each about how up out them then she many some so these would other into has more "
    "her two like him see time could no make than first been its who now people my made over "
    "did down only way find use may water long little very after words called just where most "
    "know get through back much before go good new write our used me man too any day same right "
    "look think also around another came come work three word must because does part even place "
    "well such here take why things help put years different away again off went old number great "
    "tell men say small every found still between name should home big give air line set own under "
    "read last never us left end along while might next sound below saw something thought both few "
    "those always looked show large often together asked house don't world going want school important "
    "until form food keep children feet land side without boy once animals life enough took sometimes "
    "four head above kind began almost live page got earth need far hand high year mother light parts "
    "country father let night following picture being study second eyes soon times story boys since "
    "white days ever paper hard near sentence better best across during today others however sure means "
    "knew it's try told young miles sun ways thing whole hear example heard several change answer room "
    "sea against top turned learn point city play toward five using himself usually money seen didn't "
    "car morning i'm body upon family later turn move face door cut done group true leave color red "
    "friends pulled easy piece surface river halfway university embeddings transformer sentence"
).split()


def sentences(n, seed=1234):
    """n sentences of 4 to 40 words (about 6 to 50 tokens), fixed by the seed."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        k = min(40, max(4, int(rng.lognormvariate(2.6, 0.5))))
        words = [rng.choice(WORDS) for _ in range(k)]
        words[0] = words[0].capitalize()
        out.append(" ".join(words) + rng.choice([".", ".", ".", "?", "!"]))
    return out


def run_ours(binary, extra, path, batch):
    cmd = [binary, "--input", path, "--batch-size", str(batch), "--format", "npy", *extra]
    p = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if p.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed:\n{p.stderr}")
    m = re.search(r"embed: (\d+) texts, (\d+) tokens in ([0-9.]+) s", p.stderr)
    if not m:
        sys.exit(f"no timing line in:\n{p.stderr}")
    device = re.search(r"loaded .* on (.*)", p.stderr).group(1)
    return int(m.group(1)) / float(m.group(3)), int(m.group(2)), device


def same_weights(st, binary, extra, batch, n):
    """Lowest cosine between our vectors and sentence-transformers' for the
    benchmark's first n sentences."""
    import numpy as np

    sents = sentences(n)
    with tempfile.TemporaryDirectory() as d:
        path, npy = os.path.join(d, "s.txt"), os.path.join(d, "v.npy")
        with open(path, "w", encoding="utf-8") as f:
            f.write("\n".join(sents) + "\n")
        cmd = [binary, "--input", path, "--batch-size", str(batch), "--output", npy, *extra]
        p = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        if p.returncode != 0:
            sys.exit(f"{' '.join(cmd)} failed:\n{p.stderr}")
        got = np.load(npy)
    want = st.encode(sents, batch_size=batch, convert_to_numpy=True)
    cos = (got * want).sum(1) / (np.linalg.norm(got, axis=1) * np.linalg.norm(want, axis=1))
    return float(cos.min())


def mean_sd(xs):
    return statistics.mean(xs), (statistics.stdev(xs) if len(xs) > 1 else 0.0)


def parity(binary, extra):
    import numpy as np
    from safetensors.numpy import load_file

    fx = os.path.join(ROOT, "samples", "fixtures", "embed")
    meta = json.load(open(os.path.join(fx, "gold.json"), encoding="utf-8"))
    gold = load_file(os.path.join(fx, "gold.safetensors"))["default"]
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "v.npy")
        # Texts as arguments: some gold sentences hold newlines.
        cmd = [binary, "--format", "npy", "--output", out, *extra, "--", *meta["sentences"]]
        p = subprocess.run(cmd, stderr=subprocess.PIPE, text=True)
        if p.returncode != 0:
            sys.exit(f"parity run failed:\n{p.stderr}")
        got = np.load(out)
    cos = (got * gold).sum(1) / (np.linalg.norm(got, axis=1) * np.linalg.norm(gold, axis=1))
    return float(cos.min())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--binary", default=os.path.join(ROOT, "target", "release", "embed"))
    ap.add_argument("--ours-args", default="", help="extra arguments for embed, e.g. --cpu")
    ap.add_argument("--st-device", default="cpu")
    ap.add_argument("--batch-sizes", default="1,32,256")
    ap.add_argument("--sentences", type=int, default=2048)
    ap.add_argument("--sentences-batch1", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, help="CPU threads for both sides (torch, rayon)")
    ap.add_argument("--out")
    ap.add_argument("--parity", action="store_true")
    ap.add_argument("--same-weights", action="store_true",
                    help="compare our vectors with sentence-transformers' on the benchmark's own "
                         "sentences at the largest batch (for a model without gold vectors, such as "
                         "a random one of the real shapes)")
    args = ap.parse_args()
    extra = args.ours_args.split()

    if args.threads:
        os.environ["RAYON_NUM_THREADS"] = str(args.threads)
    import torch
    import sentence_transformers
    from sentence_transformers import SentenceTransformer

    if args.threads:
        torch.set_num_threads(args.threads)

    st = SentenceTransformer(MODEL, device=args.st_device)
    lines = []
    say = lambda s="": (print(s), lines.append(s))
    say(f"- date: {time.strftime('%Y-%m-%d %H:%M')}")
    say(f"- machine: {platform.node()}, {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs; torch threads {torch.get_num_threads()}")
    say(f"- sentence-transformers {sentence_transformers.__version__}, torch {torch.__version__}, device {args.st_device}"
        + (f" ({torch.cuda.get_device_name()})" if args.st_device.startswith("cuda") else ""))
    say(f"- ours: `{os.path.relpath(args.binary, ROOT)} {args.ours_args}`"
        + (f", RAYON_NUM_THREADS={args.threads}" if args.threads else ""))
    batches = [int(b) for b in args.batch_sizes.split(",")]
    rows = []
    device = None
    with tempfile.TemporaryDirectory() as d:
        for b in batches:
            n = args.sentences_batch1 if b == 1 else args.sentences
            sents = sentences(n)
            path = os.path.join(d, f"s{n}.txt")
            with open(path, "w", encoding="utf-8") as f:
                f.write("\n".join(sents) + "\n")
            ours, st_rates = [], []
            st.encode(sents[: max(b, 8)], batch_size=b)  # warm-up
            for _ in range(args.repeats):
                rate, tokens, device = run_ours(args.binary, extra, path, b)
                ours.append(rate)
                if args.st_device.startswith("cuda"):
                    torch.cuda.synchronize()
                t = time.perf_counter()
                st.encode(sents, batch_size=b, convert_to_numpy=True)
                if args.st_device.startswith("cuda"):
                    torch.cuda.synchronize()
                st_rates.append(n / (time.perf_counter() - t))
            (om, osd), (sm, ssd) = mean_sd(ours), mean_sd(st_rates)
            rows.append((b, n, tokens, om, osd, sm, ssd))
            print(f"batch {b}: ours {om:.1f} +- {osd:.1f}, sentence-transformers {sm:.1f} +- {ssd:.1f} sentences/s", file=sys.stderr)
    say(f"- our device: {device}")
    say()
    say("| batch | sentences (tokens) | ours, sentences/s | sentence-transformers, sentences/s | ours / theirs |")
    say("|---:|---:|---:|---:|---:|")
    for b, n, tokens, om, osd, sm, ssd in rows:
        say(f"| {b} | {n} ({tokens}) | {om:.1f} ± {osd:.1f} | {sm:.1f} ± {ssd:.1f} | {om / sm:.2f} |")
    if args.same_weights:
        say()
        say(f"- same weights: lowest cosine of ours to sentence-transformers' vectors: {same_weights(st, args.binary, extra, batches[-1], args.sentences):.7f}")
    if args.parity:
        say()
        say(f"- parity: lowest cosine to the sentence-transformers gold vectors: {parity(args.binary, extra):.7f}")
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
