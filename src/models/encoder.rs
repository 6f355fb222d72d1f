//! Transformer encoders as sentence-transformers runs them: BERT,
//! XLM-RoBERTa, NomicBERT, new-style GTE and ModernBERT. One forward pass,
//! written once per backend; a family is a config parser, a names table and
//! the switches of [`EncoderConfig`] (positions, norm placement, gated FFN,
//! biases, sliding windows) the pass honours.
//!
//! Forward pass:
//!   h = LayerNorm(`word[id]` (+ `position[pos + offset]`) (+ `token_type[type]`))
//!   per layer, post-norm (BERT, XLM-R, NomicBERT, GTE):
//!       a = LN(h + Wo · attention(rope?(Wqkv h)));  h = LN(a + W2 · ffn(W1 a))
//!   pre-norm (ModernBERT; its first layer has no attention norm):
//!       h = h + Wo · attention(rope(Wqkv LN(h)));   h = h + W2 · ffn(W1 LN(h))
//!       and a final LN.
//!   ffn is act(x) or, gated, act(x_a) * x_b over the two halves of W1 x.
//! Batches are ragged: sequences of different lengths packed row after row,
//! with no padding, each attending only to itself.

use crate::cpu::{self, Activation, AttentionShape, AttnShape, RopeStyle, SeqSpan};
use crate::error::{Error, Result};
use crate::gpu::ops::Dispatch;
use crate::gpu::profile::StepProfile;
use crate::gpu::{dense, llm_ops, Gpu};
use safetensors::{Dtype, SafeTensors};
use serde_json::Value;
use std::path::Path;
use std::sync::OnceLock;
use web_time::Instant;

/// An encoder architecture, by its config.json `model_type`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    Bert,
    XlmRoberta,
    NomicBert,
    /// New-style GTE (Alibaba-NLP/new-impl: gte-*-v1.5, gte-multilingual).
    Gte,
    ModernBert,
}

/// The `model_type`s the encoder runs, for error messages.
pub const SUPPORTED: &str = "bert, xlm-roberta (roberta), nomic_bert, gte (new), modernbert";

impl Family {
    fn from_model_type(t: &str) -> Option<Family> {
        Some(match t {
            "bert" => Family::Bert,
            "xlm-roberta" | "roberta" | "camembert" => Family::XlmRoberta,
            "nomic_bert" => Family::NomicBert,
            "gte" | "new" => Family::Gte,
            "modernbert" => Family::ModernBert,
            _ => return None,
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            Family::Bert => "bert",
            Family::XlmRoberta => "xlm-roberta",
            Family::NomicBert => "nomic_bert",
            Family::Gte => "gte",
            Family::ModernBert => "modernbert",
        }
    }
}

/// How token positions enter the model.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Positions {
    /// A learned table of `rows`; token i of a sequence reads row
    /// `offset + i` (XLM-R numbers positions from padding_idx + 1).
    Learned { rows: usize, offset: usize },
    /// Rotary embeddings of q and k (rotate-half pairs over the whole head);
    /// the base is per layer ([`LayerSpec::rope_theta`]).
    Rotary,
}

/// What one layer does differently from the others.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LayerSpec {
    /// 0: global attention; else ModernBERT's local window (keys within window / 2).
    pub window: usize,
    /// RoPE base of this layer (unused with learned positions).
    pub rope_theta: f32,
}

/// `config.json` of an encoder: every field the forward pass needs.
#[derive(Clone, Debug, PartialEq)]
pub struct EncoderConfig {
    pub family: Family,
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub intermediate_size: usize,
    pub hidden_act: Activation,
    /// The FFN multiplies act(first half) by the second half of a [2 i, d] projection.
    pub gated: bool,
    /// Longest sequence the model takes (for learned positions: the table's rows
    /// past the offset).
    pub max_position_embeddings: usize,
    pub positions: Positions,
    /// 0: the model has no token-type embedding.
    pub type_vocab_size: usize,
    pub layer_norm_eps: f32,
    /// ModernBERT's pre-norm layers with a final norm.
    pub pre_norm: bool,
    pub layers: Vec<LayerSpec>,
    /// GTE's fixed NTK-aware RoPE scaling factor (`rope_scaling: {type:
    /// ntk, factor}`, gte-*-v1.5); 1: none.
    pub rope_ntk_factor: f32,
    /// How a cross-encoder's head pools and transforms (when it has one).
    pub classifier: ClassifierSpec,
}

/// A sequence-classification head's shape, from config.json: BERT and XLM-R
/// pool the first token through dense + tanh; ModernBERT pools the first
/// token or the mean (`classifier_pooling`) through dense (+ bias when
/// `classifier_bias`) + `classifier_activation` + LayerNorm.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ClassifierSpec {
    pub mean_pooling: bool,
    /// None: tanh (BERT's pooler).
    pub act: Option<Activation>,
    pub dense_bias: bool,
    pub norm: bool,
}

/// `layer_norm_eps` when config.json leaves it out (transformers' BertConfig default).
const DEFAULT_LAYER_NORM_EPS: f32 = 1e-12;
/// `type_vocab_size` default in transformers' BertConfig.
const DEFAULT_TYPE_VOCAB_SIZE: usize = 2;
/// transformers' defaults for the rotary families' bases and ModernBERT's window.
const NOMIC_ROPE_THETA: f32 = 1000.0;
const GTE_ROPE_THETA: f32 = 10000.0;
const MODERNBERT_GLOBAL_THETA: f32 = 160_000.0;
const MODERNBERT_LOCAL_THETA: f32 = 10_000.0;
const MODERNBERT_LOCAL_ATTENTION: usize = 128;
const MODERNBERT_GLOBAL_EVERY: usize = 3;
const MODERNBERT_NORM_EPS: f32 = 1e-5;

/// A reader of config.json values that names the file in every error.
struct Json<'a> {
    path: &'a Path,
    v: &'a Value,
}

impl Json<'_> {
    /// The first of `keys` present (aliases, as the reference accepts them).
    fn any<'k>(&self, keys: &[&'k str]) -> Option<(&'k str, &Value)> {
        keys.iter().find_map(|k| match self.v.get(*k) {
            None | Some(Value::Null) => None,
            Some(x) => Some((*k, x)),
        })
    }

    fn size(&self, keys: &[&str], default: Option<usize>) -> Result<usize> {
        match self.any(keys) {
            None => default
                .ok_or_else(|| Error::format(self.path, format!("missing field {}", keys[0]))),
            Some((k, x)) => x
                .as_u64()
                .filter(|&n| n > 0 && n <= u32::MAX as u64)
                .map(|n| n as usize)
                .ok_or_else(|| {
                    Error::format(
                        self.path,
                        format!("{k} is {x}, expected a positive integer"),
                    )
                }),
        }
    }

    /// As [`Json::size`] where 0 is allowed (type_vocab_size).
    fn count(&self, keys: &[&str], default: usize) -> Result<usize> {
        match self.any(keys) {
            None => Ok(default),
            Some((k, x)) => x
                .as_u64()
                .filter(|&n| n <= u32::MAX as u64)
                .map(|n| n as usize)
                .ok_or_else(|| {
                    Error::format(self.path, format!("{k} is {x}, expected an integer >= 0"))
                }),
        }
    }

    fn float(&self, keys: &[&str], default: f32, ok: impl Fn(f64) -> bool) -> Result<f32> {
        match self.any(keys) {
            None => Ok(default),
            Some((k, x)) => x
                .as_f64()
                .filter(|f| ok(*f))
                .map(|f| f as f32)
                .ok_or_else(|| Error::format(self.path, format!("{k} is {x}, out of range"))),
        }
    }

    fn str(&self, keys: &[&str]) -> Option<&str> {
        self.any(keys).and_then(|(_, x)| x.as_str())
    }

    fn bool(&self, key: &str, default: bool) -> bool {
        self.v.get(key).and_then(Value::as_bool).unwrap_or(default)
    }
}

impl EncoderConfig {
    pub fn from_file(path: &Path) -> Result<EncoderConfig> {
        let text = crate::util::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
        EncoderConfig::from_json(path, &text)
    }

