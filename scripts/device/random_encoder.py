#!/usr/bin/env python3
"""Random weights of a sentence-transformers BERT encoder's real shapes, for
speed runs on the lent H200 where the real weights would not fit a call's
carry: reads DIR/config.json (the other small files of the directory stay
as they are) and writes DIR/model.safetensors of a BertModel with that
config, every matrix N(0, 1/fan_in), embeddings N(0, 1), norms near 1.

    python3 scripts/device/random_encoder.py samples/models/all-minilm-l6-v2
"""

import os
import sys

import torch
from transformers import BertConfig, BertModel


def main():
    d = sys.argv[1]
    cfg = BertConfig.from_pretrained(d)
    model = BertModel(cfg, add_pooling_layer=False).eval()
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            if p.dim() == 2 and "embeddings" not in name:
                p.copy_(torch.randn(p.shape, generator=g) / p.shape[1] ** 0.5)
            elif p.dim() == 2:
                p.copy_(torch.randn(p.shape, generator=g))
            elif "LayerNorm" in name and name.endswith("weight"):
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(0.05 * torch.randn(p.shape, generator=g))
    model.save_pretrained(d, safe_serialization=True)
    print(f"random_encoder: wrote {os.path.join(d, 'model.safetensors')}", file=sys.stderr)


if __name__ == "__main__":
    main()
