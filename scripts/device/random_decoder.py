#!/usr/bin/env python3
"""A randomly initialised decoder with a real checkpoint's shapes, as an HF
directory without a tokenizer, for speed and GPU-against-CPU checks on the lent
H200 (scripts/device/recipe_check.sh), where no weights can be fetched.

    python3 scripts/device/random_decoder.py gemma3-270m OUT_DIR
    python3 scripts/device/random_decoder.py lfm2-350m OUT_DIR
    python3 scripts/device/random_decoder.py lfm2-1.2b OUT_DIR
    python3 scripts/device/random_decoder.py smollm2-135m OUT_DIR
    python3 scripts/device/random_decoder.py smollm2-1.7b OUT_DIR

Shapes: gemma-3-270m's config (hidden 640, 18 layers, 4/1 heads of 256,
feed-forward 2048, vocabulary 262144, sliding window 512 on 5 of every 6
layers); LFM2-350M's (as scripts/fixtures/lfm2_350m_random.py); LFM2-1.2B's
(hidden 2048, 32 heads, feed-forward 12288 auto-adjusted to 8192);
SmolLM2-135M's (the default model: Llama, hidden 576, 30 layers, 9 heads and
3 key heads of 64, feed-forward 1536); SmolLM2-1.7B's (Llama: hidden 2048, 24 layers, 32 heads of 64, feed-forward
8192, SmolLM2's vocabulary of 49152, so SmolLM2-135M can draft for it:
scripts/device/speculative.sh). Init: every
matrix N(0, 1/fan_in), embeddings N(0, 0.1^2) (Gemma's scaled by its
sqrt(hidden) on input), norms near their unit gain, bf16.
"""

import sys

import torch
from transformers import (Gemma3ForCausalLM, Gemma3TextConfig, Lfm2Config, Lfm2ForCausalLM, LlamaConfig,
                          LlamaForCausalLM)


def gemma3_270m():
    cfg = Gemma3TextConfig(vocab_size=262144, hidden_size=640, intermediate_size=2048, num_hidden_layers=18,
                           num_attention_heads=4, num_key_value_heads=1, head_dim=256, query_pre_attn_scalar=256,
                           max_position_embeddings=32768, sliding_window=512, rms_norm_eps=1e-6,
                           rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 1e6},
                                            "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}},
                           tie_word_embeddings=True, dtype="bfloat16")
    return Gemma3ForCausalLM(cfg), True


def lfm2(hidden, intermediate, heads):
    """LFM2's layout (16 layers, attention at 6 of them, 8 KV heads, its
    vocabulary) at one size."""
    cfg = Lfm2Config(vocab_size=65536, hidden_size=hidden, intermediate_size=intermediate, num_hidden_layers=16,
                     num_attention_heads=heads, num_key_value_heads=8, max_position_embeddings=128000,
                     norm_eps=1e-5, conv_L_cache=3, block_multiple_of=256, block_ffn_dim_multiplier=1.0,
                     block_auto_adjust_ff_dim=True, full_attn_idxs=[2, 5, 8, 10, 12, 14],
                     tie_word_embeddings=True, dtype="bfloat16")
    return Lfm2ForCausalLM(cfg), False


def lfm2_350m():
    return lfm2(1024, 6656, 16)


def lfm2_1_2b():
    return lfm2(2048, 12288, 32)


def smollm2_135m():
    cfg = LlamaConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                      num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=8192,
                      rms_norm_eps=1e-5, rope_theta=100000.0, tie_word_embeddings=True, dtype="bfloat16")
    return LlamaForCausalLM(cfg), False


def smollm2_1_7b():
    cfg = LlamaConfig(vocab_size=49152, hidden_size=2048, intermediate_size=8192, num_hidden_layers=24,
                      num_attention_heads=32, num_key_value_heads=32, max_position_embeddings=8192,
                      rms_norm_eps=1e-5, rope_theta=130000.0, tie_word_embeddings=True, dtype="bfloat16")
    return LlamaForCausalLM(cfg), False


def main():
    name, out = sys.argv[1], sys.argv[2]
    model, gemma = {"gemma3-270m": gemma3_270m, "lfm2-350m": lfm2_350m, "lfm2-1.2b": lfm2_1_2b,
                    "smollm2-135m": smollm2_135m, "smollm2-1.7b": smollm2_1_7b}[name]()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for pname, p in sorted(model.named_parameters(), key=lambda kv: kv[0]):
            if pname.endswith("embed_tokens.weight"):
                v = 0.1 * torch.randn(p.shape, generator=g)
            elif p.dim() == 1:
                # Gemma stores w of (1 + w).
                v = (0.0 if gemma else 1.0) + 0.1 * torch.randn(p.shape, generator=g)
            else:
                v = torch.randn(p.shape, generator=g) / (p[0].numel() ** 0.5)
            p.copy_(v.to(p.dtype))
    model.to(torch.bfloat16).save_pretrained(out, safe_serialization=True)


if __name__ == "__main__":
    main()
