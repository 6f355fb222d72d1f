#!/usr/bin/env bash
# llama.cpp as a peer (speed) and an oracle (correctness), built from the
# source vendored in PyPI's llama-cpp-python sdist. Nothing of it is committed:
# the sdist is cached in samples/cache/, the sources and the build live in the
# git-ignored peers/.
#
# Usage:
#   scripts/peers/llama-cpp.sh               download (cached), unpack, build (idempotent;
#                                            AMX=1 keeps AMX, see build(); SERVER=1 adds
#                                            llama-server, without its web UI)
#   scripts/peers/llama-cpp.sh --unpack      download and unpack only (enough for the
#                                            GGUF converter, convert_hf_to_gguf.py)
#   scripts/peers/llama-cpp.sh --pack OUT.tar.gz
#                                            pack the sources minus docs, models, the web
#                                            UI's sources and unused backends (the server
#                                            stays), to build on another machine, e.g. with
#                                            CUDA:
#       tar xzf OUT.tar.gz && cd llama.cpp &&
#       cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON \
#             -DCMAKE_CUDA_ARCHITECTURES=90 -DLLAMA_BUILD_TESTS=OFF \
#             -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_UI=OFF \
#             -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_OPENSSL=OFF &&
#       cmake --build build --target llama-bench llama-completion llama-perplexity llama-server
#
# Result: peers/llama.cpp/build/bin/ holds llama-bench, llama-quantize,
# llama-perplexity, llama-completion (the classic CLI: -no-cnv --temp 0),
# llama-tokenize and the shared libraries (libllama.so, libggml*.so).
# peers/llama_cpp_py/llama_cpp/ is the sdist's ctypes binding; use it with
#   PYTHONPATH=peers/llama_cpp_py LLAMA_CPP_LIB_PATH=peers/llama.cpp/build/bin
# (scripts/fixtures/smollm2_reference.py does).
# Needs: python3 with pip, cmake, ninja (or make), a C++17 compiler.
set -euo pipefail
cd "$(dirname "$0")/../.."

VERSION=0.3.36
SDIST=samples/cache/llama_cpp_python-$VERSION.tar.gz
SRC=peers/llama.cpp
PY=peers/llama_cpp_py
STAMP=$SRC/.from-llama-cpp-python-$VERSION
TARGETS=(llama-bench llama-quantize llama-perplexity llama-completion llama-tokenize)

download() {
    if [[ ! -f $SDIST ]]; then
        mkdir -p samples/cache
        echo "llama-cpp: downloading llama-cpp-python==$VERSION (sdist)" >&2
        python3 -m pip download --quiet --no-deps --no-binary llama-cpp-python -d samples/cache \
            "llama-cpp-python==$VERSION"
    fi
}

unpack() {
    download
    [[ -f $STAMP ]] && return
    echo "llama-cpp: unpacking vendor/llama.cpp into $SRC" >&2
    rm -rf "$SRC" "$PY"
    mkdir -p "$SRC" "$PY"
    tar xzf "$SDIST" -C "$SRC" --strip-components=3 "llama_cpp_python-$VERSION/vendor/llama.cpp"
    tar xzf "$SDIST" -C "$PY" --strip-components=1 "llama_cpp_python-$VERSION/llama_cpp"
    touch "$STAMP"
}

# Native, but without AMX: on the lent Xeon VMs the CPU reports AMX, so
# -march=native compiles llama.cpp's AMX kernels for repacked Q4/Q8 weights,
# and every llama-bench run then died with SIGILL (`tilezero` on a worker
# thread: the hypervisor does not grant the tile state). GCC keeps explicit
# -mno-* flags over -march=native's, so the build still gets every other ISA
# extension the CPU has (AVX-512, VNNI, ...); on CPUs without AMX the flags
# change nothing. AMX=1 keeps it for machines that allow it.
NO_AMX=(-mno-amx-tile -mno-amx-int8 -mno-amx-bf16)
[[ ${AMX:-0} == 1 ]] && NO_AMX=()

build() {
    unpack
    local gen=() server=OFF
    command -v ninja >/dev/null && gen=(-G Ninja)
    if [[ ${SERVER:-0} == 1 ]]; then
        server=ON
        TARGETS+=(llama-server)
    fi
    # Configured again when SERVER changes (cmake keeps the rest of the build).
    if [[ ! -f $SRC/build/CMakeCache.txt ]] || ! grep -q "LLAMA_BUILD_SERVER:BOOL=$server" "$SRC/build/CMakeCache.txt"; then
        cmake -S "$SRC" -B "$SRC/build" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release \
            -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=$server \
            -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
            -DLLAMA_BUILD_APP=OFF -DLLAMA_OPENSSL=OFF -DGGML_NATIVE=ON \
            -DCMAKE_C_FLAGS="${NO_AMX[*]}" -DCMAKE_CXX_FLAGS="${NO_AMX[*]}"
    fi
    local start=$SECONDS
    cmake --build "$SRC/build" --target "${TARGETS[@]}" -j "${JOBS:-$(nproc)}"
    echo "llama-cpp: build step took $((SECONDS - start)) s; binaries in $SRC/build/bin" >&2
}

pack() {
    local out=$1
    unpack
    # Everything a CPU or CUDA build of the library and tools/ needs, llama-server
    # included (tools/server, tools/cli and tools/ui's CMake files, which the
    # server's build adds; configure it with -DLLAMA_BUILD_UI=OFF
    # -DLLAMA_USE_PREBUILT_UI=OFF to build it offline without the web UI),
    # and the GGUF converter (convert_hf_to_gguf.py, conversion/, gguf-py);
    # the other GPU backends, docs, vocab test models, the web UI's sources
    # and the server's tests are left out.
    local excludes=(
        --exclude=llama.cpp/build --exclude=llama.cpp/docs --exclude=llama.cpp/models
        --exclude=llama.cpp/media --exclude=llama.cpp/.github --exclude=llama.cpp/.devops
        --exclude=llama.cpp/tests --exclude=llama.cpp/examples --exclude=llama.cpp/pocs
        --exclude=llama.cpp/tools/ui/src --exclude=llama.cpp/tools/ui/static
        --exclude=llama.cpp/tools/ui/tests --exclude=llama.cpp/tools/ui/package-lock.json
        --exclude=llama.cpp/tools/server/tests --exclude=llama.cpp/tools/server/bench
        --exclude=llama.cpp/gguf-py/tests
        --exclude="$(basename "$STAMP")"
    )
    for b in cann et hexagon hip metal musa opencl openvino sycl virtgpu vulkan webgpu zdnn zendnn; do
        excludes+=(--exclude="llama.cpp/ggml/src/ggml-$b")
    done
    tar czf "$out" -C "$(dirname "$SRC")" "${excludes[@]}" llama.cpp
    echo "llama-cpp: packed $(du -h "$out" | cut -f1) into $out" >&2
}

case "${1:-}" in
    "") build ;;
    --unpack) unpack ;;
    --pack) [[ $# -eq 2 ]] || { echo "usage: $0 --pack OUT.tar.gz" >&2; exit 2; }; pack "$2" ;;
    *) echo "usage: $0 [--unpack | --pack OUT.tar.gz]" >&2; exit 2 ;;
esac
