//! The GPU forward of the decoder recipe ([`super::recipe`]), built from the
//! same [`LlmConfig`] and [`Weights`] as the CPU reference
//! ([`super::llm::CpuLlm`], its oracle in `tests/llm_gpu.rs`).
//!
//! Weights are uploaded in their stored format ([`GpuMatrix`], `upload.rs`);
//! the KV cache and the conv state stay on the GPU. Decode (`decode.rs`) is
//! prepared once (bind groups, dispatch list, scratch buffers: nothing is
//! allocated per token) and records a whole token, every layer, the head and
//! the argmax, into one submission; the per-token values (position, KV
//! length, attention splits, RoPE angles) go into small buffers written once
//! per token, and only the token id comes back (or, for sampling, the top
//! candidates; or the logits, when asked). The token a step consumes is read
//! on the GPU from where the previous step's argmax left it, so greedy
//! decoding runs a step ahead of the host ([`CausalLm::greedy_run`]); under
//! a grammar the host writes the allowed tokens' bitmap and a masked argmax
//! (or top-k, for sampling) applies it on the device, the next forward
//! queued behind it ([`CausalLm::greedy_run_guided`]). The
//! recipe's operations become fused dispatches: norm+QKV, biases+q/k
//! norm+RoPE+cache write, attention (+ merge on long contexts), output
//! projection+residual (or, with a post-norm, projection then norm+add),
//! norm+gate/up+activation, down+residual; an LFM2 conv block is
//! norm+in_proj+conv. Prefill (`prefill.rs`) runs the tiled GEMM over
//! chunks of up to [`PREFILL_CHUNK`] tokens, one submission per chunk, with
//! the prenorms (and the gated activation) fused into the GEMMs and, on
//! adapters with cooperative matrices, a tiled attention kernel; a chunk's
//! dispatches are kept while its shape repeats. Speculative decoding's
//! drafted tokens are checked in one submission as the rows of a batched
//! step (`verify.rs`), bit-equal to as many decode steps.

mod batch;
mod decode;
mod prefill;
mod upload;
mod verify;

pub use batch::{GpuBatch, MAX_SLOTS};
pub use verify::VERIFY_ROWS;

use super::llm::{
    check_truncate, conv_ring_rows, conv_rows_kept, CausalLm, GreedyGuide, LayerKind, LayerState,
    LlmConfig, SeqState, Weights, REWIND_DEPTH,
};
use super::recipe::Residual;
use crate::cpu;
use crate::error::{Error, Result};
use crate::gpu::llm_ops::{self, GemmKernel, GpuMatrix, HeadConsts};
use crate::gpu::ops::Dispatch;
use crate::gpu::profile::StepProfile;
use crate::gpu::Gpu;
use crate::sampling::{Draw, Sampler};
use prefill::{PrefillScratch, PrefillWork};
use std::sync::Arc;
use upload::Uploader;

/// Most tokens one prefill submission processes.
pub const PREFILL_CHUNK: usize = 512;
/// Most rows of one batched prefill pass (a [`GpuBatch`]'s prompts, as
/// `serve` runs them): more than a single prompt's chunk, as a pass keeps
/// no logits but each sequence's last row's, and its GEMMs then have tiles
/// for every multiprocessor (BENCHMARKS.md, thirty-fifth session).
pub const BATCH_PREFILL_CHUNK: usize = 2048;
/// KV positions allocated at first; the cache doubles when it fills.
const INITIAL_KV: usize = 256;

/// What a greedy step reads back: the token id and argmax's non-finite flag.
const TOKEN_BYTES: u64 = 8;

/// The `k` best of one row's candidates as `top_k` leaves them ((id, value
/// bits) pairs), or the damaged-logits error where any value is a NaN or an
/// infinity (top_k ranks by bits: a positive NaN or +inf comes first).
fn best_finite_candidates(raw: &[u32], k: usize) -> Result<Vec<(u32, f32)>> {
    let values: Vec<f32> = raw
        .iter()
        .skip(1)
        .step_by(2)
        .map(|&b| f32::from_bits(b))
        .collect();
    super::llm::check_logits(&values)?;
    Ok(llm_ops::best_candidates(raw, k))
}