    /// Parses and checks a config; `path` is only used in messages.
    pub fn from_json(path: &Path, text: &str) -> Result<EncoderConfig> {
        let v: Value = serde_json::from_str(text)
            .map_err(|e| Error::format(path, format!("not valid JSON: {e}")))?;
        if !v.is_object() {
            return Err(Error::format(path, "expected a JSON object"));
        }
        let j = Json { path, v: &v };
        // A BERT checkpoint may leave model_type out (older exports).
        let model_type = j.str(&["model_type"]).unwrap_or("bert");
        let family = Family::from_model_type(model_type).ok_or_else(|| {
            Error::unsupported(
                path,
                format!("model_type {model_type:?}: this encoder runs {SUPPORTED}"),
            )
        })?;
        let learned = matches!(family, Family::Bert | Family::XlmRoberta);
        if learned {
            if let Some(t) = j.str(&["position_embedding_type"]) {
                if t != "absolute" {
                    return Err(Error::unsupported(
                        path,
                        format!("position_embedding_type {t:?} (only \"absolute\")"),
                    ));
                }
            }
        }
        let act_name = j
            .str(&["hidden_act", "hidden_activation", "activation_function"])
            .unwrap_or(match family {
                Family::NomicBert => "silu",
                _ => "gelu",
            });
        let hidden_act = Activation::from_hf(act_name).ok_or_else(|| {
            Error::unsupported(
                path,
                format!("hidden_act {act_name:?} (gelu, gelu_new, relu, silu)"),
            )
        })?;
        let default_eps = if family == Family::ModernBert {
            MODERNBERT_NORM_EPS
        } else {
            DEFAULT_LAYER_NORM_EPS
        };
        let layer_norm_eps = j.float(
            &["layer_norm_eps", "layer_norm_epsilon", "norm_eps"],
            default_eps,
            |e| e > 0.0 && e < 1.0,
        )?;
        let hidden_size = j.size(&["hidden_size", "n_embd"], None)?;
        let num_hidden_layers = j.size(&["num_hidden_layers", "n_layer"], None)?;
        let num_attention_heads = j.size(&["num_attention_heads", "n_head"], None)?;
        let intermediate_size = j.size(&["intermediate_size", "n_inner"], None)?;
        let table = j.size(&["max_position_embeddings", "n_positions"], None)?;
        let positions = if learned {
            // XLM-R's position ids start after the padding index.
            let offset = if family == Family::XlmRoberta {
                j.count(&["pad_token_id"], 1)? + 1
            } else {
                0
            };
            if offset >= table {
                return Err(Error::format(
                    path,
                    format!("max_position_embeddings {table} leaves no position past pad_token_id"),
                ));
            }
            Positions::Learned {
                rows: table,
                offset,
            }
        } else {
            Positions::Rotary
        };
        let max_position_embeddings = match positions {
            Positions::Learned { rows, offset } => rows - offset,
            Positions::Rotary => table,
        };
        let type_vocab_size = match family {
            Family::ModernBert => 0,
            Family::Gte => j.count(&["type_vocab_size"], 0)?,
            _ => j.count(&["type_vocab_size"], DEFAULT_TYPE_VOCAB_SIZE)?,
        };
        if learned && type_vocab_size == 0 {
            return Err(Error::format(path, "type_vocab_size is 0"));
        }
        let theta = |keys: &[&str], default: f32| j.float(keys, default, |t| t > 1.0);
        let rope_parameters = |kind: &str| {
            v.get("rope_parameters")
                .and_then(|r| r.get(kind).or(Some(r)))
                .and_then(|r| r.get("rope_theta"))
                .and_then(Value::as_f64)
                .map(|t| t as f32)
        };
        let mut rope_ntk_factor = 1.0;
        let layers = match family {
            Family::Bert | Family::XlmRoberta => vec![
                LayerSpec {
                    window: 0,
                    rope_theta: 0.0,
                };
                num_hidden_layers
            ],
            Family::NomicBert | Family::Gte => {
                if let Some(s) = v.get("rope_scaling").filter(|s| !s.is_null()) {
                    rope_ntk_factor = match (family, ntk_factor(s)) {
                        (Family::Gte, Some(f)) => f,
                        _ => {
                            return Err(Error::unsupported(
                                path,
                                format!(
                                    "rope_scaling {s} (plain RoPE; GTE also fixed NTK: \
                                     {{\"type\": \"ntk\", \"factor\": F}})"
                                ),
                            ))
                        }
                    };
                }
                let default = if family == Family::NomicBert {
                    NOMIC_ROPE_THETA
                } else {
                    GTE_ROPE_THETA
                };
                let t = match rope_parameters("") {
                    Some(t) => t,
                    None => theta(&["rope_theta", "rotary_emb_base"], default)?,
                };
                if j.float(&["rotary_emb_fraction"], 1.0, |f| f > 0.0)? != 1.0 {
                    return Err(Error::unsupported(
                        path,
                        "rotary_emb_fraction other than 1 (partial rotary)",
                    ));
                }
                vec![
                    LayerSpec {
                        window: 0,
                        rope_theta: t,
                    };
                    num_hidden_layers
                ]
            }
            Family::ModernBert => {
                let global = match rope_parameters("full_attention") {
                    Some(t) => t,
                    None => theta(&["global_rope_theta"], MODERNBERT_GLOBAL_THETA)?,
                };
                let local = match rope_parameters("sliding_attention") {
                    Some(t) => t,
                    None => theta(&["local_rope_theta"], MODERNBERT_LOCAL_THETA)?,
                };
                let window = j.size(&["local_attention"], Some(MODERNBERT_LOCAL_ATTENTION))?;
                let every = j.size(
                    &["global_attn_every_n_layers"],
                    Some(MODERNBERT_GLOBAL_EVERY),
                )?;
                let types: Vec<bool> = match v.get("layer_types").and_then(Value::as_array) {
                    Some(list) => {
                        if list.len() != num_hidden_layers {
                            return Err(Error::format(
                                path,
                                format!(
                                    "layer_types lists {} layers, num_hidden_layers is {num_hidden_layers}",
                                    list.len()
                                ),
                            ));
                        }
                        list.iter()
                            .map(|t| match t.as_str() {
                                Some("sliding_attention") => Ok(true),
                                Some("full_attention") => Ok(false),
                                _ => Err(Error::format(
                                    path,
                                    format!(
                                        "layer_types holds {t} (full_attention, sliding_attention)"
                                    ),
                                )),
                            })
                            .collect::<Result<_>>()?
                    }
                    None => (0..num_hidden_layers).map(|i| i % every != 0).collect(),
                };
                types
                    .into_iter()
                    .map(|local_layer| LayerSpec {
                        window: if local_layer { window } else { 0 },
                        rope_theta: if local_layer { local } else { global },
                    })
                    .collect()
            }
        };
        let c = EncoderConfig {
            family,
            vocab_size: j.size(&["vocab_size"], None)?,
            hidden_size,
            num_hidden_layers,
            num_attention_heads,
            intermediate_size,
            hidden_act,
            gated: !learned,
            max_position_embeddings,
            positions,
            type_vocab_size,
            layer_norm_eps,
            pre_norm: family == Family::ModernBert,
            layers,
            rope_ntk_factor,
            classifier: classifier_spec(&j, family)?,
        };
        if family == Family::ModernBert && j.bool("attention_bias", false) {
            return Err(Error::unsupported(
                path,
                "attention_bias true (ModernBERT has none)",
            ));
        }
        if !c.hidden_size.is_multiple_of(c.num_attention_heads) {
            return Err(Error::format(
                path,
                format!(
                    "hidden_size {} is not a multiple of num_attention_heads {}",
                    c.hidden_size, c.num_attention_heads
                ),
            ));
        }
        if let Some(hd) = j.any(&["head_dim"]).and_then(|(_, x)| x.as_u64()) {
            if hd as usize != c.head_dim() {
                return Err(Error::unsupported(
                    path,
                    format!("head_dim {hd} other than hidden_size / num_attention_heads"),
                ));
            }
        }
        if c.head_dim() > dense::ATTENTION_MAX_HEAD_DIM || c.head_dim() % 2 == 1 && !learned {
            return Err(Error::unsupported(
                path,
                format!(
                    "head size {} (at most {}, even for rotary positions)",
                    c.head_dim(),
                    dense::ATTENTION_MAX_HEAD_DIM
                ),
            ));
        }
        Ok(c)
    }

    pub fn head_dim(&self) -> usize {
        self.hidden_size / self.num_attention_heads
    }

    fn rotary(&self) -> bool {
        self.positions == Positions::Rotary
    }

