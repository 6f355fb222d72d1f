#!/usr/bin/env bash
# Packs what the H200 runs need into .dev/ (git-ignored via .git/info/exclude),
# in pieces small enough for the device tool's 64 MiB per-call limit:
#   .dev/bin.tar.xz        stripped release binaries: lfm (every tool), the
#                          llm_gpu_check example and those in EXAMPLES (none by
#                          default; unpack.sh puts them in target/release and
#                          target/release/examples), the
#                          test binaries in TESTS
#                          (default gpu_parity, llm_gpu, llm_gpu_batch, speak_vits),
#                          and B_LFM (a second lfm binary to compare with, e.g.
#                          main's, carried as lfm-b);
#                          scripts/device/unpack.sh makes target/release/<tool>
#                          wrappers around lfm (and speak-b around lfm-b)
#   .dev/small.tar         the layout model, the mel filters, the LibriVox clips
#   .dev/<model>.NN        CHUNK-sized (default 34 MiB: the tree itself, ~27 MB,
#                          travels in the same call) chunks of each model in MODELS
# Run from the repo root after `cargo build --release --bin lfm --example
# llm_gpu_check` and `cargo test --release --no-run --test gpu_parity --test llm_gpu
# --test llm_gpu_batch --test speak_vits`.
set -euo pipefail
cd "$(dirname "$0")/../.."
T=${CARGO_TARGET_DIR:-target}/release
D=.dev
rm -rf "$D/stage" && mkdir -p "$D/stage/bin"
strip -o "$D/stage/bin/lfm" "$T/lfm"
strip -o "$D/stage/bin/llm_gpu_check" "$T/examples/llm_gpu_check"
if [[ -n ${B_LFM:-} ]]; then
    strip -o "$D/stage/bin/lfm-b" "$B_LFM"
fi
for e in ${EXAMPLES:-}; do
    strip -o "$D/stage/bin/$e" "$T/examples/$e"
done
for t in ${TESTS:-gpu_parity llm_gpu llm_gpu_batch speak_vits}; do
    f=$(ls -t "$T"/deps/$t-* | grep -v '\.d$' | head -1)
    strip -o "$D/stage/bin/$t" "$f"
done
tar cf - -C "$D/stage" bin | xz -T2 -6 >"$D/bin.tar.xz"
tar cf "$D/small.tar" -C samples/models layout-cdla ppocr-v4 whisper-mel \
    -C /usr/share/pocketsphinx/test/data librivox
: >"$D/chunks.txt"
for m in ${MODELS:-smollm2 piper-joe all-minilm-l6-v2 whisper-tiny.en}; do
    rm -f "$D/$m".[0-9][0-9]
    tar cf - -C samples/models "$m" | split -b "${CHUNK:-34M}" -d -a 2 - "$D/$m."
    echo "$m $(ls "$D/$m".[0-9][0-9] | wc -l)" >>"$D/chunks.txt"
done
rm -rf "$D/stage"
ls -la "$D"
