#!/usr/bin/env bash
# Two builds of `speak` on the GPU in one call, alternated run by run (A B A B ...):
# the paragraph of samples/fixtures/speak/bench.json (its phoneme ids, so espeak-ng
# is not needed or timed), whole-run and steady real-time factor, the first
# sentence's time and the cold time to first audio; then where a sentence's time
# goes: the same ids spoken as the paragraph's sentences and cut into short pieces,
# so that time = sentences * fixed + audio seconds * per_second gives the fixed
# cost a sentence pays whatever its length (dispatch latency, small under-occupied
# kernels, host recording), the part that batching sentences into the same
# dispatches could save.
#
# Needs: python3; A and B, each a `speak` binary or a wrapper around `lfm speak`
# (scripts/device/unpack.sh makes target/release/speak for the carried lfm, and
# target/release/speak-b for pack.sh's B_LFM); samples/models/piper-joe/.
# Also says whether A and B wrote the same WAV bytes (the last run of each layout).
#
# Usage: A=path/to/speak B=path/to/old-speak OUT=/tmp/ab scripts/device/speak_ab.sh
#   REPS=3 (pairs), SENTENCES=6 (the first N of the paragraph), PIECE=24 (ids per
#   piece in the fixed-cost probe; 0 skips the probe), EXTRA="--cpu" (flags for both).
# Writes $OUT/speak-ab.md and $OUT/speak-ab.json, and prints the table.
set -euo pipefail
cd "$(dirname "$0")/../.."
: "${A:?set A to the speak binary to measure}" "${B:?set B to the speak binary to compare with}"
OUT=${OUT:-/tmp/speak-ab}
mkdir -p "$OUT"
python3 - "$A" "$B" "$OUT" <<'PYEOF'
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

A, B, OUT = sys.argv[1], sys.argv[2], Path(sys.argv[3])
REPS = int(os.environ.get("REPS", "3"))
N = int(os.environ.get("SENTENCES", "6"))
PIECE = int(os.environ.get("PIECE", "24"))
EXTRA = os.environ.get("EXTRA", "").split()
sentences = json.loads(Path("samples/fixtures/speak/bench.json").read_text())["sentences"][:N]


def run(binary, pieces, tag):
    cmd = [binary, "-o", str(OUT / f"{tag}.wav"), "--force", "--seed", "1", "--json", *EXTRA]
    for ids in pieces:
        cmd += ["--phoneme-ids", ",".join(map(str, ids))]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"{binary} failed: {r.stderr.strip()}")
    j = json.loads(r.stdout)
    s = j["sentences"]
    steady = sum(x["synthesis_seconds"] for x in s[1:]) / max(sum(x["audio_seconds"] for x in s[1:]), 1e-9)
    return {
        "backend": j["backend"],
        "rtf": j["real_time_factor"],
        "rtf_steady": steady,
        "first_sentence": j["first_sentence_seconds"],
        "ttfa": j["time_to_first_audio_seconds"],
        "audio": j["audio_seconds"],
        # Sentences 2..n: time and audio, for the fixed-cost fit.
        "steady_seconds": sum(x["synthesis_seconds"] for x in s[1:]),
        "steady_audio": sum(x["audio_seconds"] for x in s[1:]),
        "steady_count": len(s) - 1,
        "host_seconds": sum(x["prior_seconds"] for x in s[1:]),
        # The device's time per stage (timestamps at the stages' ends, on
        # adapters that have them; builds before them print none).
        "device": {
            k: sum(x["device_seconds"][k] for x in s[1:])
            for k in ("prior", "regulation", "flow", "decoder")
        } if all(x.get("device_seconds") for x in s[1:]) else None,
    }


def cut(ids, n):
    return [ids[i:i + n] for i in range(0, len(ids), n)]


arms = {"A": A, "B": B}
layouts = {"paragraph": sentences}
if PIECE > 0:
    layouts[f"pieces of {PIECE} ids"] = [p for s in sentences for p in cut(s, PIECE)]