/// The token of a greedy step's readback, or the error for logits that held
/// a NaN or an infinity (which argmax would pass over).
fn greedy_token(bytes: &[u8]) -> Result<u32> {
    let word = |i: usize| u32::from_le_bytes(bytes[4 * i..4 * i + 4].try_into().expect("4 bytes"));
    if word(1) != 0 {
        return Err(Error::invalid(super::llm::NONFINITE_LOGITS));
    }
    Ok(word(0))
}

/// Sizes that default to what the adapter allows; tests lower them to
/// exercise split matrices, chunked prefill and KV-cache growth on tiny
/// models.
#[derive(Clone, Debug, Default)]
pub struct GpuLlmOptions {
    /// Largest weight buffer (at most the adapter's storage binding limit).
    pub max_chunk_bytes: Option<u64>,
    /// Most tokens per prefill submission (at most [`PREFILL_CHUNK`]), and
    /// rows per batched prefill pass (at most [`BATCH_PREFILL_CHUNK`]).
    pub prefill_chunk: Option<usize>,
    /// KV positions allocated at load (the cache grows as needed).
    pub kv_positions: Option<usize>,
    /// How a [`GpuBatch`]'s decode steps compute their products.
    pub batch_products: BatchProducts,
}

/// How a [`GpuBatch`]'s decode steps compute their products.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum BatchProducts {
    /// The batched GEMVs in the one order of summation
    /// (gemv_common.wgsl): every sequence's tokens are those it gets alone.
    #[default]
    Invariant,
    /// The prefill's GEMM over the step's rows (cooperative matrices where
    /// the adapter has them) and the batched prefill's conv kernel: faster
    /// from a few dozen sequences, but a row's sums (f16 factors, another
    /// order) are not those of its decode alone, so its tokens may part from
    /// them where two logits nearly tie.
    Gemm,
}

