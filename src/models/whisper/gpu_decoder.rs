//! The Whisper decoder on the GPU: token embedding plus positions (rows
//! gathered by buffer copies, summed by `add`), then per layer LayerNorm,
//! fused-QKV matmul, the new keys and values copied into a KV cache that
//! lives on the device, causal attention over it, the output matmul with its
//! residual; LayerNorm, cross-attention over the window's K/V that the GPU
//! encoder left on the device (`attention_tiled`), its output matmul; the
//! MLP; then the final LayerNorm and the head (the token embedding) on the
//! rows whose results are wanted, and Whisper's token choice
//! (`whisper_select`: the logit rules, each row's likeliest tokens and their
//! log probabilities; `whisper_sample`: tokens drawn at a temperature). One
//! submission per step, which reads back a few words a row; the search
//! stays on the host (`run::transcribe::decode`).
//!
//! The sequences of one step (beams, samples, windows of a batch) are the
//! rows of one pass; each has its own slot of `n_text_ctx` positions in the
//! cache and attends to its window's cross K/V (slots of `n_audio_ctx` rows
//! the encoder fills). Forking and reordering them ([`GpuDecoder::select`])
//! records cache copies that run at the start of the next step's
//! submission. The kernels are the shared dense ones and `gpu::whisper`'s
//! `attention_tiled` and `whisper_select`, whose CPU twins are
//! `cpu::{layer_norm, matmul, attention, add}` and `cpu::whisper`.

use super::gpu::{GpuLinear, GpuNorm};
use super::model::{Config, Whisper};
use crate::cpu::whisper::{
    self as select, Draw, RowRule, RuleState, SampleRules, SelectRules, TimestampRules,
};
use crate::cpu::{Activation, AttentionShape, SeqSpan};
use crate::error::{Error, Result};
use crate::gpu::dense;
use crate::gpu::ops::{self, Dispatch};
use crate::gpu::profile::{PassTimer, StepProfile};
use crate::gpu::whisper::{
    attention_tiled, attention_tiled_split, select_part_words, whisper_next, whisper_sample,
    whisper_select,
};
use crate::gpu::Gpu;
use crate::run::transcribe::Traffic;

/// The most tokens a row's choice reports: beam search takes its beams + 1
/// (`--beam-size` is at most 32).
pub const MAX_PICKS: usize = 33;

/// Greedy steps one submission runs at most ([`GpuDecoder::greedy_ahead`]).
pub const MAX_AHEAD: usize = 32;

/// Audio positions of one piece of a decode step's cross-attention
/// (flash-decoding): two tiles of 16 keys a workgroup instead of all 94 of
/// 1500 positions, so a step's few query rows fill the device.
const CROSS_KEYS_PER_SPLIT: usize = 32;

/// Pieces the cross-attention of a decode step splits the audio into.
fn cross_splits(c: &Config) -> usize {
    c.n_audio_ctx.div_ceil(CROSS_KEYS_PER_SPLIT)
}

/// Text positions of one piece of a decode step's self-attention: the same
/// flash-decoding over the cache, whose length grows with every token (one
/// thread a head walking all of them costs a step more the longer the text).
const SELF_KEYS_PER_SPLIT: usize = 32;

/// Pieces the self-attention of a decode step splits the text cache into
/// (those past a sequence's length are empty and weigh nothing).
fn self_splits(c: &Config) -> usize {
    c.n_text_ctx.div_ceil(SELF_KEYS_PER_SPLIT)
}
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
/// copied into the cache, and those after (none when the QKV product
/// writes them).
struct LayerPlan {
    before: Vec<Dispatch>,
    after: Vec<Dispatch>,
}

/// Every dispatch of a pass over `n_seqs` sequences of `n_new` new tokens.
struct Plan {
    embed: Dispatch,
    layers: Vec<LayerPlan>,
    /// The QKV products write the new keys and values into the caches.
    kv_written: bool,
}

/// The final norm and head over `rows` rows gathered into `head_in`; or,
/// when a pass's head rows are all its rows in order (a decode step),
/// `direct`ly over the last layer's output.
struct Head {
    norm: Dispatch,
    head: Dispatch,
    direct: bool,
}

/// What a pass reads back from its head rows.
pub enum Readback<'a> {
    /// The logits [rows, n_vocab].
    Logits,
    /// `whisper_select`'s words under these rules, one [`RowRule`] a row.
    Picks {
        k: usize,
        rules: &'a SelectRules,
        rows: &'a [RowRule],
    },
    /// `whisper_select`'s words with k = 1 (under `rules.rows`, one a row),
    /// then `whisper_sample`'s for each draw.
    Sample {
        rules: SampleRules<'a>,
        draws: &'a [Draw],
    },
}

impl Readback<'_> {
    /// The picks, rules and temperature of `whisper_select`, if it runs.
    fn select(&self) -> Option<(usize, &SelectRules, &[RowRule], f32)> {
        match *self {
            Readback::Logits => None,
            Readback::Picks { k, rules, rows } => Some((k, rules, rows, 0.0)),
            Readback::Sample { rules, .. } => {
                Some((1, rules.select, rules.rows, rules.temperature))
            }
        }
    }
}