    /// Attention over a fused [t, 3 d] qkv (learned positions) or separate
    /// [t, d] q, k, v (rotary: rotated apart from the projection).
    fn attention_shape(&self, window: usize) -> AttentionShape {
        let d = self.hidden_size;
        let (stride, k_col, v_col) = if self.rotary() {
            (d, 0, 0)
        } else {
            (3 * d, d, 2 * d)
        };
        AttentionShape {
            heads: self.num_attention_heads,
            kv_heads: self.num_attention_heads,
            head_dim: self.head_dim(),
            scale: 1.0 / (self.head_dim() as f32).sqrt(),
            causal: false,
            window,
            q_stride: stride,
            k_stride: stride,
            v_stride: stride,
            q_col: 0,
            k_col,
            v_col,
        }
    }

    /// The RoPE shape of [`cpu::qk_rope`] and its kernel.
    fn rope_shape(&self) -> AttnShape {
        let hd = self.head_dim();
        AttnShape {
            heads: self.num_attention_heads,
            kv_heads: self.num_attention_heads,
            head_dim: hd,
            rope_dim: hd,
            rope_style: RopeStyle::Halves,
            eps: self.layer_norm_eps,
            scale: 1.0 / (hd as f32).sqrt(),
            window: 0,
        }
    }

    /// Width of the first FFN projection: i, or 2 i gated.
    fn ffn_width(&self) -> usize {
        self.intermediate_size * if self.gated { 2 } else { 1 }
    }

    /// cos/sin of every token's RoPE angles with base `theta`: [tokens, hd / 2, 2].
    fn rope_table(&self, batch: &Batch, theta: f32) -> Vec<f32> {
        let hd = self.head_dim();
        let freqs = if self.rope_ntk_factor == 1.0 {
            cpu::rope_freqs(theta, hd)
        } else {
            // Fixed NTK (GTE's NTKScalingRotaryEmbedding, as vLLM computes
            // it): the base times the factor, every frequency then divided
            // by factor^(2 / head_dim).
            let f = self.rope_ntk_factor as f64;
            let shrink = f.powf(2.0 / hd as f64);
            (0..hd / 2)
                .map(|i| (theta as f64 * f).powf(-2.0 * i as f64 / hd as f64) / shrink)
                .collect()
        };
        let mut out = Vec::with_capacity(batch.tokens() * hd);
        for s in &batch.seqs {
            let p0 = batch.positions[s.q_start] as usize;
            out.extend(cpu::rope_table_freqs(p0, s.q_len, &freqs));
        }
        out
    }
}

/// The factor of a fixed NTK `rope_scaling` (`type` or `rope_type` "ntk",
/// `factor` > 0, no `mixed_b`), else None.
fn ntk_factor(s: &Value) -> Option<f32> {
    let kind = s.get("type").or_else(|| s.get("rope_type"))?.as_str()?;
    let factor = s.get("factor")?.as_f64().filter(|f| *f > 0.0)?;
    (kind == "ntk" && s.get("mixed_b").is_none_or(Value::is_null)).then_some(factor as f32)
}

/// The classification head's shape of a family (see [`ClassifierSpec`]).
fn classifier_spec(j: &Json, family: Family) -> Result<ClassifierSpec> {
    if family != Family::ModernBert {
        return Ok(ClassifierSpec {
            mean_pooling: false,
            act: None,
            dense_bias: true,
            norm: false,
        });
    }
    let mean_pooling = match j.str(&["classifier_pooling"]).unwrap_or("cls") {
        "cls" => false,
        "mean" => true,
        other => {
            return Err(Error::unsupported(
                j.path,
                format!("classifier_pooling {other:?} (cls, mean)"),
            ))
        }
    };
    let name = j.str(&["classifier_activation"]).unwrap_or("gelu");
    let act = Activation::from_hf(name).ok_or_else(|| {
        Error::unsupported(
            j.path,
            format!("classifier_activation {name:?} (gelu, gelu_new, relu, silu)"),
        )
    })?;
    Ok(ClassifierSpec {
        mean_pooling,
        act: Some(act),
        dense_bias: j.bool("classifier_bias", false),
        norm: true,
    })
}

/// A LayerNorm's scale and shift (zeros for ModernBERT's bias-free norms).
pub struct Norm {
    pub w: Vec<f32>,
    pub b: Vec<f32>,
}

/// One encoder layer in the engine's layout, whatever the checkpoint's names.
pub struct EncoderLayer {
    /// query, key and value stacked: [3 d, d], bias [3 d]
    pub qkv_w: Vec<f32>,
    pub qkv_b: Option<Vec<f32>>,
    /// [d, d], `[d]`
    pub attention_output_w: Vec<f32>,
    pub attention_output_b: Option<Vec<f32>>,
    /// After the attention's residual (post-norm), or before it (pre-norm;
    /// None: ModernBERT's first layer normalises nothing there).
    pub attention_norm: Option<Norm>,
    /// [i, d], or gated [2 i, d]: the activated rows, then the linear ones.
    pub intermediate_w: Vec<f32>,
    pub intermediate_b: Option<Vec<f32>>,
    /// [d, i], `[d]`
    pub output_w: Vec<f32>,
    pub output_b: Option<Vec<f32>>,
    pub output_norm: Norm,
}

pub struct EncoderWeights {
    /// [vocab, d]
    pub word_embeddings: Vec<f32>,
    /// [rows, d] (learned positions only)
    pub position_embeddings: Option<Vec<f32>>,
    /// [type_vocab, d]
    pub token_type_embeddings: Option<Vec<f32>>,
    pub embeddings_norm: Norm,
    pub layers: Vec<EncoderLayer>,
    /// ModernBERT's norm after the last layer.
    pub final_norm: Option<Norm>,
}

/// A cross-encoder's classification head: the pooled vector p (first token,
/// or ModernBERT's mean), h = act(W_dense p + b) (tanh: BERT's pooler),
/// ModernBERT's LayerNorm of h, logits = W_out h + b_out (BERT: the pooler and
/// `classifier`; XLM-R: `classifier.dense` and `classifier.out_proj`;
/// ModernBERT: `head.dense`, `head.norm` and `classifier`).
pub struct ClassifierHead {
    pub spec: ClassifierSpec,
    /// [d, d], `[d]` (zeros without a bias)
    pub dense_w: Vec<f32>,
    pub dense_b: Vec<f32>,
    pub norm: Option<Norm>,
    pub norm_eps: f32,
    /// [labels, d], `[labels]`
    pub out_w: Vec<f32>,
    pub out_b: Vec<f32>,
    pub labels: usize,
}

impl ClassifierHead {
    /// Logits of every sequence, [seqs, labels], from its rows of `hidden`.
    pub fn logits(&self, hidden: &[f32], d: usize, seqs: &[SeqSpan]) -> Vec<f32> {
        let mut out = Vec::with_capacity(seqs.len() * self.labels);
        let mut pooled = vec![0.0f32; d];
        let mut h = vec![0.0f32; d];
        for s in seqs {
            let rows = &hidden[s.q_start * d..(s.q_start + s.q_len.max(1)) * d];
            if self.spec.mean_pooling {
                pooled.fill(0.0);
                for r in rows.chunks_exact(d) {
                    pooled.iter_mut().zip(r).for_each(|(p, v)| *p += v);
                }
                let n = (rows.len() / d) as f32;
                pooled.iter_mut().for_each(|p| *p /= n);
            } else {
                pooled.copy_from_slice(&rows[..d]);
            }
            for (i, v) in h.iter_mut().enumerate() {
                let z = cpu::dot(&self.dense_w[i * d..(i + 1) * d], &pooled) + self.dense_b[i];
                *v = match self.spec.act {
                    None => z.tanh(),
                    Some(a) => a.apply(z),
                };
            }
            if let Some(n) = &self.norm {
                let mut y = vec![0.0f32; d];
                cpu::layer_norm(&h, &n.w, &n.b, self.norm_eps, &mut y);
                h = y;
            }
            for l in 0..self.labels {
                out.push(cpu::dot(&self.out_w[l * d..(l + 1) * d], &h) + self.out_b[l]);
            }
        }
        out
    }
}

/// An encoder: config and f32 weights on the host.
pub struct Encoder {
    pub config: EncoderConfig,
    pub weights: EncoderWeights,
    /// Present for a sequence-classification checkpoint (a cross-encoder).
    pub head: Option<ClassifierHead>,
    /// The layers' matrices repacked for the CPU's matmul, made on first use.
    packed: OnceLock<Vec<PackedLayer>>,
}

/// One layer's matrices in [`cpu::PackedMatrix`] form.
struct PackedLayer {
    qkv: cpu::PackedMatrix,
    attention_output: cpu::PackedMatrix,
    intermediate: cpu::PackedMatrix,
    output: cpu::PackedMatrix,
}

