#!/usr/bin/env python3
"""SmolLM2-135M-Instruct's tokenizer as Hugging Face files (tokenizer.json,
tokenizer_config.json, chat_template.jinja), built from the GGUF that
scripts/setup fetches, without torch: the folder the device scripts carry as
TOK (default .dev/lfm2-tok) for the random LFM2 checkpoints
(scripts/fixtures/lfm2_350m_random.py --tokenizer, scripts/device/llm_peer.sh).

    python3 -m venv /tmp/tokvenv && /tmp/tokvenv/bin/pip install -q gguf tokenizers
    /tmp/tokvenv/bin/python scripts/device/smollm2_tokenizer.py .dev/lfm2-tok

transformers' own GGUF tokenizer reader (what lfm2_350m_random.py uses
without --tokenizer) imports torch, which the development machines lack. This
builds the same byte-level BPE from the GGUF's vocabulary and merges, with
SmolLM2's digit split ahead of the byte-level regex (llama.cpp's "smollm"
pre-tokenizer) and the control tokens as special tokens.
"""

import json
import os
import sys

import gguf
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GGUF = os.path.join(ROOT, "samples", "models", "smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")
CONTROL = 3  # llama.cpp's token type of control tokens


def field(reader, key):
    f = reader.fields[key]
    if f.types[0] == gguf.GGUFValueType.ARRAY:
        if f.types[1] == gguf.GGUFValueType.STRING:
            return [bytes(f.parts[i]).decode("utf-8") for i in f.data]
        return [int(f.parts[i][0]) for i in f.data]
    if f.types[0] == gguf.GGUFValueType.STRING:
        return bytes(f.parts[f.data[0]]).decode("utf-8")
    return int(f.parts[f.data[0]][0])


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, ".dev", "lfm2-tok")
    r = gguf.GGUFReader(GGUF)
    tokens = field(r, "tokenizer.ggml.tokens")
    types = field(r, "tokenizer.ggml.token_type")
    merges = [tuple(m.split(" ", 1)) for m in field(r, "tokenizer.ggml.merges")]
    bos, eos = field(r, "tokenizer.ggml.bos_token_id"), field(r, "tokenizer.ggml.eos_token_id")
    tok = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges, fuse_unk=False))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t, ty in zip(tokens, types) if ty == CONTROL])
    os.makedirs(out, exist_ok=True)
    tok.save(os.path.join(out, "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": tokens[bos],
        "eos_token": tokens[eos],
        "model_max_length": 8192,
        "clean_up_tokenization_spaces": False,
    }
    with open(os.path.join(out, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f, indent=1)
    with open(os.path.join(out, "chat_template.jinja"), "w", encoding="utf-8") as f:
        f.write(field(r, "tokenizer.chat_template"))
    ids = tok.encode("2024 Hello world").ids
    assert ids[:4] == [tok.token_to_id(d) for d in "2024"], ids
    print(json.dumps({"out": out, "vocab": tok.get_vocab_size(), "example_ids": ids}))


if __name__ == "__main__":
    main()