enum GpuMixer {
    Attention {
        /// q, k, v projections and where each writes in the qkv row: one
        /// matrix when they share a format, else three.
        qkv: Vec<(GpuMatrix, usize)>,
        o: GpuMatrix,
        /// Per-head q and k RMSNorm weights and the q, k and v biases.
        consts: Option<HeadConsts>,
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
    post_mixer_norm: Option<wgpu::Buffer>,
    post_ffn_norm: Option<wgpu::Buffer>,
}

impl GpuLayer {
    /// The projection whose output joins the residual stream at `which`,
    /// and its post-norm where the layer has one.
    fn residual(&self, which: Residual) -> (&GpuMatrix, Option<&wgpu::Buffer>) {
        match (which, &self.mixer) {
            (Residual::Mixer, GpuMixer::Attention { o, .. }) => (o, self.post_mixer_norm.as_ref()),
            (Residual::Mixer, GpuMixer::Conv { out, .. }) => (out, self.post_mixer_norm.as_ref()),
            (Residual::Ffn, _) => (&self.down, self.post_ffn_norm.as_ref()),
        }
    }
}

/// Per-layer sequence state on the GPU.
enum GpuState {
    /// [cap, kv_heads * head_dim] each.
    Kv { k: wgpu::Buffer, v: wgpu::Buffer },
    /// [ring, hidden]: a ring of the gated inputs, position q in row
    /// q % ring ([`conv_ring_rows`], gemv.wgsl), so steps can be undone by
    /// moving the position back.
    Conv(wgpu::Buffer),
}

/// Buffers of one decode step, allocated once.
struct DecodeIo {
    /// [token, pos, kv_len, attention splits] as u32.
    step: wgpu::Buffer,
    /// RoPE cos/sin of this position: [rope_dim / 2, 2].
    cs: wgpu::Buffer,
    /// The same for the local RoPE (Gemma-3's sliding layers).
    cs_local: wgpu::Buffer,
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
    /// [hidden]: an output projection awaiting its post-norm.
    mix: wgpu::Buffer,
    /// [ffn]
    g: wgpu::Buffer,
    /// [2 ffn], only for split gate/up.
    gu: wgpu::Buffer,
    /// [vocab]
    logits: wgpu::Buffer,
    /// [2] u32: the token a decode step consumes; its argmax writes the
    /// next one here, so greedy steps can follow each other on the GPU, and
    /// in [1] whether the logits it chose from held a NaN or an infinity.
    token: wgpu::Buffer,
    /// [top_k, 2] u32: (id, logit bits) of the most likely tokens.
    cand: wgpu::Buffer,
    /// [4] f32: the draw of a sampled step ([`crate::sampling::Draw::to_gpu`]).
    draw: wgpu::Buffer,
    /// [ceil(vocab / 32)] u32: the tokens a grammar allows, bit id % 32 of
    /// word id / 32, for the masked argmax and top-k.
    mask: wgpu::Buffer,
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
    /// The token `sample_rows` drew (the draw in io.draw).
    Drawn,
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
    embed: GpuMatrix,
    /// None when tied to the embedding.
    head: Option<GpuMatrix>,
    final_norm: wgpu::Buffer,
    layers: Vec<GpuLayer>,
    state: Vec<GpuState>,
    /// KV positions allocated.
    cap: usize,
    pos: usize,
    /// The furthest position reached since the last reset, where the
    /// position went back since (see [`CausalLm::min_truncate_pos`]).
    high: usize,
    io: DecodeIo,
    plan: Vec<Op>,
    argmax: Vec<Dispatch>,
    /// The argmax over the tokens io.mask allows.
    masked_argmax: Vec<Dispatch>,
    /// Selects the candidates sampling needs (`top_k` of them).
    select: Vec<Dispatch>,
    /// The same among the tokens io.mask allows.
    masked_select: Vec<Dispatch>,
    /// Draws a sampled step's token (io.draw) into io.token.
    drawn: Dispatch,
    top_k: usize,
    prefill_chunk: usize,
    batch_prefill_chunk: usize,
    /// The last prefill's work buffers, reused while they are large enough
    /// (allocating ~40 MB of them per 512-token prefill cost the host
    /// milliseconds).
    prefill_scratch: Option<PrefillScratch>,
    /// The last prefill's dispatches, reused while the next has its shape.
    prefill_work: Option<PrefillWork>,
    /// RoPE cos/sin of every position reached so far
    /// ([`cpu::rope_table_freqs`]' layout), computed once: a 512-token
    /// table took the host ~0.7 ms. `rope_local` for the local RoPE.
    rope: Vec<f32>,
    rope_local: Vec<f32>,
    /// Speculative decoding's checks (`verify.rs`), made on first use.
    verify: Option<verify::Verify>,
}

impl GpuLlm {
    /// The GEMM the prompt's products (and the batch's, with
    /// [`BatchProducts::Gemm`]) run on: on cooperative matrices where the
    /// adapter has them and the activations fit f16.
    pub(super) fn gemm_kernel(&self) -> GemmKernel {
        GemmKernel::for_adapter(self.gpu.caps.coop_matrix && self.cfg.activations_fit_f16())
    }

    /// The model's GEMM plan for `w` at `n` rows: a decode step's, or with
    /// `prefill` the prefill's (the same for every chunk).
    pub(super) fn gemm_plan(&self, w: &GpuMatrix, n: usize, prefill: bool) -> llm_ops::GemmPlan {
        let (rule, plan_n) = match prefill {
            true => (llm_ops::PREFILL_SPLIT, llm_ops::PREFILL_PLAN_TOKENS),
            false => (llm_ops::DECODE_SPLIT, n),
        };
        llm_ops::gemm_plan(
            &self.gpu,
            self.gemm_kernel(),
            rule,
            w.rows * w.parts,
            w.k,
            plan_n,
        )
    }

