//! Gemma-3 text decoders (gemma-3-270m .. 27b, text part): embeddings
//! scaled by sqrt(hidden), `(1 + w)` RMSNorms (HF stores `w`; llama.cpp's
//! converter adds the 1), norms before and after both attention and the
//! MLP, per-head q/k norms, a GELU-tanh gated MLP, the softmax scale from
//! `query_pre_attn_scalar`, and sliding-window attention on the local
//! layers with their own unscaled RoPE base (full attention, with the
//! checkpoint's RoPE scaling, on every sixth), as transformers'
//! `Gemma3ForCausalLM` and llama.cpp's `gemma3` compute them.

use super::llama::{hf_rope, rope_from_params, GgufKeys};
use super::llm::{Arch, FfnAct, LayerNames, LlmConfig, Names, RopeScaling, RopeStyle};
use crate::error::{Error, Result};
use crate::formats::gguf::{Array, GgufFile, Value};
use crate::formats::hf::HfConfig;
use crate::formats::TensorSource;

/// transformers' `Gemma3TextConfig` defaults.
const DEFAULT_ROPE_THETA: f32 = 1_000_000.0;
const DEFAULT_LOCAL_ROPE_THETA: f32 = 10_000.0;
/// Every `PATTERN`-th layer is global, the others sliding (Gemma-3's 5:1),
/// when a config does not list layer types.
const PATTERN: usize = 6;

fn sliding_pattern(n_layers: usize, pattern: usize) -> Vec<bool> {
    (0..n_layers)
        .map(|i| pattern == 0 || (i + 1) % pattern != 0)
        .collect()
}

pub fn config_from_hf(c: &HfConfig) -> Result<LlmConfig> {
    for key in ["attn_logit_softcapping", "final_logit_softcapping"] {
        if c.get(key).is_some_and(|v| !v.is_null()) {
            return Err(Error::unsupported(
                c.path(),
                format!("{key} (Gemma 2's soft-capping)"),
            ));
        }
    }
    if let Some(act) = c.get_str_opt("hidden_activation")? {
        if act != "gelu_pytorch_tanh" && act != "gelu_tanh" {
            return Err(Error::unsupported(
                c.path(),
                format!("hidden_activation '{act}' (supported: gelu_pytorch_tanh)"),
            ));
        }
    }
    let mut cfg = super::llama::hf_base(c, Arch::Gemma3, DEFAULT_ROPE_THETA)?;
    let n_layers = cfg.layers.len();
    // transformers 5: one RoPE parameter set per layer type; 4: rope_theta,
    // rope_scaling (global) and rope_local_base_freq.
    let (global, local) = match c.get("rope_parameters.full_attention") {
        Some(full) => (
            rope_from_params(c, Some(full), DEFAULT_ROPE_THETA)?,
            rope_from_params(
                c,
                c.get("rope_parameters.sliding_attention"),
                DEFAULT_LOCAL_ROPE_THETA,
            )?,
        ),
        None => (
            hf_rope(c, DEFAULT_ROPE_THETA)?,
            (
                c.get_f32_opt("rope_local_base_freq")?
                    .unwrap_or(DEFAULT_LOCAL_ROPE_THETA),
                RopeScaling::None,
            ),
        ),
    };
    if local.1 != RopeScaling::None {
        return Err(Error::unsupported(
            c.path(),
            "RoPE scaling on the sliding-window layers",
        ));
    }
    (cfg.rope_theta, cfg.rope_scaling) = global;
    cfg.rope_local_theta = Some(local.0);
    cfg.rope_dim = cfg.head_dim;
    let (flags, window) = super::llama::hf_sliding(c, n_layers, false)?;
    cfg.sliding_window = c.get_usize_opt("sliding_window")?.unwrap_or(window);
    cfg.sliding_layers = if flags.is_empty() {
        let pattern = c
            .get_usize_opt("sliding_window_pattern")?
            .unwrap_or(PATTERN);
        sliding_pattern(n_layers, pattern)
    } else {
        flags
    };
    let scalar = c
        .get_f32_opt("query_pre_attn_scalar")?
        .unwrap_or(cfg.head_dim as f32);
    cfg.attn_scale = 1.0 / scalar.sqrt();
    gemma_switches(&mut cfg);
    cfg.validate(c.path())?;
    Ok(cfg)
}

