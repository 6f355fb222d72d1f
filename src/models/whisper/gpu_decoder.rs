//! The Whisper decoder on the GPU: token embedding plus positions (rows
//! gathered by buffer copies, summed by `add`), then per layer LayerNorm,
//! fused-QKV matmul, the new keys and values copied into a KV cache that
//! lives on the device, causal attention over it, the output matmul with its
//! residual; LayerNorm, cross-attention over the window's K/V that the GPU
//! encoder left on the device (`attention_tiled`), its output matmul; the
//! MLP; then the final LayerNorm and the head (the token embedding) on the
//! rows whose logits are wanted. One submission per step, which reads back
//! only those logits; the search stays on the host (`run::transcribe::decode`).
//!
//! The sequences of one step (beams, samples) are the rows of one pass;
//! each has its own slot of `n_text_ctx` positions in the cache. Forking and
//! reordering them ([`GpuDecoder::select`]) records cache copies that run at
//! the start of the next step's submission. The kernels are the shared dense
//! ones and `gpu::whisper`'s `attention_tiled`, whose CPU twins are
//! `cpu::{layer_norm, matmul, attention, add}`.

use super::gpu::{GpuLinear, GpuNorm};
use super::model::{Config, Whisper};
use crate::cpu::{Activation, AttentionShape, SeqSpan};
use crate::error::{Error, Result};
use crate::gpu::dense;
use crate::gpu::ops::{self, Dispatch};
use crate::gpu::whisper::attention_tiled;
use crate::gpu::Gpu;
use std::collections::HashMap;
use std::sync::Arc;

struct LayerWeights {
    self_norm: GpuNorm,
    self_qkv: GpuLinear,
    self_out: GpuLinear,
    cross_norm: GpuNorm,
    cross_q: GpuLinear,
    cross_out: GpuLinear,
    mlp_norm: GpuNorm,
    fc1: GpuLinear,
    fc2: GpuLinear,
}

/// The dispatches of one layer: those before the new keys and values are
/// copied into the cache, and those after.
struct LayerPlan {
    before: Vec<Dispatch>,
    after: Vec<Dispatch>,
}

/// Every dispatch of a pass over `n_seqs` sequences of `n_new` new tokens.
struct Plan {
    embed: Dispatch,
    layers: Vec<LayerPlan>,
}

/// The final norm and head over `rows` gathered rows.
struct Head {
    norm: Dispatch,
    head: Dispatch,
}

pub struct GpuDecoder {
    gpu: Arc<Gpu>,
    config: Config,
    max_seqs: usize,
    layers: Vec<LayerWeights>,
    norm: GpuNorm,
    /// The token embedding [n_vocab, d] as the output projection.
    head: GpuLinear,
    /// [n_vocab, d] f32: rows copied out per token.
    embedding: wgpu::Buffer,
    /// [n_text_ctx, d]
    positions: wgpu::Buffer,
    /// Per layer, the window's cross-attention K/V [n_audio_ctx, 2d]
    /// (the encoder's buffers).
    cross: Vec<wgpu::Buffer>,
    /// Per layer, [max_seqs * n_text_ctx, 2d]: k then v of each position,
    /// sequence s in rows s * n_text_ctx ..
    caches: Vec<wgpu::Buffer>,
    /// Same shape: where reordered sequences are staged.
    spare: Vec<wgpu::Buffer>,
    /// [max_seqs] spans for the self-attention, written each step.
    seqs: wgpu::Buffer,
    /// [rows, d]: gathered embeddings and positions.
    emb_rows: wgpu::Buffer,
    pos_rows: wgpu::Buffer,
    /// [rows, d]: the residual stream, alternating between the two.
    res: [wgpu::Buffer; 2],
    /// [rows, d]
    h: wgpu::Buffer,
    /// [rows, 3d]
    qkv: wgpu::Buffer,
    /// [rows, d]
    att: wgpu::Buffer,
    /// [rows, d]
    q: wgpu::Buffer,
    /// [rows, d_ff]
    ff: wgpu::Buffer,
    /// [max_out, d]: the rows whose logits are read, then normed.
    head_in: wgpu::Buffer,
    head_norm: wgpu::Buffer,
    /// [max_out, n_vocab]
    logits: wgpu::Buffer,
    staging: wgpu::Buffer,
    plans: HashMap<(usize, usize), Plan>,
    heads: HashMap<usize, Head>,
    /// Sequences now, and positions each holds.
    n_seqs: usize,
    len: usize,
    /// Cache slot each sequence must be copied from before the next step.
    pending: Option<Vec<usize>>,
}