    /// Whether the projection `w` into the residual stream ([n, hidden])
    /// keeps the stream's f16 copy at `n` rows (`prefill`: the prefill's
    /// plan): its GEMM is split, whose sum pass writes the copy, on
    /// cooperative matrices, over rows of whole vec4s.
    pub(super) fn keeps_residual_f16(&self, w: &GpuMatrix, n: usize, prefill: bool) -> bool {
        let d = self.cfg.hidden;
        self.gemm_kernel() != GemmKernel::Portable
            && self.gemm_plan(w, n, prefill).ways >= 2
            && llm_ops::gemm_reads_x4(d, d)
    }

    /// Whether the gated GEMM `w` ([gate; up] into [n, ffn]) writes its
    /// output as f16 pairs for the down projection at `n` rows: unsplit, on
    /// cooperative matrices, rows in pairs that the down projection reads
    /// a vec4 at a time.
    pub(super) fn gated_f16_out(&self, w: &GpuMatrix, n: usize, prefill: bool) -> bool {
        let f = self.cfg.ffn;
        self.gemm_kernel() != GemmKernel::Portable
            && self.gemm_plan(w, n, prefill).ways == 1
            && llm_ops::gemm_writes_f16(w, 0, f)
            && llm_ops::gemm_reads_x4(f, f)
    }

    /// The f32s the GEMMs of up to `rows` rows split over k need
    /// ([`GpuLlm::gemm_plan`]), for the largest of the model's products.
    pub(super) fn split_part_len(&self, rows: usize, prefill: bool) -> usize {
        let mut mats = vec![self.head()];
        for layer in &self.layers {
            match &layer.mixer {
                GpuMixer::Attention { qkv, o, .. } => {
                    mats.extend(qkv.iter().map(|q| &q.0));
                    mats.push(o);
                }
                GpuMixer::Conv { in_proj, out, .. } => mats.extend([in_proj, out]),
            }
            match &layer.ffn {
                GpuFfn::Fused(w) => mats.push(w),
                GpuFfn::Split(gate, up) => mats.extend([gate, up]),
            }
            mats.push(&layer.down);
        }
        let kernel = self.gemm_kernel();
        let len = |w: &GpuMatrix, n: usize| {
            let plan = self.gemm_plan(w, n, prefill);
            llm_ops::gemm_split_len(kernel, plan, w.rows * w.parts, w.k, n)
        };
        mats.iter()
            .map(|w| match prefill {
                true => len(w, rows),
                false => (1..=rows).map(|n| len(w, n)).max().unwrap_or(0),
            })
            .max()
            .unwrap_or(0)
    }

