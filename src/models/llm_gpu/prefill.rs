//! Prefill: the recipe recorded as GEMMs over a chunk of tokens, one
//! submission per chunk; the dispatches are kept while the chunk's shape
//! repeats.

use super::batch::LayerBufs;
use super::decode::norm_add_variant;
use super::{GpuFfn, GpuLlm, GpuMixer, GpuState};
use crate::error::Result;
use crate::gpu::llm_ops::{self, AttnBuffers, Cols, GemmInput, GemmKernel, GemmMode, GemvEpilogue};
use crate::gpu::ops::{self, Dispatch};
use crate::gpu::profile::{PassMarks, PassTimer, StepProfile};
use crate::models::llm::{attn_shape, conv_ring_rows};
use crate::models::recipe::{self, DecoderOps, Residual};
use web_time::Instant;

/// What a prefill submission computes: `n` tokens, returning the logits of
/// every one (`all`), of the last (`last`), or none.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) struct PrefillShape {
    n: usize,
    all: bool,
    last: bool,
}

/// A prefill's dispatches, kept while its shape repeats (every full chunk
/// has the same one): building its uniforms and ~140 bind groups cost the
/// host 2-3 ms per 512-token chunk. Built over the current work buffers and
/// KV caches, so it is dropped whenever either is replaced.
pub(super) struct PrefillWork {
    shape: PrefillShape,
    work: Vec<Dispatch>,
    /// Attention dispatches, with the index in `work` they go before.
    attention: Vec<(usize, llm_ops::Attention)>,
    /// A batched prefill's head, recorded after each sequence's last row is
    /// gathered ([`PrefillRowsTarget::last`]); empty otherwise.
    pub head: Vec<Dispatch>,
    /// Where the logits are read back, and how many bytes.
    staging: Option<(wgpu::Buffer, u64)>,
}

impl PrefillWork {
    /// Records the chunk's dispatches (attention with one split), calling
    /// `after` after each with its kernel name.
    pub(super) fn record(
        &self,
        pass: &mut wgpu::ComputePass<'_>,
        after: &mut dyn FnMut(&mut wgpu::ComputePass<'_>, &'static str),
    ) {
        let mut pending = self.attention.iter().peekable();
        for (i, dsp) in self.work.iter().enumerate() {
            while let Some((_, a)) = pending.next_if(|(at, _)| *at == i) {
                a.record_with(pass, 1, after);
            }
            dsp.record(pass);
            after(pass, dsp.bound.name);
        }
        for (_, a) in pending {
            a.record_with(pass, 1, after);
        }
    }
}

/// Work buffers of one prefill submission, sized for `tokens` tokens and
/// `logit_rows` rows of logits.
pub(super) struct PrefillScratch {
    tokens: usize,
    logit_rows: usize,
    pub ids: wgpu::Buffer,
    pub cs: wgpu::Buffer,
    pub cs_local: wgpu::Buffer,
    /// [n, hidden]: the residual stream.
    pub x: wgpu::Buffer,
    /// [n, hidden / 2] f16 pairs: its copy for the GEMMs that read it
    /// ([`GemmInput::F16`]), where a split GEMM's sum wrote it.
    xh: wgpu::Buffer,
    qkv: wgpu::Buffer,
    q: wgpu::Buffer,
    att: wgpu::Buffer,
    bcx: wgpu::Buffer,
    conv_out: wgpu::Buffer,
    /// [n, hidden]: output projections awaiting their post-norm, and zeros
    /// to clear it with.
    mix: wgpu::Buffer,
    zeros: wgpu::Buffer,
    gu: wgpu::Buffer,
    /// [n, ffn]: the gated MLP's output in f32, where some layer writes it
    /// so (one word where none does).
    gg: wgpu::Buffer,
    /// [n, ffn / 2] f16 pairs: the gated MLP's output where its GEMM writes
    /// it so ([`llm_ops::gemm_writes_f16`]), for the down projection (one
    /// word where no layer does).
    ggh: wgpu::Buffer,
    logits: wgpu::Buffer,
    /// The sums of the GEMMs split over k ([`llm_ops::gemm_planned`]).
    split_part: wgpu::Buffer,
}

