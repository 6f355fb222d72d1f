//! What Llama-family and LFM2 decoders share: the config, the weights of a
//! layer, the KV cache and conv state, and the CPU reference forward.
//!
//! A decoder layer is `x += mixer(norm1(x)); x += mlp(norm2(x))`, where the
//! mixer is grouped-query attention (both architectures) or LFM2's gated
//! short convolution. The architecture files (`llama.rs`, `lfm2.rs`) map
//! their checkpoint's config keys and tensor names onto these types.

pub use super::llm_cpu::{CpuLlm, Tap};
pub use crate::cpu::llm::{FfnAct, RopeStyle};

use super::recipe::Residual;
use crate::cpu;
use crate::error::{Error, Result};
use crate::formats::TensorSource;
use crate::sampling::Sampler;
use crate::tensor::Tensor;

/// The checkpoint families the decoder recipe runs. Each is a config parser
/// and a names table (`arch.rs`) over the same [`LlmConfig`] switches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arch {
    Llama,
    Mistral,
    Lfm2,
    Qwen2,
    Qwen3,
    Gemma3,
    Phi3,
}

impl Arch {
    /// The name llama.cpp's GGUF files use (`general.architecture`).
    pub fn gguf_name(self) -> &'static str {
        match self {
            // llama.cpp converts Mistral checkpoints to its llama architecture.
            Arch::Llama | Arch::Mistral => "llama",
            Arch::Lfm2 => "lfm2",
            Arch::Qwen2 => "qwen2",
            Arch::Qwen3 => "qwen3",
            Arch::Gemma3 => "gemma3",
            Arch::Phi3 => "phi3",
        }
    }
}

/// How a checkpoint stretches RoPE beyond its training context.
#[derive(Clone, Debug, PartialEq)]
pub enum RopeScaling {
    None,
    /// Positions divided by the factor (transformers' `linear`).
    Linear(f32),
    /// Llama 3.1's frequency-dependent scaling (transformers' `llama3`).
    Llama3 {
        factor: f32,
        low_freq_factor: f32,
        high_freq_factor: f32,
        original_context: usize,
    },
    /// Per-dimension divisors of the frequencies, `[rope_dim / 2]`: how
    /// llama.cpp stores Llama 3's scaling (`rope_freqs.weight`).
    Factors(Vec<f32>),
}

