//! The GPU forward of LFM2 and Llama-family decoders, built from the same
//! [`LlmConfig`] and [`Weights`] as the CPU reference ([`super::llm::CpuLlm`],
//! its oracle in `tests/llm_gpu.rs`).
//!
//! Weights are uploaded in their stored format ([`GpuMatrix`]); the KV cache
//! and the conv state stay on the GPU. Decode is prepared once (bind groups,
//! dispatch list, scratch buffers: nothing is allocated per token) and
//! records a whole token, every layer, the head and the argmax, into one
//! submission; the per-token values (position, KV length, attention splits,
//! RoPE angles) go into two small buffers written once per token, and only
//! the token id comes back (or, for sampling, the top candidates; or the
//! logits, when asked). The token a step consumes is read on the GPU from
//! where the previous step's argmax left it, so greedy decoding runs a step
//! ahead of the host ([`CausalLm::greedy_run`]). Per decode
//! layer: an attention layer is norm+QKV, q/k norm+RoPE+cache write,
//! attention (+ merge on long contexts), output projection+residual,
//! norm+gate/up+SwiGLU, down+residual; an LFM2 conv layer is
//! norm+in_proj+conv block, output projection+residual and the same MLP.
//! Prefill runs the tiled GEMM over chunks of up to [`PREFILL_CHUNK`]
//! tokens, one submission per chunk, with the prenorms (and LLaMA's SwiGLU)
//! fused into the GEMMs and, on adapters with cooperative matrices, a tiled
//! attention kernel; a chunk's dispatches are kept while its shape repeats.

use super::llm::{CausalLm, Layer, LayerKind, LlmConfig, Mixer, Weights};
use crate::cpu::{self, AttnShape};
use crate::error::{Error, Result};
use crate::gpu::llm_ops::{self, AttnBuffers, GemmMode, GemvEpilogue, GpuMatrix};
use crate::gpu::ops::Dispatch;
use crate::gpu::profile::{PassTimer, StepProfile};
use crate::gpu::Gpu;
use crate::quant::GgmlType;
use crate::run::sampling::Sampler;
use crate::tensor::Tensor;
use std::sync::Arc;
use std::time::Instant;

/// Most tokens one prefill submission processes.
pub const PREFILL_CHUNK: usize = 512;
/// KV positions allocated at first; the cache doubles when it fills.
const INITIAL_KV: usize = 256;

/// Sizes that default to what the adapter allows; tests lower them to
/// exercise split matrices, chunked prefill and KV-cache growth on tiny
/// models.
#[derive(Clone, Debug, Default)]
pub struct GpuLlmOptions {
    /// Largest weight buffer (at most the adapter's storage binding limit).
    pub max_chunk_bytes: Option<u64>,
    /// Most tokens per prefill submission (at most [`PREFILL_CHUNK`]).
    pub prefill_chunk: Option<usize>,
    /// KV positions allocated at load (the cache grows as needed).
    pub kv_positions: Option<usize>,
}

enum GpuMixer {
    Attention {
        /// q, k, v projections and where each writes in the qkv row: one
        /// matrix when they share a format, else three.
        qkv: Vec<(GpuMatrix, usize)>,
        o: GpuMatrix,
        /// LFM2's per-head q and k RMSNorm weights.
        norms: Option<(wgpu::Buffer, wgpu::Buffer)>,
    },
    Conv {
        /// Parts B, C, x.
        in_proj: GpuMatrix,
        /// [hidden, taps]
        conv: wgpu::Buffer,
        out: GpuMatrix,
    },
}

enum GpuFfn {
    /// Gate and up as two parts of one matrix (fused SwiGLU GEMV).
    Fused(GpuMatrix),
    /// Gate and up in different formats.
    Split(GpuMatrix, GpuMatrix),
}

struct GpuLayer {
    norm1: wgpu::Buffer,
    norm2: wgpu::Buffer,
    mixer: GpuMixer,
    ffn: GpuFfn,
    down: GpuMatrix,
}

/// Per-layer sequence state on the GPU.
enum GpuState {
    /// [cap, kv_heads * head_dim] each.
    Kv { k: wgpu::Buffer, v: wgpu::Buffer },
    /// [taps, hidden]: a ring of the gated inputs, position q in row q % taps
    /// (gemv.wgsl), so a decode step can be undone by not advancing.
    Conv(wgpu::Buffer),
}

/// Buffers of one decode step, allocated once.
struct DecodeIo {
    /// [token, pos, kv_len, attention splits] as u32.
    step: wgpu::Buffer,
    /// RoPE cos/sin of this position: [rope_dim / 2, 2].
    cs: wgpu::Buffer,
    /// [hidden]: the residual stream.
    x: wgpu::Buffer,
    /// [q + 2 kv]
    qkv: wgpu::Buffer,
    /// [heads * head_dim]
    q: wgpu::Buffer,
    att: wgpu::Buffer,
    part: wgpu::Buffer,
    /// [hidden]
    conv_out: wgpu::Buffer,
    /// [ffn]
    g: wgpu::Buffer,
    /// [2 ffn], only for split gate/up.
    gu: wgpu::Buffer,
    /// [vocab]
    logits: wgpu::Buffer,
    /// [1] u32: the token a decode step consumes; its argmax writes the
    /// next one here, so greedy steps can follow each other on the GPU.
    token: wgpu::Buffer,
    /// [top_k, 2] u32: (id, logit bits) of the most likely tokens.
    cand: wgpu::Buffer,
    token_staging: wgpu::Buffer,
    /// A second one, so a step can be in flight while the last is read.
    token_staging2: wgpu::Buffer,
    logits_staging: wgpu::Buffer,
    cand_staging: wgpu::Buffer,
}

/// What a decode step reads back.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Readback {
    /// The argmax token id.
    Token,
    /// The top_k most likely tokens, for sampling.
    Candidates,
    Logits,
}

/// One recorded step of the decode plan.
enum Op {
    Fixed(Dispatch),
    /// Its workgroup count depends on the KV length.
    Attention(llm_ops::Attention),
}

