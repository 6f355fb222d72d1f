//! LFM2 (Liquid AI): a hybrid of gated short-convolution layers and
//! grouped-query attention layers with per-head q/k RMSNorm, as transformers'
//! `modeling_lfm2.py`; from an HF directory or a GGUF file (llama.cpp's
//! `lfm2` architecture).

use super::llama::{gguf_layer_names, hf_rope};
use super::llm::{Arch, LayerKind, LayerNames, LlmConfig, Names, RopeScaling, RopeStyle};
use crate::cpu;
use crate::error::{Error, Result};
use crate::formats::gguf::GgufFile;
use crate::formats::hf::HfConfig;
use crate::formats::TensorSource;

/// transformers' `Lfm2Config` default.
const DEFAULT_ROPE_THETA: f32 = 1_000_000.0;

/// The feed-forward width transformers' `Lfm2MLP` builds from the config:
/// with `block_auto_adjust_ff_dim`, 2/3 of `intermediate_size`, scaled by
/// `block_ffn_dim_multiplier` and then rounded up to `block_multiple_of`
/// (the rounding only happens when a multiplier is set).
pub fn ffn_width(
    intermediate: usize,
    auto_adjust: bool,
    multiplier: Option<f64>,
    multiple_of: usize,
) -> usize {
    if !auto_adjust {
        return intermediate;
    }
    let mut ff = (2 * intermediate) as f64 / 3.0;
    ff = ff.trunc();
    if let Some(m) = multiplier {
        let scaled = (m * ff).trunc() as usize;
        let mo = multiple_of.max(1);
        return mo * scaled.div_ceil(mo);
    }
    ff as usize
}

/// A key under its current transformers name or the original LFM2 config's
/// (`block_ff_dim`, `theta`, ...), as `Lfm2Config` accepts both.
fn aliased<'a>(c: &HfConfig, names: &[&'a str]) -> Option<&'a str> {
    names
        .iter()
        .copied()
        .find(|k| c.get(k).is_some_and(|v| !v.is_null()))
}

/// Whether the head is tied (`tie_word_embeddings`, or the original
/// `tie_embedding`; tied by default, as `Lfm2Config`).
pub fn hf_tied(c: &HfConfig) -> Result<bool> {
    match aliased(c, &["tie_word_embeddings", "tie_embedding"]) {
        Some(k) => c.get_bool(k),
        None => Ok(true),
    }
}