/// Tensors of one safetensors file, read as f32 with their shapes checked.
struct Tensors<'a> {
    path: &'a Path,
    st: SafeTensors<'a>,
    /// "bert.", "roberta.", "new.", "model." in checkpoints saved from a task model.
    prefix: &'static str,
}

impl Tensors<'_> {
    fn has(&self, name: &str) -> bool {
        self.st.tensor(&format!("{}{name}", self.prefix)).is_ok()
    }

    /// A tensor of the base model (under the prefix).
    fn get(&self, name: &str, shape: &[usize]) -> Result<Vec<f32>> {
        self.read(&format!("{}{name}", self.prefix), shape)
    }

    fn opt(&self, name: &str, shape: &[usize]) -> Result<Option<Vec<f32>>> {
        if self.has(name) {
            self.get(name, shape).map(Some)
        } else {
            Ok(None)
        }
    }

    /// A tensor by its full name (a head outside the base model).
    fn read(&self, full: &str, shape: &[usize]) -> Result<Vec<f32>> {
        let t = self
            .st
            .tensor(full)
            .map_err(|_| Error::format(self.path, format!("tensor {full} is missing")))?;
        if t.shape() != shape {
            return Err(Error::format(
                self.path,
                format!(
                    "tensor {full} has shape {:?}, config.json implies {shape:?}",
                    t.shape()
                ),
            ));
        }
        let bytes = t.data();
        Ok(match t.dtype() {
            Dtype::F32 => bytemuck::pod_collect_to_vec(bytes),
            Dtype::F16 => bytes
                .chunks_exact(2)
                .map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32())
                .collect(),
            Dtype::BF16 => bytes
                .chunks_exact(2)
                .map(|b| half::bf16::from_le_bytes([b[0], b[1]]).to_f32())
                .collect(),
            other => {
                return Err(Error::unsupported(
                    self.path,
                    format!("tensor {full} has dtype {other:?} (f32, f16, bf16)"),
                ))
            }
        })
    }

    /// Several tensors stacked along the first axis.
    fn stacked(&self, parts: &[(String, Vec<usize>)]) -> Result<Vec<f32>> {
        let mut out = Vec::new();
        for (n, shape) in parts {
            out.extend(self.get(n, shape)?);
        }
        Ok(out)
    }

    fn norm(&self, name: &str, d: usize, bias: bool) -> Result<Norm> {
        Ok(Norm {
            w: self.get(&format!("{name}.weight"), &[d])?,
            b: if bias {
                self.get(&format!("{name}.bias"), &[d])?
            } else {
                self.opt(&format!("{name}.bias"), &[d])?
                    .unwrap_or_else(|| vec![0.0; d])
            },
        })
    }
}

/// The checkpoint's name of each tensor of a family (role -> name).
struct Names {
    /// Under the prefix; `{n}` is the layer.
    word: &'static str,
    position: Option<&'static str>,
    token_type: Option<&'static str>,
    embeddings_norm: &'static str,
    layer: &'static str,
}

fn names(family: Family) -> Names {
    match family {
        Family::Bert | Family::XlmRoberta => Names {
            word: "embeddings.word_embeddings.weight",
            position: Some("embeddings.position_embeddings.weight"),
            token_type: Some("embeddings.token_type_embeddings.weight"),
            embeddings_norm: "embeddings.LayerNorm",
            layer: "encoder.layer.{n}.",
        },
        Family::NomicBert => Names {
            word: "embeddings.word_embeddings.weight",
            position: None,
            token_type: Some("embeddings.token_type_embeddings.weight"),
            embeddings_norm: "emb_ln",
            layer: "encoder.layers.{n}.",
        },
        Family::Gte => Names {
            word: "embeddings.word_embeddings.weight",
            position: None,
            token_type: Some("embeddings.token_type_embeddings.weight"),
            embeddings_norm: "embeddings.LayerNorm",
            layer: "encoder.layer.{n}.",
        },
        Family::ModernBert => Names {
            word: "embeddings.tok_embeddings.weight",
            position: None,
            token_type: None,
            embeddings_norm: "embeddings.norm",
            layer: "layers.{n}.",
        },
    }
}

impl EncoderLayer {
    /// Layer `n` read through the family's names, into the engine's layout.
    fn load(ts: &Tensors, c: &EncoderConfig, n: usize, layer: &str) -> Result<EncoderLayer> {
        let (d, i) = (c.hidden_size, c.intermediate_size);
        let p = |s: &str| format!("{layer}{s}");
        let sq = vec![d, d];
        Ok(match c.family {
            Family::Bert | Family::XlmRoberta => {
                let qkv = |part: &str, shape: &[usize]| {
                    ["query", "key", "value"]
                        .map(|x| (p(&format!("attention.self.{x}.{part}")), shape.to_vec()))
                };
                EncoderLayer {
                    qkv_w: ts.stacked(&qkv("weight", &sq))?,
                    qkv_b: Some(ts.stacked(&qkv("bias", &[d]))?),
                    attention_output_w: ts.get(&p("attention.output.dense.weight"), &sq)?,
                    attention_output_b: Some(ts.get(&p("attention.output.dense.bias"), &[d])?),
                    attention_norm: Some(ts.norm(&p("attention.output.LayerNorm"), d, true)?),
                    intermediate_w: ts.get(&p("intermediate.dense.weight"), &[i, d])?,
                    intermediate_b: Some(ts.get(&p("intermediate.dense.bias"), &[i])?),
                    output_w: ts.get(&p("output.dense.weight"), &[d, i])?,
                    output_b: Some(ts.get(&p("output.dense.bias"), &[d])?),
                    output_norm: ts.norm(&p("output.LayerNorm"), d, true)?,
                }
            }
            Family::NomicBert => EncoderLayer {
                qkv_w: ts.get(&p("attn.Wqkv.weight"), &[3 * d, d])?,
                qkv_b: ts.opt(&p("attn.Wqkv.bias"), &[3 * d])?,
                attention_output_w: ts.get(&p("attn.out_proj.weight"), &sq)?,
                attention_output_b: ts.opt(&p("attn.out_proj.bias"), &[d])?,
                attention_norm: Some(ts.norm(&p("norm1"), d, true)?),
                // fc12 is the gate (activated), fc11 the linear half.
                intermediate_w: ts.stacked(&[
                    (p("mlp.fc12.weight"), vec![i, d]),
                    (p("mlp.fc11.weight"), vec![i, d]),
                ])?,
                intermediate_b: None,
                output_w: ts.get(&p("mlp.fc2.weight"), &[d, i])?,
                output_b: ts.opt(&p("mlp.fc2.bias"), &[d])?,
                output_norm: ts.norm(&p("norm2"), d, true)?,
            },
            Family::Gte => {
                // up_gate_proj holds the linear half first: swap the halves.
                let ug = ts.get(&p("mlp.up_gate_proj.weight"), &[2 * i, d])?;
                let (up, gate) = ug.split_at(i * d);
                EncoderLayer {
                    qkv_w: ts.get(&p("attention.qkv_proj.weight"), &[3 * d, d])?,
                    qkv_b: ts.opt(&p("attention.qkv_proj.bias"), &[3 * d])?,
                    attention_output_w: ts.get(&p("attention.o_proj.weight"), &sq)?,
                    attention_output_b: ts.opt(&p("attention.o_proj.bias"), &[d])?,
                    attention_norm: Some(ts.norm(&p("attn_ln"), d, true)?),
                    intermediate_w: [gate, up].concat(),
                    intermediate_b: None,
                    output_w: ts.get(&p("mlp.down_proj.weight"), &[d, i])?,
                    output_b: ts.opt(&p("mlp.down_proj.bias"), &[d])?,
                    output_norm: ts.norm(&p("mlp_ln"), d, true)?,
                }
            }
            Family::ModernBert => EncoderLayer {
                qkv_w: ts.get(&p("attn.Wqkv.weight"), &[3 * d, d])?,
                qkv_b: ts.opt(&p("attn.Wqkv.bias"), &[3 * d])?,
                attention_output_w: ts.get(&p("attn.Wo.weight"), &sq)?,
                attention_output_b: ts.opt(&p("attn.Wo.bias"), &[d])?,
                attention_norm: if n == 0 {
                    None
                } else {
                    Some(ts.norm(&p("attn_norm"), d, false)?)
                },
                intermediate_w: ts.get(&p("mlp.Wi.weight"), &[2 * i, d])?,
                intermediate_b: ts.opt(&p("mlp.Wi.bias"), &[2 * i])?,
                output_w: ts.get(&p("mlp.Wo.weight"), &[d, i])?,
                output_b: ts.opt(&p("mlp.Wo.bias"), &[d])?,
                output_norm: ts.norm(&p("mlp_norm"), d, false)?,
            },
        })
    }
}