pub struct GpuLlm {
    gpu: Arc<Gpu>,
    cfg: LlmConfig,
    subgroups: bool,
    attn: AttnShape,
    embed: GpuMatrix,
    /// None when tied to the embedding.
    head: Option<GpuMatrix>,
    final_norm: wgpu::Buffer,
    layers: Vec<GpuLayer>,
    state: Vec<GpuState>,
    /// KV positions allocated.
    cap: usize,
    pos: usize,
    io: DecodeIo,
    plan: Vec<Op>,
    argmax: Vec<Dispatch>,
    /// Selects the candidates sampling needs (`top_k` of them).
    select: Vec<Dispatch>,
    top_k: usize,
    prefill_chunk: usize,
    /// The last prefill's work buffers, reused while they are large enough
    /// (allocating ~40 MB of them per 512-token prefill cost the host
    /// milliseconds).
    prefill_scratch: Option<PrefillScratch>,
    /// The last prefill's dispatches, reused while the next has its shape.
    prefill_work: Option<PrefillWork>,
    /// RoPE cos/sin of every position reached so far ([`cpu::rope_table`]'s
    /// layout), computed once: a 512-token table took the host ~0.7 ms.
    rope: Vec<f32>,
}

/// What a prefill submission computes: `n` tokens, returning the logits of
/// every one (`all`), of the last (`last`), or none.
#[derive(Clone, Copy, PartialEq, Eq)]
struct PrefillShape {
    n: usize,
    all: bool,
    last: bool,
}

/// A prefill's dispatches, kept while its shape repeats (every full chunk
/// has the same one): building its uniforms and ~140 bind groups cost the
/// host 2-3 ms per 512-token chunk. Built over the current work buffers and
/// KV caches, so it is dropped whenever either is replaced.
struct PrefillWork {
    shape: PrefillShape,
    work: Vec<Dispatch>,
    /// Attention dispatches, with the index in `work` they go before.
    attention: Vec<(usize, llm_ops::Attention)>,
    /// Where the logits are read back, and how many bytes.
    staging: Option<(wgpu::Buffer, u64)>,
}

/// Work buffers of one prefill submission, sized for `tokens` tokens and
/// `logit_rows` rows of logits.
struct PrefillScratch {
    tokens: usize,
    logit_rows: usize,
    ids: wgpu::Buffer,
    cs: wgpu::Buffer,
    x: wgpu::Buffer,
    qkv: wgpu::Buffer,
    q: wgpu::Buffer,
    att: wgpu::Buffer,
    bcx: wgpu::Buffer,
    conv_out: wgpu::Buffer,
    gu: wgpu::Buffer,
    gg: wgpu::Buffer,
    logits: wgpu::Buffer,
}

impl PrefillScratch {
    /// `split_ffn`: some layer's gate and up are separate matrices, whose
    /// products meet in `gu` before the SwiGLU (fused ones never leave the
    /// GEMM).
    fn new(
        g: &Gpu,
        c: &LlmConfig,
        tokens: usize,
        logit_rows: usize,
        split_ffn: bool,
    ) -> Result<PrefillScratch> {
        let n = tokens;
        let (d, f, hd) = (c.hidden, c.ffn, c.head_dim);
        let (qw, kvw) = (c.heads * hd, c.kv_heads * hd);
        let f32s = |label: &str, len: usize| g.scratch(label, (len.max(1) * 4) as u64);
        let ids = g.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("tokens"),
            size: (n.max(1) * 4) as u64,
            usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        Ok(PrefillScratch {
            tokens,
            logit_rows,
            ids,
            cs: f32s("rope", n * c.rope_dim)?,
            x: f32s("x", n * d)?,
            qkv: f32s("qkv", n * (qw + 2 * kvw))?,
            q: f32s("q", n * qw)?,
            att: f32s("att", n * qw)?,
            bcx: f32s("bcx", n * 3 * d)?,
            conv_out: f32s("conv_out", n * d)?,
            gu: f32s("gu", if split_ffn { n * 2 * f } else { 0 })?,
            gg: f32s("g", n * f)?,
            logits: f32s("logits", logit_rows * c.vocab)?,
        })
    }
}

/// Uploads weights, converting formats no kernel reads to f16 (and noting
/// which, for one notice at the end).
struct Uploader<'a> {
    g: &'a Gpu,
    /// Largest weight buffer.
    max: u64,
    converted: Vec<GgmlType>,
}

