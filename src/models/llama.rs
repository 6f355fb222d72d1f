//! Llama-family decoders (Llama 2/3, SmolLM2, Mistral) and what the other
//! Llama-shaped families reuse: the HF and GGUF config readers, RoPE
//! scaling, and the standard tensor-name tables. RMSNorm, grouped-query
//! attention with RoPE, SwiGLU MLP, tied or untied head; from an HF
//! directory (transformers' `LlamaForCausalLM`, `MistralForCausalLM`) or a
//! GGUF file (llama.cpp's `llama` architecture).

use super::llm::{Arch, LayerKind, LayerNames, LlmConfig, Names, RopeScaling, RopeStyle};
use crate::cpu;
use crate::error::{Error, Result};
use crate::formats::gguf::GgufFile;
use crate::formats::hf::HfConfig;
use crate::formats::TensorSource;
use serde_json::Value;

/// transformers' default when config.json has no rope_theta.
const DEFAULT_ROPE_THETA: f32 = 10_000.0;
/// llama.cpp's default when the GGUF has no rope.freq_base.
const GGUF_DEFAULT_ROPE_THETA: f32 = 10_000.0;
/// transformers' default RMSNorm epsilon for Llama.
const DEFAULT_RMS_EPS: f32 = 1e-6;

/// The RoPE base and scaling of a transformers RoPE parameter object
/// (`rope_parameters` in transformers 5, `rope_scaling` in 4; None for a
/// plain RoPE of base `theta`). Refuses scalings we do not implement, by name.
pub fn rope_from_params(
    c: &HfConfig,
    params: Option<&Value>,
    theta: f32,
) -> Result<(f32, RopeScaling)> {
    let Some(p) = params.filter(|v| !v.is_null()) else {
        return Ok((theta, RopeScaling::None));
    };
    let theta = p
        .get("rope_theta")
        .and_then(Value::as_f64)
        .map_or(theta, |t| t as f32);
    let kind = p
        .get("rope_type")
        .or_else(|| p.get("type"))
        .and_then(Value::as_str)
        .unwrap_or("default");
    let num = |key: &str| -> Result<f32> {
        p.get(key)
            .and_then(Value::as_f64)
            .map(|v| v as f32)
            .ok_or_else(|| {
                Error::format(
                    c.path(),
                    format!("RoPE scaling '{kind}' without a numeric '{key}'"),
                )
            })
    };
    let scaling = match kind {
        "default" => RopeScaling::None,
        "linear" => RopeScaling::Linear(num("factor")?),
        "llama3" => RopeScaling::Llama3 {
            factor: num("factor")?,
            low_freq_factor: num("low_freq_factor")?,
            high_freq_factor: num("high_freq_factor")?,
            original_context: num("original_max_position_embeddings")? as usize,
        },
        other => {
            return Err(Error::unsupported(
                c.path(),
                format!("RoPE scaling '{other}' (supported: default, linear, llama3)"),
            ))
        }
    };
    if let RopeScaling::Linear(f) | RopeScaling::Llama3 { factor: f, .. } = scaling {
        if !(f.is_finite() && f > 0.0) {
            return Err(Error::format(c.path(), format!("RoPE scaling factor {f}")));
        }
    }
    Ok((theta, scaling))
}

/// `rope_theta` and scaling from transformers 4 (`rope_theta`,
/// `rope_scaling`) or 5 (`rope_parameters`) configs.
pub fn hf_rope(c: &HfConfig, default_theta: f32) -> Result<(f32, RopeScaling)> {
    let theta = c.get_f32_opt("rope_theta")?.unwrap_or(default_theta);
    let params = c
        .get("rope_parameters")
        .filter(|v| !v.is_null())
        .or_else(|| c.get("rope_scaling"));
    rope_from_params(c, params, theta)
}

/// Which layers of an HF config use sliding-window attention, and the
/// window: from `layer_types` ("sliding_attention"), or every layer when
/// `all_when_set` and `sliding_window` is set (Mistral, Phi-3).
pub fn hf_sliding(c: &HfConfig, n_layers: usize, all_when_set: bool) -> Result<(Vec<bool>, usize)> {
    let window = c.get_usize_opt("sliding_window")?.unwrap_or(0);
    let flags: Vec<bool> = match c.get_str_array_opt("layer_types")? {
        Some(types) => {
            if types.len() != n_layers {
                return Err(Error::format(
                    c.path(),
                    format!("{} layer types for {n_layers} layers", types.len()),
                ));
            }
            types
                .iter()
                .map(|t| match *t {
                    "sliding_attention" => Ok(true),
                    "full_attention" => Ok(false),
                    other => Err(Error::unsupported(
                        c.path(),
                        format!(
                            "layer type '{other}' (supported: full_attention, sliding_attention)"
                        ),
                    )),
                })
                .collect::<Result<_>>()?
        }
        None if all_when_set && window > 0 => vec![true; n_layers],
        None => Vec::new(),
    };
    if !flags.contains(&true) {
        return Ok((Vec::new(), 0));
    }
    if window == 0 {
        return Err(Error::format(
            c.path(),
            "sliding_attention layers without a sliding_window",
        ));
    }
    Ok((flags, window))
}