    /// One decode step consuming `token` whose next token is drawn where
    /// the logits are (`sample_rows`, [`crate::sampling::draw_unsorted`]'s
    /// draw; the argmax for [`Draw::GREEDY`]): only the token leaves the
    /// device.
    pub(crate) fn step_drawn(&mut self, token: u32, draw: Draw) -> Result<u32> {
        self.gpu
            .queue
            .write_buffer(&self.io.draw, 0, bytemuck::cast_slice(&draw.to_gpu()));
        greedy_token(&self.decode(token, Readback::Drawn)?)
    }

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
        if cfg.head_dim > llm_ops::MAX_HEAD_DIM {
            return Err(Error::gpu(format!(
                "attention heads of {} dimensions (the GPU kernels hold at most {})",
                cfg.head_dim,
                llm_ops::MAX_HEAD_DIM
            )));
        }
        if cfg.post_norms && !cfg.hidden.is_multiple_of(4) {
            return Err(Error::gpu(format!(
                "post-norms over a hidden size of {} (the GPU path needs a multiple of 4)",
                cfg.hidden
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
            cs_local: f32s("rope local", cfg.rope_dim)?,
            x: f32s("x", d)?,
            qkv: f32s("qkv", qw + 2 * kvw)?,
            q: f32s("q", qw)?,
            att: f32s("att", qw)?,
            part: f32s("part", llm_ops::attention_part_len(cfg.heads, hd, 1))?,
            conv_out: f32s("conv_out", d)?,
            mix: f32s("mix", d)?,
            g: f32s("g", f)?,
            gu: f32s("gu", 2 * f)?,
            logits: f32s("logits", cfg.vocab)?,
            token: f32s("token", 2)?,
            cand: f32s("candidates", 2 * llm_ops::MAX_TOP_K)?,
            draw: f32s("draw", 4)?,
            mask: f32s("token mask", cfg.vocab.div_ceil(32))?,
            token_staging: g.staging("token", TOKEN_BYTES),
            token_staging2: g.staging("token", TOKEN_BYTES),
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
                        GpuState::Conv(f32s("conv state", conv_ring_rows(cfg.conv_kernel) * d)?)
                    }
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let (v, mask) = (cfg.vocab, Some(&io.mask));
        let argmax = llm_ops::argmax(g, &io.logits, None, &io.token, v)?;
        let masked_argmax = llm_ops::argmax(g, &io.logits, mask, &io.token, v)?;
        let top_k = llm_ops::MAX_TOP_K.min(v);
        let select = llm_ops::top_k(g, &io.logits, None, &io.cand, v, top_k)?;
        let masked_select = llm_ops::top_k(g, &io.logits, mask, &io.cand, v, top_k)?;
        let drawn = llm_ops::sample_rows(g, &io.logits, &io.draw, &io.token, v, 1)?;
        let mut m = GpuLlm {
            subgroups: gpu.caps.subgroups,
            gpu,
            cfg: cfg.clone(),
            embed,
            head,
            final_norm: g.upload_f32("final_norm", &w.final_norm)?,
            layers,
            state,
            cap,
            pos: 0,
            high: 0,
            io,
            plan: Vec::new(),
            argmax,
            masked_argmax,
            select,
            masked_select,
            drawn,
            top_k,
            prefill_chunk: opts
                .prefill_chunk
                .unwrap_or(PREFILL_CHUNK)
                .clamp(1, PREFILL_CHUNK),
            batch_prefill_chunk: opts
                .prefill_chunk
                .unwrap_or(BATCH_PREFILL_CHUNK)
                .clamp(1, BATCH_PREFILL_CHUNK),
            prefill_scratch: None,
            prefill_work: None,
            rope: Vec::new(),
            rope_local: Vec::new(),
            verify: None,
        };
        m.plan = m.build_plan()?;
        m.warm_prefill()?;
        m.reset();
        Ok(m)
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
                llm_ops::warm_gemm(
                    g,
                    m.dtype,
                    self.cfg.ffn_act,
                    g.caps.coop_matrix && self.cfg.activations_fit_f16(),
                )?;
            }
        }
        llm_ops::warm_prefill_kernels(g, self.cfg.ffn_act)?;
        Ok(())
    }

