#!/usr/bin/env bash
# Builds llama.cpp with CUDA (sm_90) on the lent H200: llama-bench,
# llama-batched-bench,
# llama-quantize and llama-server, the peers of scoreboard, quantize and serve
# there (scripts/device/llm_peer.sh and serve_peer.sh run them). llama-server
# is built without its web UI (no assets are fetched; the API is whole).
# From the repo root, after packing the sources here:
#
#   scripts/peers/llama-cpp.sh --pack peers/llama-cpp-src.tar.gz     # here, ~6 MB
#   carry: peers/llama-cpp-src.tar.gz                                # to the device
#   scripts/device/llama-cpp.sh                                      # there
#
# Needs there: nvcc, cmake, ninja (the device image has them). Resumable: the
# build lives in the git-ignored peers/llama.cpp-cuda/build, which a warm
# machine keeps between calls; when it has not finished within BUILD_SECONDS
# (default 420, so one call stays under the 10-minute limit) the script exits
# 3: call it again. Run it in the background (setsid) to build while other
# work runs. Logs: $LOG (default /tmp/llama-cpp-build) env.txt, configure.log,
# build.log.
set -euo pipefail
cd "$(dirname "$0")/../.."
LOG=${LOG:-/tmp/llama-cpp-build}
PACK=peers/llama-cpp-src.tar.gz
SRC=peers/llama.cpp-cuda
mkdir -p "$LOG"

# A tree unpacked from an older pack lacks the server's sources: unpack the
# carried pack over it (the build folder stays).
if [[ ! -f $SRC/CMakeLists.txt || ! -f $SRC/tools/server/CMakeLists.txt ]]; then
    [[ -f $PACK ]] || { echo "llama-cpp: $PACK missing (scripts/peers/llama-cpp.sh --pack $PACK, then carry it)" >&2; exit 1; }
    mkdir -p "$SRC"
    tar xzf "$PACK" -C "$SRC" --strip-components=1
    [[ -f $SRC/tools/server/CMakeLists.txt ]] ||
        { echo "llama-cpp: $PACK has no tools/server; pack it again with this checkout's scripts/peers/llama-cpp.sh" >&2; exit 1; }
fi

{ nvidia-smi; nvcc --version; cmake --version | head -1; echo "ninja $(ninja --version)"; nproc; } >"$LOG/env.txt" 2>&1

# (Re)configure when there is no build yet or it was configured without the
# server (what the cache keeps of the other settings stays).
if [[ ! -f $SRC/build/build.ninja ]] ||
    ! grep -q '^LLAMA_BUILD_SERVER:BOOL=ON' "$SRC/build/CMakeCache.txt" 2>/dev/null; then
    cmake -S "$SRC" -B "$SRC/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
        -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
        -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON \
        -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
        -DLLAMA_BUILD_APP=OFF -DLLAMA_OPENSSL=OFF >"$LOG/configure.log" 2>&1 ||
        { tail -40 "$LOG/configure.log" >&2; exit 1; }
fi

start=$SECONDS
set +e
timeout "${BUILD_SECONDS:-420}" cmake --build "$SRC/build" --target llama-bench llama-quantize llama-batched-bench \
    llama-server -j "$(nproc)" >"$LOG/build.log" 2>&1
rc=$?
set -e
echo "llama-cpp: build step ran $((SECONDS - start)) s (rc $rc)" | tee -a "$LOG/env.txt" >&2
if [[ $rc -eq 124 ]]; then
    echo "llama-cpp: build not finished within ${BUILD_SECONDS:-420} s; run again to resume" >&2
    exit 3
elif [[ $rc -ne 0 ]]; then
    tail -40 "$LOG/build.log" >&2
    exit 1
fi
echo "llama-cpp: built $SRC/build/bin/llama-bench, llama-quantize, llama-batched-bench and llama-server" >&2