impl Encoder {
    /// Reads `config.json` and `model.safetensors` from a Hugging Face model directory.
    pub fn load(dir: &Path) -> Result<Encoder> {
        let config = EncoderConfig::from_file(&dir.join("config.json"))?;
        let path = dir.join("model.safetensors");
        let (weights, head) = load_weights(&path, &config)?;
        Ok(Encoder {
            config,
            weights,
            head,
            packed: OnceLock::new(),
        })
    }

    /// Repacks the weights for the CPU forward pass now rather than in the
    /// first call (which would then be slower than the rest).
    pub fn prepare_cpu(&self) {
        self.packed_layers();
    }

    fn packed_layers(&self) -> &[PackedLayer] {
        self.packed.get_or_init(|| {
            let c = &self.config;
            let (d, i, w) = (c.hidden_size, c.intermediate_size, c.ffn_width());
            self.weights
                .layers
                .iter()
                .map(|l| PackedLayer {
                    qkv: cpu::PackedMatrix::pack(&l.qkv_w, 3 * d, d),
                    attention_output: cpu::PackedMatrix::pack(&l.attention_output_w, d, d),
                    intermediate: cpu::PackedMatrix::pack(&l.intermediate_w, w, d),
                    output: cpu::PackedMatrix::pack(&l.output_w, d, i),
                })
                .collect()
        })
    }

    /// h: [tokens, d], the sum of word, position and token-type embeddings
    /// (before the embedding LayerNorm).
    pub fn embedding_sum(&self, batch: &Batch) -> Result<Vec<f32>> {
        let c = &self.config;
        let w = &self.weights;
        let d = c.hidden_size;
        let mut h = vec![0.0f32; batch.ids.len() * d];
        let offset = match c.positions {
            Positions::Learned { offset, .. } => offset,
            Positions::Rotary => 0,
        };
        let types = c.type_vocab_size.max(1);
        for t in 0..batch.ids.len() {
            let (id, pos, ty) = (
                batch.ids[t] as usize,
                batch.positions[t] as usize,
                batch.type_ids[t] as usize,
            );
            if id >= c.vocab_size || pos >= c.max_position_embeddings || ty >= types {
                return Err(Error::invalid(format!(
                    "token {t}: id {id}, position {pos}, type {ty} out of range for the model \
                     (vocabulary {}, {} positions, {types} types)",
                    c.vocab_size, c.max_position_embeddings
                )));
            }
        }
        // Rows in parallel: at batch 256 this host-side lookup is a share
        // of the GPU path's time.
        use rayon::prelude::*;
        h.par_chunks_mut(d)
            .with_min_len(64)
            .enumerate()
            .for_each(|(t, row)| {
                let (id, pos, ty) = (
                    batch.ids[t] as usize,
                    batch.positions[t] as usize,
                    batch.type_ids[t] as usize,
                );
                row.copy_from_slice(&w.word_embeddings[id * d..(id + 1) * d]);
                if let Some(pe) = &w.position_embeddings {
                    let p = pos + offset;
                    cpu::add_assign(row, &pe[p * d..(p + 1) * d]);
                }
                if let Some(te) = &w.token_type_embeddings {
                    cpu::add_assign(row, &te[ty * d..(ty + 1) * d]);
                }
            });
        Ok(h)
    }

    /// The CPU reference forward pass: last hidden state, [tokens, d].
    pub fn forward_cpu(&self, batch: &Batch) -> Result<Vec<f32>> {
        let c = &self.config;
        let (d, inter, t) = (c.hidden_size, c.intermediate_size, batch.ids.len());
        let eps = c.layer_norm_eps;
        let w = &self.weights;
        let sum = self.embedding_sum(batch)?;
        let ln = |x: &[f32], n: &Norm, y: &mut [f32]| cpu::layer_norm(x, &n.w, &n.b, eps, y);
        let mut h = vec![0.0f32; t * d];
        ln(&sum, &w.embeddings_norm, &mut h);
        let mut x = vec![0.0f32; t * d];
        let mut qkv = vec![0.0f32; t * 3 * d];
        let (mut q, mut k, mut v) = if c.rotary() {
            (vec![0.0; t * d], vec![0.0; t * d], vec![0.0; t * d])
        } else {
            (Vec::new(), Vec::new(), Vec::new())
        };
        let mut ctx = vec![0.0f32; t * d];
        let mut a = vec![0.0f32; t * d];
        let mut f = vec![0.0f32; t * c.ffn_width()];
        let mut g = vec![0.0f32; if c.gated { t * inter } else { 0 }];
        let mut tables: Vec<(f32, Vec<f32>)> = Vec::new();
        for ((l, p), spec) in w.layers.iter().zip(self.packed_layers()).zip(&c.layers) {
            // The attention's input: h, or its pre-norm.
            let input: &[f32] = match (&l.attention_norm, c.pre_norm) {
                (Some(n), true) => {
                    ln(&h, n, &mut x);
                    &x
                }
                _ => &h,
            };
            cpu::matmul_packed(input, &p.qkv, l.qkv_b.as_deref(), t, &mut qkv);
            let shape = c.attention_shape(spec.window);
            if c.rotary() {
                if !tables.iter().any(|(th, _)| *th == spec.rope_theta) {
                    tables.push((spec.rope_theta, c.rope_table(batch, spec.rope_theta)));
                }
                let table = &tables
                    .iter()
                    .find(|(th, _)| *th == spec.rope_theta)
                    .unwrap()
                    .1;
                let rs = c.rope_shape();
                cpu::qk_rope(
                    &qkv, t, &rs, None, None, None, table, 0, &mut q, &mut k, &mut v,
                );
                cpu::attention(&q, &k, &v, &batch.seqs, &shape, &mut ctx);
            } else {
                cpu::attention(&qkv, &qkv, &qkv, &batch.seqs, &shape, &mut ctx);
            }
            cpu::matmul_packed(
                &ctx,
                &p.attention_output,
                l.attention_output_b.as_deref(),
                t,
                &mut a,
            );
            cpu::add_assign(&mut a, &h);
            match (&l.attention_norm, c.pre_norm) {
                (Some(n), false) => ln(&a, n, &mut h),
                _ => h.copy_from_slice(&a),
            }
            let input: &[f32] = if c.pre_norm {
                ln(&h, &l.output_norm, &mut x);
                &x
            } else {
                &h
            };
            cpu::matmul_packed(
                input,
                &p.intermediate,
                l.intermediate_b.as_deref(),
                t,
                &mut f,
            );
            let act_out: &[f32] = if c.gated {
                cpu::gated_act(&f, inter, c.hidden_act, &mut g);
                &g
            } else {
                c.hidden_act.apply_all_fast(&mut f);
                &f
            };
            cpu::matmul_packed(act_out, &p.output, l.output_b.as_deref(), t, &mut a);
            cpu::add_assign(&mut a, &h);
            if c.pre_norm {
                h.copy_from_slice(&a);
            } else {
                ln(&a, &l.output_norm, &mut h);
            }
        }
        if let Some(n) = &w.final_norm {
            ln(&h, n, &mut x);
            return Ok(x);
        }
        Ok(h)
    }
}

/// The encoder's weights (and a cross-encoder's head) from `path`.
fn load_weights(
    path: &Path,
    c: &EncoderConfig,
) -> Result<(EncoderWeights, Option<ClassifierHead>)> {
    // Dropped before this function returns: every tensor is copied out.
    let map = crate::util::fs::map(path).map_err(|e| Error::io(path, e))?;
    let st = SafeTensors::deserialize((*map).as_ref())
        .map_err(|e| Error::format(path, format!("not a valid safetensors file: {e}")))?;
    let n = names(c.family);
    let prefix = ["", "bert.", "roberta.", "new.", "model.", "nomic_bert."]
        .into_iter()
        .find(|p| st.tensor(&format!("{p}{}", n.word)).is_ok())
        .unwrap_or("");
    let ts = Tensors { path, st, prefix };
    let d = c.hidden_size;
    let layer_prefix = |i: usize| n.layer.replace("{n}", &i.to_string());
    let mut layers = Vec::with_capacity(c.num_hidden_layers);
    for i in 0..c.num_hidden_layers {
        layers.push(EncoderLayer::load(&ts, c, i, &layer_prefix(i))?);
    }
    // A tensor of the layer past the last one: config.json undercounts.
    let next = layer_prefix(c.num_hidden_layers);
    if ts
        .st
        .names()
        .iter()
        .any(|t| t.starts_with(&format!("{prefix}{next}")))
    {
        return Err(Error::format(
            path,
            format!(
                "holds more than the {} layers config.json declares",
                c.num_hidden_layers
            ),
        ));
    }
    let position_embeddings = match (n.position, c.positions) {
        (Some(name), Positions::Learned { rows, .. }) => Some(ts.get(name, &[rows, d])?),
        _ => None,
    };
    let token_type_embeddings = match n.token_type {
        Some(name) if c.type_vocab_size > 0 => Some(ts.get(name, &[c.type_vocab_size, d])?),
        _ => None,
    };
    let bias = c.family != Family::ModernBert;
    let weights = EncoderWeights {
        word_embeddings: ts.get(n.word, &[c.vocab_size, d])?,
        position_embeddings,
        token_type_embeddings,
        embeddings_norm: ts.norm(n.embeddings_norm, d, bias)?,
        layers,
        final_norm: if c.pre_norm {
            Some(ts.norm("final_norm", d, false)?)
        } else {
            None
        },
    };
    Ok((weights, load_head(&ts, c)?))
}