impl PrefillScratch {
    /// `split_ffn`: some layer's gate and up are separate matrices, whose
    /// products meet in `gu` before the SwiGLU (fused ones never leave the
    /// GEMM).
    pub(super) fn new(m: &GpuLlm, tokens: usize, logit_rows: usize) -> Result<PrefillScratch> {
        let (g, c, split_ffn) = (&*m.gpu, &m.cfg, m.split_ffn());
        let n = tokens;
        let (d, f, hd) = (c.hidden, c.ffn, c.head_dim);
        let (qw, kvw) = (c.heads * hd, c.kv_heads * hd);
        let f32s = |label: &str, len: usize| g.scratch(label, (len.max(1) * 4) as u64);
        // Which of the gated MLP's two outputs some layer writes (the f16
        // one's choice is the prefill plan's, the same for every chunk).
        let gated_f16: Vec<bool> = m
            .layers
            .iter()
            .map(|l| match &l.ffn {
                GpuFfn::Fused(w) => m.gated_f16_out(w, n, true),
                GpuFfn::Split(..) => false,
            })
            .collect();
        let (any_f16, any_f32) = (gated_f16.contains(&true), gated_f16.contains(&false));
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
            cs_local: f32s(
                "rope local",
                if c.rope_local_theta.is_some() {
                    n * c.rope_dim
                } else {
                    0
                },
            )?,
            x: f32s("x", n * d)?,
            xh: f32s("x f16", (n * d).div_ceil(2))?,
            qkv: f32s("qkv", n * (qw + 2 * kvw))?,
            q: f32s("q", n * qw)?,
            att: f32s("att", n * qw)?,
            bcx: f32s("bcx", n * 3 * d)?,
            conv_out: f32s("conv_out", n * d)?,
            mix: f32s("mix", if c.post_norms { n * d } else { 0 })?,
            zeros: f32s("zeros", if c.post_norms { n * d } else { 0 })?,
            gu: f32s("gu", if split_ffn { n * 2 * f } else { 0 })?,
            gg: f32s("g", if any_f32 { n * f } else { 0 })?,
            ggh: f32s("g f16", if any_f16 { (n * f).div_ceil(2) } else { 0 })?,
            logits: f32s("logits", logit_rows * c.vocab)?,
            split_part: f32s("split sums", m.split_part_len(n, true))?,
        })
    }
}

/// What a batched prefill runs over: the prompt chunks of several sequences
/// one after another as the rows of one chunk, each over its own slot of a
/// [`super::GpuBatch`]'s caches and rings. The products are the prefill's
/// GEMMs over all the rows, whose every row is summed as it is alone
/// (gemm.wgsl: a row's sums never meet another row's), so each sequence's
/// rows come out as its chunk's alone.
pub(super) struct PrefillRowsTarget<'a> {
    /// One per layer: the paged caches or the slots' rings.
    pub state: Vec<LayerBufs<'a>>,
    /// One per layer: a conv layer's gated inputs at the end of each KV
    /// cache block ([blocks, taps - 1, hidden]; see
    /// [`llm_ops::short_conv_rows`]).
    pub block_ends: Vec<Option<&'a wgpu::Buffer>>,
    /// The row table ([`llm_ops::PrefillRows`]).
    pub table: &'a wgpu::Buffer,
    /// Rows of one sequence's conv ring.
    pub ring: usize,
    /// Partial results of the portable attention (one split a row).
    pub part: &'a wgpu::Buffer,
    /// Sequences in the chunk.
    pub seqs: usize,
    /// [seqs, hidden]: each sequence's last row, gathered before the head.
    pub last: &'a wgpu::Buffer,
    /// [seqs, vocab]: each sequence's next-token logits.
    pub logits: &'a wgpu::Buffer,
}

