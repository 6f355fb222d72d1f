#!/usr/bin/env python3
"""Real-time factor of `transcribe` next to faster-whisper, in the same run.

Builds one benchmark recording from the five LibriVox clips of Debian's
pocketsphinx-testdata (each clip followed by 1 s of silence, the whole
sequence `--repeat` times: 2 gives about 57 s, two 30 s windows; 8 about
3.8 minutes), then times, for each arm,
`--reps` runs of the whole transcription (model load excluded where the
tool reports it, audio decoding included):

  lfm-cpu       target/release/transcribe --cpu [--compute-type T, from
                --lfm-compute-type T]
  lfm-gpu       target/release/transcribe            (unless --no-gpu):
                encoder and decoder on the GPU
  faster-whisper  WhisperModel(..., device, compute_type) on the same
                  CTranslate2 files, same decoding options (--beam-size,
                  best_of 5, temperature fallback, no VAD)
and with --batch-sizes N,M: the batched pipelines, ours (`--batch-size N`,
on the GPU unless --no-gpu, else the CPU) and faster-whisper's
BatchedInferencePipeline(batch_size=N) on the same 30 s clips
(clip_timestamps), temperature 0, timestamps on.
Each lfm arm's last run prints where its time went (the tool's profile
line: encoder, decoder passes, host search, submissions, bytes read back).

Prints a markdown table (mean +- sd of wall time, real-time factor) and
writes the raw numbers as JSON when --json is given.

Usage: scripts/bench/transcribe.py [--model DIR] [--reps N] [--repeat N] [--beam-size N]
       [--fw-device cpu|cuda]
       [--fw-compute-type float32|float16|int8] [--lfm-compute-type float32|int8]
       [--no-gpu] [--json OUT]
"""
import argparse
import json
import math
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import wave

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CLIPS = os.environ.get("CLIPS_DIR", "/usr/share/pocketsphinx/test/data/librivox")