pub fn config_from_hf(c: &HfConfig) -> Result<LlmConfig> {
    let key = |names: &[&'static str]| aliased(c, names).unwrap_or(names[0]);
    let n_layers = c.get_usize("num_hidden_layers")?;
    let layers: Vec<LayerKind> = match c.get_str_array_opt("layer_types")? {
        Some(types) => types
            .iter()
            .map(|t| match *t {
                "conv" => Ok(LayerKind::Conv),
                "full_attention" => Ok(LayerKind::Attention),
                other => Err(Error::unsupported(
                    c.path(),
                    format!("layer type '{other}' (supported: conv, full_attention)"),
                )),
            })
            .collect::<Result<_>>()?,
        // Lfm2Config: without either list every layer is attention.
        None => match c.get_usize_array_opt("full_attn_idxs")? {
            Some(attn) => (0..n_layers)
                .map(|i| {
                    if attn.contains(&i) {
                        LayerKind::Attention
                    } else {
                        LayerKind::Conv
                    }
                })
                .collect(),
            None => vec![LayerKind::Attention; n_layers],
        },
    };
    if layers.len() != n_layers {
        return Err(Error::format(
            c.path(),
            format!("{} layer types for {n_layers} layers", layers.len()),
        ));
    }
    if c.get_bool_opt("conv_bias")?.unwrap_or(false) {
        return Err(Error::unsupported(c.path(), "conv_bias = true"));
    }
    let multiplier = c.get_f64_opt("block_ffn_dim_multiplier")?;
    if multiplier.is_some_and(|m| !(m.is_finite() && m > 0.0 && m <= 64.0)) {
        return Err(Error::format(
            c.path(),
            format!(
                "block_ffn_dim_multiplier {} (expected a positive number up to 64)",
                multiplier.unwrap_or_default()
            ),
        ));
    }
    let hidden = c.get_usize(key(&["hidden_size", "block_dim"]))?;
    let heads = c.get_usize(key(&["num_attention_heads", "num_heads"]))?;
    let head_dim = hidden / heads.max(1);
    let (rope_theta, rope_scaling) =
        match aliased(c, &["rope_parameters", "rope_scaling", "rope_theta"]) {
            Some(_) => hf_rope(c, DEFAULT_ROPE_THETA)?,
            None => (
                c.get_f32_opt("theta")?.unwrap_or(DEFAULT_ROPE_THETA),
                RopeScaling::None,
            ),
        };
    let cfg = LlmConfig {
        arch: Arch::Lfm2,
        hidden,
        heads,
        kv_heads: c.get_usize_opt("num_key_value_heads")?.unwrap_or(heads),
        head_dim,
        ffn: ffn_width(
            c.get_usize(key(&["intermediate_size", "block_ff_dim"]))?,
            c.get_bool_opt("block_auto_adjust_ff_dim")?.unwrap_or(true),
            multiplier,
            c.get_usize_opt("block_multiple_of")?.unwrap_or(256),
        ),
        vocab: c.get_usize("vocab_size")?,
        context: c.get_usize("max_position_embeddings")?,
        norm_eps: c
            .get_f32_opt(key(&["norm_eps", "block_norm_eps"]))?
            .unwrap_or(1e-5),
        rope_theta,
        rope_dim: head_dim,
        rope_style: RopeStyle::Halves,
        rope_scaling,
        layers,
        conv_kernel: c.get_usize_opt("conv_L_cache")?.unwrap_or(3),
        attn_scale: cpu::attention_scale(head_dim),
        ..LlmConfig::default()
    };
    cfg.validate(c.path())?;
    Ok(cfg)
}

pub fn hf_names(tied: bool) -> Names {
    Names {
        embed: "model.embed_tokens.weight".into(),
        final_norm: "model.embedding_norm.weight".into(),
        head: (!tied).then(|| "lm_head.weight".into()),
        norm_shift: 0.0,
        layer: Box::new(|i| {
            let p = format!("model.layers.{i}");
            LayerNames {
                norm1: format!("{p}.operator_norm.weight"),
                norm2: format!("{p}.ffn_norm.weight"),
                q: format!("{p}.self_attn.q_proj.weight"),
                k: format!("{p}.self_attn.k_proj.weight"),
                v: format!("{p}.self_attn.v_proj.weight"),
                o: format!("{p}.self_attn.out_proj.weight"),
                q_norm: Some(format!("{p}.self_attn.q_layernorm.weight")),
                k_norm: Some(format!("{p}.self_attn.k_layernorm.weight")),
                conv_in: format!("{p}.conv.in_proj.weight"),
                conv: format!("{p}.conv.conv.weight"),
                conv_out: format!("{p}.conv.out_proj.weight"),
                gate: format!("{p}.feed_forward.w1.weight"),
                up: format!("{p}.feed_forward.w3.weight"),
                down: format!("{p}.feed_forward.w2.weight"),
                ..LayerNames::default()
            }
        }),
    }
}

pub fn config_from_gguf(g: &GgufFile) -> Result<LlmConfig> {
    let key = |k: &str| format!("lfm2.{k}");
    let n_layers = g.get_usize(&key("block_count"))?;
    let hidden = g.get_usize(&key("embedding_length"))?;
    let heads = g.get_usize(&key("attention.head_count"))?;
    // head_count_kv is per layer: 0 marks a convolution layer.
    let kv_per_layer = match g.get_usize_array_opt(&key("attention.head_count_kv"))? {
        Some(a) => a,
        None => vec![g.get_usize(&key("attention.head_count_kv"))?; n_layers],
    };
    if kv_per_layer.len() != n_layers {
        return Err(Error::format(
            g.path(),
            format!(
                "{} head_count_kv entries for {n_layers} layers",
                kv_per_layer.len()
            ),
        ));
    }
    let kv_heads = kv_per_layer
        .iter()
        .copied()
        .find(|&k| k > 0)
        .unwrap_or(heads);
    if kv_per_layer.iter().any(|&k| k != 0 && k != kv_heads) {
        return Err(Error::unsupported(
            g.path(),
            "attention layers with different kv head counts",
        ));
    }
    let vocab = match g.get_usize_opt(&key("vocab_size"))? {
        Some(v) => v,
        None => g.get_str_array("tokenizer.ggml.tokens")?.len(),
    };
    let head_dim = hidden / heads.max(1);
    let cfg = LlmConfig {
        arch: Arch::Lfm2,
        hidden,
        heads,
        kv_heads,
        head_dim,
        ffn: g.get_usize(&key("feed_forward_length"))?,
        vocab,
        context: g.get_usize(&key("context_length"))?,
        norm_eps: g.get_f32(&key("attention.layer_norm_rms_epsilon"))?,
        rope_theta: g
            .get_f32_opt(&key("rope.freq_base"))?
            .unwrap_or(DEFAULT_ROPE_THETA),
        rope_dim: head_dim,
        // llama.cpp runs LFM2 with NEOX-style RoPE and does not permute q/k.
        rope_style: RopeStyle::Halves,
        layers: kv_per_layer
            .iter()
            .map(|&k| {
                if k == 0 {
                    LayerKind::Conv
                } else {
                    LayerKind::Attention
                }
            })
            .collect(),
        conv_kernel: g.get_usize(&key("shortconv.l_cache"))?,
        attn_scale: cpu::attention_scale(head_dim),
        ..LlmConfig::default()
    };
    cfg.validate(g.path())?;
    Ok(cfg)
}

pub fn gguf_names() -> Names {
    Names {
        embed: "token_embd.weight".into(),
        final_norm: "token_embd_norm.weight".into(),
        head: Some("output.weight".into()),
        norm_shift: 0.0,
        layer: Box::new(|i| {
            let mut n = gguf_layer_names(i);
            n.q_norm = Some(format!("blk.{i}.attn_q_norm.weight"));
            n.k_norm = Some(format!("blk.{i}.attn_k_norm.weight"));
            n
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::ffn_width;

    #[test]
    fn ffn_width_matches_transformers() {
        // LFM2-350M: intermediate_size 6656, multiplier 1.0, multiple_of 256 -> 4608.
        assert_eq!(ffn_width(6656, true, Some(1.0), 256), 4608);
        assert_eq!(ffn_width(96, true, Some(1.0), 256), 256);
        assert_eq!(ffn_width(96, true, None, 256), 64);
        assert_eq!(ffn_width(96, false, Some(1.0), 256), 96);
    }
}
