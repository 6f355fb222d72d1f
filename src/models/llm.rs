//! What Llama-family and LFM2 decoders share: the config, the weights of a
//! layer, the KV cache and conv state, and the CPU reference forward.
//!
//! A decoder layer is `x += mixer(norm1(x)); x += mlp(norm2(x))`, where the
//! mixer is grouped-query attention (both architectures) or LFM2's gated
//! short convolution. The architecture files (`llama.rs`, `lfm2.rs`) map
//! their checkpoint's config keys and tensor names onto these types.

use crate::cpu;
use crate::error::{Error, Result};
use crate::formats::TensorSource;
use crate::quant;
use crate::run::sampling::Sampler;
use crate::tensor::{self, Activations, Tensor};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arch {
    Llama,
    Lfm2,
}

/// Which dimensions RoPE rotates together.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopeStyle {
    /// (i, i + d/2): transformers' `rotate_half`, llama.cpp's NEOX mode.
    Halves,
    /// (2i, 2i + 1): llama.cpp's normal mode, used for GGUF Llama files whose
    /// q/k rows the converter permuted.
    Interleaved,
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
    /// Feed-forward (SwiGLU) width.
    pub ffn: usize,
    pub vocab: usize,
    /// Longest sequence the model was trained for.
    pub context: usize,
    pub norm_eps: f32,
    pub rope_theta: f32,
    /// Dimensions of each head that RoPE rotates (usually `head_dim`).
    pub rope_dim: usize,
    pub rope_style: RopeStyle,
    pub layers: Vec<LayerKind>,
    /// LFM2: taps of the causal depthwise convolution.
    pub conv_kernel: usize,
}

impl LlmConfig {
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
        Ok(())
    }
}

pub struct Attention {
    /// [heads * head_dim, hidden]
    pub q: Tensor,
    /// [kv_heads * head_dim, hidden]
    pub k: Tensor,
    pub v: Tensor,
    /// [hidden, heads * head_dim]
    pub o: Tensor,
    /// LFM2: RMSNorm over each head of q and k before RoPE, `[head_dim]`.
    pub q_norm: Option<Vec<f32>>,
    pub k_norm: Option<Vec<f32>>,
}

pub struct ShortConv {
    /// [3 * hidden, hidden]: rows for B, then C, then x.
    pub in_proj: Tensor,
    /// [hidden, kernel]: depthwise taps in time order, the last one
    /// multiplying the current input.
    pub conv: Vec<f32>,
    /// [hidden, hidden]
    pub out_proj: Tensor,
}

pub enum Mixer {
    Attention(Attention),
    Conv(ShortConv),
}

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
}

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

/// Tensor names of one decoder layer in a checkpoint's naming scheme.
pub struct LayerNames {
    pub norm1: String,
    pub norm2: String,
    pub q: String,
    pub k: String,
    pub v: String,
    pub o: String,
    pub q_norm: Option<String>,
    pub k_norm: Option<String>,
    pub conv_in: String,
    pub conv: String,
    pub conv_out: String,
    pub gate: String,
    pub up: String,
    pub down: String,
}

/// Loads every weight named by `names` and checks it against `cfg`.
pub fn load_weights(
    cfg: &LlmConfig,
    src: &dyn TensorSource,
    embed: &str,
    final_norm: &str,
    head: Option<&str>,
    names: impl Fn(usize) -> LayerNames,
) -> Result<Weights> {
    let (d, hd, f) = (cfg.hidden, cfg.head_dim, cfg.ffn);
    let embed = load_tensor(src, embed, &[cfg.vocab, d])?;
    let mut layers = Vec::with_capacity(cfg.layers.len());
    for (i, kind) in cfg.layers.iter().enumerate() {
        let n = names(i);
        let mixer = match kind {
            LayerKind::Attention => Mixer::Attention(Attention {
                q: load_tensor(src, &n.q, &[cfg.heads * hd, d])?,
                k: load_tensor(src, &n.k, &[cfg.kv_heads * hd, d])?,
                v: load_tensor(src, &n.v, &[cfg.kv_heads * hd, d])?,
                o: load_tensor(src, &n.o, &[d, cfg.heads * hd])?,
                q_norm: n
                    .q_norm
                    .as_deref()
                    .map(|name| load_vector(src, name, hd))
                    .transpose()?,
                k_norm: n
                    .k_norm
                    .as_deref()
                    .map(|name| load_vector(src, name, hd))
                    .transpose()?,
            }),
            LayerKind::Conv => Mixer::Conv(ShortConv {
                in_proj: load_tensor(src, &n.conv_in, &[3 * d, d])?,
                conv: load_vector(src, &n.conv, d * cfg.conv_kernel)?,
                out_proj: load_tensor(src, &n.conv_out, &[d, d])?,
            }),
        };
        layers.push(Layer {
            norm1: load_vector(src, &n.norm1, d)?,
            mixer,
            norm2: load_vector(src, &n.norm2, d)?,
            gate: load_tensor(src, &n.gate, &[f, d])?,
            up: load_tensor(src, &n.up, &[f, d])?,
            down: load_tensor(src, &n.down, &[d, f])?,
        });
    }
    let head = match head.filter(|h| src.has(h)) {
        Some(h) => load_tensor(src, h, &[cfg.vocab, d])?,
        None => embed.clone(),
    };
    Ok(Weights {
        embed,
        layers,
        final_norm: load_vector(src, final_norm, d)?,
        head,
    })
}