pub struct GpuDecoder {
    gpu: Arc<Gpu>,
    config: Config,
    max_seqs: usize,
    max_windows: usize,
    layers: Vec<LayerWeights>,
    norm: GpuNorm,
    /// The token embedding [n_vocab, d] as the output projection.
    head: GpuLinear,
    /// [n_vocab, d] f32: rows copied out per token.
    embedding: wgpu::Buffer,
    /// [n_text_ctx, d]
    positions: wgpu::Buffer,
    /// Per layer, the windows' cross-attention K/V [max_windows *
    /// n_audio_ctx, 2d]: window w in rows w * n_audio_ctx .. (the encoder
    /// fills them).
    pub(super) cross: Vec<wgpu::Buffer>,
    /// Per layer, [max_seqs * n_text_ctx, 2d]: k then v of each position,
    /// sequence s in rows s * n_text_ctx ..
    caches: Vec<wgpu::Buffer>,
    /// Same shape: where reordered sequences are staged.
    spare: Vec<wgpu::Buffer>,
    /// [max_seqs] spans for the self-attention and the cross-attention,
    /// written each step.
    seqs: wgpu::Buffer,
    cross_seqs: wgpu::Buffer,
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
    /// [max_seqs, heads, splits, head_dim + 2]: a decode step's split
    /// attention partials (self-attention's, then cross-attention's).
    split_part: wgpu::Buffer,
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
    /// `whisper_select`: [max_out] row rules, the run's token masks, its
    /// parts, the picks [max_out, select_words(MAX_PICKS)]; `whisper_sample`:
    /// [max_out] draws and what they drew [max_out, SAMPLE_WORDS]; where
    /// picks and draws are read.
    rules: wgpu::Buffer,
    masks: wgpu::Buffer,
    select_part: wgpu::Buffer,
    picks: wgpu::Buffer,
    draws: wgpu::Buffer,
    drawn: wgpu::Buffer,
    picks_staging: wgpu::Buffer,
    /// The masks `masks` holds.
    masks_held: Vec<u32>,
    /// Greedy decoding ahead ([`GpuDecoder::greedy_ahead`]): each
    /// sequence's [`RuleState`], every step's self-attention spans (copied
    /// into `seqs` before the step), where each step's picks are read, and
    /// `whisper_next` over (rows, timestamps).
    states: wgpu::Buffer,
    spans_ahead: wgpu::Buffer,
    ahead_staging: wgpu::Buffer,
    nexts: HashMap<(usize, bool), Dispatch>,
    plans: HashMap<(usize, usize), Plan>,
    /// By head rows and whether they are read in place ([`Head`]).
    heads: HashMap<(usize, bool), Head>,
    /// `whisper_select` over (rows, k, timestamps, temperature bits), and
    /// `whisper_sample` over (draws, timestamps, temperature bits).
    selects: HashMap<(usize, usize, bool, u32), [Dispatch; 2]>,
    samples: HashMap<(usize, bool, u32), Dispatch>,
    /// Head rows of the last pass (the logits buffer holds theirs).
    head_rows: usize,
    /// Sequences now, the window each attends to, and positions each holds.
    n_seqs: usize,
    seq_windows: Vec<usize>,
    len: usize,
    /// Cache slot each sequence must be copied from before the next step.
    pending: Option<Vec<usize>>,
    /// Submissions, bytes read back, and the passes' recording and waiting
    /// times so far.
    pub traffic: Traffic,
    /// While profiling ([`GpuDecoder::start_profile`]): timestamps around
    /// every dispatch of each step, and their sums.
    profile: Option<(PassTimer, StepProfile)>,
}

/// The timestamps of one profiled step as it is recorded, across its
/// passes: one at the start, one after each dispatch, and one at the start
/// of each later pass (the copies before it and the pass boundary).
struct Marks<'t> {
    timer: Option<&'t PassTimer>,
    names: Vec<&'static str>,
}

impl Marks<'_> {
    fn pass_start(&mut self, pass: &mut wgpu::ComputePass<'_>) {
        if let Some(t) = self.timer {
            if self.names.is_empty() {
                t.mark(pass, 0);
                self.names.push("");
            } else {
                self.after(pass, "copies and pass starts");
            }
        }
    }

    fn record(&mut self, pass: &mut wgpu::ComputePass<'_>, d: &Dispatch) {
        d.record(pass);
        self.after(pass, d.bound.name);
    }

    fn after(&mut self, pass: &mut wgpu::ComputePass<'_>, name: &'static str) {
        if let Some(t) = self.timer {
            self.names.push(name);
            t.mark(pass, self.names.len() as u32 - 1);
        }
    }
}

