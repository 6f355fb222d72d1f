//! Qwen2 / Qwen2.5 (q, k and v biases) and Qwen3 (per-head q/k RMSNorm, an
//! explicit `head_dim`): Llama-shaped decoders with transformers' and
//! llama.cpp's Llama-style names ([`super::llama::hf_names`],
//! [`super::llama::gguf_names`]), RoPE on halves (llama.cpp's NEOX mode,
//! no q/k permutation in its converter).

use super::llama::{hf_base, hf_sliding, GgufKeys};
use super::llm::{Arch, LlmConfig, RopeStyle};
use crate::error::{Error, Result};
use crate::formats::gguf::GgufFile;
use crate::formats::hf::HfConfig;
use crate::formats::TensorSource;

/// transformers' `Qwen2Config` / `Qwen3Config` default.
const DEFAULT_ROPE_THETA: f32 = 10_000.0;

pub fn config_from_hf(c: &HfConfig, arch: Arch) -> Result<LlmConfig> {
    let mut cfg = hf_base(c, arch, DEFAULT_ROPE_THETA)?;
    // Qwen2 always has q/k/v biases; Qwen3 has them only with attention_bias.
    cfg.qkv_bias = match arch {
        Arch::Qwen2 => true,
        _ => c.get_bool_opt("attention_bias")?.unwrap_or(false),
    };
    if c.get_bool_opt("use_sliding_window")?.unwrap_or(false) {
        (cfg.sliding_layers, cfg.sliding_window) = hf_sliding(c, cfg.layers.len(), false)?;
    }
    cfg.validate(c.path())?;
    Ok(cfg)
}

pub fn config_from_gguf(g: &GgufFile, arch: Arch) -> Result<LlmConfig> {
    let name = arch.gguf_name();
    let mut cfg = GgufKeys { g, arch: name }.base(arch, RopeStyle::Halves)?;
    cfg.qkv_bias = g.has("blk.0.attn_q.bias");
    if arch == Arch::Qwen3 && !g.has("blk.0.attn_q_norm.weight") {
        return Err(Error::format(
            g.path(),
            "a qwen3 file without q/k norms (blk.0.attn_q_norm.weight)",
        ));
    }
    cfg.validate(g.path())?;
    Ok(cfg)
}