    /// Makes room for `needed` positions: their RoPE angles, and KV cache
    /// room, growing the caches (and rebuilding the decode plan over the new
    /// buffers).
    fn ensure_capacity(&mut self, needed: usize) -> Result<()> {
        let rd = self.cfg.rope_dim;
        let have = self.rope.len() / rd.max(1);
        if rd > 0 && have < needed {
            let table =
                |local| cpu::rope_table_freqs(have, needed - have, &self.cfg.rope_freqs(local));
            let (global, local) = (table(false), self.cfg.rope_local_theta.map(|_| table(true)));
            self.rope.extend(global);
            self.rope_local.extend(local.unwrap_or_default());
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
        if let Some(v) = self.verify.as_mut() {
            v.invalidate();
        }
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
    /// RoPE angles of positions pos..pos + n (`cs`, and `cs_local` for the
    /// local RoPE). Queue writes land between submissions in order, so this
    /// may run while earlier steps are in flight.
    fn write_step(&self, n: usize, splits: usize, cs: &wgpu::Buffer, cs_local: &wgpu::Buffer) {
        let q = &self.gpu.queue;
        // step[0] is unused: decode reads its token from io.token.
        let step = [0, self.pos as u32, (self.pos + n) as u32, splits as u32];
        q.write_buffer(&self.io.step, 0, bytemuck::cast_slice(&step));
        let rd = self.cfg.rope_dim;
        if rd > 0 {
            let angles = &self.rope[self.pos * rd..(self.pos + n) * rd];
            q.write_buffer(cs, 0, bytemuck::cast_slice(angles));
            if !self.rope_local.is_empty() {
                let angles = &self.rope_local[self.pos * rd..(self.pos + n) * rd];
                q.write_buffer(cs_local, 0, bytemuck::cast_slice(angles));
            }
        }
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
        self.high = 0;
        for s in &self.state {
            if let GpuState::Conv(b) = s {
                let zeros = vec![0u8; b.size() as usize];
                self.gpu.queue.write_buffer(b, 0, &zeros);
            }
        }
    }

    fn truncate(&mut self, pos: usize) -> Result<()> {
        if pos == 0 {
            self.reset();
            return Ok(());
        }
        check_truncate(pos, self.pos, self.min_truncate_pos())?;
        self.high = self.high.max(self.pos);
        // The KV rows past pos are rewritten before they are read; the conv
        // rows of positions before 0 must read zeros again.
        let (d, hist) = (self.cfg.hidden, self.cfg.conv_kernel.saturating_sub(1));
        let rows = conv_ring_rows(self.cfg.conv_kernel);
        let zeros = vec![0u8; d * 4];
        for s in &self.state {
            if let GpuState::Conv(b) = s {
                for back in pos + 1..=hist {
                    let r = (pos + rows - back) % rows;
                    self.gpu.queue.write_buffer(b, (r * d * 4) as u64, &zeros);
                }
            }
        }
        self.pos = pos;
        Ok(())
    }

    fn min_truncate_pos(&self) -> usize {
        if self.cfg.layers.contains(&LayerKind::Conv) {
            self.high.max(self.pos).saturating_sub(REWIND_DEPTH)
        } else {
            0
        }
    }

    fn export_state(&mut self) -> Result<SeqState> {
        let g = &*self.gpu;
        let kvw = self.cfg.kv_heads * self.cfg.head_dim;
        let d = self.cfg.hidden;
        let rows = conv_ring_rows(self.cfg.conv_kernel);
        let keep = conv_rows_kept(rows, self.high.max(self.pos), self.pos);
        let kv_bytes = (self.pos * kvw * 4) as u64;
        let read = |b: &wgpu::Buffer, len: u64| -> Result<Vec<f32>> {
            if len == 0 {
                return Ok(Vec::new());
            }
            let staging = g.staging("state", len);
            let mut enc = g.device.create_command_encoder(&Default::default());
            enc.copy_buffer_to_buffer(b, 0, &staging, 0, len);
            Ok(bytemuck::pod_collect_to_vec(
                &g.submit_and_read(enc, &staging, len)?,
            ))
        };
        let mut layers = Vec::with_capacity(self.state.len());
        for s in &self.state {
            layers.push(match s {
                GpuState::Kv { k, v } => LayerState::Kv {
                    k: read(k, kv_bytes)?,
                    v: read(v, kv_bytes)?,
                },
                GpuState::Conv(b) => {
                    let ring = read(b, (rows * d * 4) as u64)?;
                    LayerState::Conv(
                        (1..=keep)
                            .rev()
                            .flat_map(|back| {
                                let r = (self.pos + rows - back) % rows;
                                ring[r * d..(r + 1) * d].iter().copied()
                            })
                            .collect(),
                    )
                }
            });
        }
        Ok(SeqState {
            pos: self.pos,
            layers,
        })
    }

    fn import_state(&mut self, st: &SeqState) -> Result<()> {
        self.reset();
        st.check(&self.cfg, "import_state")?;
        self.ensure_capacity(st.pos.max(1))?;
        let d = self.cfg.hidden;
        let rows = conv_ring_rows(self.cfg.conv_kernel);
        let mut kept = rows;
        let q = &self.gpu.queue;
        for (s, l) in self.state.iter().zip(&st.layers) {
            match (s, l) {
                (GpuState::Kv { k, v }, LayerState::Kv { k: sk, v: sv }) if !sk.is_empty() => {
                    q.write_buffer(k, 0, bytemuck::cast_slice(sk));
                    q.write_buffer(v, 0, bytemuck::cast_slice(sv));
                }
                (GpuState::Kv { .. }, LayerState::Kv { .. }) => {}
                (GpuState::Conv(b), LayerState::Conv(src)) => {
                    let have = (src.len() / d).min(rows);
                    kept = kept.min(have);
                    let mut ring = vec![0.0f32; rows * d];
                    let src = &src[src.len() - have * d..];
                    for (i, back) in (1..=have).rev().enumerate() {
                        let r = (st.pos + rows - back) % rows;
                        ring[r * d..(r + 1) * d].copy_from_slice(&src[i * d..(i + 1) * d]);
                    }
                    q.write_buffer(b, 0, bytemuck::cast_slice(&ring));
                }
                _ => unreachable!("checked against the config"),
            }
        }
        self.pos = st.pos;
        self.high = st.pos + rows - kept;
        Ok(())
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

    /// One batched submission per [`VERIFY_ROWS`] tokens (`verify.rs`).
    fn forward_verify(&mut self, tokens: &[u32]) -> Result<Vec<f32>> {
        self.check_tokens(tokens)?;
        let mut out = Vec::with_capacity(tokens.len() * self.cfg.vocab);
        for part in tokens.chunks(VERIFY_ROWS) {
            let bytes = self.verify_rows(part, batch::Want::Logits)?;
            out.extend_from_slice(bytemuck::cast_slice::<u8, f32>(&bytes));
        }
        Ok(out)
    }

    /// As [`CausalLm::forward_verify`], reading back each row's argmax only.
    fn verify_greedy(&mut self, tokens: &[u32]) -> Result<Vec<u32>> {
        self.check_tokens(tokens)?;
        let mut out = Vec::with_capacity(tokens.len());
        for part in tokens.chunks(VERIFY_ROWS) {
            out.extend(batch::row_tokens(
                &self.verify_rows(part, batch::Want::Tokens)?,
            )?);
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

    fn greedy_run_guided(
        &mut self,
        token: u32,
        max: usize,
        guide: &mut dyn GreedyGuide,
    ) -> Result<usize> {
        self.greedy_masked(token, max, guide)
    }

    fn step_greedy(&mut self, token: u32) -> Result<u32> {
        greedy_token(&self.decode(token, Readback::Token)?)
    }

    fn step_sample(&mut self, token: u32, sampler: &mut Sampler, history: &[u32]) -> Result<u32> {
        if let Some(k) = sampler.masked_candidates_needed() {
            if k <= self.top_k || self.top_k == self.cfg.vocab {
                let (mask, raw) = self.decode_masked_candidates(token, &mut || {
                    Ok(sampler.token_mask()?.expect("a grammar masks"))
                })?;
                let cand = llm_ops::sort_candidates(&bytemuck::pod_collect_to_vec(&raw));
                // Masked-out NaNs and infinities stay candidates, for this
                // check; a masked-out -inf may be the mask's own.
                let (allowed, refused): (Vec<_>, Vec<_>) = cand
                    .into_iter()
                    .partition(|&(id, _)| cpu::mask_allows(&mask, id as usize));
                if allowed.iter().any(|c| !c.1.is_finite())
                    || refused.iter().any(|c| c.1.is_nan() || c.1 == f32::INFINITY)
                {
                    return Err(Error::invalid(super::llm::NONFINITE_LOGITS));
                }
                return sampler.sample_top_masked(allowed);
            }
        }
        if let Some(draw) = sampler.device_draw() {
            let token = self.step_drawn(token, draw)?;
            sampler.accept(token);
            return Ok(token);
        }
        match sampler.candidates_needed() {
            Some(k) if k <= self.top_k || self.top_k == self.cfg.vocab => {
                let raw: Vec<u32> =
                    bytemuck::pod_collect_to_vec(&self.decode(token, Readback::Candidates)?);
                Ok(sampler.sample_top(best_finite_candidates(&raw, k)?))
            }
            _ => {
                let logits = self.forward(&[token], false)?;
                super::llm::check_logits(&logits)?;
                Ok(sampler.sample(&logits, history))
            }
        }
    }
}