def build_recording(path, repeat):
    frames = b""
    for _ in range(repeat):
        for name in sorted(f for f in os.listdir(CLIPS) if f.endswith(".wav")):
            with wave.open(os.path.join(CLIPS, name)) as w:
                assert (w.getnchannels(), w.getsampwidth(), w.getframerate()) == (1, 2, 16000)
                frames += w.readframes(w.getnframes())
            frames += b"\0\0" * 16000
    with wave.open(path, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(16000)
        w.writeframes(frames)
    return len(frames) / 2 / 16000


def time_lfm(binary, args, audio, reps):
    """Seconds per run as the tool reports them (load excluded), and the text."""
    times, text = [], ""
    for _ in range(reps):
        o = subprocess.run([binary, *args, audio], capture_output=True, text=True, check=True)
        m = re.search(r"of audio in ([0-9.]+) s", o.stderr)
        times.append(float(m.group(1)))
        text = o.stdout.strip()
        timing = next(l for l in o.stderr.splitlines() if "of audio in" in l)
        device = timing.split(", ")[-1]
    profile = [l for l in o.stderr.splitlines() if "windows," in l]
    print(f"{' '.join(args)}: {profile[-1] if profile else o.stderr.strip()}", file=sys.stderr)
    return times, text, device


def clips_of(seconds):
    """30 s clip_timestamps covering a recording of `seconds` exactly."""
    n = round(seconds * 16000)
    clips = []
    for start in range(0, n, 30 * 16000):
        end = min(start + 30 * 16000, n)
        e = end / 16000
        while int(e * 16000) < end:
            e = math.nextafter(e, math.inf)
        clips.append(dict(start=start / 16000, end=e))
    return clips


def time_faster_whisper_batched(model_dir, audio, reps, device, compute_type, threads, batch_size,
                                beam_size):
    from faster_whisper import BatchedInferencePipeline, WhisperModel
    import numpy as np

    model = WhisperModel(model_dir, device=device, compute_type=compute_type, cpu_threads=threads)
    pipe = BatchedInferencePipeline(model)
    with wave.open(audio) as w:
        samples = np.frombuffer(w.readframes(w.getnframes()), dtype=np.int16).astype(np.float32) / 32768.0
    clips = clips_of(len(samples) / 16000)
    times, text = [], ""
    for _ in range(reps):
        t0 = time.perf_counter()
        segments, _ = pipe.transcribe(samples, language="en", beam_size=beam_size, best_of=5,
                                      temperature=0.0, without_timestamps=False,
                                      clip_timestamps=clips, batch_size=batch_size)
        text = " ".join(s.text.strip() for s in segments)
        times.append(time.perf_counter() - t0)
    return times, text


def time_faster_whisper(model_dir, audio, reps, device, compute_type, threads, **extra):
    from faster_whisper import WhisperModel

    model = WhisperModel(model_dir, device=device, compute_type=compute_type, cpu_threads=threads)
    # The samples, not the path: faster-whisper's own decoder (PyAV) changes
    # its API between versions, and our timing of lfm excludes no decoding
    # either way worth counting (a 16 kHz mono WAV).
    import numpy as np
    with wave.open(audio) as w:
        samples = np.frombuffer(w.readframes(w.getnframes()), dtype=np.int16).astype(np.float32) / 32768.0
    times, text = [], ""
    for _ in range(reps):
        t0 = time.perf_counter()
        options = dict(language="en", best_of=5, vad_filter=False,
                       condition_on_previous_text=True, without_timestamps=False)
        options.update(extra)
        segments, _ = model.transcribe(samples, **options)
        text = " ".join(s.text.strip() for s in segments)
        times.append(time.perf_counter() - t0)
    return times, text


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=os.path.join(ROOT, "samples/models/whisper-tiny.en"))
    ap.add_argument("--binary", default=os.path.join(ROOT, "target/release/transcribe"))
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--repeat", type=int, default=2, help="times the five clips are concatenated")
    ap.add_argument("--beam-size", type=int, default=1)
    ap.add_argument("--fw-device", default="cpu")
    ap.add_argument("--fw-compute-type", default="float32")
    ap.add_argument("--lfm-compute-type", default="float32",
                    help="our CPU arm's --compute-type (float32: the flag is not passed)")
    ap.add_argument("--fw-threads", type=int, default=0,
                    help="faster-whisper's cpu_threads (0: its default of 4)")
    ap.add_argument("--no-gpu", action="store_true")
    ap.add_argument("--no-cpu", action="store_true")
    ap.add_argument("--batched-only", action="store_true",
                    help="only the batched arms (--batch-sizes), not the sequential ones")
    ap.add_argument("--batch-sizes", default="",
                    help="comma-separated batch sizes for the batched pipelines (ours and faster-whisper's)")
    ap.add_argument("--features", action="store_true",
                    help="also time word timestamps and VAD (lfm --word-timestamps / --vad, "
                         "faster-whisper word_timestamps=True / vad_filter=True)")
    ap.add_argument("--json")
    a = ap.parse_args()

    tmp = tempfile.mkdtemp()
    audio = os.path.join(tmp, f"librivox-x{a.repeat}.wav")
    seconds = build_recording(audio, a.repeat)
    arms = []
    model_args = ["-m", a.model, "--beam-size", str(a.beam_size)]
    if not a.no_cpu and not a.batched_only:
        cpu = ["--cpu"]
        if a.lfm_compute_type != "float32":
            cpu += ["--compute-type", a.lfm_compute_type]
        arms.append((" ".join(["lfm", *cpu]), *time_lfm(a.binary, [*cpu, *model_args], audio, a.reps)))
    if not a.no_gpu and not a.batched_only:
        arms.append(("lfm (GPU)", *time_lfm(a.binary, model_args, audio, a.reps)))
    features = [] if a.batched_only else [("", [], dict(beam_size=a.beam_size))]
    if a.features and not a.batched_only:
        features += [(" --word-timestamps", ["--word-timestamps"],
                      dict(beam_size=a.beam_size, word_timestamps=True)),
                     (" --vad", ["--vad"], dict(beam_size=a.beam_size, vad_filter=True))]
        for label, flags, _ in features[1:]:
            if not a.no_cpu:
                arms.append((f"lfm --cpu{label}", *time_lfm(a.binary, ["--cpu", *flags, *model_args],
                                                            audio, a.reps)))
            if not a.no_gpu:
                arms.append((f"lfm (GPU){label}", *time_lfm(a.binary, [*flags, *model_args],
                                                                    audio, a.reps)))
    batch_sizes = [int(b) for b in a.batch_sizes.split(",") if b]
    for b in batch_sizes:
        flags = ["--batch-size", str(b)] + (["--cpu"] if a.no_gpu else [])
        arms.append((f"lfm{' --cpu' if a.no_gpu else ' (GPU)'} --batch-size {b}",
                     *time_lfm(a.binary, [*flags, *model_args], audio, a.reps)))
        try:
            t, text = time_faster_whisper_batched(a.model, audio, a.reps, a.fw_device,
                                                  a.fw_compute_type, a.fw_threads, b, a.beam_size)
            arms.append((f"faster-whisper batched {b} {a.fw_device} {a.fw_compute_type}", t, text,
                         a.fw_device))
        except Exception as e:  # reported, not fatal
            print(f"faster-whisper batched {b} did not run: {e}", file=sys.stderr)
    for label, _, extra in features:
        try:
            t, text = time_faster_whisper(a.model, audio, a.reps, a.fw_device, a.fw_compute_type,
                                          a.fw_threads, **extra)
            threads = f", {a.fw_threads} threads" if a.fw_device == "cpu" and a.fw_threads else ""
            arms.append((f"faster-whisper {a.fw_device} {a.fw_compute_type}{threads}{label}", t, text,
                         a.fw_device))
        except Exception as e:  # reported, not fatal: the lfm numbers still stand
            print(f"faster-whisper{label} did not run: {e}", file=sys.stderr)

    print(f"audio: {seconds:.1f} s ({os.path.basename(audio)}), model {a.model}, "
          f"beam size {a.beam_size}, {a.reps} runs each\n")
    print("| arm | device | time per run (s) | real-time factor |")
    print("|---|---|---|---|")
    rows = []
    for name, times, text, device in arms:
        mean = statistics.mean(times)
        sd = statistics.stdev(times) if len(times) > 1 else 0.0
        print(f"| {name} | {device} | {mean:.2f} ± {sd:.2f} | {mean / seconds:.3f} |")
        rows.append(dict(arm=name, device=device, times=times, rtf=mean / seconds, text=text))
    for r in rows:
        print(f"\n{r['arm']}: {r['text'][:160]}...", file=sys.stderr)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(dict(audio_seconds=seconds, model=a.model, reps=a.reps, arms=rows), f, indent=1)


if __name__ == "__main__":
    main()
