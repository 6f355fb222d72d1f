#!/usr/bin/env python3
"""Load generator for OpenAI-compatible servers (`serve`, llama-server):
N concurrent streaming clients, each sending requests of a random token-id
prompt (so no tokenizer is needed, and both servers see the same tokens)
for exactly --max-tokens tokens (`ignore_eos`, which both llama-server and
`serve` take: a logit_bias against the end-of-sequence token would send
`serve` down its full-logits path, which measures that path instead).

    scripts/bench/serve_bench.py --url http://127.0.0.1:8080 --streams 1,8,64 \
        --prompt-tokens 128 --max-tokens 128 --requests 2 --vocab 65536

Prints a markdown table: streams, requests, aggregate output tok/s, time to
first token p50/p99, inter-token latency p50/p99 (ms), and a stream's decode
rate, 1 / mean inter-token latency (the first token's prefill excluded: the
number to hold against a plain decode's tg rate). Standard library only;
the streams are spread over --processes worker processes.
"""

import argparse
import http.client
import json
import multiprocessing
import os
import random
import statistics
import threading
import time
from urllib.parse import urlparse


def percentile(xs, p):
    if not xs:
        return float("nan")
    xs = sorted(xs)
    k = min(len(xs) - 1, max(0, round(p / 100 * (len(xs) - 1))))
    return xs[k]


def one_request(url, prompt, max_tokens, temperature):
    u = urlparse(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=600)
    body = {
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": temperature,
        "stream": True,
        "stream_options": {"include_usage": True},
        "ignore_eos": True,
    }
    t0 = time.perf_counter()
    conn.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
    resp = conn.getresponse()
    if resp.status != 200:
        raise RuntimeError(f"HTTP {resp.status}: {resp.read()[:200]!r}")
    times = []
    usage = 0
    buf = b""
    while True:
        chunk = resp.read1(65536)
        if not chunk:
            break
        buf += chunk
        while b"\n\n" in buf:
            event, buf = buf.split(b"\n\n", 1)
            for line in event.split(b"\n"):
                if not line.startswith(b"data: ") or line == b"data: [DONE]":
                    continue
                v = json.loads(line[6:])
                if v.get("usage"):
                    usage = v["usage"]["completion_tokens"]
                choices = v.get("choices") or []
                if choices and choices[0].get("finish_reason") is None:
                    times.append(time.perf_counter())
    conn.close()
    # Every token's chunk counts, text or not (a model without a tokenizer
    # streams `token_ids` and no text); the usage is the count where given.
    return t0, times, max(usage, len(times))


def clients(url, prompts, requests, max_tokens, temperature):
    """One worker process: a thread per stream (prompts[i * requests + k]
    is stream i's k-th request); returns the first-token delays, the
    inter-token gaps, the tokens and the errors."""
    ttft, itl, tokens, errors = [], [], [0], []
    lock = threading.Lock()

    def client(i):
        for k in range(requests):
            try:
                t0, times, count = one_request(url, prompts[i * requests + k], max_tokens, temperature)
            except Exception as e:  # noqa: BLE001 - reported by the caller
                errors.append(str(e))
                return
            with lock:
                if times:
                    ttft.append(times[0] - t0)
                    itl.extend(b - a for a, b in zip(times, times[1:]))
                tokens[0] += count

    threads = [threading.Thread(target=client, args=(i,)) for i in range(len(prompts) // requests)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return ttft, itl, tokens[0], errors


def run(url, streams, requests, prompt_tokens, max_tokens, vocab, seed, processes, temperature):
    rng = random.Random(seed)
    prompts = [[rng.randrange(vocab) for _ in range(prompt_tokens)] for _ in range(streams * requests)]
    # Streams are spread over worker processes: one Python process parsing
    # every server-sent event under the GIL tops out at a few thousand
    # tokens a second, below what a batching server delivers.
    workers = max(1, min(streams, processes))
    shares = [[] for _ in range(workers)]
    for i in range(streams):
        shares[i % workers].extend(prompts[i * requests : (i + 1) * requests])
    # The clock starts once the workers exist: their start-up is not the
    # server's time.
    with multiprocessing.get_context("fork").Pool(workers) as pool:
        start = time.perf_counter()
        results = pool.starmap(clients, [(url, sh, requests, max_tokens, temperature) for sh in shares])
        wall = time.perf_counter() - start
    ttft = [x for r in results for x in r[0]]
    itl = [x for r in results for x in r[1]]
    tokens = sum(r[2] for r in results)
    errors = [e for r in results for e in r[3]]
    if errors:
        raise SystemExit(f"{len(errors)} requests failed, first: {errors[0]}")
    return {
        "streams": streams,
        "requests": streams * requests,
        "tokens": tokens,
        "tok_per_s": tokens / wall,
        "ttft_p50_ms": 1e3 * percentile(ttft, 50),
        "ttft_p99_ms": 1e3 * percentile(ttft, 99),
        "itl_p50_ms": 1e3 * percentile(itl, 50),
        "itl_p99_ms": 1e3 * percentile(itl, 99),
        "mean_itl_ms": 1e3 * statistics.fmean(itl) if itl else float("nan"),
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--url", default="http://127.0.0.1:8080")
    ap.add_argument("--streams", default="1,8,64")
    ap.add_argument("--requests", type=int, default=2, help="requests per stream")
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--vocab", type=int, required=True, help="token ids are drawn below this")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--label", default="")
    ap.add_argument(
        "--temperature",
        type=float,
        default=0.0,
        help="sampling temperature of every request (default 0: greedy); other sampling "
        "fields are left to each server's defaults, as an OpenAI client leaves them",
    )
    ap.add_argument(
        "--processes",
        type=int,
        default=max(1, (os.cpu_count() or 2) // 2),
        help="worker processes the streams are spread over (default: half the CPUs)",
    )
    a = ap.parse_args()
    print(f"\n{a.label} ({a.url}, prompt {a.prompt_tokens}, {a.max_tokens} tokens each, temperature {a.temperature})\n")
    print("| streams | requests | output tok/s | TTFT p50 ms | TTFT p99 ms | ITL p50 ms | ITL p99 ms | decode tok/s a stream |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for n in [int(s) for s in a.streams.split(",")]:
        r = run(a.url, n, a.requests, a.prompt_tokens, a.max_tokens, a.vocab, a.seed, a.processes, a.temperature)
        print(
            f"| {r['streams']} | {r['requests']} | {r['tok_per_s']:.1f} | {r['ttft_p50_ms']:.1f} | "
            f"{r['ttft_p99_ms']:.1f} | {r['itl_p50_ms']:.2f} | {r['itl_p99_ms']:.2f} | "
            f"{1e3 / r['mean_itl_ms']:.1f} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
