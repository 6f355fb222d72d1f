"""Writes a randomly initialised LFM2 checkpoint (HF directory, float16
safetensors, no tokenizer) with the shapes of LFM2-350M, for speed and
GPU-vs-CPU runs where the real weights cannot be had (no registry ships
them; see MODELS.md).

    python3 scripts/device/lfm2_random.py OUT_DIR [--small]

LFM2-350M's config: hidden 1024, 16 layers with attention at 2, 5, 8, 10,
12, 14 (the others gated short convolutions, conv_L_cache 3), 16 query / 8
key-value heads, intermediate_size 6656 auto-adjusted to a feed-forward of
4608, vocabulary 65536, tied embeddings, rope_theta 1e6, norm_eps 1e-5.
--small keeps the architecture at a size a CPU-only machine runs quickly
(hidden 256, 4 layers, vocabulary 4096), for trying the device script here.

Weights follow scripts/fixtures/llm_tiny.py's scheme, louder than
transformers' init so the logits are peaked and greedy choices are stable:
embeddings N(0, 1), norms 1 + 0.2 N(0, 1), input projections and the conv
kernel 1.5 N(0, 1) / sqrt(fan_in), output projections 3 N(0, 1) / sqrt(fan_in).
Needs torch and transformers (>= 4.54, which added LFM2).
"""

import argparse
import math

import torch
from transformers import Lfm2Config, Lfm2ForCausalLM

OUTPUT_PROJECTIONS = ("out_proj", "o_proj", "feed_forward.w2", "down_proj")


def config(small):
    shape = (
        dict(hidden_size=256, intermediate_size=1536, num_hidden_layers=4,
             num_attention_heads=4, num_key_value_heads=2, vocab_size=4096,
             full_attn_idxs=[1, 3])
        if small
        else dict(hidden_size=1024, intermediate_size=6656, num_hidden_layers=16,
                  num_attention_heads=16, num_key_value_heads=8, vocab_size=65536,
                  full_attn_idxs=[2, 5, 8, 10, 12, 14])
    )
    common = dict(
        max_position_embeddings=128000,
        norm_eps=1e-5,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=7,
        tie_word_embeddings=True,
        conv_bias=False,
        conv_L_cache=3,
        block_multiple_of=256,
        block_ffn_dim_multiplier=1.0,
        block_auto_adjust_ff_dim=True,
        **shape,
    )
    try:
        return Lfm2Config(rope_parameters={"rope_type": "default", "rope_theta": 1e6}, **common)
    except TypeError:  # transformers 4.x
        return Lfm2Config(rope_theta=1e6, **common)


def randomise(model, seed):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters(), key=lambda kv: kv[0]):
            if name.endswith("embed_tokens.weight"):
                p.copy_(torch.randn(p.shape, generator=g))
            elif p.dim() == 1:
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=g))
            else:
                fan_in = math.prod(p.shape[1:])
                gain = 3.0 if any(k in name for k in OUTPUT_PROJECTIONS) else 1.5
                p.copy_(gain * torch.randn(p.shape, generator=g) / math.sqrt(fan_in))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--small", action="store_true")
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    model = Lfm2ForCausalLM(config(a.small)).eval()
    randomise(model, a.seed)
    model.to(torch.float16).save_pretrained(a.out, safe_serialization=True)
    n = sum(p.numel() for p in model.parameters())
    print(f"lfm2_random: {n / 1e6:.1f}M parameters -> {a.out}")


if __name__ == "__main__":
    main()