/// A sequence-classification head, when the checkpoint has one (BERT:
/// `bert.pooler.dense` + `classifier`; XLM-R: `classifier.dense` +
/// `classifier.out_proj`; ModernBERT: `head.dense` + `head.norm` + `classifier`).
fn load_head(ts: &Tensors, c: &EncoderConfig) -> Result<Option<ClassifierHead>> {
    let d = c.hidden_size;
    let labels_of = |name: &str| -> Option<usize> {
        ts.st
            .tensor(name)
            .ok()
            .and_then(|t| (t.shape().len() == 2 && t.shape()[1] == d).then(|| t.shape()[0]))
    };
    let (dense, out) = if ts.st.tensor("classifier.out_proj.weight").is_ok() {
        ("classifier.dense".to_string(), "classifier.out_proj")
    } else if ts.st.tensor("classifier.weight").is_ok() {
        let dense = if c.family == Family::ModernBert {
            "head.dense".to_string()
        } else {
            format!("{}pooler.dense", ts.prefix)
        };
        (dense, "classifier")
    } else {
        return Ok(None);
    };
    let out_w_name = format!("{out}.weight");
    let labels = labels_of(&out_w_name).ok_or_else(|| {
        Error::format(ts.path, format!("tensor {out_w_name} is not [labels, {d}]"))
    })?;
    let spec = c.classifier;
    let dense_b = if spec.dense_bias {
        ts.read(&format!("{dense}.bias"), &[d])?
    } else {
        vec![0.0; d]
    };
    let norm = if spec.norm {
        let b = if ts.st.tensor("head.norm.bias").is_ok() {
            ts.read("head.norm.bias", &[d])?
        } else {
            vec![0.0; d]
        };
        Some(Norm {
            w: ts.read("head.norm.weight", &[d])?,
            b,
        })
    } else {
        None
    };
    Ok(Some(ClassifierHead {
        spec,
        dense_w: ts.read(&format!("{dense}.weight"), &[d, d])?,
        dense_b,
        norm,
        norm_eps: c.layer_norm_eps,
        out_w: ts.read(&out_w_name, &[labels, d])?,
        out_b: ts.read(&format!("{out}.bias"), &[labels])?,
        labels,
    }))
}

/// A ragged batch of token sequences, packed row after row.
#[derive(Clone, Debug, Default)]
pub struct Batch {
    /// `[tokens]`
    pub ids: Vec<u32>,
    /// `[tokens]`: 0 for single sentences, 1 for a pair's second text (BERT)
    pub type_ids: Vec<u32>,
    /// `[tokens]`: position within its sequence
    pub positions: Vec<u32>,
    pub seqs: Vec<SeqSpan>,
}

impl Batch {
    /// Packs single-sentence sequences (token type 0, positions from 0).
    pub fn new<S: AsRef<[u32]>>(sequences: &[S]) -> Batch {
        let mut b = Batch::default();
        for s in sequences {
            b.push(s.as_ref(), None);
        }
        b
    }

    /// Appends one sequence; `type_ids` (the tokenizer's) default to 0.
    pub fn push(&mut self, ids: &[u32], type_ids: Option<&[u32]>) {
        self.seqs.push(SeqSpan::same(self.ids.len(), ids.len()));
        self.ids.extend_from_slice(ids);
        match type_ids {
            Some(t) => self.type_ids.extend_from_slice(t),
            None => self.type_ids.extend(std::iter::repeat_n(0, ids.len())),
        }
        self.positions.extend(0..ids.len() as u32);
    }

    pub fn tokens(&self) -> usize {
        self.ids.len()
    }
}

/// Where the GPU passes' time goes, summed over the profiled passes.
#[derive(Clone, Debug, Default)]
pub struct EncoderTimes {
    /// Building, recording, submitting and running each pass, per kernel.
    pub pass: StepProfile,
    /// Uploading the embedding sum (part of the pass's prepare time).
    pub upload_us: f64,
    /// Reading the last hidden state (or the pooled vectors) back.
    pub readback_us: f64,
}

/// An encoder with its weights on the GPU: the same forward pass as
/// [`Encoder::forward_cpu`], recorded into one submission per batch.
pub struct GpuEncoder {
    config: EncoderConfig,
    layers: Vec<GpuLayer>,
    embeddings_norm: GpuNorm,
    final_norm: Option<GpuNorm>,
    /// [max(3 d, ffn width)] zeros: the bias of bias-free layers on the GEMM path.
    zeros: wgpu::Buffer,
    gemm: EncoderGemm,
}

/// Which kernel runs the encoder's linear layers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EncoderGemm {
    /// The dense f32 matmul (fused bias, activation, residual): the default,
    /// since on the H200 it outran the prefill GEMM on cooperative matrices
    /// at every batch size measured (BENCHMARKS.md, embed).
    Dense,
    /// The prefill GEMM (`llm_ops::gemm`, after a `bias_rows` fill),
    /// portable or cooperative as the adapter allows (tests run it on any adapter).
    Gemm,
}

struct GpuNorm {
    w: wgpu::Buffer,
    b: wgpu::Buffer,
}

struct GpuLayer {
    qkv_w: wgpu::Buffer,
    qkv_b: Option<wgpu::Buffer>,
    attention_output_w: wgpu::Buffer,
    attention_output_b: Option<wgpu::Buffer>,
    attention_norm: Option<GpuNorm>,
    intermediate_w: wgpu::Buffer,
    intermediate_b: Option<wgpu::Buffer>,
    output_w: wgpu::Buffer,
    output_b: Option<wgpu::Buffer>,
    output_norm: GpuNorm,
}

/// y[m, n] = x[m, k] · w^T + bias: a linear layer with no activation or residual.
fn plain_linear<'a>(
    x: &'a wgpu::Buffer,
    w: &'a wgpu::Buffer,
    bias: Option<&'a wgpu::Buffer>,
    y: &'a wgpu::Buffer,
    m: usize,
    k: usize,
    n: usize,
) -> dense::Linear<'a> {
    dense::Linear {
        x,
        w,
        format: dense::WeightFormat::F32,
        bias,
        residual: None,
        y,
        m,
        k,
        n,
        act: None,
    }
}

/// Most rows one qk_rope dispatch takes (its y workgroup count).
const MAX_ROPE_TOKENS: usize = 65535;