fn gemma_switches(cfg: &mut LlmConfig) {
    cfg.post_norms = true;
    cfg.ffn_act = FfnAct::GeluTanh;
    cfg.embed_scale = (cfg.hidden as f32).sqrt();
}

pub fn hf_names() -> Names {
    Names {
        embed: "model.embed_tokens.weight".into(),
        final_norm: "model.norm.weight".into(),
        head: None,
        norm_shift: 1.0,
        layer: Box::new(|i| {
            let p = format!("model.layers.{i}");
            let attn = |w: &str| format!("{p}.self_attn.{w}");
            LayerNames {
                norm1: format!("{p}.input_layernorm.weight"),
                post_mixer_norm: Some(format!("{p}.post_attention_layernorm.weight")),
                norm2: format!("{p}.pre_feedforward_layernorm.weight"),
                post_ffn_norm: Some(format!("{p}.post_feedforward_layernorm.weight")),
                q: attn("q_proj.weight"),
                k: attn("k_proj.weight"),
                v: attn("v_proj.weight"),
                o: attn("o_proj.weight"),
                q_norm: Some(attn("q_norm.weight")),
                k_norm: Some(attn("k_norm.weight")),
                gate: format!("{p}.mlp.gate_proj.weight"),
                up: format!("{p}.mlp.up_proj.weight"),
                down: format!("{p}.mlp.down_proj.weight"),
                ..LayerNames::default()
            }
        }),
    }
}

/// llama.cpp's reading of a `gemma3` GGUF (`llama_model_gemma3`).
pub fn config_from_gguf(g: &GgufFile) -> Result<LlmConfig> {
    let keys = GgufKeys { g, arch: "gemma3" };
    let key = |k: &str| keys.key(k);
    let mut cfg = keys.base(Arch::Gemma3, RopeStyle::Halves)?;
    if g.get_f32_opt(&key("final_logit_softcapping"))?
        .is_some_and(|v| v != 0.0)
    {
        return Err(Error::unsupported(g.path(), "final_logit_softcapping"));
    }
    let n_layers = cfg.layers.len();
    let window = g
        .get_usize_opt(&key("attention.sliding_window"))?
        .unwrap_or(0);
    if window > 0 {
        cfg.sliding_window = window;
        let pattern_key = key("attention.sliding_window_pattern");
        cfg.sliding_layers = match g.get(&pattern_key) {
            Some(Value::Array(Array::Bool(flags))) => flags.clone(),
            None => sliding_pattern(n_layers, PATTERN),
            Some(v) => match v.as_i128() {
                Some(p) if (0..=4096).contains(&p) => sliding_pattern(n_layers, p as usize),
                _ => {
                    return Err(Error::format(
                        g.path(),
                        format!("{pattern_key} is neither a layer count nor an array of booleans"),
                    ))
                }
            },
        };
        cfg.rope_local_theta = Some(
            g.get_f32_opt(&key("rope.freq_base_swa"))?
                .unwrap_or(DEFAULT_LOCAL_ROPE_THETA),
        );
    }
    // llama.cpp: 1 / sqrt(head_dim), except the 27B (62 layers), whose
    // query_pre_attn_scalar is hidden / heads.
    let scalar = if n_layers == 62 {
        (cfg.hidden / cfg.heads) as f32
    } else {
        cfg.head_dim as f32
    };
    cfg.attn_scale = 1.0 / scalar.sqrt();
    gemma_switches(&mut cfg);
    cfg.validate(g.path())?;
    Ok(cfg)
}