runs = {(arm, lay): [] for arm in arms for lay in layouts}
for rep in range(REPS):
    for lay, pieces in layouts.items():
        for arm, binary in arms.items():
            runs[(arm, lay)].append(run(binary, pieces, f"{arm}-{len(pieces)}"))
            print(arm, lay, rep, runs[(arm, lay)][-1], file=sys.stderr)

med = lambda rs, k: statistics.median(r[k] for r in rs)
lines = [
    f"A = {A}, B = {B}; {len(sentences)} sentences of bench.json; {REPS} runs each, alternated; medians",
    "",
    "| arm | ids as | sentences | backend | RTF whole run | RTF steady (2..n) | first sentence (s) | cold time to first audio (s) | host share (2..n) |",
    "|---|---|---:|---|---:|---:|---:|---:|---:|",
]
for (arm, lay), rs in runs.items():
    n = len(layouts[lay])
    host = med(rs, "host_seconds") / max(med(rs, "steady_seconds"), 1e-9)
    lines.append(
        f"| {arm} | {lay} | {n} | {rs[0]['backend']} | {med(rs, 'rtf'):.4f} | {med(rs, 'rtf_steady'):.4f} "
        f"| {med(rs, 'first_sentence'):.3f} | {med(rs, 'ttfa'):.3f} | {host:.2f} |"
    )
dev_lines = []
for (arm, lay), rs in runs.items():
    if rs[0]["device"] is None or rs[0]["steady_count"] == 0:
        continue
    n = rs[0]["steady_count"]
    stage = {k: statistics.median(r["device"][k] for r in rs) for k in rs[0]["device"]}
    busy = sum(stage.values())
    dev_lines.append(
        f"| {arm} | {lay} | " + " | ".join(f"{stage[k] / n * 1e3:.2f}" for k in stage)
        + f" | {busy / n * 1e3:.2f} | {busy / med(rs, 'steady_seconds'):.2f} |"
    )
if dev_lines:
    lines += [
        "",
        "Device time a sentence (ms, sentences 2..n, between timestamps at the stages' ends), and the device's busy share of the wall time:",
        "",
        "| arm | ids as | prior | durations + regulation | flow | decoder | total | busy share |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
        *dev_lines,
    ]
# Paired ratios A/B on the paragraph.
par = "paragraph"
ratios = {k: [a[k] / b[k] for a, b in zip(runs[("A", par)], runs[("B", par)])] for k in ("rtf", "rtf_steady", "first_sentence", "ttfa")}
lines += ["", "A / B on the paragraph, pair by pair: " + ", ".join(
    f"{k} {statistics.median(v):.3f} ({min(v):.3f}-{max(v):.3f})" for k, v in ratios.items())]
if PIECE > 0:
    lines += ["", "Fixed cost a sentence (sentences 2..n, medians of the runs): time = n * fixed + audio * per_second"]
    for arm in arms:
        if runs[(arm, "paragraph")][0]["steady_count"] == 0:
            continue
        (n1, t1, a1), (n2, t2, a2) = [
            (rs[0]["steady_count"], med(rs, "steady_seconds"), med(rs, "steady_audio"))
            for rs in (runs[(arm, lay)] for lay in layouts)
        ]
        per_second = (t1 * n2 - t2 * n1) / (a1 * n2 - a2 * n1)
        fixed = (t1 - a1 * per_second) / n1
        lines.append(
            f"- {arm}: fixed {fixed * 1e3:.2f} ms a sentence, {per_second:.4f} s a second of audio; "
            f"the paragraph's sentences ({n1} timed, {t1 / n1 * 1e3:.1f} ms each) spend "
            f"{100 * fixed * n1 / t1:.0f}% of their time on the fixed cost"
        )
lines += [""]
for lay, pieces in layouts.items():
    a, b = (OUT / f"{arm}-{len(pieces)}.wav" for arm in arms)
    same = a.read_bytes() == b.read_bytes()
    lines.append(f"- {lay}: A and B wrote {'the same' if same else 'DIFFERENT'} WAV bytes")
(OUT / "speak-ab.json").write_text(json.dumps({f"{a}|{l}": r for (a, l), r in runs.items()}, indent=1) + "\n")
(OUT / "speak-ab.md").write_text("\n".join(lines) + "\n")
print("\n".join(lines))
PYEOF