impl GpuEncoder {
    /// Uploads the encoder weights (the embedding tables stay on the host:
    /// the lookup is done there and only the summed rows are uploaded).
    pub fn new(gpu: &Gpu, model: &Encoder) -> Result<GpuEncoder> {
        let up = |name: String, data: &[f32]| gpu.upload_f32(&name, data);
        let opt = |name: String, data: &Option<Vec<f32>>| -> Result<Option<wgpu::Buffer>> {
            data.as_ref().map(|d| up(name, d)).transpose()
        };
        let norm = |name: String, n: &Norm| -> Result<GpuNorm> {
            Ok(GpuNorm {
                w: up(format!("{name}.weight"), &n.w)?,
                b: up(format!("{name}.bias"), &n.b)?,
            })
        };
        let mut layers = Vec::new();
        for (n, l) in model.weights.layers.iter().enumerate() {
            let name = |s: &str| format!("layer.{n}.{s}");
            layers.push(GpuLayer {
                qkv_w: up(name("qkv.weight"), &l.qkv_w)?,
                qkv_b: opt(name("qkv.bias"), &l.qkv_b)?,
                attention_output_w: up(name("attention_output.weight"), &l.attention_output_w)?,
                attention_output_b: opt(name("attention_output.bias"), &l.attention_output_b)?,
                attention_norm: l
                    .attention_norm
                    .as_ref()
                    .map(|x| norm(name("attention_norm"), x))
                    .transpose()?,
                intermediate_w: up(name("intermediate.weight"), &l.intermediate_w)?,
                intermediate_b: opt(name("intermediate.bias"), &l.intermediate_b)?,
                output_w: up(name("output.weight"), &l.output_w)?,
                output_b: opt(name("output.bias"), &l.output_b)?,
                output_norm: norm(name("output_norm"), &l.output_norm)?,
            });
        }
        let w = &model.weights;
        let gpu_model = GpuEncoder {
            config: model.config.clone(),
            layers,
            embeddings_norm: norm("embeddings_norm".into(), &w.embeddings_norm)?,
            final_norm: w
                .final_norm
                .as_ref()
                .map(|n| norm("final_norm".into(), n))
                .transpose()?,
            zeros: gpu.upload_f32(
                "zeros",
                &vec![0.0; (3 * model.config.hidden_size).max(model.config.ffn_width())],
            )?,
            gemm: EncoderGemm::Dense,
        };
        // One tiny pass compiles every pipeline (some drivers only finish
        // compiling at the first dispatch), so the first real batch is as
        // fast as the rest.
        let d = model.config.hidden_size;
        gpu_model.forward(gpu, &Batch::new(&[[0u32, 0]]), &vec![0.0; 2 * d])?;
        Ok(gpu_model)
    }

    /// Picks the kernel of the linear layers (tests force one or the other).
    pub fn set_gemm(&mut self, gemm: EncoderGemm) {
        self.gemm = gemm;
    }

    /// The GEMM kernel of the linear layers, or None for the dense matmul.
    fn gemm_kernel(&self, gpu: &Gpu) -> Option<llm_ops::GemmKernel> {
        let coop = gpu.caps.coop_matrix;
        match self.gemm {
            EncoderGemm::Dense => None,
            EncoderGemm::Gemm => Some(llm_ops::GemmKernel::for_adapter(coop)),
        }
    }

    /// One linear layer: the dense matmul with its fused epilogue, or (with
    /// `gemm`, no activation) y = bias + residual, then y += x W^T by the GEMM.
    fn project(
        &self,
        gpu: &Gpu,
        gemm: Option<llm_ops::GemmKernel>,
        l: &dense::Linear,
    ) -> Result<Vec<crate::gpu::ops::Dispatch>> {
        let Some(kernel) = gemm.filter(|_| l.act.is_none()) else {
            return Ok(vec![dense::matmul(gpu, l)?]);
        };
        let w = llm_ops::GpuMatrix {
            dtype: crate::quant::GgmlType::F32,
            k: l.k,
            rows: l.n,
            parts: 1,
            chunks: vec![llm_ops::MatrixChunk {
                buf: l.w.clone(),
                row0: 0,
                rows: l.n,
                d_off: 0,
            }],
        };
        let bias = l.bias.unwrap_or(&self.zeros);
        let mut work = vec![dense::bias_rows(
            gpu,
            Some(bias),
            l.residual,
            l.y,
            l.m,
            l.n,
        )?];
        work.extend(llm_ops::gemm(
            gpu,
            kernel,
            &w,
            llm_ops::GemmMode::Add,
            l.x,
            l.k,
            l.y,
            l.n,
            0,
            l.m,
        )?);
        Ok(work)
    }

    /// Most tokens one submission may hold: the largest activation,
    /// [tokens, max(3 d, ffn width)] f32, must fit one storage binding.
    pub fn max_tokens(&self, gpu: &Gpu) -> usize {
        let c = &self.config;
        let widest = (3 * c.hidden_size).max(c.ffn_width()) as u64 * 4;
        let fit = (gpu.caps.max_binding / widest) as usize;
        if c.rotary() {
            fit.min(MAX_ROPE_TOKENS)
        } else {
            fit
        }
    }

    /// Last hidden state, [tokens, d]. `sum` is [`Encoder::embedding_sum`] of
    /// `batch`; the batch must hold at most [`GpuEncoder::max_tokens`] tokens.
    pub fn forward(&self, gpu: &Gpu, batch: &Batch, sum: &[f32]) -> Result<Vec<f32>> {
        self.forward_timed(gpu, batch, sum, None, None)
    }