/// Records the recipe's operations for one prefill chunk.
struct PrefillRecorder<'a> {
    m: &'a GpuLlm,
    sc: &'a PrefillScratch,
    shape: PrefillShape,
    kernel: GemmKernel,
    /// Set for a batched prefill.
    rows: Option<&'a PrefillRowsTarget<'a>>,
    work: Vec<Dispatch>,
    /// Attention dispatches, with the index in `work` they go before.
    attention: Vec<(usize, llm_ops::Attention)>,
    head: Vec<Dispatch>,
    /// The last block's output ([n, width]), the input of its projection.
    y: Option<(GemmInput<'a>, usize)>,
    /// Whether `xh` holds the residual stream's current values.
    xh_current: bool,
}

impl<'a> PrefillRecorder<'a> {
    /// The residual stream as its GEMMs read it: the f16 copy where it is
    /// current.
    fn residual_input(&self) -> GemmInput<'a> {
        if self.xh_current {
            GemmInput::F16(&self.sc.xh)
        } else {
            GemmInput::F32(&self.sc.x)
        }
    }

    /// y (+)= W x over the chunk's tokens.
    #[allow(clippy::too_many_arguments)]
    fn gemm(
        &mut self,
        w: &llm_ops::GpuMatrix,
        mode: GemmMode,
        x: GemmInput<'a>,
        x_stride: usize,
        y: &wgpu::Buffer,
        y_stride: usize,
        out_off: usize,
    ) -> Result<()> {
        let ds = llm_ops::gemm_planned(
            &self.m.gpu,
            self.kernel,
            w,
            mode,
            x,
            x_stride,
            y,
            y_stride,
            out_off,
            self.shape.n,
            &self.sc.split_part,
            self.m.gemm_plan(w, self.shape.n, true),
        )?;
        self.work.extend(ds);
        Ok(())
    }
}

impl<'a> DecoderOps for PrefillRecorder<'a> {
    fn embed(&mut self) -> Result<()> {
        let (m, sc) = (self.m, self.sc);
        let scale = m.cfg.embed_scale;
        let n = self.shape.n;
        self.work.extend(llm_ops::embedding(
            &m.gpu, &m.embed, &sc.ids, 0, 1, scale, &sc.x, n,
        )?);
        self.xh_current = false;
        Ok(())
    }

    fn attention(&mut self, li: usize) -> Result<()> {
        let (m, sc): (&'a GpuLlm, &'a PrefillScratch) = (self.m, self.sc);
        let (g, c, n) = (&*m.gpu, &m.cfg, self.shape.n);
        let layer = &m.layers[li];
        let GpuMixer::Attention {
            qkv: mats, consts, ..
        } = &layer.mixer
        else {
            unreachable!("the recipe runs attention on attention layers")
        };
        let kv = match (self.rows, &m.state[li]) {
            (Some(r), _) => match r.state[li] {
                LayerBufs::Kv(k, v) => AttnBuffers {
                    step: r.table,
                    k_cache: k,
                    v_cache: v,
                },
                LayerBufs::Conv(_) => unreachable!("both follow the config's layers"),
            },
            (None, GpuState::Kv { k, v }) => AttnBuffers {
                step: &m.io.step,
                k_cache: k,
                v_cache: v,
            },
            (None, GpuState::Conv(_)) => unreachable!("both follow the config's layers"),
        };
        let qw = c.heads * c.head_dim;
        let qkvw = qw + 2 * c.kv_heads * c.head_dim;
        // The prenorm is fused into the GEMMs that read it.
        let norm1 = GemmMode::Norm {
            nw: &layer.norm1,
            eps: c.norm_eps,
        };
        for (mat, off) in mats {
            self.gemm(
                mat,
                norm1,
                self.residual_input(),
                c.hidden,
                &sc.qkv,
                qkvw,
                *off,
            )?;
        }
        let shape = attn_shape(c, li);
        let cs = if c.uses_local_rope(li) {
            &sc.cs_local
        } else {
            &sc.cs
        };
        let (qkv, q, att) = (&sc.qkv, &sc.q, &sc.att);
        let (consts, sub) = (consts.as_ref(), m.subgroups);
        let Some(r) = self.rows else {
            let rope = llm_ops::qk_rope(g, &shape, qkv, consts, cs, &kv, q, n)?;
            self.work.push(rope);
            match llm_ops::prefill_attention(g, &shape, q, &kv, att, n)? {
                Some(a) => self.work.push(a),
                None => {
                    let a = llm_ops::flash_attention(g, sub, &shape, q, &kv, att, &m.io.part, n)?;
                    self.attention.push((self.work.len(), a));
                }
            }
            self.y = Some((att.into(), qw));
            return Ok(());
        };
        let rope = llm_ops::qk_rope_rows(g, &shape, qkv, consts, cs, &kv, q, n)?;
        self.work.push(rope);
        let (tiles, _) = llm_ops::PrefillRows::most_blocks(n, r.seqs);
        match llm_ops::prefill_attention_rows(g, &shape, q, &kv, att, n, tiles)? {
            Some(a) => self.work.push(a),
            None => {
                // One split a row: as the single prefill records it.
                let a = llm_ops::flash_attention_rows(g, sub, &shape, q, &kv, att, r.part, n, 1)?;
                self.attention.push((self.work.len(), a));
            }
        }
        self.y = Some(((&sc.att).into(), qw));
        Ok(())
    }

