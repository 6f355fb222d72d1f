#!/usr/bin/env python3
"""Drive the llama.cpp built by scripts/peers/llama-cpp.sh from Python.

Uses the ctypes binding from the same llama-cpp-python sdist
(peers/llama_cpp_py) against the shared libraries in
peers/llama.cpp/build/bin, so the binding and the library are the same
version. Nothing here is run by tests.

Subcommands (token ids as comma-separated lists):
  logits MODEL.gguf IDS N_PROMPT OUT.npy [--kv f32|f16]
      decode IDS[:N_PROMPT] in one batch (logits at every position), then
      IDS[N_PROMPT:] one token at a time with the KV/conv cache; writes
      float32 [N_PROMPT + len(IDS) - N_PROMPT, n_vocab] to OUT.npy
  greedy MODEL.gguf IDS N_PREDICT [--kv f32|f16]
      greedy continuation of IDS; prints JSON {"tokens": [...], "pieces": [...]}
  tokenize MODEL.gguf TEXT [--parse-special]
      prints JSON token ids (no BOS added)
  detokenize MODEL.gguf IDS [--remove-special] [--unparse-special]
      llama_detokenize with the vocabulary only; prints JSON {"hex": the
      bytes, "text": them as UTF-8, invalid sequences replaced}
Library use from another script: run this file with subprocess (keeps ggml's
threads and libraries out of a torch process).
"""

import argparse
import ctypes
import importlib
import json
import os
import sys
import types

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LIB_DIR = os.path.join(ROOT, "peers", "llama.cpp", "build", "bin")
BINDING = os.path.join(ROOT, "peers", "llama_cpp_py")


_quiet = None


def available():
    return os.path.exists(os.path.join(LIB_DIR, "libllama.so")) and os.path.isdir(os.path.join(BINDING, "llama_cpp"))


def load():
    if not available():
        sys.exit("llama_cpp: build llama.cpp first: scripts/peers/llama-cpp.sh")
    os.environ["LLAMA_CPP_LIB_PATH"] = LIB_DIR
    # Only the low-level ctypes module is needed: register the package without
    # running its __init__ (which pulls in the high-level API and its deps).
    package = types.ModuleType("llama_cpp")
    package.__path__ = [os.path.join(BINDING, "llama_cpp")]
    sys.modules["llama_cpp"] = package
    llama_cpp = importlib.import_module("llama_cpp.llama_cpp")

    llama_cpp.llama_backend_init()
    global _quiet  # the callback must outlive every llama.cpp call
    _quiet = llama_cpp.llama_log_callback(lambda level, text, data: None)
    llama_cpp.llama_log_set(_quiet, ctypes.c_void_p(0))
    return llama_cpp


class Model:
    def __init__(self, L, path, n_ctx, kv):
        self.L = L
        mp = L.llama_model_default_params()
        self.model = L.llama_model_load_from_file(path.encode(), mp)
        if not self.model:
            sys.exit(f"llama_cpp: cannot load {path}")
        self.vocab = L.llama_model_get_vocab(self.model)
        self.n_vocab = L.llama_vocab_n_tokens(self.vocab)
        cp = L.llama_context_default_params()
        cp.n_ctx = n_ctx
        cp.n_batch = n_ctx
        cp.n_ubatch = n_ctx
        kv_type = {"f32": L.GGML_TYPE_F32, "f16": L.GGML_TYPE_F16}[kv]
        cp.type_k = kv_type
        cp.type_v = kv_type
        # Flash attention on the CPU rounds Q to f16; the plain path keeps f32.
        cp.flash_attn_type = L.LLAMA_FLASH_ATTN_TYPE_DISABLED
        self.ctx = L.llama_init_from_model(self.model, cp)
        if not self.ctx:
            sys.exit(f"llama_cpp: cannot create a context for {path}")

    def decode(self, toks, pos0, all_logits):
        """Decode toks at positions pos0.. in one batch; return the logits rows
        asked for (every position, or only the last)."""
        L = self.L
        b = L.llama_batch_init(len(toks), 0, 1)
        for i, t in enumerate(toks):
            b.token[i] = t
            b.pos[i] = pos0 + i
            b.n_seq_id[i] = 1
            b.seq_id[i][0] = 0
            b.logits[i] = 1 if (all_logits or i == len(toks) - 1) else 0
        b.n_tokens = len(toks)
        rc = L.llama_decode(self.ctx, b)
        if rc != 0:
            sys.exit(f"llama_cpp: llama_decode returned {rc}")
        rows = [
            np.ctypeslib.as_array(L.llama_get_logits_ith(self.ctx, i), shape=(self.n_vocab,)).copy()
            for i in range(len(toks))
            if all_logits or i == len(toks) - 1
        ]
        L.llama_batch_free(b)
        return rows

    def piece(self, tok):
        buf = ctypes.create_string_buffer(256)
        n = self.L.llama_token_to_piece(self.vocab, tok, buf, len(buf), 0, True)
        return buf.raw[:n].decode("utf-8", errors="replace")

    def tokenize(self, text, parse_special):
        data = text.encode("utf-8")
        cap = len(data) + 16
        out = (self.L.llama_token * cap)()
        n = self.L.llama_tokenize(self.vocab, data, len(data), out, cap, False, parse_special)
        if n < 0:
            sys.exit("llama_cpp: tokenize buffer too small")
        return [int(out[i]) for i in range(n)]