    /// [`GpuEncoder::forward`], then with `pool` each sequence's rows
    /// pooled on the device ([n_seqs, modes * d] comes back, not every
    /// token's state), adding the pass's device timestamps to `prof` when
    /// given (its readback is timed apart, in [`EncoderTimes`]).
    pub fn forward_timed(
        &self,
        gpu: &Gpu,
        batch: &Batch,
        sum: &[f32],
        pool: Option<&[dense::PoolMode]>,
        prof: Option<&mut EncoderTimes>,
    ) -> Result<Vec<f32>> {
        let start = Instant::now();
        let c = &self.config;
        let (d, inter, t) = (c.hidden_size, c.intermediate_size, batch.tokens());
        if t == 0 {
            return Ok(Vec::new());
        }
        if t > self.max_tokens(gpu) {
            return Err(Error::invalid(format!(
                "batch of {t} tokens is over the {} this adapter can hold in one pass",
                self.max_tokens(gpu)
            )));
        }
        let eps = c.layer_norm_eps;
        let bytes = |n: usize| (n * 4) as u64;
        let x = gpu.upload_f32("embedding sum", sum)?;
        let uploaded = Instant::now();
        let h = gpu.scratch("hidden", bytes(t * d))?;
        let h1 = gpu.scratch("attention hidden", bytes(t * d))?;
        let normed = gpu.scratch("normed", bytes(t * d))?;
        let qkv = gpu.scratch("qkv", bytes(t * 3 * d))?;
        let ctx = gpu.scratch("context", bytes(t * d))?;
        let f = gpu.scratch("intermediate", bytes(t * c.ffn_width()))?;
        let gemm = self.gemm_kernel(gpu);
        // The activation's output: gated, or GELU apart from the GEMM.
        let unfused_gelu = gemm.is_some() && !c.gated && c.hidden_act == Activation::Gelu;
        let g = if c.gated || unfused_gelu {
            Some(gpu.scratch("activated", bytes(t * inter))?)
        } else {
            None
        };
        let seqs = gpu.upload_u32("sequences", &dense::pack_seqs(&batch.seqs))?;
        // Rotary: q, k, v apart, a step record for qk_rope (no cache: row t
        // is token t) and one angle table per RoPE base.
        let rope = if c.rotary() {
            let mut tables: Vec<(f32, wgpu::Buffer)> = Vec::new();
            for spec in &c.layers {
                if !tables.iter().any(|(th, _)| *th == spec.rope_theta) {
                    let table = c.rope_table(batch, spec.rope_theta);
                    tables.push((spec.rope_theta, gpu.upload_f32("rope table", &table)?));
                }
            }
            Some((
                gpu.scratch("q", bytes(t * d))?,
                gpu.scratch("k", bytes(t * d))?,
                gpu.scratch("v", bytes(t * d))?,
                gpu.upload_u32("step", &[0, 0, t as u32, 1])?,
                tables,
            ))
        } else {
            None
        };
        let norm = |x: &wgpu::Buffer, n: &GpuNorm, y: &wgpu::Buffer| {
            dense::layer_norm(gpu, &gpu.reduce_variant(), x, &n.w, &n.b, y, d, t, eps)
        };
        let mut work = vec![norm(&x, &self.embeddings_norm, &h)?];
        for (l, spec) in self.layers.iter().zip(&c.layers) {
            let input = match (&l.attention_norm, c.pre_norm) {
                (Some(n), true) => {
                    work.push(norm(&h, n, &normed)?);
                    &normed
                }
                _ => &h,
            };
            work.extend(self.project(
                gpu,
                gemm,
                &plain_linear(input, &l.qkv_w, l.qkv_b.as_ref(), &qkv, t, d, 3 * d),
            )?);
            let shape = c.attention_shape(spec.window);
            match &rope {
                Some((q, k, v, step, tables)) => {
                    let cs = &tables
                        .iter()
                        .find(|(th, _)| *th == spec.rope_theta)
                        .expect("a table per base")
                        .1;
                    let kv = llm_ops::AttnBuffers {
                        step,
                        k_cache: k,
                        v_cache: v,
                    };
                    work.push(llm_ops::qk_rope(
                        gpu,
                        &c.rope_shape(),
                        &qkv,
                        None,
                        cs,
                        &kv,
                        q,
                        t,
                    )?);
                    work.push(dense::attention(
                        gpu,
                        q,
                        k,
                        v,
                        &seqs,
                        &batch.seqs,
                        &shape,
                        &ctx,
                    )?);
                }
                None => work.push(dense::attention(
                    gpu,
                    &qkv,
                    &qkv,
                    &qkv,
                    &seqs,
                    &batch.seqs,
                    &shape,
                    &ctx,
                )?),
            }
            // Post-norm: h1 = LN(h + attention); pre-norm: h1 = h + attention.
            let post = match (&l.attention_norm, c.pre_norm) {
                (Some(n), false) => Some(n),
                _ => None,
            };
            let sum_target = if post.is_some() { &normed } else { &h1 };
            work.extend(self.project(
                gpu,
                gemm,
                &dense::Linear {
                    residual: Some(&h),
                    ..plain_linear(
                        &ctx,
                        &l.attention_output_w,
                        l.attention_output_b.as_ref(),
                        sum_target,
                        t,
                        d,
                        d,
                    )
                },
            )?);
            if let Some(n) = post {
                work.push(norm(&normed, n, &h1)?);
            }
            let input = if c.pre_norm {
                work.push(norm(&h1, &l.output_norm, &normed)?);
                &normed
            } else {
                &h1
            };
            let act_out = match &g {
                Some(g) if unfused_gelu => {
                    work.extend(self.project(
                        gpu,
                        gemm,
                        &plain_linear(
                            input,
                            &l.intermediate_w,
                            l.intermediate_b.as_ref(),
                            &f,
                            t,
                            d,
                            inter,
                        ),
                    )?);
                    work.push(dense::gelu(gpu, &f, g, t * inter)?);
                    g
                }
                Some(g) => {
                    work.extend(self.project(
                        gpu,
                        gemm,
                        &plain_linear(
                            input,
                            &l.intermediate_w,
                            l.intermediate_b.as_ref(),
                            &f,
                            t,
                            d,
                            2 * inter,
                        ),
                    )?);
                    work.push(dense::gated(gpu, &f, g, inter, t, c.hidden_act)?);
                    g
                }
                None => {
                    work.extend(self.project(
                        gpu,
                        gemm,
                        &dense::Linear {
                            act: Some(c.hidden_act),
                            ..plain_linear(
                                input,
                                &l.intermediate_w,
                                l.intermediate_b.as_ref(),
                                &f,
                                t,
                                d,
                                inter,
                            )
                        },
                    )?);
                    &f
                }
            };
            // Post-norm: h = LN(h1 + ffn); pre-norm: h = h1 + ffn.
            let target = if c.pre_norm { &h } else { &normed };
            work.extend(self.project(
                gpu,
                gemm,
                &dense::Linear {
                    residual: Some(&h1),
                    ..plain_linear(
                        act_out,
                        &l.output_w,
                        l.output_b.as_ref(),
                        target,
                        t,
                        inter,
                        d,
                    )
                },
            )?);
            if !c.pre_norm {
                work.push(norm(&normed, &l.output_norm, &h)?);
            }
        }
        let out = match &self.final_norm {
            Some(n) => {
                work.push(norm(&h, n, &normed)?);
                &normed
            }
            None => &h,
        };
        let (out, len) = match pool {
            Some(modes) => {
                let n = batch.seqs.len();
                let pooled = gpu.scratch("pooled", bytes(n * modes.len() * d))?;
                work.push(dense::seq_pool(gpu, out, &seqs, n, d, modes, &pooled)?);
                (pooled, n * modes.len() * d)
            }
            None => (out.clone(), t * d),
        };
        let work: Vec<&Dispatch> = work.iter().collect();
        let read = match prof {
            None => {
                gpu.run_all(&work)?;
                None
            }
            Some(times) => {
                times.upload_us += (uploaded - start).as_secs_f64() * 1e6;
                gpu.run_timed(&work, start, &mut times.pass)?;
                Some((Instant::now(), times))
            }
        };
        let mut values = gpu.read_f32(&out)?;
        values.truncate(len);
        if let Some((at, times)) = read {
            times.readback_us += at.elapsed().as_secs_f64() * 1e6;
        }
        Ok(values)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(json: &str) -> Result<EncoderConfig> {
        EncoderConfig::from_json(Path::new("config.json"), json)
    }

    /// nomic-embed-text-v1.5's own config.json (the remote-code keys).
    #[test]
    fn nomic_remote_code_keys() {
        let c = parse(
            r#"{"model_type": "nomic_bert", "activation_function": "swiglu", "n_embd": 768,
                "n_head": 12, "n_inner": 3072, "n_layer": 12, "n_positions": 8192,
                "layer_norm_epsilon": 1e-12, "rotary_emb_base": 1000, "rotary_emb_fraction": 1.0,
                "type_vocab_size": 2, "vocab_size": 30528}"#,
        )
        .unwrap();
        assert_eq!(c.family, Family::NomicBert);
        assert_eq!(
            (c.hidden_size, c.num_hidden_layers, c.intermediate_size),
            (768, 12, 3072)
        );
        assert_eq!(c.hidden_act, Activation::Silu);
        assert!(c.gated && !c.pre_norm && c.positions == Positions::Rotary);
        assert!(c
            .layers
            .iter()
            .all(|l| l.rope_theta == 1000.0 && l.window == 0));
    }

    /// ModernBERT-base as transformers 4 saved it: global every third layer.
    #[test]
    fn modernbert_legacy_keys() {
        let c = parse(
            r#"{"model_type": "modernbert", "hidden_size": 768, "num_hidden_layers": 6,
                "num_attention_heads": 12, "intermediate_size": 1152, "vocab_size": 50368,
                "max_position_embeddings": 8192, "global_attn_every_n_layers": 3,
                "local_attention": 128, "global_rope_theta": 160000.0,
                "local_rope_theta": 10000.0, "hidden_activation": "gelu", "norm_eps": 1e-05}"#,
        )
        .unwrap();
        let windows: Vec<usize> = c.layers.iter().map(|l| l.window).collect();
        assert_eq!(windows, [0, 128, 128, 0, 128, 128]);
        assert_eq!(c.layers[0].rope_theta, 160000.0);
        assert_eq!(c.layers[1].rope_theta, 10000.0);
        assert!(c.pre_norm && c.gated && c.type_vocab_size == 0);
    }

    #[test]
    fn xlm_roberta_positions_start_after_padding() {
        let c = parse(
            r#"{"model_type": "xlm-roberta", "hidden_size": 384, "num_hidden_layers": 12,
                "num_attention_heads": 12, "intermediate_size": 1536, "vocab_size": 250002,
                "max_position_embeddings": 514, "pad_token_id": 1, "type_vocab_size": 1}"#,
        )
        .unwrap();
        assert_eq!(
            c.positions,
            Positions::Learned {
                rows: 514,
                offset: 2
            }
        );
        assert_eq!(c.max_position_embeddings, 512);
    }

    #[test]
    fn unsupported_architectures_name_the_supported_ones() {
        let e = parse(r#"{"model_type": "deberta-v2", "hidden_size": 8}"#)
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("\"deberta-v2\"") && e.contains(SUPPORTED), "{e}");
    }

    #[test]
    fn rope_scaling_fixed_ntk_on_gte_only() {
        let config = |family: &str, scaling: &str| {
            format!(
                r#"{{"model_type": "{family}", "hidden_size": 8, "num_hidden_layers": 1,
                    "num_attention_heads": 2, "intermediate_size": 8, "vocab_size": 8,
                    "max_position_embeddings": 8, "rope_scaling": {scaling}}}"#
            )
        };
        let c = parse(&config("new", r#"{"type": "ntk", "factor": 2.0}"#)).unwrap();
        assert_eq!(c.rope_ntk_factor, 2.0);
        for (family, scaling) in [
            ("gte", r#"{"type": "ntk", "factor": 2.0, "mixed_b": 0.5}"#),
            ("gte", r#"{"type": "dynamic", "factor": 2.0}"#),
            ("gte", r#"{"type": "ntk", "factor": 0}"#),
            ("nomic_bert", r#"{"type": "ntk", "factor": 2.0}"#),
        ] {
            let e = parse(&config(family, scaling)).err().unwrap().to_string();
            assert!(e.contains("rope_scaling"), "{family} {scaling}: {e}");
        }
    }
}