impl GpuDecoder {
    /// The decoder of `model` over up to `max_windows` windows (their cross
    /// K/V slots, which the encoder fills), for at most `max_seqs` sequences
    /// at once.
    pub fn new(
        gpu: Arc<Gpu>,
        model: &Whisper,
        max_seqs: usize,
        max_windows: usize,
    ) -> Result<GpuDecoder> {
        let c = model.config.clone();
        let dec = &model.decoder;
        let g = &*gpu;
        let (d, ctx, vocab) = (c.d_model, c.n_text_ctx, c.n_vocab);
        let max_windows = max_windows.max(1);
        let max_seqs = max_seqs.max(max_windows);
        // A prompt pass holds every window's prompt (each shorter than the
        // context); a step, every sequence.
        let rows = (ctx * max_windows).max(max_seqs);
        // Head rows: each window's prompt reads two, a step each sequence.
        let max_out = max_seqs.max(2 * max_windows);
        let slot = c.n_audio_ctx * 2 * d * 4;
        if (slot * max_windows) as u64 > g.caps.max_binding {
            return Err(Error::invalid(format!(
                "{max_windows} windows at once need {} MB of cross-attention state a layer; \
                 this adapter binds at most {} MB (at most {} windows)",
                slot * max_windows / 1_000_000,
                g.caps.max_binding / 1_000_000,
                g.caps.max_binding / slot as u64
            )));
        }
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
        let picks_bytes = (max_out * select::select_words(MAX_PICKS) * 4) as u64;
        let part_bytes = (select_part_words(vocab, max_out, MAX_PICKS) * 4) as u64;
        Ok(GpuDecoder {
            norm: GpuNorm::from(g, "decoder.norm", &dec.norm)?,
            head: GpuLinear::upload(g, "decoder.head", &dec.embedding, None, vocab, d)?,
            embedding: g.upload_f32("decoder.embedding", &dec.embedding)?,
            positions: g.upload_f32("decoder.positions", &dec.positions)?,
            cross: (0..c.n_text_layers)
                .map(|i| {
                    g.scratch(
                        &format!("decoder.{i}.cross_kv"),
                        (slot * max_windows) as u64,
                    )
                })
                .collect::<Result<_>>()?,
            caches: cache("kv_cache")?,
            spare: cache("kv_spare")?,
            seqs: g.scratch("decoder.seqs", (max_seqs * 16) as u64)?,
            cross_seqs: g.scratch("decoder.cross_seqs", (max_seqs * 16) as u64)?,
            emb_rows: f32s("decoder.emb_rows", rows * d)?,
            pos_rows: f32s("decoder.pos_rows", rows * d)?,
            res: [f32s("decoder.x", rows * d)?, f32s("decoder.x2", rows * d)?],
            h: f32s("decoder.h", rows * d)?,
            qkv: f32s("decoder.qkv", rows * 3 * d)?,
            att: f32s("decoder.attention", rows * d)?,
            split_part: f32s(
                "decoder.split_part",
                max_seqs
                    * c.n_text_heads
                    * cross_splits(&c).max(self_splits(&c))
                    * (d / c.n_text_heads + 2),
            )?,
            q: f32s("decoder.cross_q", rows * d)?,
            ff: f32s("decoder.ffn", rows * c.d_ff)?,
            head_in: f32s("decoder.head_in", max_out * d)?,
            head_norm: f32s("decoder.head_norm", max_out * d)?,
            logits: f32s("decoder.logits", max_out * vocab)?,
            staging: g.staging("decoder.logits.read", (max_out * vocab * 4) as u64),
            rules: g.scratch(
                "decoder.select.rules",
                (max_out * std::mem::size_of::<RowRule>()) as u64,
            )?,
            masks: g.scratch(
                "decoder.select.masks",
                (2 * select::mask_words(vocab) * 4) as u64,
            )?,
            select_part: g.scratch("decoder.select.part", part_bytes)?,
            picks: g.scratch("decoder.select.picks", picks_bytes)?,
            draws: g.scratch("decoder.sample.draws", (max_out * 8) as u64)?,
            drawn: g.scratch(
                "decoder.sample.drawn",
                (max_out * select::SAMPLE_WORDS * 4) as u64,
            )?,
            picks_staging: g.staging("decoder.select.read", picks_bytes),
            masks_held: Vec::new(),
            states: g.scratch(
                "decoder.ahead.states",
                (max_seqs * std::mem::size_of::<RuleState>()) as u64,
            )?,
            spans_ahead: g.scratch("decoder.ahead.spans", (MAX_AHEAD * max_seqs * 16) as u64)?,
            ahead_staging: g.staging(
                "decoder.ahead.read",
                (MAX_AHEAD * max_seqs * select::select_words(1) * 4) as u64,
            ),
            nexts: HashMap::new(),
            layers,
            gpu,
            config: c,
            max_seqs,
            max_windows,
            plans: HashMap::new(),
            heads: HashMap::new(),
            selects: HashMap::new(),
            samples: HashMap::new(),
            head_rows: 0,
            n_seqs: 0,
            seq_windows: Vec::new(),
            len: 0,
            pending: None,
            traffic: Traffic::default(),
            profile: None,
        })
    }