def ids_arg(s):
    return [int(x) for x in s.split(",") if x]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("logits")
    p.add_argument("model")
    p.add_argument("ids", type=ids_arg)
    p.add_argument("n_prompt", type=int)
    p.add_argument("out")
    p.add_argument("--kv", choices=["f32", "f16"], default="f32")
    p = sub.add_parser("greedy")
    p.add_argument("model")
    p.add_argument("ids", type=ids_arg)
    p.add_argument("n_predict", type=int)
    p.add_argument("--kv", choices=["f32", "f16"], default="f16")
    p = sub.add_parser("tokenize")
    p.add_argument("model")
    p.add_argument("text")
    p.add_argument("--parse-special", action="store_true")
    p = sub.add_parser("detokenize")
    p.add_argument("model")
    p.add_argument("ids", type=ids_arg)
    p.add_argument("--remove-special", action="store_true")
    p.add_argument("--unparse-special", action="store_true")
    args = ap.parse_args()

    L = load()
    if args.cmd == "logits":
        m = Model(L, args.model, max(64, len(args.ids) + 8), args.kv)
        rows = m.decode(args.ids[: args.n_prompt], 0, True)
        for j, t in enumerate(args.ids[args.n_prompt :]):
            rows += m.decode([t], args.n_prompt + j, False)
        np.save(args.out, np.stack(rows).astype(np.float32))
    elif args.cmd == "greedy":
        m = Model(L, args.model, len(args.ids) + args.n_predict + 8, args.kv)
        row = m.decode(args.ids, 0, False)[0]
        tokens = []
        for j in range(args.n_predict):
            tokens.append(int(np.argmax(row)))
            if j + 1 < args.n_predict:
                row = m.decode([tokens[-1]], len(args.ids) + j, False)[0]
        json.dump({"tokens": tokens, "pieces": [m.piece(t) for t in tokens]}, sys.stdout)
        print()
    elif args.cmd == "tokenize":
        m = Model(L, args.model, 64, "f16")
        json.dump(m.tokenize(args.text, args.parse_special), sys.stdout)
        print()
    elif args.cmd == "detokenize":
        data = detokenize(L, args.model, args.ids, args.remove_special, args.unparse_special)
        json.dump({"hex": data.hex(), "text": data.decode("utf-8", errors="replace")}, sys.stdout)
        print()


def detokenize(L, path, ids, remove_special, unparse_special):
    mp = L.llama_model_default_params()
    mp.vocab_only = True
    model = L.llama_model_load_from_file(path.encode(), mp)
    if not model:
        sys.exit(f"llama_cpp: cannot load {path}")
    vocab = L.llama_model_get_vocab(model)
    tokens = (L.llama_token * max(1, len(ids)))(*ids)
    cap = 64 + 64 * len(ids)
    buf = ctypes.create_string_buffer(cap)
    n = L.llama_detokenize(vocab, tokens, len(ids), buf, cap, remove_special, unparse_special)
    if n < 0:
        sys.exit("llama_cpp: detokenize buffer too small")
    L.llama_model_free(model)
    return buf.raw[:n]


if __name__ == "__main__":
    main()
