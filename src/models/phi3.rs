//! Phi-3 / Phi-3.5 / Phi-4-mini: a Llama-shaped decoder whose q, k and v
//! projections are one matrix (`qkv_proj`) and whose gate and up are one
//! (`gate_up_proj`, gate rows first); split into the recipe's roles on load.
//! RoPE on halves, optionally on a fraction of each head
//! (`partial_rotary_factor`).

use super::llama::{hf_base, hf_sliding, GgufKeys};
use super::llm::{Arch, LayerNames, LlmConfig, Names, RopeStyle};
use crate::error::{Error, Result};
use crate::formats::gguf::GgufFile;
use crate::formats::hf::HfConfig;
use crate::formats::TensorSource;

/// transformers' `Phi3Config` default.
const DEFAULT_ROPE_THETA: f32 = 10_000.0;

pub fn config_from_hf(c: &HfConfig) -> Result<LlmConfig> {
    let mut cfg = hf_base(c, Arch::Phi3, DEFAULT_ROPE_THETA)?;
    // transformers masks every layer to the sliding window when one is set.
    (cfg.sliding_layers, cfg.sliding_window) = hf_sliding(c, cfg.layers.len(), true)?;
    if c.get_str_opt("hidden_act")?.is_some_and(|a| a != "silu") {
        return Err(Error::unsupported(
            c.path(),
            format!(
                "hidden_act '{}' (supported: silu)",
                c.get_str("hidden_act")?
            ),
        ));
    }
    cfg.validate(c.path())?;
    Ok(cfg)
}

pub fn hf_names(tied: bool) -> Names {
    Names {
        embed: "model.embed_tokens.weight".into(),
        final_norm: "model.norm.weight".into(),
        head: (!tied).then(|| "lm_head.weight".into()),
        norm_shift: 0.0,
        layer: Box::new(|i| {
            let p = format!("model.layers.{i}");
            LayerNames {
                norm1: format!("{p}.input_layernorm.weight"),
                norm2: format!("{p}.post_attention_layernorm.weight"),
                qkv: Some(format!("{p}.self_attn.qkv_proj.weight")),
                o: format!("{p}.self_attn.o_proj.weight"),
                gate_up: Some(format!("{p}.mlp.gate_up_proj.weight")),
                down: format!("{p}.mlp.down_proj.weight"),
                ..LayerNames::default()
            }
        }),
    }
}

/// llama.cpp's phi3: the sliding window is not applied (it says so when it
/// loads such a file), and we follow it on its files.
pub fn config_from_gguf(g: &GgufFile) -> Result<LlmConfig> {
    let cfg = GgufKeys { g, arch: "phi3" }.base(Arch::Phi3, RopeStyle::Halves)?;
    cfg.validate(g.path())?;
    Ok(cfg)
}