    /// Starts timing every dispatch of the decoder steps that follow (not
    /// the prompts); an error when the adapter has no timestamps in passes.
    pub fn start_profile(&mut self, what: &str) -> Result<()> {
        let timer = PassTimer::new(&self.gpu, 256)?;
        let prof = StepProfile {
            what: what.into(),
            ..StepProfile::default()
        };
        self.profile = Some((timer, prof));
        Ok(())
    }

    /// The steps timed since [`GpuDecoder::start_profile`], averaged.
    pub fn take_profile(&mut self) -> Option<StepProfile> {
        self.profile.take().map(|(_, p)| p.finish())
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

    /// Each sequence's rows against its window's audio positions, the
    /// sequences of one window (beams, samples: neighbours) as one span so
    /// that its keys are read once for all of them; padded with empty spans
    /// to the `n_seqs` the pass's dispatch was bound for.
    fn cross_spans(&self, n_new: usize) -> Vec<SeqSpan> {
        let audio = self.config.n_audio_ctx;
        let mut spans: Vec<SeqSpan> = Vec::with_capacity(self.seq_windows.len());
        for (s, &w) in self.seq_windows.iter().enumerate() {
            match spans.last_mut() {
                Some(last) if last.kv_start == w * audio => last.q_len += n_new,
                _ => spans.push(SeqSpan {
                    q_start: s * n_new,
                    q_len: n_new,
                    kv_start: w * audio,
                    kv_len: audio,
                }),
            }
        }
        spans.resize(
            self.seq_windows.len(),
            SeqSpan {
                q_start: 0,
                q_len: 0,
                kv_start: 0,
                kv_len: audio,
            },
        );
        spans
    }

    /// Positions the sequences can still take.
    pub fn room(&self) -> usize {
        self.config.n_text_ctx - self.len
    }

    /// The most windows and sequences this decoder holds.
    pub fn capacity(&self) -> (usize, usize) {
        (self.max_windows, self.max_seqs)
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
        // A decode step of a few rows folds each norm into the product
        // after it and writes the new keys and values from the QKV product:
        // no copies, so one compute pass. Longer passes norm apart and copy.
        let folded = n_new == 1 && m <= dense::MATMUL_THIN_ROWS;
        for (li, w) in self.layers.iter().enumerate() {
            let (a, b) = (&self.res[li % 2], &self.res[(li + 1) % 2]);
            let cache = &self.caches[li];
            let cross = &self.cross[li];
            let mut before = Vec::new();
            if folded {
                let write = dense::CacheWrite {
                    cache,
                    seqs: &self.seqs,
                    n_seqs,
                    from_col: d,
                };
                before.push(w.self_qkv.matmul_norm(
                    g,
                    &w.self_norm,
                    a,
                    &self.qkv,
                    m,
                    None,
                    None,
                    Some(&write),
                )?);
            } else {
                before.extend([
                    w.self_norm.run(g, a, &self.h, d, m)?,
                    w.self_qkv.matmul(g, &self.h, &self.qkv, m, None, None)?,
                ]);
            }
            // A decode step's one new row per sequence sees its whole cache
            // (the causal mask removes nothing): its keys split as the
            // cross-attention's are; a prompt's rows go through the causal
            // kernel.
            let mut after = Vec::new();
            if n_new == 1 {
                after.extend(attention_tiled_split(
                    g,
                    &self.qkv,
                    cache,
                    cache,
                    &self.seqs,
                    n_seqs,
                    1,
                    m,
                    &self.split_part,
                    &self.att,
                    &AttentionShape {
                        causal: false,
                        ..self_shape
                    },
                    self_splits(c),
                )?);
            } else {
                after.push(dense::attention(
                    g,
                    &self.qkv,
                    cache,
                    cache,
                    &self.seqs,
                    &widest,
                    &self_shape,
                    &self.att,
                )?);
            }
            after.push(w.self_out.matmul(g, &self.att, b, m, None, Some(a))?);
            if folded {
                after.push(w.cross_q.matmul_norm(
                    g,
                    &w.cross_norm,
                    b,
                    &self.q,
                    m,
                    None,
                    None,
                    None,
                )?);
            } else {
                after.extend([
                    w.cross_norm.run(g, b, &self.h, d, m)?,
                    w.cross_q.matmul(g, &self.h, &self.q, m, None, None)?,
                ]);
            }
            // Spans of up to every sequence's rows (one window's). A decode
            // step's few rows split the keys (flash-decoding); a prompt's
            // many rows fill the device as they are.
            if n_new == 1 {
                after.extend(attention_tiled_split(
                    g,
                    &self.q,
                    cross,
                    cross,
                    &self.cross_seqs,
                    n_seqs,
                    m,
                    m,
                    &self.split_part,
                    &self.att,
                    &cross_shape,
                    cross_splits(c),
                )?);
            } else {
                after.push(attention_tiled(
                    g,
                    &self.q,
                    cross,
                    cross,
                    &self.cross_seqs,
                    n_seqs,
                    m,
                    &self.att,
                    &cross_shape,
                )?);
            }
            after.push(w.cross_out.matmul(g, &self.att, a, m, None, Some(b))?);
            if folded {
                after.push(
                    w.fc1
                        .matmul_norm(g, &w.mlp_norm, a, &self.ff, m, gelu, None, None)?,
                );
            } else {
                after.extend([
                    w.mlp_norm.run(g, a, &self.h, d, m)?,
                    w.fc1.matmul(g, &self.h, &self.ff, m, gelu, None)?,
                ]);
            }
            after.push(w.fc2.matmul(g, &self.ff, b, m, None, Some(a))?);
            if folded {
                before.append(&mut after);
            }
            layers.push(LayerPlan { before, after });
        }
        Ok(Plan {
            embed,
            layers,
            kv_written: folded,
        })
    }

    fn head_plan(&self, rows: usize, direct: bool) -> Result<Head> {
        let g = &*self.gpu;
        let d = self.config.d_model;
        // The norm stays a dispatch of its own: folded into the head, each
        // of the head's many workgroups would normalise the rows again.
        let input = match direct {
            true => &self.res[self.layers.len() % 2],
            false => &self.head_in,
        };
        Ok(Head {
            norm: self.norm.run(g, input, &self.head_norm, d, rows)?,
            head: self
                .head
                .matmul(g, &self.head_norm, &self.logits, rows, None, None)?,
            direct,
        })
    }

    /// Runs `prompts[w]` (all of one length) as the only sequence of window
    /// `w`; what `read` asks for after each prompt's rows `rows` (window
    /// after window).
    pub fn prompt(
        &mut self,
        prompts: &[&[u32]],
        rows: &[usize],
        read: &Readback,
    ) -> Result<Vec<u32>> {
        let n = prompts[0].len();
        assert!(
            n > 0 && prompts.iter().all(|p| p.len() == n),
            "decoder: prompts of one length"
        );
        if prompts.len() > self.max_windows {
            return Err(Error::invalid(format!(
                "{} windows at once; this GPU decoder was made for at most {}",
                prompts.len(),
                self.max_windows
            )));
        }
        self.n_seqs = prompts.len();
        self.seq_windows = (0..prompts.len()).collect();
        self.len = 0;
        self.pending = None;
        let head: Vec<usize> = (0..prompts.len())
            .flat_map(|w| rows.iter().map(move |&r| w * n + r))
            .collect();
        self.run(&prompts.concat(), &head, read)
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
        self.seq_windows = sources.iter().map(|&s| self.seq_windows[s]).collect();
        self.n_seqs = sources.len();
        Ok(())
    }

    /// Appends `tokens[i]` to sequence i; what `read` asks for after them.
    pub fn step(&mut self, tokens: &[u32], read: &Readback) -> Result<Vec<u32>> {
        assert_eq!(tokens.len(), self.n_seqs, "decoder: one token per sequence");
        let rows: Vec<usize> = (0..tokens.len()).collect();
        self.run(tokens, &rows, read)
    }

    /// Greedy decoding `n` steps (up to [`MAX_AHEAD`]) in one submission:
    /// appends `tokens[i]` to sequence i and picks its next token under
    /// `rows[i]` (k = 1), then n - 1 times appends what was picked, under
    /// the rules that follow from `states[i]` (each sequence's tokens so
    /// far, `tokens[i]` included) as `whisper_next` updates them. Returns
    /// `whisper_select`'s words of every step, step after step. Every
    /// sequence takes all n steps, one that ends on the way too: the
    /// caller reads up to its end and drops the rest.
    pub fn greedy_ahead(
        &mut self,
        tokens: &[u32],
        rules: &SelectRules,
        rows: &[RowRule],
        states: &[RuleState],
        timestamps: &TimestampRules,
        n: usize,
    ) -> Result<Vec<u32>> {
        let n_seqs = self.n_seqs;
        assert!(
            tokens.len() == n_seqs
                && rows.len() == n_seqs
                && states.len() == n_seqs
                && (1..=MAX_AHEAD).contains(&n),
            "decoder: {n} steps ahead of {} tokens, {} rules, {} states for {n_seqs} sequences",
            tokens.len(),
            rows.len(),
            states.len()
        );
        assert_eq!(
            rules.vocab, self.config.n_vocab,
            "decoder: rules of another vocabulary"
        );
        let (d, past) = (self.config.d_model, self.len);
        // n passes of one new row a sequence.
        let all: Vec<usize> = (0..n_seqs).collect();
        let head_key = self.prepare_pass(tokens, n, (n_seqs, 1), &all)?;
        self.prepare_select(rules, rows, 1, 0.0)?;
        let next_key = (n_seqs, timestamps.timestamps);
        if !self.nexts.contains_key(&next_key) {
            let next = whisper_next(
                &self.gpu,
                &self.picks,
                &self.embedding,
                &self.states,
                &self.rules,
                &self.emb_rows,
                n_seqs,
                d,
                timestamps,
            )?;
            self.nexts.insert(next_key, next);
        }
        let t0 = web_time::Instant::now();
        let gpu = &self.gpu;
        gpu.queue
            .write_buffer(&self.states, 0, bytemuck::cast_slice(states));
        let spans: Vec<u32> = (0..n)
            .flat_map(|i| dense::pack_seqs(&self.spans(n_seqs, 1, past + i + 1)))
            .collect();
        gpu.queue
            .write_buffer(&self.spans_ahead, 0, bytemuck::cast_slice(&spans));
        gpu.queue.write_buffer(
            &self.cross_seqs,
            0,
            bytemuck::cast_slice(&dense::pack_seqs(&self.cross_spans(1))),
        );
        let plan = &self.plans[&(n_seqs, 1)];
        let head = &self.heads[&head_key];
        let select = &self.selects[&(n_seqs, 1, rules.timestamps, 0f32.to_bits())];
        let next = &self.nexts[&next_key];
        let span_bytes = (n_seqs * 16) as u64;
        let pick_bytes = (n_seqs * select::select_words(1) * 4) as u64;
        let mut marks = Marks {
            timer: None,
            names: Vec::new(),
        };
        let mut enc = gpu.device.create_command_encoder(&Default::default());
        if let Some(slots) = &self.pending {
            self.record_selection(&mut enc, slots);
        }
        for i in 0..n {
            enc.copy_buffer_to_buffer(
                &self.spans_ahead,
                i as u64 * span_bytes,
                &self.seqs,
                0,
                span_bytes,
            );
            let first = (i == 0).then_some(tokens);
            self.record_layers(&mut enc, &mut marks, plan, first, n_seqs, 1, past + i);
            if !head.direct {
                self.record_head_in(&mut enc, &all);
            }
            {
                let mut pass = enc.begin_compute_pass(&Default::default());
                for work in [&head.norm, &head.head, &select[0], &select[1], next] {
                    work.record(&mut pass);
                }
            }
            enc.copy_buffer_to_buffer(
                &self.picks,
                0,
                &self.ahead_staging,
                i as u64 * pick_bytes,
                pick_bytes,
            );
        }
        let t1 = web_time::Instant::now();
        let done = gpu.queue.submit([enc.finish()]);
        let bytes = n as u64 * pick_bytes;
        let out = gpu.read_staging(&self.ahead_staging, bytes, done)?;
        self.traffic.submissions += 1;
        self.traffic.bytes_read += bytes;
        self.traffic.record += t1 - t0;
        self.traffic.wait += t1.elapsed();
        self.pending = None;
        self.len = past + n;
        self.head_rows = n_seqs;
        Ok(bytemuck::pod_collect_to_vec(&out))
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

    /// Checks that `tokens` lie in the vocabulary and that `positions` more
    /// fit the context, then binds a pass over `n_seqs` x `n_new` rows and a
    /// head over its rows `head_rows` if not yet; returns the head's key.
    fn prepare_pass(
        &mut self,
        tokens: &[u32],
        positions: usize,
        (n_seqs, n_new): (usize, usize),
        head_rows: &[usize],
    ) -> Result<(usize, bool)> {
        let (ctx, vocab) = (self.config.n_text_ctx, self.config.n_vocab);
        if self.len + positions > ctx {
            return Err(Error::invalid(format!(
                "decoder: {} positions exceed the {ctx} of the model's context",
                self.len + positions
            )));
        }
        if let Some(&t) = tokens.iter().find(|&&t| t as usize >= vocab) {
            return Err(Error::invalid(format!(
                "decoder: token {t} outside the vocabulary of {vocab}"
            )));
        }
        if !self.plans.contains_key(&(n_seqs, n_new)) {
            let plan = self.plan(n_seqs, n_new)?;
            self.plans.insert((n_seqs, n_new), plan);
        }
        // The head reads the last layer's rows in place when it takes all
        // of them in order.
        let direct =
            head_rows.len() == n_seqs * n_new && head_rows.iter().enumerate().all(|(i, &r)| i == r);
        let key = (head_rows.len(), direct);
        if !self.heads.contains_key(&key) {
            let head = self.head_plan(head_rows.len(), direct)?;
            self.heads.insert(key, head);
        }
        Ok(key)
    }

    /// Binds `whisper_select` for `rows.len()` rows and k picks if not yet,
    /// and writes the run's token sets (when they changed) and the rows'
    /// rules.
    fn prepare_select(
        &mut self,
        rules: &SelectRules,
        rows: &[RowRule],
        k: usize,
        temperature: f32,
    ) -> Result<()> {
        let key = (rows.len(), k, rules.timestamps, temperature.to_bits());
        if !self.selects.contains_key(&key) {
            let d = whisper_select(
                &self.gpu,
                &self.logits,
                &self.rules,
                &self.masks,
                &self.select_part,
                &self.picks,
                rows.len(),
                rules,
                k,
                temperature,
            )?;
            self.selects.insert(key, d);
        }
        if self.masks_held != rules.masks {
            self.gpu
                .queue
                .write_buffer(&self.masks, 0, bytemuck::cast_slice(&rules.masks));
            self.masks_held = rules.masks.clone();
        }
        self.gpu
            .queue
            .write_buffer(&self.rules, 0, bytemuck::cast_slice(rows));
        Ok(())
    }

    /// Records a pass's input rows (the embeddings of `tokens`, or of what
    /// `whisper_next` left in `emb_rows` when None, plus the positions from
    /// `past`) and its layers, the new keys and values copied into the
    /// caches.
    #[allow(clippy::too_many_arguments)]
    fn record_layers(
        &self,
        enc: &mut wgpu::CommandEncoder,
        marks: &mut Marks,
        plan: &Plan,
        tokens: Option<&[u32]>,
        n_seqs: usize,
        n_new: usize,
        past: usize,
    ) {
        let (d, ctx) = (self.config.d_model, self.config.n_text_ctx);
        let row = (d * 4) as u64;
        for r in 0..n_seqs * n_new {
            let at = r as u64 * row;
            if let Some(tokens) = tokens {
                let tok = tokens[r] as u64;
                enc.copy_buffer_to_buffer(&self.embedding, tok * row, &self.emb_rows, at, row);
            }
            let pos = (past + r % n_new) as u64;
            enc.copy_buffer_to_buffer(&self.positions, pos * row, &self.pos_rows, at, row);
        }
        {
            let mut pass = enc.begin_compute_pass(&Default::default());
            marks.pass_start(&mut pass);
            marks.record(&mut pass, &plan.embed);
            if plan.kv_written {
                for work in plan.layers.iter().flat_map(|l| &l.before) {
                    marks.record(&mut pass, work);
                }
                return;
            }
        }
        let kv_row = (2 * d * 4) as u64;
        for (layer, cache) in plan.layers.iter().zip(&self.caches) {
            {
                let mut pass = enc.begin_compute_pass(&Default::default());
                marks.pass_start(&mut pass);
                for work in &layer.before {
                    marks.record(&mut pass, work);
                }
            }
            // k and v of each new row: columns d..3d of its fused QKV row.
            for r in 0..n_seqs * n_new {
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
            marks.pass_start(&mut pass);
            for work in &layer.after {
                marks.record(&mut pass, work);
            }
        }
    }

    /// The last layer's rows `rows` into the head's input.
    fn record_head_in(&self, enc: &mut wgpu::CommandEncoder, rows: &[usize]) {
        let row = (self.config.d_model * 4) as u64;
        let last = &self.res[self.layers.len() % 2];
        for (i, &r) in rows.iter().enumerate() {
            enc.copy_buffer_to_buffer(last, r as u64 * row, &self.head_in, i as u64 * row, row);
        }
    }

    /// One pass: `tokens` holds `n_new` new tokens of each sequence, sequence
    /// after sequence; returns what `read` asks for after its rows `rows`:
    /// the logits (as f32 bits) or `whisper_select`'s words.
    fn run(&mut self, tokens: &[u32], rows: &[usize], read: &Readback) -> Result<Vec<u32>> {
        let prepare = web_time::Instant::now();
        let vocab = self.config.n_vocab;
        let n_seqs = self.n_seqs;
        let n_new = tokens.len() / n_seqs;
        let past = self.len;
        assert!(
            n_new > 0 && tokens.len() == n_seqs * n_new,
            "decoder: tokens per sequence"
        );
        let max_out = (self.logits.size() / (vocab as u64 * 4)) as usize;
        assert!(
            rows.len() <= max_out && rows.iter().all(|&r| r < tokens.len()),
            "decoder: logits of rows {rows:?}"
        );
        let head_key = self.prepare_pass(tokens, n_new, (n_seqs, n_new), rows)?;
        if let Some((k, rules, rules_rows, temperature)) = read.select() {
            assert!(
                k <= MAX_PICKS && rules_rows.len() == rows.len() && rules.vocab == vocab,
                "decoder: {k} picks for {} rules of {} rows",
                rules_rows.len(),
                rows.len()
            );
            self.prepare_select(rules, rules_rows, k, temperature)?;
        }
        if let Readback::Sample { rules, draws } = read {
            assert!(
                !draws.is_empty()
                    && draws.len() <= max_out
                    && draws.iter().all(|d| (d.row as usize) < rows.len()),
                "decoder: {} draws from {} rows",
                draws.len(),
                rows.len()
            );
            let key = (
                draws.len(),
                rules.select.timestamps,
                rules.temperature.to_bits(),
            );
            if !self.samples.contains_key(&key) {
                let d = whisper_sample(
                    &self.gpu,
                    &self.logits,
                    &self.rules,
                    &self.masks,
                    &self.select_part,
                    &self.picks,
                    &self.draws,
                    &self.drawn,
                    draws.len(),
                    rules.select,
                    rules.temperature,
                )?;
                self.samples.insert(key, d);
            }
            self.gpu
                .queue
                .write_buffer(&self.draws, 0, bytemuck::cast_slice(draws));
        }
        // Recording starts once the shapes' dispatches are bound (the
        // first pass of a shape also builds them, and compiles pipelines).
        let t0 = web_time::Instant::now();
        let plan = &self.plans[&(n_seqs, n_new)];
        let head = &self.heads[&head_key];
        let gpu = &self.gpu;
        let spans = self.spans(n_seqs, n_new, past + n_new);
        gpu.queue.write_buffer(
            &self.seqs,
            0,
            bytemuck::cast_slice(&dense::pack_seqs(&spans)),
        );
        gpu.queue.write_buffer(
            &self.cross_seqs,
            0,
            bytemuck::cast_slice(&dense::pack_seqs(&self.cross_spans(n_new))),
        );

        let mut marks = Marks {
            timer: self.profile.as_ref().filter(|_| n_new == 1).map(|(t, _)| t),
            names: Vec::new(),
        };
        let mut enc = gpu.device.create_command_encoder(&Default::default());
        if let Some(slots) = &self.pending {
            self.record_selection(&mut enc, slots);
        }
        self.record_layers(
            &mut enc,
            &mut marks,
            plan,
            Some(tokens),
            n_seqs,
            n_new,
            past,
        );
        if !head.direct {
            self.record_head_in(&mut enc, rows);
        }
        let picking = read.select().map(|(k, rules, _, temperature)| {
            &self.selects[&(rows.len(), k, rules.timestamps, temperature.to_bits())]
        });
        let sample = match read {
            Readback::Sample { rules, draws } => Some(
                &self.samples[&(
                    draws.len(),
                    rules.select.timestamps,
                    rules.temperature.to_bits(),
                )],
            ),
            _ => None,
        };
        {
            let mut pass = enc.begin_compute_pass(&Default::default());
            marks.pass_start(&mut pass);
            marks.record(&mut pass, &head.norm);
            marks.record(&mut pass, &head.head);
            for d in picking.into_iter().flatten().chain(sample) {
                marks.record(&mut pass, d);
            }
        }
        if let Some(t) = marks.timer {
            t.resolve(&mut enc, marks.names.len() as u32);
        }
        let (staging, bytes) = match read {
            Readback::Logits => {
                let bytes = rows.len() * vocab * 4;
                enc.copy_buffer_to_buffer(&self.logits, 0, &self.staging, 0, bytes as u64);
                (&self.staging, bytes)
            }
            Readback::Picks { k, .. } => {
                let bytes = rows.len() * select::select_words(*k) * 4;
                enc.copy_buffer_to_buffer(&self.picks, 0, &self.picks_staging, 0, bytes as u64);
                (&self.picks_staging, bytes)
            }
            // The picks (for a probe's probability), then the draws.
            Readback::Sample { draws, .. } => {
                let picked = (rows.len() * select::select_words(1) * 4) as u64;
                let drawn = (draws.len() * select::SAMPLE_WORDS * 4) as u64;
                enc.copy_buffer_to_buffer(&self.picks, 0, &self.picks_staging, 0, picked);
                enc.copy_buffer_to_buffer(&self.drawn, 0, &self.picks_staging, picked, drawn);
                (&self.picks_staging, (picked + drawn) as usize)
            }
        };
        let t1 = web_time::Instant::now();
        let done = gpu.queue.submit([enc.finish()]);
        let out = gpu.read_staging(staging, bytes as u64, done.clone())?;
        self.traffic.submissions += 1;
        self.traffic.bytes_read += bytes as u64;
        self.traffic.record += t1 - t0;
        self.traffic.wait += t1.elapsed();
        if marks.timer.is_some() {
            let names = &marks.names[1..];
            let (timer, prof) = self.profile.as_mut().expect("profiling");
            let ts = timer.read(gpu, names.len() as u32 + 1, done)?;
            prof.add_step([prepare, t0, t1, t1, web_time::Instant::now()], names, &ts);
        }
        self.pending = None;
        self.len = past + n_new;
        self.head_rows = rows.len();
        Ok(bytemuck::pod_collect_to_vec(&out))
    }

    /// The logits [rows.len(), n_vocab] of the last pass's head rows `rows`
    /// (indices into the rows it read), read back in one submission.
    pub fn head_logits(&mut self, rows: &[usize]) -> Result<Vec<f32>> {
        assert!(
            !rows.is_empty() && rows.iter().all(|&r| r < self.head_rows),
            "decoder: logits of head rows {rows:?} of {}",
            self.head_rows
        );
        let gpu = &self.gpu;
        let row = (self.config.n_vocab * 4) as u64;
        let mut enc = gpu.device.create_command_encoder(&Default::default());
        for (i, &r) in rows.iter().enumerate() {
            enc.copy_buffer_to_buffer(
                &self.logits,
                r as u64 * row,
                &self.staging,
                i as u64 * row,
                row,
            );
        }
        let t = web_time::Instant::now();
        let bytes = rows.len() as u64 * row;
        let out = gpu.submit_and_read(enc, &self.staging, bytes)?;
        self.traffic.submissions += 1;
        self.traffic.bytes_read += bytes;
        self.traffic.wait += t.elapsed();
        Ok(bytemuck::pod_collect_to_vec(&out))
    }
}