    fn short_conv(&mut self, li: usize) -> Result<()> {
        let (m, sc): (&'a GpuLlm, &'a PrefillScratch) = (self.m, self.sc);
        let (c, n, d) = (&m.cfg, self.shape.n, m.cfg.hidden);
        let layer = &m.layers[li];
        let GpuMixer::Conv { in_proj, conv, .. } = &layer.mixer else {
            unreachable!("the recipe runs the conv block on conv layers")
        };
        let norm1 = GemmMode::Norm {
            nw: &layer.norm1,
            eps: c.norm_eps,
        };
        self.gemm(in_proj, norm1, self.residual_input(), d, &sc.bcx, 3 * d, 0)?;
        let (g, taps, out) = (&*m.gpu, c.conv_kernel, &sc.conv_out);
        let dispatch = match (self.rows, &m.state[li]) {
            (Some(r), _) => {
                let (LayerBufs::Conv(st), Some(ends)) = (&r.state[li], r.block_ends[li]) else {
                    unreachable!("both follow the config's layers")
                };
                let (_, tiles) = llm_ops::PrefillRows::most_blocks(n, r.seqs);
                llm_ops::short_conv_rows(
                    g, &sc.bcx, conv, st, r.table, out, ends, d, taps, r.ring, n, tiles,
                )?
            }
            (None, GpuState::Conv(st)) => {
                let ring = conv_ring_rows(taps);
                llm_ops::short_conv(g, &sc.bcx, conv, st, &m.io.step, out, d, taps, ring, n)?
            }
            (None, GpuState::Kv { .. }) => unreachable!("both follow the config's layers"),
        };
        self.work.push(dispatch);
        self.y = Some(((&sc.conv_out).into(), d));
        Ok(())
    }

    fn ffn(&mut self, li: usize) -> Result<()> {
        let (m, sc): (&'a GpuLlm, &'a PrefillScratch) = (self.m, self.sc);
        let (c, n) = (&m.cfg, self.shape.n);
        let (d, f) = (c.hidden, c.ffn);
        let layer = &m.layers[li];
        match &layer.ffn {
            GpuFfn::Fused(mat) => {
                // Its output in f16 pairs where the down projection can
                // read them so.
                let f16_out = m.gated_f16_out(mat, n, true);
                let mode = GemmMode::NormSwiglu {
                    nw: &layer.norm2,
                    eps: c.norm_eps,
                    act: c.ffn_act,
                    f16_out,
                };
                let (out, y) = match f16_out {
                    true => (&sc.ggh, GemmInput::F16(&sc.ggh)),
                    false => (&sc.gg, GemmInput::F32(&sc.gg)),
                };
                self.gemm(mat, mode, self.residual_input(), d, out, f, 0)?;
                self.y = Some((y, f));
                return Ok(());
            }
            GpuFfn::Split(gate, up) => {
                let norm2 = GemmMode::Norm {
                    nw: &layer.norm2,
                    eps: c.norm_eps,
                };
                self.gemm(gate, norm2, self.residual_input(), d, &sc.gu, 2 * f, 0)?;
                self.gemm(up, norm2, self.residual_input(), d, &sc.gu, 2 * f, f)?;
                self.work
                    .push(llm_ops::swiglu(&m.gpu, &sc.gu, &sc.gg, f, n, c.ffn_act)?);
            }
        }
        self.y = Some(((&sc.gg).into(), f));
        Ok(())
    }