/// The fields every Llama-shaped HF config shares, for `arch`.
pub fn hf_base(c: &HfConfig, arch: Arch, default_theta: f32) -> Result<LlmConfig> {
    let hidden = c.get_usize("hidden_size")?;
    let heads = c.get_usize("num_attention_heads")?;
    let head_dim = c
        .get_usize_opt("head_dim")?
        .unwrap_or(hidden / heads.max(1));
    let n_layers = c.get_usize("num_hidden_layers")?;
    let (rope_theta, rope_scaling) = hf_rope(c, default_theta)?;
    let partial = c
        .get("rope_parameters.partial_rotary_factor")
        .and_then(Value::as_f64)
        .or(c.get_f64_opt("partial_rotary_factor")?)
        .unwrap_or(1.0);
    Ok(LlmConfig {
        arch,
        hidden,
        heads,
        kv_heads: c.get_usize_opt("num_key_value_heads")?.unwrap_or(heads),
        head_dim,
        ffn: c.get_usize("intermediate_size")?,
        vocab: c.get_usize("vocab_size")?,
        context: c.get_usize("max_position_embeddings")?,
        norm_eps: c.get_f32_opt("rms_norm_eps")?.unwrap_or(DEFAULT_RMS_EPS),
        rope_theta,
        rope_dim: ((head_dim as f64 * partial) as usize) & !1,
        rope_style: RopeStyle::Halves,
        rope_scaling,
        layers: vec![LayerKind::Attention; n_layers],
        attn_scale: cpu::attention_scale(head_dim),
        ..LlmConfig::default()
    })
}

/// Refuses projection biases where the architecture has none.
pub fn hf_no_biases(c: &HfConfig) -> Result<()> {
    if c.get_bool_opt("attention_bias")?.unwrap_or(false)
        || c.get_bool_opt("mlp_bias")?.unwrap_or(false)
    {
        return Err(Error::unsupported(
            c.path(),
            "biases in attention or MLP projections",
        ));
    }
    Ok(())
}

/// Llama (`mistral`: the same with a sliding window on every layer when the
/// config sets one).
pub fn config_from_hf(c: &HfConfig, arch: Arch) -> Result<LlmConfig> {
    let mut cfg = hf_base(c, arch, DEFAULT_ROPE_THETA)?;
    hf_no_biases(c)?;
    if arch == Arch::Mistral {
        (cfg.sliding_layers, cfg.sliding_window) = hf_sliding(c, cfg.layers.len(), true)?;
    }
    cfg.validate(c.path())?;
    Ok(cfg)
}

/// transformers' Llama-style names (`model.layers.N.self_attn.q_proj`, ...),
/// with the optional roles the config asks for: q/k/v biases (Qwen2), q/k
/// norms (Qwen3).
pub fn hf_names(cfg: &LlmConfig, tied: bool) -> Names {
    let (bias, qk_norm) = (cfg.qkv_bias, cfg.arch == Arch::Qwen3);
    Names {
        embed: "model.embed_tokens.weight".into(),
        final_norm: "model.norm.weight".into(),
        head: (!tied).then(|| "lm_head.weight".into()),
        norm_shift: 0.0,
        layer: Box::new(move |i| {
            let p = format!("model.layers.{i}");
            let attn = |w: &str| format!("{p}.self_attn.{w}");
            LayerNames {
                norm1: format!("{p}.input_layernorm.weight"),
                norm2: format!("{p}.post_attention_layernorm.weight"),
                q: attn("q_proj.weight"),
                k: attn("k_proj.weight"),
                v: attn("v_proj.weight"),
                o: attn("o_proj.weight"),
                q_bias: bias.then(|| attn("q_proj.bias")),
                k_bias: bias.then(|| attn("k_proj.bias")),
                v_bias: bias.then(|| attn("v_proj.bias")),
                q_norm: qk_norm.then(|| attn("q_norm.weight")),
                k_norm: qk_norm.then(|| attn("k_norm.weight")),
                gate: format!("{p}.mlp.gate_proj.weight"),
                up: format!("{p}.mlp.up_proj.weight"),
                down: format!("{p}.mlp.down_proj.weight"),
                ..LayerNames::default()
            }
        }),
    }
}