impl RopeScaling {
    /// The rotation frequencies of dimension pairs `0..rope_dim / 2` for
    /// base `theta`, computed in f64 (transformers' formulas).
    pub fn inv_freqs(&self, theta: f32, rope_dim: usize) -> Vec<f64> {
        let base = cpu::rope_freqs(theta, rope_dim);
        match self {
            RopeScaling::None => base,
            RopeScaling::Linear(f) => base.iter().map(|w| w / *f as f64).collect(),
            RopeScaling::Factors(ff) => base.iter().zip(ff).map(|(w, f)| w / *f as f64).collect(),
            RopeScaling::Llama3 {
                factor,
                low_freq_factor,
                high_freq_factor,
                original_context,
            } => {
                let (factor, low, high) = (
                    *factor as f64,
                    *low_freq_factor as f64,
                    *high_freq_factor as f64,
                );
                let old = *original_context as f64;
                let (low_wavelen, high_wavelen) = (old / low, old / high);
                base.iter()
                    .map(|&w| {
                        let wavelen = 2.0 * std::f64::consts::PI / w;
                        if wavelen < high_wavelen {
                            w
                        } else if wavelen > low_wavelen {
                            w / factor
                        } else {
                            let smooth = (old / wavelen - low) / (high - low);
                            (1.0 - smooth) * w / factor + smooth * w
                        }
                    })
                    .collect()
            }
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LayerKind {
    Attention,
    /// LFM2 gated short convolution.
    Conv,
}

#[derive(Clone, Debug)]
pub struct LlmConfig {
    pub arch: Arch,
    pub hidden: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    /// Feed-forward width.
    pub ffn: usize,
    pub vocab: usize,
    /// Longest sequence the model was trained for.
    pub context: usize,
    pub norm_eps: f32,
    pub rope_theta: f32,
    /// Dimensions of each head that RoPE rotates (usually `head_dim`).
    pub rope_dim: usize,
    pub rope_style: RopeStyle,
    /// Applies to the full-attention layers (sliding layers use it too unless
    /// `rope_local_theta` is set).
    pub rope_scaling: RopeScaling,
    /// Gemma-3: the sliding-window layers' own RoPE base, unscaled.
    pub rope_local_theta: Option<f32>,
    pub layers: Vec<LayerKind>,
    /// Attention layers that see only the last `sliding_window` positions
    /// (one flag per layer; empty when none do).
    pub sliding_layers: Vec<bool>,
    pub sliding_window: usize,
    /// LFM2: taps of the causal depthwise convolution.
    pub conv_kernel: usize,
    /// Qwen2: biases on the q, k and v projections.
    pub qkv_bias: bool,
    /// Gemma-3: RMSNorms on the attention and feed-forward outputs before
    /// they join the residual stream.
    pub post_norms: bool,
    pub ffn_act: FfnAct,
    /// Gemma: the embedding rows are multiplied by this (sqrt(hidden)).
    pub embed_scale: f32,
    /// The softmax scale of attention scores (1 / sqrt(head_dim) unless the
    /// checkpoint says otherwise).
    pub attn_scale: f32,
}

impl Default for LlmConfig {
    /// A Llama-style config with every size zero, for tests to fill in.
    fn default() -> LlmConfig {
        LlmConfig {
            arch: Arch::Llama,
            hidden: 0,
            heads: 0,
            kv_heads: 0,
            head_dim: 0,
            ffn: 0,
            vocab: 0,
            context: 0,
            norm_eps: 1e-5,
            rope_theta: 10_000.0,
            rope_dim: 0,
            rope_style: RopeStyle::Halves,
            rope_scaling: RopeScaling::None,
            rope_local_theta: None,
            layers: Vec::new(),
            sliding_layers: Vec::new(),
            sliding_window: 0,
            conv_kernel: 0,
            qkv_bias: false,
            post_norms: false,
            ffn_act: FfnAct::Silu,
            embed_scale: 1.0,
            attn_scale: 0.0,
        }
    }
}

impl LlmConfig {
    /// Whether prefill's activations stay inside f16's range, so the GPU may
    /// multiply them on f16 cooperative matrices. Gemma-3's do not: its
    /// real checkpoints gave infinite logits that way on the H200.
    pub fn activations_fit_f16(&self) -> bool {
        self.arch != Arch::Gemma3
    }

    /// Checks the numbers against each other so the forward never indexes
    /// out of range; `source` names the file in errors.
    pub fn validate(&self, source: &std::path::Path) -> Result<()> {
        let bad = |what: String| Err(Error::format(source, what));
        if self.hidden == 0
            || self.heads == 0
            || self.kv_heads == 0
            || self.head_dim == 0
            || self.vocab == 0
        {
            return bad(format!("zero size in config: {self:?}"));
        }
        if !self.heads.is_multiple_of(self.kv_heads) {
            return bad(format!(
                "{} heads is not a multiple of {} kv heads",
                self.heads, self.kv_heads
            ));
        }
        if self.rope_dim > self.head_dim || !self.rope_dim.is_multiple_of(2) {
            return bad(format!(
                "rope dimension {} does not fit head dimension {}",
                self.rope_dim, self.head_dim
            ));
        }
        if self.layers.is_empty() || self.layers.len() > 4096 {
            return bad(format!("{} layers", self.layers.len()));
        }
        if self.layers.contains(&LayerKind::Conv) && !(1..=64).contains(&self.conv_kernel) {
            return bad(format!("conv kernel size {}", self.conv_kernel));
        }
        if !self.sliding_layers.is_empty() {
            if self.sliding_layers.len() != self.layers.len() {
                return bad(format!(
                    "{} sliding-window flags for {} layers",
                    self.sliding_layers.len(),
                    self.layers.len()
                ));
            }
            if self.sliding_window == 0 {
                return bad("sliding-window layers with a window of 0".into());
            }
        }
        if let RopeScaling::Factors(f) = &self.rope_scaling {
            if f.len() != self.rope_dim / 2 || f.iter().any(|v| !(v.is_finite() && *v > 0.0)) {
                return bad(format!(
                    "{} RoPE frequency factors for {} rotated dimensions (need {} positive ones)",
                    f.len(),
                    self.rope_dim,
                    self.rope_dim / 2
                ));
            }
        }
        if !(self.attn_scale.is_finite() && self.attn_scale > 0.0) {
            return bad(format!("attention scale {}", self.attn_scale));
        }
        Ok(())
    }

    /// Bytes of f32 keys and values one cached position takes over every
    /// attention layer.
    pub fn kv_bytes_per_position(&self) -> usize {
        let attention = self
            .layers
            .iter()
            .filter(|k| **k == LayerKind::Attention)
            .count();
        2 * attention * self.kv_heads * self.head_dim * std::mem::size_of::<f32>()
    }

    /// Whether attention layer `layer` sees only the last `sliding_window`
    /// positions.
    pub fn is_sliding(&self, layer: usize) -> bool {
        self.sliding_layers.get(layer).copied().unwrap_or(false)
    }

    /// The positions attention layer `layer` sees back from a query (the
    /// query included); 0 for all of them.
    pub fn window(&self, layer: usize) -> usize {
        if self.is_sliding(layer) {
            self.sliding_window
        } else {
            0
        }
    }

    /// Whether layer `layer` rotates with the local RoPE (Gemma-3's
    /// sliding layers) rather than the global one.
    pub fn uses_local_rope(&self, layer: usize) -> bool {
        self.rope_local_theta.is_some() && self.is_sliding(layer)
    }

    /// RoPE frequencies of the global (`local` false) or local rotation.
    pub fn rope_freqs(&self, local: bool) -> Vec<f64> {
        match (local, self.rope_local_theta) {
            (true, Some(theta)) => RopeScaling::None.inv_freqs(theta, self.rope_dim),
            _ => self.rope_scaling.inv_freqs(self.rope_theta, self.rope_dim),
        }
    }
}

#[derive(Clone)]
pub struct Attention {
    /// [heads * head_dim, hidden]
    pub q: Tensor,
    /// [kv_heads * head_dim, hidden]
    pub k: Tensor,
    pub v: Tensor,
    /// [hidden, heads * head_dim]
    pub o: Tensor,
    /// LFM2, Qwen3, Gemma-3: RMSNorm over each head of q and k before RoPE,
    /// `[head_dim]`.
    pub q_norm: Option<Vec<f32>>,
    pub k_norm: Option<Vec<f32>>,
    /// Qwen2: the q, k and v biases side by side, `[(heads + 2 kv_heads) head_dim]`.
    pub qkv_bias: Option<Vec<f32>>,
}

#[derive(Clone)]
pub struct ShortConv {
    /// [3 * hidden, hidden]: rows for B, then C, then x.
    pub in_proj: Tensor,
    /// [hidden, kernel]: depthwise taps in time order, the last one
    /// multiplying the current input.
    pub conv: Vec<f32>,
    /// [hidden, hidden]
    pub out_proj: Tensor,
}

// One per layer, so the attention variant's size costs nothing worth a box.
#[allow(clippy::large_enum_variant)]
#[derive(Clone)]
pub enum Mixer {
    Attention(Attention),
    Conv(ShortConv),
}

#[derive(Clone)]
pub struct Layer {
    /// `[hidden]`
    pub norm1: Vec<f32>,
    pub mixer: Mixer,
    /// `[hidden]`
    pub norm2: Vec<f32>,
    /// [ffn, hidden]
    pub gate: Tensor,
    /// [ffn, hidden]
    pub up: Tensor,
    /// [hidden, ffn]
    pub down: Tensor,
    /// Gemma-3: RMSNorm weights of the mixer's and the feed-forward's
    /// outputs, `[hidden]` each.
    pub post_mixer_norm: Option<Vec<f32>>,
    pub post_ffn_norm: Option<Vec<f32>>,
}

impl Layer {
    /// The projection whose output joins the residual stream at `which`,
    /// and its post-norm where the layer has one.
    pub fn residual(&self, which: Residual) -> (&Tensor, Option<&[f32]>) {
        match (which, &self.mixer) {
            (Residual::Mixer, Mixer::Attention(a)) => (&a.o, self.post_mixer_norm.as_deref()),
            (Residual::Mixer, Mixer::Conv(c)) => (&c.out_proj, self.post_mixer_norm.as_deref()),
            (Residual::Ffn, _) => (&self.down, self.post_ffn_norm.as_deref()),
        }
    }
}

#[derive(Clone)]
pub struct Weights {
    /// [vocab, hidden]
    pub embed: Tensor,
    pub layers: Vec<Layer>,
    /// `[hidden]`
    pub final_norm: Vec<f32>,
    /// [vocab, hidden]; the embedding itself when tied.
    pub head: Tensor,
}

/// Reads a tensor and checks its shape (a file whose tensors disagree with
/// its config is an error, never an out-of-bounds index later).
pub fn load_tensor(src: &dyn TensorSource, name: &str, shape: &[usize]) -> Result<Tensor> {
    let t = src.tensor(name)?;
    if t.shape != shape {
        return Err(Error::format(
            src.path(),
            format!(
                "tensor '{name}' has shape {:?}, expected {shape:?} from the config",
                t.shape
            ),
        ));
    }
    Ok(t)
}

/// A 1-D (or [n, 1]-like) tensor of `len` values as f32.
pub fn load_vector(src: &dyn TensorSource, name: &str, len: usize) -> Result<Vec<f32>> {
    let t = src.tensor(name)?;
    if t.numel() != len {
        return Err(Error::format(
            src.path(),
            format!("tensor '{name}' has {} values, expected {len}", t.numel()),
        ));
    }
    Ok(t.to_f32())
}

/// Tensor names of one decoder layer in a checkpoint's naming scheme; a
/// role the architecture lacks is `None`.
#[derive(Default)]
pub struct LayerNames {
    pub norm1: String,
    pub norm2: String,
    pub q: String,
    pub k: String,
    pub v: String,
    /// Phi-3: q, k and v rows in one matrix (then `q`, `k`, `v` are unused).
    pub qkv: Option<String>,
    pub q_bias: Option<String>,
    pub k_bias: Option<String>,
    pub v_bias: Option<String>,
    pub o: String,
    pub q_norm: Option<String>,
    pub k_norm: Option<String>,
    pub post_mixer_norm: Option<String>,
    pub post_ffn_norm: Option<String>,
    pub conv_in: String,
    pub conv: String,
    pub conv_out: String,
    pub gate: String,
    pub up: String,
    /// Phi-3: gate rows, then up rows, in one matrix (then `gate`, `up` are
    /// unused).
    pub gate_up: Option<String>,
    pub down: String,
}

/// Where an architecture keeps its weights in one checkpoint format.
pub struct Names {
    pub embed: String,
    pub final_norm: String,
    /// None when the head is always the embedding; a named head that the
    /// file lacks is tied too.
    pub head: Option<String>,
    /// Added to every RMSNorm weight on load: Gemma's HF checkpoints store
    /// `w` of a `(1 + w)` norm (llama.cpp's converter adds the 1).
    pub norm_shift: f32,
    pub layer: Box<dyn Fn(usize) -> LayerNames>,
}

impl LayerNames {
    /// Every role's name, in one fixed order; None where this table has
    /// none.
    fn roles(&self) -> [Option<&str>; 21] {
        fn s(n: &str) -> Option<&str> {
            (!n.is_empty()).then_some(n)
        }
        fn o(n: &Option<String>) -> Option<&str> {
            n.as_deref()
        }
        [
            s(&self.norm1),
            s(&self.norm2),
            s(&self.q),
            s(&self.k),
            s(&self.v),
            o(&self.qkv),
            o(&self.q_bias),
            o(&self.k_bias),
            o(&self.v_bias),
            s(&self.o),
            o(&self.q_norm),
            o(&self.k_norm),
            o(&self.post_mixer_norm),
            o(&self.post_ffn_norm),
            s(&self.conv_in),
            s(&self.conv),
            s(&self.conv_out),
            s(&self.gate),
            s(&self.up),
            o(&self.gate_up),
            s(&self.down),
        ]
    }
}

/// (name in `a`, name in `b`) of every weight both tables name for `cfg`'s
/// layers: how a checkpoint's names map onto another format's (export).
pub fn name_pairs(cfg: &LlmConfig, a: &Names, b: &Names) -> Vec<(String, String)> {
    let mut out = vec![
        (a.embed.clone(), b.embed.clone()),
        (a.final_norm.clone(), b.final_norm.clone()),
    ];
    if let (Some(x), Some(y)) = (&a.head, &b.head) {
        out.push((x.clone(), y.clone()));
    }
    for i in 0..cfg.layers.len() {
        let (la, lb) = ((a.layer)(i), (b.layer)(i));
        for (x, y) in la.roles().into_iter().zip(lb.roles()) {
            if let (Some(x), Some(y)) = (x, y) {
                out.push((x.to_string(), y.to_string()));
            }
        }
    }
    out
}

/// Loads every weight `names` lists and checks it against `cfg`.
pub fn load_weights(cfg: &LlmConfig, src: &dyn TensorSource, names: &Names) -> Result<Weights> {
    let (d, hd, f) = (cfg.hidden, cfg.head_dim, cfg.ffn);
    let (qw, kvw) = (cfg.heads * hd, cfg.kv_heads * hd);
    let norm = |name: &str, len: usize| -> Result<Vec<f32>> {
        let mut w = load_vector(src, name, len)?;
        if names.norm_shift != 0.0 {
            w.iter_mut().for_each(|v| *v += names.norm_shift);
        }
        Ok(w)
    };
    let opt_norm = |name: &Option<String>, len: usize| -> Result<Option<Vec<f32>>> {
        name.as_deref().map(|n| norm(n, len)).transpose()
    };
    let embed = load_tensor(src, &names.embed, &[cfg.vocab, d])?;
    let mut layers = Vec::with_capacity(cfg.layers.len());
    for (i, kind) in cfg.layers.iter().enumerate() {
        let n = (names.layer)(i);
        let mixer = match kind {
            LayerKind::Attention => {
                let (q, k, v) = match &n.qkv {
                    Some(fused) => {
                        let t = load_tensor(src, fused, &[qw + 2 * kvw, d])?;
                        (
                            t.row_range(format!("{fused}[q]"), 0, qw)?,
                            t.row_range(format!("{fused}[k]"), qw, kvw)?,
                            t.row_range(format!("{fused}[v]"), qw + kvw, kvw)?,
                        )
                    }
                    None => (
                        load_tensor(src, &n.q, &[qw, d])?,
                        load_tensor(src, &n.k, &[kvw, d])?,
                        load_tensor(src, &n.v, &[kvw, d])?,
                    ),
                };
                let qkv_bias = match (&n.q_bias, &n.k_bias, &n.v_bias) {
                    (Some(qb), Some(kb), Some(vb)) if cfg.qkv_bias => {
                        let mut b = load_vector(src, qb, qw)?;
                        b.extend(load_vector(src, kb, kvw)?);
                        b.extend(load_vector(src, vb, kvw)?);
                        Some(b)
                    }
                    _ => None,
                };
                Mixer::Attention(Attention {
                    q,
                    k,
                    v,
                    o: load_tensor(src, &n.o, &[d, qw])?,
                    q_norm: opt_norm(&n.q_norm, hd)?,
                    k_norm: opt_norm(&n.k_norm, hd)?,
                    qkv_bias,
                })
            }
            LayerKind::Conv => Mixer::Conv(ShortConv {
                in_proj: load_tensor(src, &n.conv_in, &[3 * d, d])?,
                conv: load_vector(src, &n.conv, d * cfg.conv_kernel)?,
                out_proj: load_tensor(src, &n.conv_out, &[d, d])?,
            }),
        };
        let (gate, up) = match &n.gate_up {
            Some(fused) => {
                let t = load_tensor(src, fused, &[2 * f, d])?;
                (
                    t.row_range(format!("{fused}[gate]"), 0, f)?,
                    t.row_range(format!("{fused}[up]"), f, f)?,
                )
            }
            None => (
                load_tensor(src, &n.gate, &[f, d])?,
                load_tensor(src, &n.up, &[f, d])?,
            ),
        };
        let (post_mixer_norm, post_ffn_norm) = if cfg.post_norms {
            (
                opt_norm(&n.post_mixer_norm, d)?,
                opt_norm(&n.post_ffn_norm, d)?,
            )
        } else {
            (None, None)
        };
        layers.push(Layer {
            norm1: norm(&n.norm1, d)?,
            mixer,
            norm2: norm(&n.norm2, d)?,
            gate,
            up,
            down: load_tensor(src, &n.down, &[d, f])?,
            post_mixer_norm,
            post_ffn_norm,
        });
    }
    let head = match names.head.as_deref().filter(|h| src.has(h)) {
        Some(h) => load_tensor(src, h, &[cfg.vocab, d])?,
        None => embed.clone(),
    };
    Ok(Weights {
        embed,
        layers,
        final_norm: norm(&names.final_norm, d)?,
        head,
    })
}

impl Weights {
    /// The layers' matrices repacked eight rows at a time for the CPU's
    /// int8 decode products ([`Tensor::repacked_rows8`]; matrices of other
    /// types stay), and the head for its 16-bit ones. The embedding is
    /// read a row at a time and stays (a tied head becomes a copy).
    pub fn repack_rows8(&mut self) {
        self.head = self.head.repacked_rows8();
        use rayon::prelude::*;
        self.layers.par_iter_mut().for_each(|l| {
            let mut matrices = vec![&mut l.gate, &mut l.up, &mut l.down];
            match &mut l.mixer {
                Mixer::Attention(a) => matrices.extend([&mut a.q, &mut a.k, &mut a.v, &mut a.o]),
                Mixer::Conv(c) => matrices.extend([&mut c.in_proj, &mut c.out_proj]),
            }
            for m in matrices {
                *m = m.repacked_rows8();
            }
        });
    }

    /// Every matrix (embedding, projections, head) converted to `dtype`, as a
    /// weight-format arm for benchmarks and KL-divergence runs. A matrix whose
    /// row length does not fit the block size gets llama-quantize's fallback
    /// type (`quant::policy::fallback`); those are returned as (name, type).
    /// Norms and the conv taps stay f32.
    pub fn converted(
        &self,
        dtype: crate::quant::GgmlType,
    ) -> Result<(Weights, Vec<(String, crate::quant::GgmlType)>)> {
        let mut fell_back = Vec::new();
        let mut conv = |t: &Tensor| -> Result<Tensor> {
            let to = crate::quant::policy::fallback(dtype, t.row_len());
            if to != dtype {
                fell_back.push((t.name.clone(), to));
            }
            t.to_dtype(to)
        };
        let tied = self.head.name == self.embed.name;
        let embed = conv(&self.embed)?;
        let head = if tied {
            embed.clone()
        } else {
            conv(&self.head)?
        };
        let mut layers = Vec::with_capacity(self.layers.len());
        for l in &self.layers {
            let mixer = match &l.mixer {
                Mixer::Attention(a) => Mixer::Attention(Attention {
                    q: conv(&a.q)?,
                    k: conv(&a.k)?,
                    v: conv(&a.v)?,
                    o: conv(&a.o)?,
                    q_norm: a.q_norm.clone(),
                    k_norm: a.k_norm.clone(),
                    qkv_bias: a.qkv_bias.clone(),
                }),
                Mixer::Conv(c) => Mixer::Conv(ShortConv {
                    in_proj: conv(&c.in_proj)?,
                    conv: c.conv.clone(),
                    out_proj: conv(&c.out_proj)?,
                }),
            };
            layers.push(Layer {
                norm1: l.norm1.clone(),
                mixer,
                norm2: l.norm2.clone(),
                gate: conv(&l.gate)?,
                up: conv(&l.up)?,
                down: conv(&l.down)?,
                post_mixer_norm: l.post_mixer_norm.clone(),
                post_ffn_norm: l.post_ffn_norm.clone(),
            });
        }
        Ok((
            Weights {
                embed,
                layers,
                final_norm: self.final_norm.clone(),
                head,
            },
            fell_back,
        ))
    }

    /// (number of weights, bytes of weights), the head counted once when tied.
    pub fn totals(&self) -> (usize, usize) {
        let mut tensors: Vec<&Tensor> = vec![&self.embed];
        if self.head.name != self.embed.name {
            tensors.push(&self.head);
        }
        let mut floats = self.final_norm.len();
        for l in &self.layers {
            tensors.extend([&l.gate, &l.up, &l.down]);
            floats += l.norm1.len() + l.norm2.len();
            match &l.mixer {
                Mixer::Attention(a) => {
                    tensors.extend([&a.q, &a.k, &a.v, &a.o]);
                    floats += a.q_norm.as_ref().map_or(0, Vec::len)
                        + a.k_norm.as_ref().map_or(0, Vec::len);
                }
                Mixer::Conv(c) => {
                    tensors.extend([&c.in_proj, &c.out_proj]);
                    floats += c.conv.len();
                }
            }
        }
        let params = tensors.iter().map(|t| t.numel()).sum::<usize>() + floats;
        let bytes = tensors.iter().map(|t| t.bytes().len()).sum::<usize>() + floats * 4;
        (params, bytes)
    }

    /// Bytes of weights one decoded token reads: every matrix once, one row
    /// of the embedding (the roofline's numerator).
    pub fn bytes_per_token(&self) -> usize {
        let mut n = self.embed.row_bytes() + self.final_norm.len() * 4 + self.head.bytes().len();
        for l in &self.layers {
            n += (l.norm1.len() + l.norm2.len()) * 4;
            n += l.gate.bytes().len() + l.up.bytes().len() + l.down.bytes().len();
            n += match &l.mixer {
                Mixer::Attention(a) => {
                    a.q.bytes().len() + a.k.bytes().len() + a.v.bytes().len() + a.o.bytes().len()
                }
                Mixer::Conv(c) => {
                    c.in_proj.bytes().len() + c.out_proj.bytes().len() + c.conv.len() * 4
                }
            };
        }
        n
    }
}

/// The error for logits holding a NaN or an infinity; the tools add the
/// model file's name.
pub const NONFINITE_LOGITS: &str = "the model's logits are NaN or infinite (damaged weights?)";

/// Refuses logits holding a NaN or an infinity (damaged weights), which
/// argmax and sampling would otherwise pass over or turn into token 0.
pub fn check_logits(logits: &[f32]) -> Result<()> {
    if logits.iter().all(|x| x.is_finite()) {
        Ok(())
    } else {
        Err(Error::invalid(NONFINITE_LOGITS))
    }
}

/// Positions an LFM2 conv layer's state can be rewound by
/// ([`CausalLm::truncate`]): its ring keeps the gated inputs of this many
/// positions beyond the `kernel - 1` the next token reads. More than the
/// longest draft speculative decoding checks (`generate --draft`).
pub const REWIND_DEPTH: usize = 32;

/// Rows of LFM2's conv-state ring, on the CPU and the GPU alike: the gated
/// inputs of position q in row q % rows, positions before 0 zeros.
pub fn conv_ring_rows(kernel: usize) -> usize {
    kernel.saturating_sub(1) + REWIND_DEPTH
}

/// Row of `pos - back` (which may be before position 0) in a conv ring of
/// `rows` rows.
pub(crate) fn ring_row(pos: usize, back: usize, rows: usize) -> usize {
    (pos + rows * back.div_ceil(rows).max(1) - back) % rows
}

/// A sequence's state on the host, backend-neutral: what
/// [`CausalLm::export_state`] gives and [`CausalLm::import_state`] takes.
#[derive(Clone, Debug, PartialEq)]
pub struct SeqState {
    /// Tokens consumed.
    pub pos: usize,
    /// One per layer, in order.
    pub layers: Vec<LayerState>,
}

#[derive(Clone, Debug, PartialEq)]
pub enum LayerState {
    /// Keys and values of positions `0..pos`, `[pos, kv_heads * head_dim]`
    /// each (after RoPE, as attention reads them).
    Kv { k: Vec<f32>, v: Vec<f32> },
    /// The gated conv inputs of the `rows` positions before `pos`, oldest
    /// first, `[rows, hidden]`, `rows >= kernel - 1` (positions before 0
    /// are zeros).
    Conv(Vec<f32>),
}

impl SeqState {
    /// The state after only the first `pos` tokens, when it holds enough
    /// of each conv layer's history for that; None otherwise.
    pub fn truncated(&self, pos: usize, cfg: &LlmConfig) -> Option<SeqState> {
        if pos > self.pos {
            return None;
        }
        let kvw = cfg.kv_heads * cfg.head_dim;
        let (d, hist) = (cfg.hidden, cfg.conv_kernel.saturating_sub(1));
        let back = self.pos - pos;
        let layers = self
            .layers
            .iter()
            .map(|l| match l {
                LayerState::Kv { k, v } => Some(LayerState::Kv {
                    k: k.get(..pos * kvw)?.to_vec(),
                    v: v.get(..pos * kvw)?.to_vec(),
                }),
                LayerState::Conv(rows) => {
                    let have = rows.len() / d.max(1);
                    // Rows of positions pos - hist .. pos - 1; those before
                    // position 0 are zeros whether or not they were kept.
                    let keep = have.checked_sub(back)?;
                    if keep < hist.min(pos) {
                        return None;
                    }
                    let mut out = vec![0.0; hist.saturating_sub(keep) * d];
                    let kept = &rows[..keep * d];
                    out.extend_from_slice(&kept[keep.saturating_sub(hist) * d..]);
                    Some(LayerState::Conv(out))
                }
            })
            .collect::<Option<Vec<_>>>()?;
        Some(SeqState { pos, layers })
    }

    /// Checks the state against `cfg` (layer kinds and sizes); `what`
    /// names its source in the error.
    pub fn check(&self, cfg: &LlmConfig, what: &str) -> Result<()> {
        let bad = |m: String| Err(Error::invalid(format!("{what}: {m}")));
        if self.layers.len() != cfg.layers.len() {
            return bad(format!(
                "state of {} layers for a model of {}",
                self.layers.len(),
                cfg.layers.len()
            ));
        }
        if self.pos > cfg.context {
            return bad(format!(
                "{} positions exceed the model's context of {}",
                self.pos, cfg.context
            ));
        }
        let kvw = cfg.kv_heads * cfg.head_dim;
        let (d, hist) = (cfg.hidden, cfg.conv_kernel.saturating_sub(1));
        for (i, (l, kind)) in self.layers.iter().zip(&cfg.layers).enumerate() {
            let ok = match (l, kind) {
                (LayerState::Kv { k, v }, LayerKind::Attention) => {
                    k.len() == self.pos * kvw && v.len() == self.pos * kvw
                }
                (LayerState::Conv(rows), LayerKind::Conv) => {
                    rows.len().is_multiple_of(d) && rows.len() / d >= hist
                }
                _ => false,
            };
            if !ok {
                return bad(format!(
                    "layer {i} does not match the model's {kind:?} layer"
                ));
            }
        }
        Ok(())
    }
}

/// A causal language model on some backend.
pub trait CausalLm {
    fn config(&self) -> &LlmConfig;
    /// Tokens consumed so far.
    fn position(&self) -> usize;
    /// Forgets the sequence (KV cache and conv state).
    fn reset(&mut self);
    /// Appends `tokens` to the sequence. Returns logits `[n, vocab]`: for
    /// every token when `all_logits`, else only for the last one.
    fn forward(&mut self, tokens: &[u32], all_logits: bool) -> Result<Vec<f32>>;
    /// Appends one token and returns the argmax of the next-token logits.
    /// Backends override this to avoid reading back the logits.
    fn step_greedy(&mut self, token: u32) -> Result<u32> {
        let logits = self.forward(&[token], false)?;
        check_logits(&logits)?;
        Ok(crate::sampling::argmax(&logits) as u32)
    }
    /// Appends one token and draws the next with `sampler` (`history`: the
    /// tokens so far, for the repetition penalty). Backends override this to
    /// read back less than the logits.
    fn step_sample(&mut self, token: u32, sampler: &mut Sampler, history: &[u32]) -> Result<u32> {
        let logits = self.forward(&[token], false)?;
        check_logits(&logits)?;
        Ok(sampler.sample(&logits, history))
    }
    /// Greedy decoding: consumes `token`, then each token produced, passing
    /// every produced token to `emit` until it returns false or `max` are
    /// produced; returns how many were. The sequence afterwards is what as
    /// many [`CausalLm::step_greedy`] calls leave (the last produced token is
    /// not consumed). Backends override this to keep the device busy.
    fn greedy_run(
        &mut self,
        token: u32,
        max: usize,
        emit: &mut dyn FnMut(u32) -> bool,
    ) -> Result<usize> {
        let mut token = token;
        for produced in 1..=max {
            token = self.step_greedy(token)?;
            if !emit(token) {
                return Ok(produced);
            }
        }
        Ok(max)
    }
    /// [`CausalLm::greedy_run`] under a mask (a grammar): each step takes
    /// the argmax of the logits [`GreedyGuide::mask`] allows
    /// ([`cpu::masked_argmax`]) and passes it to [`GreedyGuide::emit`];
    /// returns how many were taken. The sequence afterwards is as for
    /// `greedy_run`. The GPU applies the mask on the device and keeps the
    /// next step's forward queued while the host computes the next mask.
    fn greedy_run_guided(
        &mut self,
        token: u32,
        max: usize,
        guide: &mut dyn GreedyGuide,
    ) -> Result<usize> {
        let mut token = token;
        for produced in 1..=max {
            let logits = self.forward(&[token], false)?;
            check_logits(&logits)?;
            let mask = guide.mask()?;
            token = cpu::masked_argmax(&logits, &mask)
                .ok_or_else(|| Error::invalid(NO_TOKEN_ALLOWED))? as u32;
            if !guide.emit(token) {
                return Ok(produced);
            }
        }
        Ok(max)
    }
    /// Appends `tokens` and returns the logits of every one, `[n, vocab]`,
    /// for checking drafted tokens (speculative decoding). Row `i` is what
    /// `forward(&[tokens[i]], false)` would return after the tokens before
    /// it, bit for bit: the CPU and the GPU run the tokens as rows of their
    /// batched decode products (not through prefill, whose GEMMs round
    /// differently: on the H200 their argmaxes left plain greedy's path);
    /// the default runs the single-token forwards.
    fn forward_verify(&mut self, tokens: &[u32]) -> Result<Vec<f32>> {
        let mut out = Vec::with_capacity(tokens.len() * self.config().vocab);
        for &t in tokens {
            out.extend(self.forward(&[t], false)?);
        }
        Ok(out)
    }
    /// The argmax of each row of [`CausalLm::forward_verify`] (the first on
    /// ties), all a greedy check needs; an error for non-finite logits.
    /// Backends override this to read back the token ids only.
    fn verify_greedy(&mut self, tokens: &[u32]) -> Result<Vec<u32>> {
        let vocab = self.config().vocab;
        let logits = self.forward_verify(tokens)?;
        check_logits(&logits)?;
        Ok(logits
            .chunks_exact(vocab)
            .map(|row| crate::sampling::argmax(row) as u32)
            .collect())
    }
    /// Forgets every position from `pos` on, as if only the first `pos`
    /// tokens had been consumed: rejected draft tokens, or the part of a
    /// cached conversation that a new request does not share. Attention
    /// layers keep every position, so any `pos` works for them; LFM2's conv
    /// layers keep the inputs of the last `kernel - 1 + REWIND_DEPTH`
    /// positions, so `pos` must be at least [`CausalLm::min_truncate_pos`]
    /// (or 0, which is [`CausalLm::reset`]). An error otherwise, and when
    /// `pos` is past [`CausalLm::position`].
    fn truncate(&mut self, pos: usize) -> Result<()>;
    /// The smallest position [`CausalLm::truncate`] accepts now besides 0:
    /// 0 for models without conv layers, else [`REWIND_DEPTH`] before the
    /// furthest position reached since the last reset (or import).
    fn min_truncate_pos(&self) -> usize;
    /// The sequence's state (KV cache, conv state) copied to the host, in
    /// a form every backend reads ([`CausalLm::import_state`]).
    fn export_state(&mut self) -> Result<SeqState>;
    /// Replaces the sequence with `state` (from [`CausalLm::export_state`]
    /// of this model on any backend). An error, leaving the model reset,
    /// when the state does not fit this model's layers and sizes.
    fn import_state(&mut self, state: &SeqState) -> Result<()>;
    /// Runs `steps` greedy steps from `token` and says where each step's
    /// time goes (GPU backends, with timestamp queries).
    fn profile_decode(
        &mut self,
        _token: u32,
        _steps: usize,
    ) -> Result<crate::gpu::profile::StepProfile> {
        Err(crate::error::Error::invalid(
            "decode profiling needs the GPU backend",
        ))
    }
    /// Prefills `tokens` and says where the time of each prefill submission
    /// goes (GPU backends, with timestamp queries).
    fn profile_prefill(&mut self, _tokens: &[u32]) -> Result<crate::gpu::profile::StepProfile> {
        Err(crate::error::Error::invalid(
            "prefill profiling needs the GPU backend",
        ))
    }
}

/// What [`CausalLm::greedy_run_guided`] asks of its caller at each step.
pub trait GreedyGuide {
    /// The tokens the next may be, as a bitmap over the vocabulary: token
    /// `id` when bit `id % 32` of word `id / 32` is set. An error ends the
    /// run.
    fn mask(&mut self) -> Result<std::rc::Rc<Vec<u32>>>;
    /// Takes the token chosen; false ends the run.
    fn emit(&mut self, token: u32) -> bool;
}

/// The error of a step whose mask allows no token.
pub const NO_TOKEN_ALLOWED: &str = "the mask allows no token of the vocabulary";

/// The error of a truncation to `pos` that the sequence cannot make.
pub fn check_truncate(pos: usize, now: usize, floor: usize) -> Result<()> {
    if pos > now {
        return Err(Error::invalid(format!(
            "cannot truncate a sequence of {now} tokens to {pos}"
        )));
    }
    if pos < floor {
        return Err(Error::invalid(format!(
            "cannot rewind the conv state to position {pos}: it holds the inputs back to {floor} only"
        )));
    }
    Ok(())
}

/// Conv-ring rows that hold this sequence's inputs before `pos`, when the
/// furthest position reached is `high`: the newest `rows - (high - pos)`.
pub fn conv_rows_kept(rows: usize, high: usize, pos: usize) -> usize {
    rows - (high - pos).min(rows)
}

/// The attention shape of layer `li` (its window, the checkpoint's scale).
pub fn attn_shape(cfg: &LlmConfig, li: usize) -> cpu::AttnShape {
    cpu::AttnShape {
        heads: cfg.heads,
        kv_heads: cfg.kv_heads,
        head_dim: cfg.head_dim,
        rope_dim: cfg.rope_dim,
        rope_style: cfg.rope_style,
        eps: cfg.norm_eps,
        scale: cfg.attn_scale,
        window: cfg.window(li),
    }
}
