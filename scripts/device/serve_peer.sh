#!/usr/bin/env bash
# serve beside llama-server on the lent H200 (issue 19's benchmark): both
# servers on the same GGUF file, one load generator for both
# (scripts/bench/serve_bench.py: standard-library python3, streaming
# /v1/completions of random token-id prompts, temperature 0, `ignore_eos`,
# so every request produces exactly N tokens), at
# each stream count in $STREAMS. For each model and stream count S, each
# server is started fresh (llama-server -ngl 99 -np S, continuous batching;
# serve --gpu --parallel S with KV room for S sequences), warmed with one short
# request, measured, and stopped. From the repo root there, after
#
#   scripts/device/unpack.sh         the release binaries (target/release/serve)
#   scripts/device/llama-cpp.sh      llama-server (CUDA), from the pack of
#                                    scripts/peers/llama-cpp.sh --pack (it now
#                                    keeps tools/server); run again while it exits 3
#   scripts/device/llm_peer.sh       $WORK/lfm2-{350m,1.2b}-q4_0.gguf (random LFM2
#                                    with SmolLM2's tokenizer, llama-quantize Q4_0)
#
# Environment: OUT (required), WORK (default /tmp/lfm-llm), BIN (default
# target/release), MODELS (default "350m 1.2b"; one per call keeps a call
# under 10 minutes), STREAMS (default 1,8,64,256), P and N (prompt and
# generated tokens per request, default 128 and 128), REQ (requests per
# stream, default 2), VOCAB (prompt ids are drawn below it, default 49152:
# the tokenizer's own ids), KV_MIB_PER_SEQ (default 96: serve's paged GPU
# cache gets room for 4096 positions a sequence, of 6 attention layers x 8
# KV heads x 64 x f32 x 2, 96 MiB, for both LFM2 sizes; the cache clamps it
# to what one binding of the adapter holds), LLAMA_ARGS (extra llama-server
# flags), SERVE_ARGS (extra serve flags, e.g. "--batch-products gemm"),
# TEMP (every request's temperature, default 0; above 0 each server samples
# with its own defaults for the other fields).
# On the CPU (the same table on a machine without a GPU):
# DEVICE=cpu (llama-server without -ngl and with -t $(nproc), serve --cpu),
# LS=peers/llama.cpp/build/bin/llama-server (scripts/peers/llama-cpp.sh
# with SERVER=1) and GGUFS="FILE ..." (any GGUF files instead of MODELS'
# random LFM2). Results: $OUT/serve-peer-<model>.md (the side-by-side table), and
# per run the servers' logs and the bench's output. A failed run is reported
# and the others still run; exit status: the number of failed runs.
set -uo pipefail
cd "$(dirname "$0")/../.."
[[ ${DEVICE:-gpu} == gpu ]] &&
    export VK_DRIVER_FILES=${VK_DRIVER_FILES:-/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json}
: "${OUT:?set OUT to the folder for results}"
WORK=${WORK:-/tmp/lfm-llm}
BIN=${BIN:-target/release}
MODELS=${MODELS:-350m 1.2b}
STREAMS=${STREAMS:-1,8,64,256}
P=${P:-128}
N=${N:-128}
REQ=${REQ:-2}
VOCAB=${VOCAB:-49152}
KV_MIB_PER_SEQ=${KV_MIB_PER_SEQ:-96}
LLAMA_ARGS=${LLAMA_ARGS:-}
SERVE_ARGS=${SERVE_ARGS:-}
TEMP=${TEMP:-0}
DEVICE=${DEVICE:-gpu}
LS=${LS:-peers/llama.cpp-cuda/build/bin/llama-server}
BENCH=scripts/bench/serve_bench.py
PORT_LLAMA=${PORT_LLAMA:-8180}
PORT_LFM=${PORT_LFM:-8181}
mkdir -p "$OUT"
for b in "$LS" "$BIN/serve"; do
    [[ -x $b ]] || { echo "serve_peer.sh: $b missing (see the header)" >&2; exit 1; }
done
failed=0
pid=

if [[ $DEVICE == gpu ]]; then
    nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,driver_version --format=csv >"$OUT/serve-peer-env.txt" 2>&1
    LLAMA_DEVICE=(-ngl 99)
else
    grep -m1 "model name" /proc/cpuinfo >"$OUT/serve-peer-env.txt"
    echo "$(nproc) threads" >>"$OUT/serve-peer-env.txt"
    LLAMA_DEVICE=(-t "$(nproc)")
fi
git log -1 --format='checkout %H' >>"$OUT/serve-peer-env.txt" 2>/dev/null

stop() {
    if [[ -n $pid ]]; then
        kill "$pid" 2>/dev/null
        # SIGTERM lets both finish; a server that hangs is killed.
        for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
        kill -9 "$pid" 2>/dev/null
        wait "$pid" 2>/dev/null
        pid=
    fi
}
trap stop EXIT