/// GGUF metadata keys of one architecture (`llama.block_count`, ...).
pub struct GgufKeys<'a> {
    pub g: &'a GgufFile,
    pub arch: &'static str,
}

impl GgufKeys<'_> {
    pub fn key(&self, k: &str) -> String {
        format!("{}.{k}", self.arch)
    }

    /// The fields every Llama-shaped GGUF shares (llama.cpp's names).
    pub fn base(&self, arch: Arch, rope_style: RopeStyle) -> Result<LlmConfig> {
        let g = self.g;
        let key = |k: &str| self.key(k);
        let hidden = g.get_usize(&key("embedding_length"))?;
        let heads = g.get_usize(&key("attention.head_count"))?;
        let head_dim = g
            .get_usize_opt(&key("attention.key_length"))?
            .unwrap_or(hidden / heads.max(1));
        let vocab = match g.get_usize_opt(&key("vocab_size"))? {
            Some(v) => v,
            None => g.get_str_array("tokenizer.ggml.tokens")?.len(),
        };
        Ok(LlmConfig {
            arch,
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
            rope_style,
            rope_scaling: self.rope_scaling()?,
            layers: vec![LayerKind::Attention; g.get_usize(&key("block_count"))?],
            attn_scale: cpu::attention_scale(head_dim),
            ..LlmConfig::default()
        })
    }

    /// `rope_freqs.weight` (Llama 3's per-dimension factors) or the
    /// `rope.scaling.*` keys; refuses scalings we do not implement, by name.
    fn rope_scaling(&self) -> Result<RopeScaling> {
        let g = self.g;
        if g.has("rope_freqs.weight") {
            return Ok(RopeScaling::Factors(
                g.tensor("rope_freqs.weight")?.to_f32(),
            ));
        }
        match g.get_str_opt(&self.key("rope.scaling.type"))? {
            None | Some("none") => Ok(RopeScaling::None),
            Some("linear") => {
                let f = g
                    .get_f32_opt(&self.key("rope.scaling.factor"))?
                    .unwrap_or(1.0);
                if !(f.is_finite() && f > 0.0) {
                    return Err(Error::format(g.path(), format!("RoPE scaling factor {f}")));
                }
                Ok(if f == 1.0 {
                    RopeScaling::None
                } else {
                    RopeScaling::Linear(f)
                })
            }
            Some(other) => Err(Error::unsupported(
                g.path(),
                format!("RoPE scaling '{other}' (supported: none, linear, Llama 3's rope_freqs)"),
            )),
        }
    }
}

pub fn config_from_gguf(g: &GgufFile) -> Result<LlmConfig> {
    // llama.cpp's converter permutes q/k rows for ggml's normal RoPE mode.
    let cfg = GgufKeys { g, arch: "llama" }.base(Arch::Llama, RopeStyle::Interleaved)?;
    cfg.validate(g.path())?;
    Ok(cfg)
}

/// llama.cpp's tensor names (`blk.N.attn_q.weight`, ...), with the optional
/// roles the config asks for.
pub fn gguf_names(cfg: &LlmConfig) -> Names {
    let (bias, qk_norm, post) = (
        cfg.qkv_bias,
        cfg.arch == Arch::Qwen3 || cfg.arch == Arch::Gemma3,
        cfg.post_norms,
    );
    let fused = cfg.arch == Arch::Phi3;
    Names {
        embed: "token_embd.weight".into(),
        final_norm: "output_norm.weight".into(),
        head: Some("output.weight".into()),
        norm_shift: 0.0,
        layer: Box::new(move |i| {
            let t = |w: &str| format!("blk.{i}.{w}");
            let mut n = gguf_layer_names(i);
            n.q_bias = bias.then(|| t("attn_q.bias"));
            n.k_bias = bias.then(|| t("attn_k.bias"));
            n.v_bias = bias.then(|| t("attn_v.bias"));
            if qk_norm {
                n.q_norm = Some(t("attn_q_norm.weight"));
                n.k_norm = Some(t("attn_k_norm.weight"));
            }
            if post {
                n.post_mixer_norm = Some(t("post_attention_norm.weight"));
                n.post_ffn_norm = Some(t("post_ffw_norm.weight"));
            }
            if fused {
                n.qkv = Some(t("attn_qkv.weight"));
                n.gate_up = Some(t("ffn_up.weight"));
            }
            n
        }),
    }
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
        conv_in: format!("{p}.shortconv.in_proj.weight"),
        conv: format!("{p}.shortconv.conv.weight"),
        conv_out: format!("{p}.shortconv.out_proj.weight"),
        gate: format!("{p}.ffn_gate.weight"),
        up: format!("{p}.ffn_up.weight"),
        down: format!("{p}.ffn_down.weight"),
        ..LayerNames::default()
    }
}
