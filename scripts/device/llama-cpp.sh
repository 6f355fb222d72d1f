#!/usr/bin/env bash
# llama.cpp with CUDA (sm_90) as generate's speed and accuracy peer on the lent
# H200. Run from the repo root on that machine, after packing the sources here:
#
#   scripts/peers/llama-cpp.sh --pack peers/llama-cpp-src.tar.gz     # here, ~6 MB
#   carry: peers/llama-cpp-src.tar.gz                                # to the device
#   scripts/device/llama-cpp.sh                                      # there
#
# Needs there: nvcc, cmake, ninja (the device image has them), the SmolLM2 GGUF
# under samples/models/smollm2/, samples/corpus/. Resumable: the build lives in
# the git-ignored peers/llama.cpp-cuda/build, which a warm machine keeps between
# calls; when the build has not finished within BUILD_SECONDS (default 420, so
# one call stays under the 10-minute limit) the script exits 3: call it again.
#
# Writes under $OUT: env.txt (nvidia-smi, nvcc), configure.log, build.log,
# llama-bench.json and llama-bench.md (SmolLM2 Q4_1, all layers on the GPU,
# pp512 / tg128, flash attention off and on, 5 repetitions),
# perplexity.txt (SmolLM2 Q4_1 on samples/corpus/alice-ch1-4.txt, ctx 512).
set -euo pipefail
cd "$(dirname "$0")/../.."
: "${OUT:?set OUT to the folder for results}"

PACK=peers/llama-cpp-src.tar.gz
SRC=peers/llama.cpp-cuda
MODEL=samples/models/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
CORPUS=samples/corpus/alice-ch1-4.txt

[[ -f $MODEL ]] || { echo "llama-cpp: $MODEL missing" >&2; exit 1; }
if [[ ! -f $SRC/CMakeLists.txt ]]; then
    [[ -f $PACK ]] || { echo "llama-cpp: $PACK missing (scripts/peers/llama-cpp.sh --pack $PACK, then carry it)" >&2; exit 1; }
    mkdir -p "$SRC"
    tar xzf "$PACK" -C "$SRC" --strip-components=1
fi

{ nvidia-smi; nvcc --version; cmake --version | head -1; echo "ninja $(ninja --version)"; nproc; } >"$OUT/env.txt" 2>&1

if [[ ! -f $SRC/build/build.ninja ]]; then
    cmake -S "$SRC" -B "$SRC/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
        -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
        -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF \
        -DLLAMA_BUILD_APP=OFF -DLLAMA_OPENSSL=OFF >"$OUT/configure.log" 2>&1 ||
        { tail -40 "$OUT/configure.log" >&2; exit 1; }
fi

start=$SECONDS
set +e
timeout "${BUILD_SECONDS:-420}" cmake --build "$SRC/build" --target llama-bench llama-perplexity -j "$(nproc)" \
    >"$OUT/build.log" 2>&1
rc=$?
set -e
echo "llama-cpp: build step ran $((SECONDS - start)) s (rc $rc)" | tee -a "$OUT/env.txt" >&2
if [[ $rc -eq 124 ]]; then
    echo "llama-cpp: build not finished within ${BUILD_SECONDS:-420} s; run again to resume" >&2
    exit 3
elif [[ $rc -ne 0 ]]; then
    tail -40 "$OUT/build.log" >&2
    exit 1
fi

BIN=$SRC/build/bin
"$BIN/llama-bench" -m "$MODEL" -ngl 99 -p 512 -n 128 -fa 0,1 -r 5 -o json >"$OUT/llama-bench.json"
"$BIN/llama-bench" -m "$MODEL" -ngl 99 -p 512 -n 128 -fa 0,1 -r 5 -o md >"$OUT/llama-bench.md"
cat "$OUT/llama-bench.md"
"$BIN/llama-perplexity" -m "$MODEL" -f "$CORPUS" -c 512 -ngl 99 >"$OUT/perplexity.txt" 2>&1
grep -E "Final estimate|estimated PPL" "$OUT/perplexity.txt" || tail -5 "$OUT/perplexity.txt"