# wait_up PORT SECONDS: until GET /health answers 200 (llama-server answers 503
# while it loads), or the server exits, or time runs out.
wait_up() {
    python3 - "$1" "$2" "$pid" <<'EOF'
import os, sys, time, urllib.request
port, limit, pid = int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3])
end = time.time() + limit
while time.time() < end:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
            if r.status == 200:
                sys.exit(0)
    except Exception:
        pass
    try:
        os.kill(pid, 0)
    except OSError:
        sys.exit("the server exited")
    time.sleep(0.5)
sys.exit(f"no answer from port {port} within {limit:.0f} s")
EOF
}

# run NAME PORT S GGUF: starts server NAME with S parallel sequences, warms it,
# measures S streams; the table row (prefixed with NAME) goes to stdout.
run() {
    local name=$1 port=$2 s=$3 gguf=$4 tag
    tag=$(basename "$gguf" .gguf)-$name-$s
    case $name in
    llama-server)
        # Context per slot: -c / -np; room for the prompt and the tokens.
        # shellcheck disable=SC2086
        "$LS" -m "$gguf" "${LLAMA_DEVICE[@]}" -np "$s" -c $((s * (P + N + 64))) \
            --host 127.0.0.1 --port "$port" $LLAMA_ARGS >"$OUT/$tag.server.log" 2>&1 &
        ;;
    serve)
        # shellcheck disable=SC2086
        "$BIN/serve" -m "$gguf" "--$DEVICE" --host 127.0.0.1 --port "$port" --parallel "$s" \
            --kv-memory $((s * KV_MIB_PER_SEQ)) $SERVE_ARGS >"$OUT/$tag.server.log" 2>&1 &
        ;;
    esac
    pid=$!
    if ! wait_up "$port" 300 2>"$OUT/$tag.wait.txt"; then
        echo "serve_peer.sh: $tag did not come up ($(cat "$OUT/$tag.wait.txt")), see $OUT/$tag.server.log" >&2
        tail -5 "$OUT/$tag.server.log" >&2
        stop
        return 1
    fi
    local common=(--url "http://127.0.0.1:$port" --prompt-tokens "$P" --vocab "$VOCAB" --temperature "$TEMP")
    # Warm-up (pipelines, CUDA graphs, first allocations), not measured.
    timeout -s KILL 120 python3 "$BENCH" "${common[@]}" --streams 1 --requests 1 --max-tokens 8 \
        --seed 7 >"$OUT/$tag.warmup.txt" 2>&1
    local rc=0
    timeout -s KILL 540 python3 "$BENCH" "${common[@]}" --streams "$s" --requests "$REQ" \
        --max-tokens "$N" --label "$tag" >"$OUT/$tag.bench.txt" 2>&1 || rc=$?
    stop
    if [[ $rc -ne 0 ]]; then
        echo "serve_peer.sh: $tag bench failed (rc $rc), see $OUT/$tag.bench.txt" >&2
        tail -3 "$OUT/$tag.bench.txt" >&2
        return 1
    fi
    grep '^| [0-9]' "$OUT/$tag.bench.txt" | sed "s/^|/| $name |/"
}

files=${GGUFS:-$(for size in $MODELS; do echo "$WORK/lfm2-$size-q4_0.gguf"; done)}
for gguf in $files; do
    name=$(basename "$gguf" .gguf)
    table=$OUT/serve-peer-$name.md
    if [[ ! -f $gguf ]]; then
        echo "serve_peer.sh: $gguf missing (scripts/device/llm_peer.sh makes the random LFM2)" >&2
        failed=$((failed + 1))
        continue
    fi
    {
        echo "$name ($gguf, $DEVICE), prompt $P, $N tokens a request, $REQ requests a stream, temperature $TEMP, serve flags: ${SERVE_ARGS:-none}"
        echo
        echo "| server | streams | requests | output tok/s | TTFT p50 ms | TTFT p99 ms | ITL p50 ms | ITL p99 ms | decode tok/s a stream |"
        echo "|---|---:|---:|---:|---:|---:|---:|---:|---:|"
    } >"$table"
    for s in ${STREAMS//,/ }; do
        run llama-server "$PORT_LLAMA" "$s" "$gguf" >>"$table" || failed=$((failed + 1))
        run serve "$PORT_LFM" "$s" "$gguf" >>"$table" || failed=$((failed + 1))
    done
    echo "== $table"
    cat "$table"
done
# How many sequences serve's GPU batch held (it clamps to what one binding
# of the adapter holds per layer).
grep -h "up to" "$OUT"/*-serve-*.server.log 2>/dev/null | sort | uniq -c
exit "$failed"
