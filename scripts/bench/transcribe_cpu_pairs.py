#!/usr/bin/env python3
"""`transcribe --cpu` against faster-whisper's CPU path, in alternating pairs
(ours, peer, ours, peer) on the same recording, with wall time and CPU time
(user + system: on a shared machine the CPU seconds mean more than the wall).

Ours: the binary as a child process (its own report of decoding time, load
excluded, and the child's CPU time, load included). faster-whisper: the
model loaded once, each `transcribe` timed in the process (wall and
process CPU time, every thread), same options as scripts/bench/transcribe.py.

Usage: scripts/bench/transcribe_cpu_pairs.py --binary B [--binary B2 ...] [--repeat 2]
       [--beams 1 5] [--pairs 2] [--compute-type int8] [--threads 2]
"""
import argparse
import os
import re
import resource
import subprocess
import sys
import tempfile
import time
import wave

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from transcribe import ROOT, build_recording  # noqa: E402


def child_cpu():
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def run_ours(binary, model, beam, audio):
    c0, t0 = child_cpu(), time.perf_counter()
    o = subprocess.run([binary, "--cpu", "-m", model, "--beam-size", str(beam), audio],
                       capture_output=True, text=True, check=True)
    wall, cpu = time.perf_counter() - t0, child_cpu() - c0
    decode = float(re.search(r"of audio in ([0-9.]+) s", o.stderr).group(1))
    return decode, wall, cpu, o.stdout.strip()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--binary", action="append", required=True)
    ap.add_argument("--model", default=os.path.join(ROOT, "samples/models/whisper-tiny.en"))
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--beams", type=int, nargs="+", default=[1, 5])
    ap.add_argument("--pairs", type=int, default=2)
    ap.add_argument("--compute-type", default="int8")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    a = ap.parse_args()

    import numpy as np
    from faster_whisper import WhisperModel

    audio = os.path.join(tempfile.mkdtemp(), f"librivox-x{a.repeat}.wav")
    seconds = build_recording(audio, a.repeat)
    with wave.open(audio) as w:
        samples = np.frombuffer(w.readframes(w.getnframes()), dtype=np.int16).astype(np.float32) / 32768.0
    fw = WhisperModel(a.model, device="cpu", compute_type=a.compute_type, cpu_threads=a.threads)
    print(f"audio {seconds:.1f} s, model {a.model}, faster-whisper {a.compute_type} "
          f"{a.threads} threads\n")
    print("| beam | pair | arm | decode wall (s) | RTF | CPU s (user+sys) | load |")
    print("|---:|---:|---|---:|---:|---:|---|")
    texts = {}
    for beam in a.beams:
        for pair in range(1, a.pairs + 1):
            for binary in a.binary:
                load = " ".join(open("/proc/loadavg").read().split()[:3])
                decode, wall, cpu, text = run_ours(binary, a.model, beam, audio)
                texts.setdefault((beam, binary), text)
                print(f"| {beam} | {pair} | {binary} | {decode:.2f} | {decode / seconds:.3f} "
                      f"| {cpu:.2f} | {load} |", flush=True)
            load = " ".join(open("/proc/loadavg").read().split()[:3])
            c0, t0 = time.process_time(), time.perf_counter()
            segments, _ = fw.transcribe(samples, language="en", beam_size=beam, best_of=5,
                                        vad_filter=False, condition_on_previous_text=True,
                                        without_timestamps=False)
            text = " ".join(s.text.strip() for s in segments)
            wall, cpu = time.perf_counter() - t0, time.process_time() - c0
            texts.setdefault((beam, "faster-whisper"), text)
            print(f"| {beam} | {pair} | faster-whisper {a.compute_type} | {wall:.2f} "
                  f"| {wall / seconds:.3f} | {cpu:.2f} | {load} |", flush=True)
    for (beam, arm), text in texts.items():
        print(f"\nbeam {beam}, {arm}: {text}", file=sys.stderr)


if __name__ == "__main__":
    main()