    fn residual(&mut self, li: usize, which: Residual) -> Result<()> {
        let (m, sc): (&'a GpuLlm, &'a PrefillScratch) = (self.m, self.sc);
        let (c, n, d) = (&m.cfg, self.shape.n, m.cfg.hidden);
        let layer = &m.layers[li];
        let (w, post) = layer.residual(which);
        let (y, width) = self.y.take().expect("a block ran before its projection");
        match post {
            None => {
                // A split GEMM's sum keeps the f16 copy the next GEMMs read.
                let shadow = m.keeps_residual_f16(w, n, true);
                let mode = match shadow {
                    true => GemmMode::AddShadow { yh: &sc.xh },
                    false => GemmMode::Add,
                };
                self.gemm(w, mode, y, width, &sc.x, d, 0)?;
                self.xh_current = shadow;
            }
            Some(pw) => {
                // The GEMM adds into its output: clear it first (from a
                // buffer never written, which wgpu zero-initialises).
                self.work.push(ops::copy(
                    &m.gpu,
                    &sc.zeros,
                    &sc.mix,
                    n * d,
                    n * d / 1024 + 1,
                )?);
                self.gemm(w, GemmMode::Add, y, width, &sc.mix, d, 0)?;
                self.xh_current = false;
                let variant = norm_add_variant(m.subgroups);
                self.work.push(ops::rms_norm(
                    &m.gpu, &variant, &sc.mix, pw, &sc.x, d, n, c.norm_eps,
                )?);
            }
        }
        Ok(())
    }

    fn head(&mut self) -> Result<()> {
        let (m, sc): (&'a GpuLlm, &'a PrefillScratch) = (self.m, self.sc);
        let (c, n, d) = (&m.cfg, self.shape.n, m.cfg.hidden);
        if let Some(r) = self.rows {
            let head = GemvEpilogue::Norm {
                nw: &m.final_norm,
                eps: c.norm_eps,
            };
            // Each column as the single prefill's GEMV of its last row.
            let cols = Cols::new(r.seqs, d, c.vocab);
            self.head = llm_ops::gemv_cols(&m.gpu, m.head(), &head, r.last, 0, r.logits, 0, cols)?;
            return Ok(());
        }
        if self.shape.all {
            let norm = GemmMode::Norm {
                nw: &m.final_norm,
                eps: c.norm_eps,
            };
            self.gemm(
                m.head(),
                norm,
                self.residual_input(),
                d,
                &sc.logits,
                c.vocab,
                0,
            )?;
        } else if self.shape.last {
            let head = GemvEpilogue::Norm {
                nw: &m.final_norm,
                eps: c.norm_eps,
            };
            self.work.extend(llm_ops::gemv(
                &m.gpu,
                m.head(),
                &head,
                &sc.x,
                (n - 1) * d,
                &sc.logits,
                0,
            )?);
        }
        Ok(())
    }
}

