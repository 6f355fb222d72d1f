#!/usr/bin/env python3
"""`speak --cpu` against onnxruntime (scripts/bench/speak_ort.py) as whole
processes, in alternating pairs (A B A B ...) after one warm-up of each: the
paragraph of samples/fixtures/speak/bench.json (six sentences, phoneme ids,
default scales), voice load / session creation included. Prints per-pair CPU
and wall seconds, each side's threads (the most seen in /proc while it ran),
the pair-by-pair ratio A/B and the medians, with the load average.

Usage: /work/pyenv/bin/python scripts/bench/speak_pairs.py SPEAK_BIN [PAIRS]
       [--extra SPEAK_BIN2]   (a third row: another build, paired too)
"""
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

args = sys.argv[1:]
extra = None
if "--extra" in args:
    i = args.index("--extra")
    extra = args[i + 1]
    del args[i : i + 2]
speak = args[0]
pairs = int(args[1]) if len(args) > 1 else 5
sentences = json.loads(Path("samples/fixtures/speak/bench.json").read_text())["sentences"]


def speak_cmd(binary):
    cmd = [binary, "--cpu", "--seed", "1", "-q", "-o", f"/tmp/speak-pairs-{os.getpid()}.wav", "--force"]
    for ids in sentences:
        cmd += ["--phoneme-ids", ",".join(map(str, ids))]
    return cmd


ort_cmd = [sys.executable, "scripts/bench/speak_ort.py"]


def run(cmd):
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL)
    threads = 0
    while True:
        pid, status, ru = os.wait4(p.pid, os.WNOHANG)
        if pid:
            break
        try:
            threads = max(threads, int(Path(f"/proc/{p.pid}/status").read_text().split("Threads:")[1].split()[0]))
        except (OSError, IndexError, ValueError):
            pass
        time.sleep(0.05)
    wall = time.perf_counter() - t0
    if status != 0:
        sys.exit(f"speak_pairs: {cmd[0]} failed ({status})")
    return {"wall": wall, "cpu": ru.ru_utime + ru.ru_stime, "threads": threads}


rows = {"A": speak_cmd(speak), "B": ort_cmd}
if extra:
    rows["C"] = speak_cmd(extra)
for cmd in rows.values():
    run(cmd)  # warm-up: page cache, CPU frequency
res = {k: [] for k in rows}
loads = [os.getloadavg()[0]]
for i in range(pairs):
    for k, cmd in rows.items():
        res[k].append(run(cmd))
    loads.append(os.getloadavg()[0])
    print(" ".join(f"{k}: cpu {res[k][-1]['cpu']:.2f} wall {res[k][-1]['wall']:.2f}" for k in rows), flush=True)
print(f"load average (1 min) over the run: {min(loads):.2f} to {max(loads):.2f}")
for k in rows:
    r = res[k]
    print(
        f"{k} ({'speak --cpu ' + Path(rows[k][0]).name if k != 'B' else 'onnxruntime'}): "
        f"median cpu {statistics.median(x['cpu'] for x in r):.2f} s, "
        f"wall {statistics.median(x['wall'] for x in r):.2f} s, threads seen {max(x['threads'] for x in r)}"
    )
for k in rows:
    if k == "B":
        continue
    for m in ("cpu", "wall"):
        ratios = [a[m] / b[m] for a, b in zip(res[k], res["B"])]
        print(f"{k}/B {m}: median {statistics.median(ratios):.3f} (pairs: {' '.join(f'{x:.2f}' for x in ratios)})")