impl Uploader<'_> {
    /// The tensor in a format the kernels read: as it is, or as f16.
    fn readable(&mut self, t: &Tensor) -> Result<Tensor> {
        if llm_ops::format_defines(t.dtype).is_some() {
            return Ok(t.clone());
        }
        if !self.converted.contains(&t.dtype) {
            self.converted.push(t.dtype);
        }
        t.to_dtype(GgmlType::F16)
    }

    /// One matrix of `parts` (same shape; their formats already readable
    /// and equal, or all converted here).
    fn matrix(&mut self, label: &str, parts: &[&Tensor]) -> Result<GpuMatrix> {
        let parts: Vec<Tensor> = parts
            .iter()
            .map(|t| self.readable(t))
            .collect::<Result<_>>()?;
        let bytes: Vec<&[u8]> = parts.iter().map(|t| t.bytes()).collect();
        let t = &parts[0];
        GpuMatrix::upload(
            self.g,
            label,
            t.dtype,
            t.row_len(),
            t.rows(),
            &bytes,
            self.max,
        )
    }

    fn layer(&mut self, i: usize, l: &Layer, cfg: &LlmConfig) -> Result<GpuLayer> {
        let (d, hd) = (cfg.hidden, cfg.head_dim);
        let (qw, kvw) = (cfg.heads * hd, cfg.kv_heads * hd);
        let g = self.g;
        let mixer = match &l.mixer {
            Mixer::Attention(a) => {
                let (q, k, v) = (
                    self.readable(&a.q)?,
                    self.readable(&a.k)?,
                    self.readable(&a.v)?,
                );
                // One QKV product when the three share a format.
                let qkv = if q.dtype == k.dtype && k.dtype == v.dtype {
                    let bytes = [q.bytes(), k.bytes(), v.bytes()].concat();
                    let t = Tensor::from_bytes("qkv", q.dtype, vec![qw + 2 * kvw, d], bytes)?;
                    vec![(self.matrix(&format!("layer {i} qkv"), &[&t])?, 0)]
                } else {
                    vec![
                        (self.matrix(&format!("layer {i} q"), &[&q])?, 0),
                        (self.matrix(&format!("layer {i} k"), &[&k])?, qw),
                        (self.matrix(&format!("layer {i} v"), &[&v])?, qw + kvw),
                    ]
                };
                let norms = match (&a.q_norm, &a.k_norm) {
                    (Some(qn), Some(kn)) => {
                        Some((g.upload_f32("q_norm", qn)?, g.upload_f32("k_norm", kn)?))
                    }
                    (None, None) => None,
                    _ => {
                        return Err(Error::invalid(format!(
                            "layer {i}: a q norm without a k norm (or the reverse)"
                        )))
                    }
                };
                GpuMixer::Attention {
                    qkv,
                    o: self.matrix(&format!("layer {i} o"), &[&a.o])?,
                    norms,
                }
            }
            Mixer::Conv(c) => {
                // B, C and x rows as three parts, so one GEMV workgroup finds
                // a channel's three rows in one buffer.
                let t = self.readable(&c.in_proj)?;
                let (rb, b) = (t.row_bytes(), t.bytes());
                let parts: Vec<&[u8]> = (0..3).map(|p| &b[p * d * rb..(p + 1) * d * rb]).collect();
                let label = format!("layer {i} in_proj");
                GpuMixer::Conv {
                    in_proj: GpuMatrix::upload(g, &label, t.dtype, d, d, &parts, self.max)?,
                    conv: g.upload_f32("conv", &c.conv)?,
                    out: self.matrix(&format!("layer {i} out_proj"), &[&c.out_proj])?,
                }
            }
        };
        let (gate, up) = (self.readable(&l.gate)?, self.readable(&l.up)?);
        let ffn = if gate.dtype == up.dtype {
            GpuFfn::Fused(self.matrix(&format!("layer {i} gate/up"), &[&gate, &up])?)
        } else {
            GpuFfn::Split(
                self.matrix(&format!("layer {i} gate"), &[&gate])?,
                self.matrix(&format!("layer {i} up"), &[&up])?,
            )
        };
        Ok(GpuLayer {
            norm1: g.upload_f32("norm1", &l.norm1)?,
            norm2: g.upload_f32("norm2", &l.norm2)?,
            mixer,
            ffn,
            down: self.matrix(&format!("layer {i} down"), &[&l.down])?,
        })
    }
}

