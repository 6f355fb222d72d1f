//! Llama-family decoders (Llama 2/3, SmolLM2, ...): RMSNorm, grouped-query
//! attention with RoPE, SwiGLU MLP, tied or untied head. Config and tensor
//! names from an HF directory (transformers' `LlamaForCausalLM`) or a GGUF
//! file (llama.cpp's `llama` architecture).

use super::llm::{load_weights, Arch, LayerKind, LayerNames, LlmConfig, RopeStyle, Weights};
use crate::error::{Error, Result};
use crate::formats::gguf::GgufFile;
use crate::formats::hf::HfConfig;
use crate::formats::TensorSource;

/// transformers' default when config.json has no rope_theta.
const DEFAULT_ROPE_THETA: f32 = 10_000.0;
/// llama.cpp's default when the GGUF has no rope.freq_base.
const GGUF_DEFAULT_ROPE_THETA: f32 = 10_000.0;

/// Reads `rope_theta` from transformers 4 (`rope_theta`) or 5
/// (`rope_parameters.rope_theta`) configs; refuses scaled RoPE variants.
pub fn hf_rope_theta(c: &HfConfig, default: f32) -> Result<f32> {
    let params = c
        .get("rope_parameters")
        .or_else(|| c.get("rope_scaling"))
        .filter(|v| !v.is_null());
    if let Some(p) = params {
        let kind = p
            .get("rope_type")
            .or_else(|| p.get("type"))
            .and_then(|t| t.as_str())
            .unwrap_or("default");
        if kind != "default" {
            return Err(Error::unsupported(
                c.path(),
                format!("RoPE scaling '{kind}'"),
            ));
        }
        if let Some(theta) = p.get("rope_theta").and_then(|t| t.as_f64()) {
            return Ok(theta as f32);
        }
    }
    Ok(c.get_f32_opt("rope_theta")?.unwrap_or(default))
}

pub fn config_from_hf(c: &HfConfig) -> Result<LlmConfig> {
    let hidden = c.get_usize("hidden_size")?;
    let heads = c.get_usize("num_attention_heads")?;
    let head_dim = c
        .get_usize_opt("head_dim")?
        .unwrap_or(hidden / heads.max(1));
    let cfg = LlmConfig {
        arch: Arch::Llama,
        hidden,
        heads,
        kv_heads: c.get_usize_opt("num_key_value_heads")?.unwrap_or(heads),
        head_dim,
        ffn: c.get_usize("intermediate_size")?,
        vocab: c.get_usize("vocab_size")?,
        context: c.get_usize("max_position_embeddings")?,
        norm_eps: c.get_f32_opt("rms_norm_eps")?.unwrap_or(1e-6),
        rope_theta: hf_rope_theta(c, DEFAULT_ROPE_THETA)?,
        rope_dim: head_dim,
        rope_style: RopeStyle::Halves,
        layers: vec![LayerKind::Attention; c.get_usize("num_hidden_layers")?],
        conv_kernel: 0,
    };
    if c.get_bool_opt("attention_bias")?.unwrap_or(false)
        || c.get_bool_opt("mlp_bias")?.unwrap_or(false)
    {
        return Err(Error::unsupported(
            c.path(),
            "biases in attention or MLP projections",
        ));
    }
    cfg.validate(c.path())?;
    Ok(cfg)
}

pub fn load_hf(cfg: &LlmConfig, src: &dyn TensorSource, tied: bool) -> Result<Weights> {
    load_weights(
        cfg,
        src,
        "model.embed_tokens.weight",
        "model.norm.weight",
        (!tied).then_some("lm_head.weight"),
        |i| {
            let p = format!("model.layers.{i}");
            LayerNames {
                norm1: format!("{p}.input_layernorm.weight"),
                norm2: format!("{p}.post_attention_layernorm.weight"),
                q: format!("{p}.self_attn.q_proj.weight"),
                k: format!("{p}.self_attn.k_proj.weight"),
                v: format!("{p}.self_attn.v_proj.weight"),
                o: format!("{p}.self_attn.o_proj.weight"),
                q_norm: None,
                k_norm: None,
                conv_in: String::new(),
                conv: String::new(),
                conv_out: String::new(),
                gate: format!("{p}.mlp.gate_proj.weight"),
                up: format!("{p}.mlp.up_proj.weight"),
                down: format!("{p}.mlp.down_proj.weight"),
            }
        },
    )
}

pub fn config_from_gguf(g: &GgufFile) -> Result<LlmConfig> {
    let key = |k: &str| format!("llama.{k}");
    let hidden = g.get_usize(&key("embedding_length"))?;
    let heads = g.get_usize(&key("attention.head_count"))?;
    let head_dim = g
        .get_usize_opt(&key("attention.key_length"))?
        .unwrap_or(hidden / heads.max(1));
    let vocab = match g.get_usize_opt(&key("vocab_size"))? {
        Some(v) => v,
        None => g.get_str_array("tokenizer.ggml.tokens")?.len(),
    };
    let cfg = LlmConfig {
        arch: Arch::Llama,
        hidden,
        heads,
        kv_heads: g
            .get_usize_opt(&key("attention.head_count_kv"))?
            .unwrap_or(heads),
        head_dim,
        ffn: g.get_usize(&key("feed_forward_length"))?,
        vocab,
        context: g.get_usize(&key("context_length"))?,
        norm_eps: g.get_f32(&key("attention.layer_norm_rms_epsilon"))?,
        rope_theta: g
            .get_f32_opt(&key("rope.freq_base"))?
            .unwrap_or(GGUF_DEFAULT_ROPE_THETA),
        rope_dim: g
            .get_usize_opt(&key("rope.dimension_count"))?
            .unwrap_or(head_dim),
        // llama.cpp's converter permutes q/k rows for ggml's normal RoPE mode.
        rope_style: RopeStyle::Interleaved,
        layers: vec![LayerKind::Attention; g.get_usize(&key("block_count"))?],
        conv_kernel: 0,
    };
    if let Some(kind) = g.get_str_opt(&key("rope.scaling.type"))? {
        if kind != "none" {
            return Err(Error::unsupported(
                g.path(),
                format!("RoPE scaling '{kind}'"),
            ));
        }
    }
    cfg.validate(g.path())?;
    Ok(cfg)
}

pub fn load_gguf(cfg: &LlmConfig, g: &GgufFile) -> Result<Weights> {
    load_weights(
        cfg,
        g,
        "token_embd.weight",
        "output_norm.weight",
        Some("output.weight"),
        gguf_layer_names,
    )
}

/// llama.cpp's per-layer tensor names (shared with LFM2's attention layers).
pub fn gguf_layer_names(i: usize) -> LayerNames {
    let p = format!("blk.{i}");
    LayerNames {
        norm1: format!("{p}.attn_norm.weight"),
        norm2: format!("{p}.ffn_norm.weight"),
        q: format!("{p}.attn_q.weight"),
        k: format!("{p}.attn_k.weight"),
        v: format!("{p}.attn_v.weight"),
        o: format!("{p}.attn_output.weight"),
        q_norm: None,
        k_norm: None,
        conv_in: format!("{p}.shortconv.in_proj.weight"),
        conv: format!("{p}.shortconv.conv.weight"),
        conv_out: format!("{p}.shortconv.out_proj.weight"),
        gate: format!("{p}.ffn_gate.weight"),
        up: format!("{p}.ffn_up.weight"),
        down: format!("{p}.ffn_down.weight"),
    }
}
