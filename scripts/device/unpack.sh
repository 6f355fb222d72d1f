#!/usr/bin/env bash
# Device side of scripts/device/pack.sh: run first in every call, from the repo
# root. Installs the carried Vulkan loader, puts the binaries under
# target/release (tool wrappers around lfm), collects model chunks in
# /tmp/lfm-stash across calls (a warm machine keeps /tmp), and unpacks each
# model whose chunks are all there into samples/models.
# .gl holds the Debian packages libvulkan1, libglvnd0, libegl1, libgl1,
# libglx0, libgles2 and libopengl0 (the NVIDIA Vulkan driver there needs the
# GL dispatch libraries too); the commands after this script also need
#   export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
# or wgpu finds no adapter. Write results under /tmp and tar them into $OUT:
# only a few files come back from $OUT, and it is emptied before each call.
set -uo pipefail
cd "$(dirname "$0")/../.."
for f in .gl/*.deb; do dpkg -x "$f" /; done
ldconfig
# Test binaries find their fixtures through the checkout path they were built
# in (CARGO_MANIFEST_DIR); point it here.
built_in=${BUILT_IN:-/work/main}
[[ -e $built_in ]] || { mkdir -p "$(dirname "$built_in")" && ln -s "$PWD" "$built_in"; }
S=/tmp/lfm-stash
mkdir -p "$S" samples/models target/release/examples
if [[ -f .dev/bin.tar.xz ]]; then
    rm -rf "$S/bin" && tar xJf .dev/bin.tar.xz -C "$S"
fi
if [[ -d $S/bin ]]; then
    cp "$S/bin/lfm" target/release/lfm
    cp "$S/bin/llm_gpu_check" target/release/examples/llm_gpu_check
    # The test and example binaries pack.sh carried, in target/release (as
    # the older scripts call them) and in target/release/examples (where
    # cargo puts examples).
    for t in "$S"/bin/*; do
        case $(basename "$t") in lfm | llm_gpu_check) ;; *) cp "$t" target/release/ && cp "$t" target/release/examples/ ;; esac
    done
    # ... and the tools through the target folder (CARGO_BIN_EXE_lfm).
    built_target=${BUILT_TARGET:-/work/target}
    [[ -e $built_target ]] || { mkdir -p "$built_target" && ln -s "$PWD/target/release" "$built_target/release"; }
    for tool in generate scoreboard embed transcribe speak ocr-layout quantize kld gguf-write serve; do
        printf '#!/bin/sh\nexec "$(dirname "$0")/lfm" %s "$@"\n' "$tool" >"target/release/$tool"
        chmod +x "target/release/$tool"
    done
    # pack.sh's B_LFM: the build to compare with (scripts/device/speak_ab.sh's B).
    if [[ -f target/release/lfm-b ]]; then
        printf '#!/bin/sh\nexec "$(dirname "$0")/lfm-b" speak "$@"\n' >target/release/speak-b
        chmod +x target/release/speak-b
    fi
fi
[[ -f .dev/small.tar ]] && tar xf .dev/small.tar -C "$S"
for m in layout-cdla whisper-mel; do
    [[ -d $S/$m ]] && ln -sfn "$S/$m" "samples/models/$m"
done
for f in .dev/*.[0-9][0-9]; do
    [[ -f $f ]] && cp "$f" "$S/"
done
# A model is complete when its chunk count (in .dev/chunks.txt, carried every
# call) is reached.
while read -r m n; do
    have=$(ls "$S/$m".[0-9][0-9] 2>/dev/null | wc -l)
    if [[ ! -d $S/models/$m && $have -eq $n ]]; then
        mkdir -p "$S/models" && cat "$S/$m".[0-9][0-9] | tar xf - -C "$S/models" && rm -f "$S/$m".[0-9][0-9]
    fi
    if [[ -d $S/models/$m ]]; then
        ln -sfn "$S/models/$m" "samples/models/$m"
        echo "unpack: $m ready"
    else
        echo "unpack: $m has $have of $n chunks"
    fi
done <.dev/chunks.txt