impl GpuDecoder {
    /// The decoder of `model` attending to `cross` (per layer [n_audio_ctx,
    /// 2d], the GPU encoder's output), for at most `max_seqs` sequences at once.
    pub fn new(
        gpu: Arc<Gpu>,
        model: &Whisper,
        cross: Vec<wgpu::Buffer>,
        max_seqs: usize,
    ) -> Result<GpuDecoder> {
        let c = model.config.clone();
        let dec = &model.decoder;
        let g = &*gpu;
        let (d, ctx, vocab) = (c.d_model, c.n_text_ctx, c.n_vocab);
        let max_seqs = max_seqs.max(1);
        let rows = ctx.max(max_seqs);
        let max_out = max_seqs.max(2);
        let f32s = |name: &str, n: usize| g.scratch(name, (n * 4) as u64);
        let layers = dec
            .layers
            .iter()
            .enumerate()
            .map(|(i, l)| {
                let p = format!("decoder.{i}");
                Ok(LayerWeights {
                    self_norm: GpuNorm::from(g, &format!("{p}.self_norm"), &l.self_norm)?,
                    self_qkv: GpuLinear::from(g, &format!("{p}.self_qkv"), &l.self_qkv)?,
                    self_out: GpuLinear::from(g, &format!("{p}.self_out"), &l.self_out)?,
                    cross_norm: GpuNorm::from(g, &format!("{p}.cross_norm"), &l.cross_norm)?,
                    cross_q: GpuLinear::from(g, &format!("{p}.cross_q"), &l.cross_q)?,
                    cross_out: GpuLinear::from(g, &format!("{p}.cross_out"), &l.cross_out)?,
                    mlp_norm: GpuNorm::from(g, &format!("{p}.mlp_norm"), &l.mlp.norm)?,
                    fc1: GpuLinear::from(g, &format!("{p}.fc1"), &l.mlp.fc1)?,
                    fc2: GpuLinear::from(g, &format!("{p}.fc2"), &l.mlp.fc2)?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let cache = |name: &str| -> Result<Vec<wgpu::Buffer>> {
            (0..c.n_text_layers)
                .map(|i| f32s(&format!("decoder.{i}.{name}"), max_seqs * ctx * 2 * d))
                .collect()
        };
        Ok(GpuDecoder {
            norm: GpuNorm::from(g, "decoder.norm", &dec.norm)?,
            head: GpuLinear::upload(g, "decoder.head", &dec.embedding, None, vocab, d)?,
            embedding: g.upload_f32("decoder.embedding", &dec.embedding)?,
            positions: g.upload_f32("decoder.positions", &dec.positions)?,
            cross,
            caches: cache("kv_cache")?,
            spare: cache("kv_spare")?,
            seqs: g.scratch("decoder.seqs", (max_seqs * 16) as u64)?,
            emb_rows: f32s("decoder.emb_rows", rows * d)?,
            pos_rows: f32s("decoder.pos_rows", rows * d)?,
            res: [f32s("decoder.x", rows * d)?, f32s("decoder.x2", rows * d)?],
            h: f32s("decoder.h", rows * d)?,
            qkv: f32s("decoder.qkv", rows * 3 * d)?,
            att: f32s("decoder.attention", rows * d)?,
            q: f32s("decoder.cross_q", rows * d)?,
            ff: f32s("decoder.ffn", rows * c.d_ff)?,
            head_in: f32s("decoder.head_in", max_out * d)?,
            head_norm: f32s("decoder.head_norm", max_out * d)?,
            logits: f32s("decoder.logits", max_out * vocab)?,
            staging: g.staging("decoder.logits.read", (max_out * vocab * 4) as u64),
            layers,
            gpu,
            config: c,
            max_seqs,
            plans: HashMap::new(),
            heads: HashMap::new(),
            n_seqs: 0,
            len: 0,
            pending: None,
        })
    }

    fn self_shape(&self) -> AttentionShape {
        let c = &self.config;
        let d = c.d_model;
        let head_dim = d / c.n_text_heads;
        AttentionShape {
            heads: c.n_text_heads,
            kv_heads: c.n_text_heads,
            head_dim,
            scale: 1.0 / (head_dim as f32).sqrt(),
            causal: true,
            window: 0,
            q_stride: 3 * d,
            q_col: 0,
            k_stride: 2 * d,
            k_col: 0,
            v_stride: 2 * d,
            v_col: d,
        }
    }

    fn spans(&self, n_seqs: usize, n_new: usize, kv_len: usize) -> Vec<SeqSpan> {
        (0..n_seqs)
            .map(|s| SeqSpan {
                q_start: s * n_new,
                q_len: n_new,
                kv_start: s * self.config.n_text_ctx,
                kv_len,
            })
            .collect()
    }

    /// Binds every dispatch of a pass over `n_seqs` x `n_new` rows.
    fn plan(&self, n_seqs: usize, n_new: usize) -> Result<Plan> {
        let g = &*self.gpu;
        let c = &self.config;
        let (d, m) = (c.d_model, n_seqs * n_new);
        let self_shape = self.self_shape();
        let cross_shape = AttentionShape {
            causal: false,
            q_stride: d,
            ..self_shape
        };
        // Bound for the longest context; each step writes its own spans.
        let widest = self.spans(n_seqs, n_new, c.n_text_ctx);
        let gelu = Some(Activation::Gelu);
        let embed = ops::add(g, &self.emb_rows, &self.pos_rows, &self.res[0], m * d)?;
        let mut layers = Vec::with_capacity(self.layers.len());
        for (li, w) in self.layers.iter().enumerate() {
            let (a, b) = (&self.res[li % 2], &self.res[(li + 1) % 2]);
            let before = vec![
                w.self_norm.run(g, a, &self.h, d, m)?,
                w.self_qkv.matmul(g, &self.h, &self.qkv, m, None, None)?,
            ];
            let cache = &self.caches[li];
            let cross = &self.cross[li];
            let after = vec![
                dense::attention(
                    g,
                    &self.qkv,
                    cache,
                    cache,
                    &self.seqs,
                    &widest,
                    &self_shape,
                    &self.att,
                )?,
                w.self_out.matmul(g, &self.att, b, m, None, Some(a))?,
                w.cross_norm.run(g, b, &self.h, d, m)?,
                w.cross_q.matmul(g, &self.h, &self.q, m, None, None)?,
                attention_tiled(
                    g,
                    &self.q,
                    cross,
                    cross,
                    &self.att,
                    m,
                    c.n_audio_ctx,
                    &cross_shape,
                )?,
                w.cross_out.matmul(g, &self.att, a, m, None, Some(b))?,
                w.mlp_norm.run(g, a, &self.h, d, m)?,
                w.fc1.matmul(g, &self.h, &self.ff, m, gelu, None)?,
                w.fc2.matmul(g, &self.ff, b, m, None, Some(a))?,
            ];
            layers.push(LayerPlan { before, after });
        }
        Ok(Plan { embed, layers })
    }

    fn head_plan(&self, rows: usize) -> Result<Head> {
        let g = &*self.gpu;
        let d = self.config.d_model;
        Ok(Head {
            norm: self.norm.run(g, &self.head_in, &self.head_norm, d, rows)?,
            head: self
                .head
                .matmul(g, &self.head_norm, &self.logits, rows, None, None)?,
        })
    }

    /// Runs `prompt` as the only sequence; the logits after its rows `rows`.
    pub fn prompt(&mut self, prompt: &[u32], rows: &[usize]) -> Result<Vec<f32>> {
        self.n_seqs = 1;
        self.len = 0;
        self.pending = None;
        self.run(prompt, rows)
    }

    /// Sequence i becomes a copy of sequence `sources[i]`.
    pub fn select(&mut self, sources: &[usize]) -> Result<()> {
        if sources.len() > self.max_seqs {
            return Err(Error::invalid(format!(
                "{} sequences at once; this GPU decoder was made for at most {}",
                sources.len(),
                self.max_seqs
            )));
        }
        assert!(
            !sources.is_empty() && sources.iter().all(|&s| s < self.n_seqs),
            "decoder: select {sources:?} of {} sequences",
            self.n_seqs
        );
        // Compose with a selection not yet carried out.
        let slots: Vec<usize> = match &self.pending {
            Some(p) => sources.iter().map(|&s| p[s]).collect(),
            None => sources.to_vec(),
        };
        let identity = slots.iter().enumerate().all(|(i, &s)| i == s);
        self.pending = (!identity).then_some(slots);
        self.n_seqs = sources.len();
        Ok(())
    }

    /// Appends `tokens[i]` to sequence i; the logits after them [n, n_vocab].
    pub fn step(&mut self, tokens: &[u32]) -> Result<Vec<f32>> {
        assert_eq!(tokens.len(), self.n_seqs, "decoder: one token per sequence");
        let rows: Vec<usize> = (0..tokens.len()).collect();
        self.run(tokens, &rows)
    }

    /// The cache copies of a pending selection: each sequence's positions to
    /// the spare cache at its new slot, then back.
    fn record_selection(&self, enc: &mut wgpu::CommandEncoder, slots: &[usize]) {
        let slot_bytes = (self.config.n_text_ctx * 2 * self.config.d_model * 4) as u64;
        let used = (self.len * 2 * self.config.d_model * 4) as u64;
        if used == 0 {
            return;
        }
        for (cache, spare) in self.caches.iter().zip(&self.spare) {
            for (i, &src) in slots.iter().enumerate() {
                enc.copy_buffer_to_buffer(
                    cache,
                    src as u64 * slot_bytes,
                    spare,
                    i as u64 * slot_bytes,
                    used,
                );
            }
            for i in 0..slots.len() {
                let at = i as u64 * slot_bytes;
                enc.copy_buffer_to_buffer(spare, at, cache, at, used);
            }
        }
    }

    /// One pass: `tokens` holds `n_new` new tokens of each sequence, sequence
    /// after sequence; returns the logits after the rows `rows` of it.
    fn run(&mut self, tokens: &[u32], rows: &[usize]) -> Result<Vec<f32>> {
        let c = &self.config;
        let (d, ctx, vocab) = (c.d_model, c.n_text_ctx, c.n_vocab);
        let n_seqs = self.n_seqs;
        let n_new = tokens.len() / n_seqs;
        let past = self.len;
        assert!(
            n_new > 0 && tokens.len() == n_seqs * n_new,
            "decoder: tokens per sequence"
        );
        if past + n_new > ctx {
            return Err(Error::invalid(format!(
                "decoder: {} positions exceed the {ctx} of the model's context",
                past + n_new
            )));
        }
        if let Some(&t) = tokens.iter().find(|&&t| t as usize >= vocab) {
            return Err(Error::invalid(format!(
                "decoder: token {t} outside the vocabulary of {vocab}"
            )));
        }
        let max_out = (self.logits.size() / (vocab as u64 * 4)) as usize;
        assert!(
            rows.len() <= max_out && rows.iter().all(|&r| r < tokens.len()),
            "decoder: logits of rows {rows:?}"
        );
        if !self.plans.contains_key(&(n_seqs, n_new)) {
            let plan = self.plan(n_seqs, n_new)?;
            self.plans.insert((n_seqs, n_new), plan);
        }
        if !self.heads.contains_key(&rows.len()) {
            let head = self.head_plan(rows.len())?;
            self.heads.insert(rows.len(), head);
        }
        let plan = &self.plans[&(n_seqs, n_new)];
        let head = &self.heads[&rows.len()];
        let gpu = &self.gpu;
        let spans = self.spans(n_seqs, n_new, past + n_new);
        gpu.queue.write_buffer(
            &self.seqs,
            0,
            bytemuck::cast_slice(&dense::pack_seqs(&spans)),
        );

        let mut enc = gpu.device.create_command_encoder(&Default::default());
        if let Some(slots) = &self.pending {
            self.record_selection(&mut enc, slots);
        }
        let row = (d * 4) as u64;
        for (r, &tok) in tokens.iter().enumerate() {
            let at = r as u64 * row;
            enc.copy_buffer_to_buffer(&self.embedding, tok as u64 * row, &self.emb_rows, at, row);
            let pos = (past + r % n_new) as u64;
            enc.copy_buffer_to_buffer(&self.positions, pos * row, &self.pos_rows, at, row);
        }
        {
            let mut pass = enc.begin_compute_pass(&Default::default());
            plan.embed.record(&mut pass);
        }
        let kv_row = (2 * d * 4) as u64;
        for (layer, cache) in plan.layers.iter().zip(&self.caches) {
            {
                let mut pass = enc.begin_compute_pass(&Default::default());
                for work in &layer.before {
                    work.record(&mut pass);
                }
            }
            // k and v of each new row: columns d..3d of its fused QKV row.
            for r in 0..tokens.len() {
                let (s, t) = (r / n_new, r % n_new);
                enc.copy_buffer_to_buffer(
                    &self.qkv,
                    ((r * 3 * d + d) * 4) as u64,
                    cache,
                    ((s * ctx + past + t) as u64) * kv_row,
                    kv_row,
                );
            }
            let mut pass = enc.begin_compute_pass(&Default::default());
            for work in &layer.after {
                work.record(&mut pass);
            }
        }
        let last = &self.res[self.layers.len() % 2];
        for (i, &r) in rows.iter().enumerate() {
            enc.copy_buffer_to_buffer(last, r as u64 * row, &self.head_in, i as u64 * row, row);
        }
        {
            let mut pass = enc.begin_compute_pass(&Default::default());
            head.norm.record(&mut pass);
            head.head.record(&mut pass);
        }
        let bytes = (rows.len() * vocab * 4) as u64;
        enc.copy_buffer_to_buffer(&self.logits, 0, &self.staging, 0, bytes);
        let out = gpu.submit_and_read(enc, &self.staging, bytes)?;
        self.pending = None;
        self.len = past + n_new;
        Ok(bytemuck::pod_collect_to_vec(&out))
    }
}