impl GpuLlm {
    /// Uploads the model and prepares decode. Fails (rather than panics) on
    /// an adapter that lacks the memory or limits, or rejects a kernel.
    pub fn new(
        gpu: Arc<Gpu>,
        cfg: &LlmConfig,
        w: &Weights,
        opts: &GpuLlmOptions,
    ) -> Result<GpuLlm> {
        let max = opts
            .max_chunk_bytes
            .unwrap_or(gpu.caps.max_binding)
            .min(gpu.caps.max_binding);
        let attn = AttnShape {
            heads: cfg.heads,
            kv_heads: cfg.kv_heads,
            head_dim: cfg.head_dim,
            rope_dim: cfg.rope_dim,
            rope_theta: cfg.rope_theta,
            rope_style: cfg.rope_style,
            eps: cfg.norm_eps,
        };
        if cfg.head_dim > llm_ops::MAX_HEAD_DIM {
            return Err(Error::gpu(format!(
                "attention heads of {} dimensions (the GPU kernels hold at most {})",
                cfg.head_dim,
                llm_ops::MAX_HEAD_DIM
            )));
        }
        let handle = gpu.clone();
        let g = &*handle;
        let mut up = Uploader {
            g,
            max,
            converted: Vec::new(),
        };
        let layers = w
            .layers
            .iter()
            .enumerate()
            .map(|(i, l)| up.layer(i, l, cfg))
            .collect::<Result<Vec<_>>>()?;
        let embed = up.matrix("embedding", &[&w.embed])?;
        let tied = std::ptr::eq(w.head.bytes(), w.embed.bytes());
        let head = if tied {
            None
        } else {
            Some(up.matrix("head", &[&w.head])?)
        };
        if !up.converted.is_empty() {
            let names: Vec<&str> = up.converted.iter().map(|t| t.name()).collect();
            eprintln!(
                "gpu: no kernel reads {} weights yet; converted them to f16",
                names.join(", ")
            );
        }
        let (d, hd) = (cfg.hidden, cfg.head_dim);
        let (qw, kvw) = (cfg.heads * hd, cfg.kv_heads * hd);
        let f32s = |label: &str, n: usize| g.scratch(label, (n.max(1) * 4) as u64);
        let f = cfg.ffn;
        let io = DecodeIo {
            step: f32s("step", 4)?,
            cs: f32s("rope", cfg.rope_dim)?,
            x: f32s("x", d)?,
            qkv: f32s("qkv", qw + 2 * kvw)?,
            q: f32s("q", qw)?,
            att: f32s("att", qw)?,
            part: f32s("part", llm_ops::attention_part_len(cfg.heads, hd, 1))?,
            conv_out: f32s("conv_out", d)?,
            g: f32s("g", f)?,
            gu: f32s("gu", 2 * f)?,
            logits: f32s("logits", cfg.vocab)?,
            token: f32s("token", 1)?,
            cand: f32s("candidates", 2 * llm_ops::MAX_TOP_K)?,
            token_staging: g.staging("token", 4),
            token_staging2: g.staging("token", 4),
            logits_staging: g.staging("logits", (cfg.vocab * 4) as u64),
            cand_staging: g.staging("candidates", (8 * llm_ops::MAX_TOP_K) as u64),
        };
        let cap = opts
            .kv_positions
            .unwrap_or(INITIAL_KV)
            .clamp(1, cfg.context.min(max_positions(g, kvw)).max(1));
        let state = cfg
            .layers
            .iter()
            .map(|k| {
                Ok(match k {
                    LayerKind::Attention => GpuState::Kv {
                        k: f32s("k cache", cap * kvw)?,
                        v: f32s("v cache", cap * kvw)?,
                    },
                    LayerKind::Conv => {
                        GpuState::Conv(f32s("conv state", cfg.conv_kernel.max(1) * d)?)
                    }
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let argmax = llm_ops::argmax(g, &io.logits, &io.token, cfg.vocab)?;
        let top_k = llm_ops::MAX_TOP_K.min(cfg.vocab);
        let select = llm_ops::top_k(g, &io.logits, &io.cand, cfg.vocab, top_k)?;
        let mut m = GpuLlm {
            subgroups: gpu.caps.subgroups,
            gpu,
            cfg: cfg.clone(),
            attn,
            embed,
            head,
            final_norm: g.upload_f32("final_norm", &w.final_norm)?,
            layers,
            state,
            cap,
            pos: 0,
            io,
            plan: Vec::new(),
            argmax,
            select,
            top_k,
            prefill_chunk: opts
                .prefill_chunk
                .unwrap_or(PREFILL_CHUNK)
                .clamp(1, PREFILL_CHUNK),
            prefill_scratch: None,
            prefill_work: None,
            rope: Vec::new(),
        };
        m.plan = m.build_plan()?;
        m.warm_prefill()?;
        m.reset();
        Ok(m)
    }

    /// The decode plan over the current buffers (rebuilt when the KV cache
    /// grows).
    fn build_plan(&self) -> Result<Vec<Op>> {
        let g = &*self.gpu;
        let (io, sub, eps) = (&self.io, self.subgroups, self.cfg.norm_eps);
        let mut plan = Vec::new();
        let fixed = |ds: Vec<Dispatch>, plan: &mut Vec<Op>| {
            plan.extend(ds.into_iter().map(Op::Fixed));
        };
        fixed(
            llm_ops::embedding(g, &self.embed, &io.token, 0, &io.x, 1)?,
            &mut plan,
        );
        for (layer, state) in self.layers.iter().zip(&self.state) {
            let norm1 = GemvEpilogue::Norm {
                nw: &layer.norm1,
                eps,
            };
            match (&layer.mixer, state) {
                (GpuMixer::Attention { qkv, o, norms }, GpuState::Kv { k, v }) => {
                    for (m, off) in qkv {
                        fixed(
                            llm_ops::gemv(g, sub, m, &norm1, &io.x, 0, &io.qkv, *off)?,
                            &mut plan,
                        );
                    }
                    let kv = AttnBuffers {
                        step: &io.step,
                        k_cache: k,
                        v_cache: v,
                    };
                    let norms = norms.as_ref().map(|(a, b)| (a, b));
                    let rope =
                        llm_ops::qk_rope(g, &self.attn, &io.qkv, norms, &io.cs, &kv, &io.q, 1)?;
                    plan.push(Op::Fixed(rope));
                    plan.push(Op::Attention(llm_ops::flash_attention(
                        g, sub, &self.attn, &io.q, &kv, &io.att, &io.part, 1,
                    )?));
                    fixed(
                        llm_ops::gemv(g, sub, o, &GemvEpilogue::Add, &io.att, 0, &io.x, 0)?,
                        &mut plan,
                    );
                }
                (GpuMixer::Conv { in_proj, conv, out }, GpuState::Conv(st)) => {
                    let epi = GemvEpilogue::Conv {
                        nw: &layer.norm1,
                        eps,
                        conv,
                        state: st,
                        step: &io.step,
                        taps: self.cfg.conv_kernel,
                    };
                    fixed(
                        llm_ops::gemv(g, sub, in_proj, &epi, &io.x, 0, &io.conv_out, 0)?,
                        &mut plan,
                    );
                    fixed(
                        llm_ops::gemv(g, sub, out, &GemvEpilogue::Add, &io.conv_out, 0, &io.x, 0)?,
                        &mut plan,
                    );
                }
                _ => unreachable!("states are built from the same layer kinds"),
            }
            let norm2 = GemvEpilogue::Norm {
                nw: &layer.norm2,
                eps,
            };
            match &layer.ffn {
                GpuFfn::Fused(m) => {
                    let epi = GemvEpilogue::Swiglu {
                        nw: &layer.norm2,
                        eps,
                    };
                    fixed(
                        llm_ops::gemv(g, sub, m, &epi, &io.x, 0, &io.g, 0)?,
                        &mut plan,
                    );
                }
                GpuFfn::Split(gate, up) => {
                    fixed(
                        llm_ops::gemv(g, sub, gate, &norm2, &io.x, 0, &io.gu, 0)?,
                        &mut plan,
                    );
                    fixed(
                        llm_ops::gemv(g, sub, up, &norm2, &io.x, 0, &io.gu, self.cfg.ffn)?,
                        &mut plan,
                    );
                    plan.push(Op::Fixed(llm_ops::swiglu(
                        g,
                        &io.gu,
                        &io.g,
                        self.cfg.ffn,
                        1,
                    )?));
                }
            }
            fixed(
                llm_ops::gemv(g, sub, &layer.down, &GemvEpilogue::Add, &io.g, 0, &io.x, 0)?,
                &mut plan,
            );
        }
        let head = GemvEpilogue::Norm {
            nw: &self.final_norm,
            eps,
        };
        fixed(
            llm_ops::gemv(g, sub, self.head(), &head, &io.x, 0, &io.logits, 0)?,
            &mut plan,
        );
        Ok(plan)
    }

    /// Compute dispatches one greedy decode step records (attention merges
    /// on long contexts add one per attention layer).
    pub fn dispatches_per_token(&self) -> usize {
        self.plan.len() + self.argmax.len()
    }

    fn head(&self) -> &GpuMatrix {
        self.head.as_ref().unwrap_or(&self.embed)
    }

    fn matrices(&self) -> impl Iterator<Item = &GpuMatrix> {
        let per_layer = self.layers.iter().flat_map(|l| {
            let mut v: Vec<&GpuMatrix> = vec![&l.down];
            match &l.mixer {
                GpuMixer::Attention { qkv, o, .. } => {
                    v.extend(qkv.iter().map(|(m, _)| m));
                    v.push(o);
                }
                GpuMixer::Conv { in_proj, out, .. } => v.extend([in_proj, out]),
            }
            match &l.ffn {
                GpuFfn::Fused(m) => v.push(m),
                GpuFfn::Split(a, b) => v.extend([a, b]),
            }
            v
        });
        per_layer.chain([&self.embed, self.head()])
    }

    /// Compiles every prefill pipeline now, so that a kernel the driver
    /// rejects shows at load time rather than in the middle of a run.
    fn warm_prefill(&self) -> Result<()> {
        let g = &*self.gpu;
        let mut seen = Vec::new();
        for m in self.matrices() {
            if !seen.contains(&m.dtype) {
                seen.push(m.dtype);
                llm_ops::warm_gemm(g, m.dtype)?;
            }
        }
        llm_ops::warm_prefill_kernels(g)?;
        Ok(())
    }

    /// Makes room for `needed` positions: their RoPE angles, and KV cache
    /// room, growing the caches (and rebuilding the decode plan over the new
    /// buffers).
    fn ensure_capacity(&mut self, needed: usize) -> Result<()> {
        let rd = self.cfg.rope_dim;
        let have = self.rope.len() / rd.max(1);
        if rd > 0 && have < needed {
            let more = cpu::rope_table(have, needed - have, rd, self.cfg.rope_theta);
            self.rope.extend(more);
        }
        if needed <= self.cap {
            return Ok(());
        }
        let kvw = self.cfg.kv_heads * self.cfg.head_dim;
        let limit = max_positions(&self.gpu, kvw).min(self.cfg.context);
        if needed > limit {
            return Err(Error::gpu(format!(
                "a sequence of {needed} tokens does not fit this adapter's KV cache \
                 (at most {limit} positions of {kvw} floats in one binding)"
            )));
        }
        let cap = (2 * self.cap).max(needed).min(limit);
        let g = &*self.gpu;
        let used = (self.pos * kvw * 4) as u64;
        let mut enc = g.device.create_command_encoder(&Default::default());
        for s in self.state.iter_mut() {
            if let GpuState::Kv { k, v } = s {
                let nk = g.scratch("k cache", (cap * kvw * 4) as u64)?;
                let nv = g.scratch("v cache", (cap * kvw * 4) as u64)?;
                if used > 0 {
                    enc.copy_buffer_to_buffer(k, 0, &nk, 0, used);
                    enc.copy_buffer_to_buffer(v, 0, &nv, 0, used);
                }
                *k = nk;
                *v = nv;
            }
        }
        g.queue.submit([enc.finish()]);
        self.cap = cap;
        self.plan = self.build_plan()?;
        self.prefill_work = None;
        Ok(())
    }

    /// Fails when `n` more tokens would not fit the model's context.
    fn check_room(&self, n: usize) -> Result<()> {
        if self.pos + n > self.cfg.context {
            return Err(Error::invalid(format!(
                "sequence of {} tokens exceeds the model's context of {}",
                self.pos + n,
                self.cfg.context
            )));
        }
        Ok(())
    }

    fn check_tokens(&self, tokens: &[u32]) -> Result<()> {
        if tokens.is_empty() {
            return Err(Error::invalid("forward: no tokens"));
        }
        self.check_room(tokens.len())?;
        if let Some(t) = tokens.iter().find(|&&t| t as usize >= self.cfg.vocab) {
            return Err(Error::invalid(format!(
                "token id {t} is outside the {}-token vocabulary",
                self.cfg.vocab
            )));
        }
        Ok(())
    }

    /// Writes the per-call values every kernel reads: the step buffer and the
    /// RoPE angles of positions pos..pos + n. Queue writes land between
    /// submissions in order, so this may run while earlier steps are in flight.
    fn write_step(&self, n: usize, splits: usize, cs: &wgpu::Buffer) {
        let q = &self.gpu.queue;
        // step[0] is unused: decode reads its token from io.token.
        let step = [0, self.pos as u32, (self.pos + n) as u32, splits as u32];
        q.write_buffer(&self.io.step, 0, bytemuck::cast_slice(&step));
        let rd = self.cfg.rope_dim;
        if rd > 0 {
            let angles = &self.rope[self.pos * rd..(self.pos + n) * rd];
            q.write_buffer(cs, 0, bytemuck::cast_slice(angles));
        }
    }

    /// One decode step: appends `token`; returns the bytes `what` asks for.
    fn decode(&mut self, token: u32, what: Readback) -> Result<Vec<u8>> {
        self.check_tokens(&[token])?;
        self.write_token(token);
        let splits = self.begin_step()?;
        let mut enc = self.encode_step(splits, what);
        let g = &*self.gpu;
        let io = &self.io;
        let (src, staging, len) = match what {
            Readback::Token => (&io.token, &io.token_staging, 4),
            Readback::Candidates => (&io.cand, &io.cand_staging, 8 * self.top_k as u64),
            Readback::Logits => (&io.logits, &io.logits_staging, (self.cfg.vocab * 4) as u64),
        };
        enc.copy_buffer_to_buffer(src, 0, staging, 0, len);
        let out = g.submit_and_read(enc, staging, len)?;
        self.pos += 1;
        Ok(out)
    }

    /// Makes room for one more position and writes its step values; returns
    /// the attention splits the step records.
    fn begin_step(&mut self) -> Result<usize> {
        self.ensure_capacity(self.pos + 1)?;
        let splits = llm_ops::attention_splits(self.pos + 1);
        self.write_step(1, splits, &self.io.cs);
        Ok(splits)
    }

    /// An encoder holding one decode step's pass (the readback copy is the
    /// caller's).
    fn encode_step(&self, splits: usize, what: Readback) -> wgpu::CommandEncoder {
        let mut enc = self.gpu.device.create_command_encoder(&Default::default());
        {
            let mut pass = enc.begin_compute_pass(&Default::default());
            self.record_step(&mut pass, splits, what, &mut |_, _| {});
        }
        enc
    }

    /// Sets the token the next decode step consumes (otherwise it consumes
    /// the one the previous step's argmax left in io.token).
    fn write_token(&self, token: u32) {
        self.gpu
            .queue
            .write_buffer(&self.io.token, 0, bytemuck::bytes_of(&token));
    }

    /// Submits one greedy decode step consuming the token in io.token, its
    /// argmax copied into `staging`; advances the position.
    fn submit_greedy(&mut self, staging: &wgpu::Buffer) -> Result<wgpu::SubmissionIndex> {
        self.check_room(1)?;
        let splits = self.begin_step()?;
        let mut enc = self.encode_step(splits, Readback::Token);
        enc.copy_buffer_to_buffer(&self.io.token, 0, staging, 0, 4);
        let done = self.gpu.queue.submit([enc.finish()]);
        self.pos += 1;
        Ok(done)
    }

    /// Greedy decoding with the GPU one step ahead of the host: step i + 1
    /// is submitted, consuming the token step i left on the GPU, before the
    /// host reads step i's token, so recording and submitting overlap the
    /// device's work. When `emit` stops early the step that ran ahead is
    /// undone (the position goes back; its KV row and conv-state ring row are
    /// rewritten by the next token), so the sequence is what a loop of
    /// [`CausalLm::step_greedy`] leaves.
    fn greedy_pipelined(
        &mut self,
        token: u32,
        max: usize,
        emit: &mut dyn FnMut(u32) -> bool,
    ) -> Result<usize> {
        if max == 0 {
            return Ok(0);
        }
        self.check_tokens(&[token])?;
        self.write_token(token);
        let staging = [
            self.io.token_staging.clone(),
            self.io.token_staging2.clone(),
        ];
        // Submission of each step in flight, oldest first.
        let mut flight = std::collections::VecDeque::new();
        flight.push_back(self.submit_greedy(&staging[0])?);
        let (mut submitted, mut produced) = (1, 0);
        loop {
            if submitted < max {
                flight.push_back(self.submit_greedy(&staging[submitted % 2])?);
                submitted += 1;
            }
            let done = flight.pop_front().expect("a step in flight");
            let bytes = self.gpu.read_staging(&staging[produced % 2], 4, done)?;
            let next = u32::from_le_bytes(bytes[..4].try_into().expect("4 bytes"));
            produced += 1;
            if !emit(next) || produced == max {
                if submitted > produced {
                    // The step that ran ahead consumed `next`: wait for it
                    // (its staging buffer must be unmapped for reuse) and
                    // take it back.
                    let done = flight.pop_front().expect("the step ahead");
                    self.gpu.read_staging(&staging[produced % 2], 4, done)?;
                    self.pos -= 1;
                }
                return Ok(produced);
            }
        }
    }

    /// Records one decode step into `pass`, calling `after` after each
    /// dispatch with its kernel name.
    fn record_step(
        &self,
        pass: &mut wgpu::ComputePass<'_>,
        splits: usize,
        what: Readback,
        after: &mut dyn FnMut(&mut wgpu::ComputePass<'_>, &'static str),
    ) {
        let last = match what {
            Readback::Token => &self.argmax[..],
            Readback::Candidates => &self.select[..],
            Readback::Logits => &[],
        };
        for op in &self.plan {
            match op {
                Op::Fixed(d) => {
                    d.record(pass);
                    after(pass, d.bound.name);
                }
                Op::Attention(a) => a.record_with(pass, splits, after),
            }
        }
        for d in last {
            d.record(pass);
            after(pass, d.bound.name);
        }
    }

    /// Runs `steps` greedy decode steps from `token` with a device timestamp
    /// after every dispatch, and says where the time went: host recording,
    /// submission and waiting, and device time per kernel.
    pub fn profile_decode(&mut self, mut token: u32, steps: usize) -> Result<StepProfile> {
        // Every attention layer may add a merge.
        let timer = PassTimer::new(&self.gpu, 2 * self.plan.len() as u32 + 2)?;
        let mut prof = StepProfile {
            what: "decode step".into(),
            ..Default::default()
        };
        for _ in 0..steps {
            self.check_tokens(&[token])?;
            self.write_token(token);
            let splits = self.begin_step()?;
            let g = &*self.gpu;
            let t0 = Instant::now();
            let mut enc = g.device.create_command_encoder(&Default::default());
            let mut names = Vec::new();
            {
                let mut pass = enc.begin_compute_pass(&Default::default());
                timer.mark(&mut pass, 0);
                self.record_step(&mut pass, splits, Readback::Token, &mut |p, name| {
                    names.push(name);
                    timer.mark(p, names.len() as u32);
                });
            }
            let marks = names.len() as u32 + 1;
            if marks > timer.capacity() {
                return Err(Error::gpu("profile: more dispatches than timestamps"));
            }
            timer.resolve(&mut enc, marks);
            enc.copy_buffer_to_buffer(&self.io.token, 0, &self.io.token_staging, 0, 4);
            let t1 = Instant::now();
            let done = g.queue.submit([enc.finish()]);
            let t2 = Instant::now();
            let out = g.read_staging(&self.io.token_staging, 4, done.clone())?;
            let t3 = Instant::now();
            let ts = timer.read(g, marks, done)?;
            prof.add_step([t0, t0, t1, t2, t3], &names, &ts);
            self.pos += 1;
            token = u32::from_le_bytes(out[..4].try_into().expect("4 bytes"));
        }
        Ok(prof.finish())
    }

    /// Largest prefill chunk whose buffers all fit one binding.
    fn prefill_chunk_len(&self) -> usize {
        let c = &self.cfg;
        let widest = [
            c.vocab,
            2 * c.ffn,
            3 * c.hidden,
            (c.heads + 2 * c.kv_heads) * c.head_dim,
        ]
        .into_iter()
        .max()
        .unwrap_or(1);
        let fit = (self.gpu.caps.max_binding / (4 * widest as u64)) as usize;
        fit.clamp(1, self.prefill_chunk)
    }

    /// Runs `tokens` (at most a prefill chunk) through the model in one
    /// submission; returns the logits of every token (`all`), of the last
    /// one (`last`), or none.
    fn prefill(&mut self, tokens: &[u32], all: bool, last: bool) -> Result<Vec<f32>> {
        self.prefill_timed(tokens, all, last, None)
    }

    /// Builds a prefill's dispatches (uniforms and bind groups over the
    /// current work buffers and caches) for `shape`.
    fn prefill_work(&self, shape: PrefillShape) -> Result<PrefillWork> {
        let PrefillShape { n, all, last } = shape;
        let sc = self.prefill_scratch.as_ref().expect("allocated before");
        let g = &*self.gpu;
        let gemm_kernel = llm_ops::GemmKernel::for_adapter(g.caps.coop_matrix);
        let c = &self.cfg;
        let (d, f, hd) = (c.hidden, c.ffn, c.head_dim);
        let qw = c.heads * hd;
        let qkvw = qw + 2 * c.kv_heads * hd;
        let (tok, cs, x, qkv, q, att) = (&sc.ids, &sc.cs, &sc.x, &sc.qkv, &sc.q, &sc.att);
        let (bcx, conv_out, gu, gg, logits) = (&sc.bcx, &sc.conv_out, &sc.gu, &sc.gg, &sc.logits);
        let eps = c.norm_eps;
        let mut work: Vec<Dispatch> = Vec::new();
        let mut attention = Vec::new();
        work.extend(llm_ops::embedding(g, &self.embed, tok, 0, x, n)?);
        // Dispatches are recorded in order; attention ones are kept aside
        // with the index they go before.
        for (layer, state) in self.layers.iter().zip(&self.state) {
            // Each layer's prenorms are fused into the GEMMs that read them.
            let norm1 = GemmMode::Norm {
                nw: &layer.norm1,
                eps,
            };
            match (&layer.mixer, state) {
                (
                    GpuMixer::Attention {
                        qkv: mats,
                        o,
                        norms,
                    },
                    GpuState::Kv { k, v },
                ) => {
                    for (m, off) in mats {
                        work.extend(llm_ops::gemm(
                            g,
                            gemm_kernel,
                            m,
                            norm1,
                            x,
                            d,
                            qkv,
                            qkvw,
                            *off,
                            n,
                        )?);
                    }
                    let kv = AttnBuffers {
                        step: &self.io.step,
                        k_cache: k,
                        v_cache: v,
                    };
                    let norms = norms.as_ref().map(|(a, b)| (a, b));
                    work.push(llm_ops::qk_rope(g, &self.attn, qkv, norms, cs, &kv, q, n)?);
                    match llm_ops::prefill_attention(g, &self.attn, q, &kv, att, n)? {
                        Some(a) => work.push(a),
                        None => {
                            let a = llm_ops::flash_attention(
                                g,
                                self.subgroups,
                                &self.attn,
                                q,
                                &kv,
                                att,
                                &self.io.part,
                                n,
                            )?;
                            attention.push((work.len(), a));
                        }
                    }
                    work.extend(llm_ops::gemm(
                        g,
                        gemm_kernel,
                        o,
                        GemmMode::Add,
                        att,
                        qw,
                        x,
                        d,
                        0,
                        n,
                    )?);
                }
                (GpuMixer::Conv { in_proj, conv, out }, GpuState::Conv(st)) => {
                    work.extend(llm_ops::gemm(
                        g,
                        gemm_kernel,
                        in_proj,
                        norm1,
                        x,
                        d,
                        bcx,
                        3 * d,
                        0,
                        n,
                    )?);
                    work.push(llm_ops::short_conv(
                        g,
                        bcx,
                        conv,
                        st,
                        &self.io.step,
                        conv_out,
                        d,
                        c.conv_kernel,
                        n,
                    )?);
                    work.extend(llm_ops::gemm(
                        g,
                        gemm_kernel,
                        out,
                        GemmMode::Add,
                        conv_out,
                        d,
                        x,
                        d,
                        0,
                        n,
                    )?);
                }
                _ => unreachable!("states are built from the same layer kinds"),
            }
            let norm2 = GemmMode::Norm {
                nw: &layer.norm2,
                eps,
            };
            match &layer.ffn {
                GpuFfn::Fused(m) => {
                    let mode = GemmMode::NormSwiglu {
                        nw: &layer.norm2,
                        eps,
                    };
                    work.extend(llm_ops::gemm(g, gemm_kernel, m, mode, x, d, gg, f, 0, n)?)
                }
                GpuFfn::Split(gate, up) => {
                    work.extend(llm_ops::gemm(
                        g,
                        gemm_kernel,
                        gate,
                        norm2,
                        x,
                        d,
                        gu,
                        2 * f,
                        0,
                        n,
                    )?);
                    work.extend(llm_ops::gemm(
                        g,
                        gemm_kernel,
                        up,
                        norm2,
                        x,
                        d,
                        gu,
                        2 * f,
                        f,
                        n,
                    )?);
                    work.push(llm_ops::swiglu(g, gu, gg, f, n)?);
                }
            }
            work.extend(llm_ops::gemm(
                g,
                gemm_kernel,
                &layer.down,
                GemmMode::Add,
                gg,
                f,
                x,
                d,
                0,
                n,
            )?);
        }
        if all {
            let norm = GemmMode::Norm {
                nw: &self.final_norm,
                eps,
            };
            work.extend(llm_ops::gemm(
                g,
                gemm_kernel,
                self.head(),
                norm,
                x,
                d,
                logits,
                c.vocab,
                0,
                n,
            )?);
        } else if last {
            let head = GemvEpilogue::Norm {
                nw: &self.final_norm,
                eps,
            };
            work.extend(llm_ops::gemv(
                g,
                self.subgroups,
                self.head(),
                &head,
                x,
                (n - 1) * d,
                logits,
                0,
            )?);
        }
        let rows = if all { n } else { 1 };
        let staging = (all || last).then(|| {
            let len = (rows * c.vocab * 4) as u64;
            (g.staging("logits", len), len)
        });
        Ok(PrefillWork {
            shape,
            work,
            attention,
            staging,
        })
    }

    /// Prefills `tokens` from the current position (in chunks, as
    /// `forward` does) with a device timestamp after every dispatch; each
    /// chunk is one run of the profile.
    pub fn profile_prefill(&mut self, tokens: &[u32]) -> Result<StepProfile> {
        self.check_tokens(tokens)?;
        let chunk = self.prefill_chunk_len();
        let mut prof = StepProfile {
            what: format!("prefill of {} tokens", tokens.len().min(chunk)),
            ..Default::default()
        };
        for part in tokens.chunks(chunk) {
            self.prefill_timed(part, false, true, Some(&mut prof))?;
        }
        Ok(prof.finish())
    }

    /// [`GpuLlm::prefill`], adding the submission's device timestamps to
    /// `prof` when given.
    fn prefill_timed(
        &mut self,
        tokens: &[u32],
        all: bool,
        last: bool,
        prof: Option<&mut StepProfile>,
    ) -> Result<Vec<f32>> {
        let start = Instant::now();
        let n = tokens.len();
        self.ensure_capacity(self.pos + n)?;
        let rows = if all { n } else { 1 };
        let fits = |s: &PrefillScratch| s.tokens >= n && s.logit_rows >= rows;
        if !self.prefill_scratch.as_ref().is_some_and(fits) {
            // Room for a whole chunk, so one allocation serves every prompt;
            // the old buffers go first, so both are never held at once.
            let tokens = n.max(self.prefill_chunk_len());
            self.prefill_work = None;
            self.prefill_scratch = None;
            let split_ffn = self
                .layers
                .iter()
                .any(|l| matches!(l.ffn, GpuFfn::Split(..)));
            self.prefill_scratch = Some(PrefillScratch::new(
                &self.gpu, &self.cfg, tokens, rows, split_ffn,
            )?);
        }
        let shape = PrefillShape { n, all, last };
        if self.prefill_work.as_ref().is_none_or(|w| w.shape != shape) {
            self.prefill_work = None;
            self.prefill_work = Some(self.prefill_work(shape)?);
        }
        let sc = self.prefill_scratch.as_ref().expect("allocated above");
        let pw = self.prefill_work.as_ref().expect("built above");
        let g = &*self.gpu;
        g.queue
            .write_buffer(&sc.ids, 0, bytemuck::cast_slice(tokens));
        self.write_step(n, 1, &sc.cs);
        let (work, attention) = (&pw.work, &pw.attention);

        // Recording starts here (the profile counts the timer's own set-up
        // in it). Room for a timestamp before the first dispatch and after
        // each.
        let t0 = Instant::now();
        let timer = match prof {
            Some(_) => Some(PassTimer::new(
                g,
                (work.len() + 2 * attention.len() + 1) as u32,
            )?),
            None => None,
        };
        let mut names = Vec::new();
        let mut enc = g.device.create_command_encoder(&Default::default());
        {
            let mut pass = enc.begin_compute_pass(&Default::default());
            let mut after = |p: &mut wgpu::ComputePass<'_>, name: &'static str| {
                if let Some(t) = &timer {
                    names.push(name);
                    t.mark(p, names.len() as u32);
                }
            };
            if let Some(t) = &timer {
                t.mark(&mut pass, 0);
            }
            let mut pending = attention.iter().peekable();
            for (i, dsp) in work.iter().enumerate() {
                while let Some((_, a)) = pending.next_if(|(at, _)| *at == i) {
                    a.record_with(&mut pass, 1, &mut after);
                }
                dsp.record(&mut pass);
                after(&mut pass, dsp.bound.name);
            }
            for (_, a) in pending {
                a.record_with(&mut pass, 1, &mut after);
            }
        }
        self.pos += n;
        let marks = names.len() as u32 + 1;
        if let Some(t) = &timer {
            t.resolve(&mut enc, marks);
        }
        if let Some((staging, len)) = &pw.staging {
            enc.copy_buffer_to_buffer(&sc.logits, 0, staging, 0, *len);
        }
        let t1 = Instant::now();
        let done = g.queue.submit([enc.finish()]);
        let t2 = Instant::now();
        let out = match &pw.staging {
            Some((staging, len)) => {
                bytemuck::pod_collect_to_vec(&g.read_staging(staging, *len, done.clone())?)
            }
            None => Vec::new(),
        };
        if let (Some(t), Some(prof)) = (&timer, prof) {
            let ts = t.read(g, marks, done)?;
            let t3 = Instant::now();
            prof.add_step([start, t0, t1, t2, t3], &names, &ts);
        }
        Ok(out)
    }
}

/// KV positions one cache binding holds on this adapter.
fn max_positions(g: &Gpu, kvw: usize) -> usize {
    (g.caps.max_binding / (4 * kvw.max(1) as u64)) as usize
}

impl CausalLm for GpuLlm {
    fn config(&self) -> &LlmConfig {
        &self.cfg
    }

    fn position(&self) -> usize {
        self.pos
    }

    fn reset(&mut self) {
        self.pos = 0;
        for s in &self.state {
            if let GpuState::Conv(b) = s {
                let zeros = vec![0u8; b.size() as usize];
                self.gpu.queue.write_buffer(b, 0, &zeros);
            }
        }
    }

    fn forward(&mut self, tokens: &[u32], all_logits: bool) -> Result<Vec<f32>> {
        self.check_tokens(tokens)?;
        if tokens.len() == 1 {
            let bytes = self.decode(tokens[0], Readback::Logits)?;
            return Ok(bytemuck::pod_collect_to_vec(&bytes));
        }
        let chunk = self.prefill_chunk_len();
        let mut out = Vec::new();
        let count = tokens.len().div_ceil(chunk);
        for (i, part) in tokens.chunks(chunk).enumerate() {
            let last = i + 1 == count;
            out.extend(self.prefill(part, all_logits, last)?);
        }
        Ok(out)
    }

    fn profile_decode(&mut self, token: u32, steps: usize) -> Result<StepProfile> {
        GpuLlm::profile_decode(self, token, steps)
    }

    fn profile_prefill(&mut self, tokens: &[u32]) -> Result<StepProfile> {
        GpuLlm::profile_prefill(self, tokens)
    }

    fn greedy_run(
        &mut self,
        token: u32,
        max: usize,
        emit: &mut dyn FnMut(u32) -> bool,
    ) -> Result<usize> {
        self.greedy_pipelined(token, max, emit)
    }

    fn step_greedy(&mut self, token: u32) -> Result<u32> {
        let bytes = self.decode(token, Readback::Token)?;
        Ok(u32::from_le_bytes(bytes[..4].try_into().expect("4 bytes")))
    }

    fn step_sample(&mut self, token: u32, sampler: &mut Sampler, history: &[u32]) -> Result<u32> {
        match sampler.candidates_needed() {
            Some(k) if k <= self.top_k || self.top_k == self.cfg.vocab => {
                let raw = self.decode(token, Readback::Candidates)?;
                let cand = llm_ops::sort_candidates(&bytemuck::pod_collect_to_vec(&raw));
                Ok(sampler.sample_top(cand))
            }
            _ => {
                let logits = self.forward(&[token], false)?;
                Ok(sampler.sample(&logits, history))
            }
        }
    }
}
