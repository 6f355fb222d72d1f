#!/usr/bin/env bash
# Packs faster-whisper for the H200 into .dev/fw-site.tar.xz (git-ignored
# with .dev/): ctranslate2 4.8.5 (its one Linux wheel holds the CUDA build)
# and faster-whisper 1.2.1, unpacked as a site-packages folder, shared
# objects stripped (ctranslate2's _ext.so is 68 MB of debug info, 1.3 MB
# without), xz-compressed: ~15 MB, so it travels in the same call as the
# tree. Their other needs (numpy, pyyaml, tokenizers, onnxruntime,
# huggingface-hub, tqdm) are on the device image. PyAV, which
# faster_whisper.audio imports, is replaced by a stub package that fails
# when used: scripts/bench/transcribe.py hands faster-whisper decoded
# samples, never a file, and PyAV's wheel (~35 MB) would not fit.
# scripts/device/transcribe_fw.sh unpacks and uses it there. Carry it in a
# call without a model chunk (15 MB + a 34 MB chunk + the tree is over the
# 64 MiB a call takes); on a warm machine it stays in /tmp/fw-site.
#
# Run here, from the repository root (needs pip and network):
#   scripts/device/pack_fw.sh            # PYVER=3.12 (the device's python3)
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PY:-python3}
# Outside .dev: the wheels themselves (44 MB) must not travel.
W=${WHEELS_DIR:-/tmp/lfm-fw-wheels}
mkdir -p "$W"
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version "${PYVER:-3.12}" \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d "$W" \
    ctranslate2==4.8.5 faster-whisper==1.2.1
stage=.dev/fw-stage
rm -rf "$stage" && mkdir -p "$stage"
for w in "$W"/ctranslate2-4.8.5-*.whl "$W"/faster_whisper-1.2.1-*.whl; do
    unzip -q -o "$w" -d "$stage"
done
find "$stage" -name '*.so*' -type f -exec strip --strip-unneeded {} +
mkdir -p "$stage/av"
cat >"$stage/av/__init__.py" <<'PY'
"""Stub of PyAV for the device run (scripts/device/pack_fw.sh): faster-whisper
imports av at load time; the benchmark passes samples, so nothing calls it."""


def __getattr__(name):
    raise ImportError(f"av.{name}: PyAV is not installed here (a stub); pass samples, not files")
PY
tar cf - -C "$stage" . | xz -T2 -6 >.dev/fw-site.tar.xz
rm -rf "$stage"
ls -la .dev/fw-site.tar.xz