impl GpuLlm {
    /// Builds a prefill's dispatches (uniforms and bind groups over the
    /// current work buffers and caches) for `shape`.
    fn prefill_work(&self, shape: PrefillShape) -> Result<PrefillWork> {
        let sc = self.prefill_scratch.as_ref().expect("allocated before");
        let g = &*self.gpu;
        let mut rec = PrefillRecorder {
            m: self,
            sc,
            shape,
            kernel: self.gemm_kernel(),
            rows: None,
            work: Vec::new(),
            attention: Vec::new(),
            head: Vec::new(),
            y: None,
            xh_current: false,
        };
        recipe::decoder(&self.cfg, &mut rec)?;
        let rows = if shape.all { shape.n } else { 1 };
        let staging = (shape.all || shape.last).then(|| {
            let len = (rows * self.cfg.vocab * 4) as u64;
            (g.staging("logits", len), len)
        });
        Ok(PrefillWork {
            shape,
            work: rec.work,
            attention: rec.attention,
            head: Vec::new(),
            staging,
        })
    }

    /// Builds a batched prefill's dispatches over `sc`: `n` rows of the
    /// sequences `rows` describes (no logits of their own: the head reads
    /// [`PrefillRowsTarget::last`]).
    pub(super) fn prefill_rows_work(
        &self,
        sc: &PrefillScratch,
        rows: &PrefillRowsTarget<'_>,
        n: usize,
    ) -> Result<PrefillWork> {
        let shape = PrefillShape {
            n,
            all: false,
            last: false,
        };
        let mut rec = PrefillRecorder {
            m: self,
            sc,
            shape,
            kernel: self.gemm_kernel(),
            rows: Some(rows),
            work: Vec::new(),
            attention: Vec::new(),
            head: Vec::new(),
            y: None,
            xh_current: false,
        };
        recipe::decoder(&self.cfg, &mut rec)?;
        Ok(PrefillWork {
            shape,
            work: rec.work,
            attention: rec.attention,
            head: rec.head,
            staging: None,
        })
    }

    /// Whether some layer's gate and up are separate matrices (the prefill
    /// then needs room for both products).
    pub(super) fn split_ffn(&self) -> bool {
        self.layers
            .iter()
            .any(|l| matches!(l.ffn, GpuFfn::Split(..)))
    }

    /// Largest prefill chunk whose buffers all fit one binding.
    pub(super) fn prefill_chunk_len(&self) -> usize {
        self.chunk_that_fits(self.prefill_chunk)
    }

    /// Largest batched prefill pass whose buffers all fit one binding.
    pub(super) fn batch_prefill_chunk_len(&self) -> usize {
        self.chunk_that_fits(self.batch_prefill_chunk)
    }

    /// `most` rows, or fewer where their widest buffer would not fit one
    /// binding.
    fn chunk_that_fits(&self, most: usize) -> usize {
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
        fit.clamp(1, most)
    }

    /// Runs `tokens` (at most a prefill chunk) through the model in one
    /// submission; returns the logits of every token (`all`), of the last
    /// one (`last`), or none.
    pub(super) fn prefill(&mut self, tokens: &[u32], all: bool, last: bool) -> Result<Vec<f32>> {
        self.prefill_timed(tokens, all, last, None)
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
            self.prefill_scratch = Some(PrefillScratch::new(self, tokens, rows)?);
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
        self.write_step(n, 1, &sc.cs, &sc.cs_local);

        // Recording starts here (the profile counts the timer's own set-up
        // in it). Room for a timestamp before the first dispatch and after
        // each.
        let t0 = Instant::now();
        let timer = match prof {
            Some(_) => Some(PassTimer::new(
                g,
                (pw.work.len() + 2 * pw.attention.len() + 1) as u32,
            )?),
            None => None,
        };
        let mut enc = g.device.create_command_encoder(&Default::default());
        let marks = {
            let mut pass = enc.begin_compute_pass(&Default::default());
            let mut marks = timer.as_ref().map(|t| PassMarks::start(t, &mut pass));
            pw.record(&mut pass, &mut |p, name| {
                if let Some(m) = marks.as_mut() {
                    m.after(p, name);
                }
            });
            marks
        };
        if let Some(m) = &marks {
            m.resolve(&mut enc)?;
        }
        self.pos += n;
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
        if let (Some(m), Some(prof)) = (marks, prof) {
            m.add_to(prof, g, done, [start, t0, t1, t2])?;
        }
        Ok(out)
    }
}