impl Weights {
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
        Ok(crate::run::sampling::argmax(&logits) as u32)
    }
    /// Appends one token and draws the next with `sampler` (`history`: the
    /// tokens so far, for the repetition penalty). Backends override this to
    /// read back less than the logits.
    fn step_sample(&mut self, token: u32, sampler: &mut Sampler, history: &[u32]) -> Result<u32> {
        let logits = self.forward(&[token], false)?;
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

/// Observer of named intermediate activations (`"layer.3.conv_out"`), for
/// finding the first op where two backends diverge. Nothing is formatted or
/// copied when no tap is set.
pub type Tap = Box<dyn FnMut(&str, &[f32])>;

/// Per-layer sequence state.
enum State {
    /// Keys and values of every position so far, [pos, kv_heads * head_dim] each.
    Kv { k: Vec<f32>, v: Vec<f32> },
    /// The last `kernel - 1` gated inputs B*x of the convolution, [kernel - 1, hidden].
    Conv(Vec<f32>),
}

/// The CPU forward: the reference, or with [`Activations::Int8`] the faster
/// decode of the CLI tools.
pub struct CpuLlm {
    pub cfg: LlmConfig,
    pub w: Weights,
    state: Vec<State>,
    pos: usize,
    tap: Option<Tap>,
    /// How single-token (decode) products inside the layers treat their
    /// input; prefill's matrix products and the vocabulary projection stay
    /// f32.
    act: Activations,
}

impl CpuLlm {
    /// The reference: every product in f32.
    pub fn new(cfg: LlmConfig, w: Weights) -> CpuLlm {
        let mut m = CpuLlm {
            cfg,
            w,
            state: Vec::new(),
            pos: 0,
            tap: None,
            act: Activations::F32,
        };
        m.reset();
        m
    }

    /// Decode products with their input treated as `act` says.
    pub fn with_activations(mut self, act: Activations) -> CpuLlm {
        self.act = act;
        self
    }

    pub fn set_tap(&mut self, tap: Option<Tap>) {
        self.tap = tap;
    }

    fn tap(&mut self, name: impl FnOnce() -> String, x: &[f32]) {
        if let Some(t) = self.tap.as_mut() {
            t(&name(), x);
        }
    }
}

impl CausalLm for CpuLlm {
    fn config(&self) -> &LlmConfig {
        &self.cfg
    }

    fn position(&self) -> usize {
        self.pos
    }

    fn reset(&mut self) {
        let hidden = self.cfg.hidden;
        let hist = self.cfg.conv_kernel.saturating_sub(1);
        self.state = self
            .cfg
            .layers
            .iter()
            .map(|k| match k {
                LayerKind::Attention => State::Kv {
                    k: Vec::new(),
                    v: Vec::new(),
                },
                LayerKind::Conv => State::Conv(vec![0.0; hist * hidden]),
            })
            .collect();
        self.pos = 0;
    }

    fn forward(&mut self, tokens: &[u32], all_logits: bool) -> Result<Vec<f32>> {
        let cfg = self.cfg.clone();
        let n = tokens.len();
        if n == 0 {
            return Err(Error::invalid("forward: no tokens"));
        }
        if self.pos + n > cfg.context {
            return Err(Error::invalid(format!(
                "sequence of {} tokens exceeds the model's context of {}",
                self.pos + n,
                cfg.context
            )));
        }
        let (d, hd) = (cfg.hidden, cfg.head_dim);
        let (qw, kvw) = (cfg.heads * hd, cfg.kv_heads * hd);
        let act = self.act;
        // y = x W^T for m rows: one row (decode) as `act` says, more in f32.
        let product = |w: &Tensor, x: &[f32], m: usize, y: &mut [f32]| {
            if m == 1 {
                tensor::matvec_with(w, x, y, act)
            } else {
                tensor::matmul(w, x, m, y)
            }
        };
        // x: [n, hidden]
        let mut x = vec![0.0f32; n * d];
        for (t, &tok) in tokens.iter().enumerate() {
            if tok as usize >= cfg.vocab {
                return Err(Error::invalid(format!(
                    "token id {tok} is outside the {}-token vocabulary",
                    cfg.vocab
                )));
            }
            quant::dequantize_row(
                self.w.embed.dtype,
                self.w.embed.row(tok as usize),
                &mut x[t * d..(t + 1) * d],
            );
        }
        let mut h = vec![0.0f32; n * d];
        let mut mix = vec![0.0f32; n * d];
        for li in 0..cfg.layers.len() {
            let layer = &self.w.layers[li];
            cpu::rms_norm(&x, &layer.norm1, cfg.norm_eps, &mut h);
            match (&layer.mixer, &mut self.state[li]) {
                (Mixer::Attention(a), State::Kv { k: kc, v: vc }) => {
                    let mut q = vec![0.0f32; n * qw];
                    let mut k = vec![0.0f32; n * kvw];
                    let mut v = vec![0.0f32; n * kvw];
                    if n == 1 {
                        tensor::matvec_same_input(
                            &[&a.q, &a.k, &a.v],
                            &h,
                            &mut [&mut q, &mut k, &mut v],
                            act,
                        );
                    } else {
                        tensor::matmul(&a.q, &h, n, &mut q);
                        tensor::matmul(&a.k, &h, n, &mut k);
                        tensor::matmul(&a.v, &h, n, &mut v);
                    }
                    if let Some(w) = &a.q_norm {
                        let src = q.clone();
                        cpu::rms_norm(&src, w, cfg.norm_eps, &mut q);
                    }
                    if let Some(w) = &a.k_norm {
                        let src = k.clone();
                        cpu::rms_norm(&src, w, cfg.norm_eps, &mut k);
                    }
                    cpu::rope(
                        &mut q,
                        cfg.heads,
                        hd,
                        cfg.rope_dim,
                        self.pos,
                        cfg.rope_theta,
                        cfg.rope_style,
                    );
                    cpu::rope(
                        &mut k,
                        cfg.kv_heads,
                        hd,
                        cfg.rope_dim,
                        self.pos,
                        cfg.rope_theta,
                        cfg.rope_style,
                    );
                    kc.extend_from_slice(&k);
                    vc.extend_from_slice(&v);
                    let mut att = vec![0.0f32; n * qw];
                    cpu::flash_attention(
                        &q,
                        kc,
                        vc,
                        n,
                        self.pos + n,
                        cfg.heads,
                        cfg.kv_heads,
                        hd,
                        &mut att,
                    );
                    product(&a.o, &att, n, &mut mix);
                }
                (Mixer::Conv(c), State::Conv(state)) => {
                    let mut bcx = vec![0.0f32; n * 3 * d];
                    product(&c.in_proj, &h, n, &mut bcx);
                    let mut conv_out = vec![0.0f32; n * d];
                    cpu::short_conv(&bcx, &c.conv, cfg.conv_kernel, d, state, &mut conv_out);
                    product(&c.out_proj, &conv_out, n, &mut mix);
                }
                _ => unreachable!("layer state is built from the same layer kinds"),
            }
            self.tap(|| format!("layer.{li}.mixer_out"), &mix);
            cpu::add_assign(&mut x, &mix);
            let layer = &self.w.layers[li];
            cpu::rms_norm(&x, &layer.norm2, cfg.norm_eps, &mut h);
            let mut g = vec![0.0f32; n * cfg.ffn];
            let mut u = vec![0.0f32; n * cfg.ffn];
            if n == 1 {
                tensor::matvec_same_input(
                    &[&layer.gate, &layer.up],
                    &h,
                    &mut [&mut g, &mut u],
                    act,
                );
            } else {
                tensor::matmul(&layer.gate, &h, n, &mut g);
                tensor::matmul(&layer.up, &h, n, &mut u);
            }
            for (g, u) in g.iter_mut().zip(&u) {
                *g = cpu::silu(*g) * u;
            }
            product(&layer.down, &g, n, &mut mix);
            cpu::add_assign(&mut x, &mix);
            self.tap(|| format!("layer.{li}.out"), &x);
        }
        self.pos += n;
        let rows = if all_logits { n } else { 1 };
        let last = &x[(n - rows) * d..];
        let mut normed = vec![0.0f32; rows * d];
        cpu::rms_norm(last, &self.w.final_norm, cfg.norm_eps, &mut normed);
        let mut logits = vec![0.0f32; rows * cfg.vocab];
        // The vocabulary projection keeps f32 inputs: rounding the final
        // hidden state (large outliers) to 8 bits moves logits by enough to
        // change SmolLM2's first greedy token (tests/smollm2_reference.rs).
        tensor::matmul(&self.w.head, &normed, rows, &mut logits);
        Ok(logits)
    }
}
