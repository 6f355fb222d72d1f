//! Many sequences decoding together on the GPU: [`GpuBatch`], the GPU's
//! [`BatchedLm`].
//!
//! The KV cache is paged: each attention layer's keys and values are one
//! pool of blocks of [`BLOCK`] positions ([`BlockPool`], the same books the
//! CPU batch keeps), and a sequence's block table says where each of its
//! positions is; the batched kernels read the tables after the row
//! records (paged_cache.wgsl). Every open sequence also has a slot: a row
//! of a step's buffers and its own ring of conv states. A decode step takes
//! one token of every running sequence and
//! records the whole recipe once for all of them, in one submission: the
//! products are the batched GEMVs (`gemv_cols_*`: tiles of 64 weight rows x
//! 32 sequences, each weight slice dequantised once for the 32, split over k
//! where the tiles are few; each sequence's result bit-equal to the single
//! decode's, gemv_common.wgsl's one order of summation),
//! RoPE and the cache write go to each row's position in its blocks,
//! attention runs over each row's own blocks, the conv block reads and
//! writes each row's own ring, and a greedy step reads back one token id
//! per row. Greedy rows may run a step ahead of the host
//! ([`BatchedLm::greedy_run_many`]): each step reads the tokens the last
//! one's argmax left on the device, and is submitted before the host reads
//! the last one's. The prompt
//! chunks of a step run together as one prefill: their rows one after
//! another through the prefill's GEMMs (the weights read once for all of
//! them, every row summed as it is alone), RoPE at each row's position,
//! the keys and values written into each sequence's blocks, attention and
//! the conv block per sequence over its own blocks and ring (in blocks of
//! queries that never cross sequences), and the head over each sequence's
//! last row (`prefill.rs`, [`llm_ops::PrefillRows`]). A lone prompt chunk
//! and a batch of one (a lone sequence's decode: the kernels `generate`
//! runs, a step ahead of the host where the caller asks for a greedy run)
//! go through the single-sequence [`GpuLlm`] that owns the weights: the
//! sequence's positions are gathered into its contiguous cache on the GPU,
//! and what it computed is copied back into the sequence's blocks when
//! they are next needed. So for temperature 0 every sequence's tokens are
//! those of `generate --gpu` for its prompt alone. That holds for the
//! default [`BatchProducts::Invariant`]; with [`BatchProducts::Gemm`] a
//! decode step of independent rows computes its products as the batched
//! prefill does (the prefill's GEMM, and its conv kernel over one-row
//! segments): each weight tile is read once for up to 64 rows and, where
//! the adapter has cooperative matrices, multiplied on them, at the price
//! of sums that are not the single decode's.
//!
//! The prefix cache: a block whose positions were all computed as a prompt
//! from 0 is keyed by its tokens and everything before them; a new prompt
//! that starts with cached blocks shares them (nothing copied, nothing
//! recomputed), and they stay cached after their sequences end until the
//! pool needs them (least recently used first). A hybrid model's prefix
//! also needs its conv state: its prompts run through the batched prefill,
//! whose conv kernel keeps the gated inputs of each block's last positions
//! (`ends`), and a sequence that takes cached blocks starts its rings from
//! the last one's.

use super::prefill::{PrefillRowsTarget, PrefillScratch, PrefillWork};
use super::{BatchProducts, GpuFfn, GpuLlm, GpuMixer};
use crate::cpu;
use crate::error::{Error, Result};
use crate::gpu::llm_ops::{
    self, AttnBuffers, Cols, GemmInput, GemmKernel, GemmMode, GemvEpilogue, PrefillRows,
    RowsSegment,
};
use crate::gpu::ops::{self, Dispatch};
use crate::gpu::profile::{PassMarks, PassTimer, StepProfile};
use crate::models::batch::{BatchedLm, Candidates, SeqId, SeqWork};
use crate::models::kv_blocks::{blocks_for, chain, BlockPool, BlockUsage, BLOCK};
use crate::models::llm::{attn_shape, conv_ring_rows, CausalLm, LayerKind, LlmConfig, Weights};
use crate::models::recipe::{self, DecoderOps, Residual};
use crate::sampling::{Draw, Sampler};
use std::collections::HashMap;
use std::sync::Arc;

/// Most sequences one [`GpuBatch`] decodes at once.
pub const MAX_SLOTS: usize = 256;

/// Per-layer state of every sequence.
enum SlotState {
    /// The paged caches: [blocks * BLOCK, kv_heads * head_dim] each.
    Kv { k: wgpu::Buffer, v: wgpu::Buffer },
    /// `ring`: [slots * ring, hidden], slot s's ring in rows s ring ..;
    /// `ends`: [blocks, taps - 1, hidden], the gated inputs of the last
    /// positions of each KV cache block computed as a prompt (what a
    /// sequence that takes the block from the prefix cache starts its ring
    /// from).
    Conv {
        ring: wgpu::Buffer,
        ends: wgpu::Buffer,
    },
}

/// Buffers of a step of many rows (a batched decode step: one row per slot;
/// a verification: consecutive positions of one sequence).
pub(super) struct BatchIo {
    /// [slots, ROW_RECORD] u32 (llm_ops::ROW_RECORD), then the rows' KV
    /// block tables.
    pub(super) rows: wgpu::Buffer,
    /// With [`BatchProducts::Gemm`]: the rows as a [`PrefillRows`] table of
    /// one-row segments, for the batched prefill's conv kernel.
    prefill_rows: Option<wgpu::Buffer>,
    /// With [`BatchProducts::Gemm`]: the sums of the products split over k
    /// ([`llm_ops::gemm_split`]).
    split_part: Option<wgpu::Buffer>,
    /// With [`BatchProducts::Gemm`]: [rows, hidden / 2] f16 pairs, the
    /// residual stream's copy for the GEMMs that read it
    /// ([`GemmInput::F16`]), where a split GEMM's sum wrote it.
    xh: Option<wgpu::Buffer>,
    /// [slots, rope_dim]: each row's RoPE angles.
    cs: wgpu::Buffer,
    cs_local: wgpu::Buffer,
    x: wgpu::Buffer,
    qkv: wgpu::Buffer,
    q: wgpu::Buffer,
    att: wgpu::Buffer,
    part: wgpu::Buffer,
    conv_out: wgpu::Buffer,
    mix: wgpu::Buffer,
    g: wgpu::Buffer,
    /// With [`BatchProducts::Gemm`]: [rows, ffn / 2] f16 pairs, the gated
    /// MLP's output where its GEMM writes it so, for the down projection.
    gh: Option<wgpu::Buffer>,
    gu: wgpu::Buffer,
    /// [slots, vocab]
    logits: wgpu::Buffer,
    /// [slots, 2] u32: the token each row consumes (written by the host, or
    /// left by the last step's argmax), then each row's argmax and
    /// non-finite flag.
    next: wgpu::Buffer,
    /// [slots, 4] f32: each row's draw ([`crate::sampling::Draw::to_gpu`])
    /// for a sampled step.
    draws: wgpu::Buffer,
    /// [slots, candidates, 2] u32: each row's most likely tokens as (id,
    /// logit bits) pairs.
    cand: wgpu::Buffer,
    cand_staging: wgpu::Buffer,
    /// Two, for a step read back while the next one runs.
    next_staging: [wgpu::Buffer; 2],
    logits_staging: wgpu::Buffer,
}

impl BatchIo {
    /// Buffers for steps of up to `rows` rows whose attention splits at most
    /// `max_splits` ways and whose KV block tables take `table_words` u32s
    /// in all, computing their products on `gemm` where given, else on the
    /// batch-invariant GEMVs.
    pub(super) fn new(
        m: &GpuLlm,
        rows: usize,
        max_splits: usize,
        table_words: usize,
        gemm: Option<GemmKernel>,
    ) -> Result<BatchIo> {
        let (g, cfg) = (&*m.gpu, &m.cfg);
        let (d, hd, f) = (cfg.hidden, cfg.head_dim, cfg.ffn);
        let qw = cfg.heads * hd;
        let qkvw = qw + 2 * cfg.kv_heads * hd;
        let f32s = |label: &str, n: usize| g.scratch(label, (n.max(1) * 4) as u64);
        let part = llm_ops::attention_rows_part_len(cfg.heads, hd, rows, max_splits);
        Ok(BatchIo {
            rows: f32s("batch rows", rows * llm_ops::ROW_RECORD + table_words)?,
            prefill_rows: match gemm {
                Some(_) => Some(f32s(
                    "batch prefill rows",
                    rows * (llm_ops::ROW_RECORD + 2) + table_words,
                )?),
                None => None,
            },
            split_part: match gemm {
                Some(_) => Some(f32s("batch split sums", m.split_part_len(rows, false))?),
                None => None,
            },
            xh: match gemm {
                Some(_) => Some(f32s("batch x f16", (rows * d).div_ceil(2))?),
                None => None,
            },
            cs: f32s("batch rope", rows * cfg.rope_dim)?,
            cs_local: f32s("batch rope local", rows * cfg.rope_dim)?,
            x: f32s("batch x", rows * d)?,
            qkv: f32s("batch qkv", rows * qkvw)?,
            q: f32s("batch q", rows * qw)?,
            att: f32s("batch att", rows * qw)?,
            part: f32s("batch part", part)?,
            conv_out: f32s("batch conv_out", rows * d)?,
            mix: f32s("batch mix", rows * d)?,
            g: f32s("batch g", rows * f)?,
            gh: match gemm {
                Some(_) => Some(f32s("batch g f16", (rows * f).div_ceil(2))?),
                None => None,
            },
            // With the GEMM, also a conv block's gated inputs.
            gu: f32s(
                "batch gu",
                match gemm {
                    Some(_) => rows * (2 * f).max(3 * d),
                    None => rows * 2 * f,
                },
            )?,
            logits: f32s("batch logits", rows * cfg.vocab)?,
            next: f32s("batch next", rows * 2)?,
            draws: f32s("batch draws", rows * 4)?,
            cand: f32s("batch candidates", rows * candidates_per_row(cfg.vocab) * 2)?,
            cand_staging: g.staging(
                "batch candidates",
                (rows * candidates_per_row(cfg.vocab) * 8) as u64,
            ),
            next_staging: [
                g.staging("batch next", (rows * 8) as u64),
                g.staging("batch next 2", (rows * 8) as u64),
            ],
            logits_staging: g.staging("batch logits", (rows * cfg.vocab * 4) as u64),
        })
    }

    /// Writes the step's inputs: each row's token (none: those the last
    /// step's argmax left), row record and RoPE angles (`cs_local`: none
    /// without a local RoPE).
    pub(super) fn write(
        &self,
        g: &crate::gpu::Gpu,
        tokens: Option<&[u32]>,
        records: &[u32],
        cs: &[f32],
        cs_local: &[f32],
    ) {
        if let Some(tokens) = tokens {
            let pairs: Vec<u32> = tokens.iter().flat_map(|&t| [t, 0]).collect();
            g.queue
                .write_buffer(&self.next, 0, bytemuck::cast_slice(&pairs));
        }
        g.queue
            .write_buffer(&self.rows, 0, bytemuck::cast_slice(records));
        if !cs.is_empty() {
            g.queue.write_buffer(&self.cs, 0, bytemuck::cast_slice(cs));
        }
        if !cs_local.is_empty() {
            g.queue
                .write_buffer(&self.cs_local, 0, bytemuck::cast_slice(cs_local));
        }
    }

    /// Copies what `want` asks for of `n` rows into its staging buffer
    /// ([`BatchIo::staging`]); returns the bytes copied.
    pub(super) fn copy_out(
        &self,
        enc: &mut wgpu::CommandEncoder,
        want: Want,
        n: usize,
        vocab: usize,
        half: usize,
    ) -> u64 {
        let (src, len) = match want {
            Want::Tokens | Want::Drawn => (&self.next, (n * 8) as u64),
            Want::Candidates => (&self.cand, (n * candidates_per_row(vocab) * 8) as u64),
            Want::Logits => (&self.logits, (n * vocab * 4) as u64),
        };
        enc.copy_buffer_to_buffer(src, 0, self.staging(want, half), 0, len);
        len
    }

    /// The staging buffer of what `want` asks for (of tokens, the `half`th
    /// of two, for a step read back while the next one runs).
    pub(super) fn staging(&self, want: Want, half: usize) -> &wgpu::Buffer {
        match want {
            Want::Tokens | Want::Drawn => &self.next_staging[half],
            Want::Candidates => &self.cand_staging,
            Want::Logits => &self.logits_staging,
        }
    }
}

/// Where a decode step's submissions end, in shares of its operations out
/// of the last share (see [`GpuBatch::submit_rows`]).
const SUBMIT_SHARES: [usize; 4] = [1, 2, 4, 8];

enum Op {
    Fixed(Dispatch),
    /// Recorded with the most splits of any row.
    Attention(llm_ops::Attention),
}

/// The recorded step of `n` rows, its argmax, its draw and its selection
/// of candidates.
pub(super) struct Plan {
    ops: Vec<Op>,
    argmax: Vec<Dispatch>,
    drawn: Dispatch,
    select: Vec<Dispatch>,
}

impl Plan {
    /// Records `n` rows' step over `target` (and each row's argmax into
    /// `io.next`).
    pub(super) fn new(target: RowsTarget<'_>, n: usize) -> Result<Plan> {
        let mut rec = BatchRecorder {
            t: target,
            n,
            ops: Vec::new(),
            y: None,
            xh_current: false,
        };
        recipe::decoder(&rec.t.m.cfg, &mut rec)?;
        let (m, io) = (rec.t.m, rec.t.io);
        let argmax = llm_ops::argmax_rows(&m.gpu, &io.logits, &io.next, m.cfg.vocab, n)?;
        let v = m.cfg.vocab;
        let drawn = llm_ops::sample_rows(&m.gpu, &io.logits, &io.draws, &io.next, v, n)?;
        let select =
            llm_ops::top_k_rows(&m.gpu, &io.logits, &io.cand, v, candidates_per_row(v), n)?;
        Ok(Plan {
            ops: rec.ops,
            argmax,
            drawn,
            select,
        })
    }

    /// Records the step into `pass` (attention with `most_splits`, the most
    /// of any row), with the argmax, the draw or the candidates `want` asks for,
    /// calling `after` after each dispatch with its kernel name.
    pub(super) fn record(
        &self,
        pass: &mut wgpu::ComputePass<'_>,
        most_splits: usize,
        want: Want,
        after: &mut dyn FnMut(&mut wgpu::ComputePass<'_>, &'static str),
    ) {
        self.record_part(pass, 0..self.ops.len(), most_splits, want, after);
    }

    /// [`Plan::record`] of the operations in `ops` only, with what `want`
    /// asks for when the range ends the step.
    fn record_part(
        &self,
        pass: &mut wgpu::ComputePass<'_>,
        ops: std::ops::Range<usize>,
        most_splits: usize,
        want: Want,
        after: &mut dyn FnMut(&mut wgpu::ComputePass<'_>, &'static str),
    ) {
        let ends = ops.end == self.ops.len();
        for op in &self.ops[ops] {
            match op {
                Op::Fixed(d) => {
                    d.record(pass);
                    after(pass, d.bound.name);
                }
                Op::Attention(a) => a.record_with(pass, most_splits, after),
            }
        }
        let last = match want {
            _ if !ends => &[][..],
            Want::Tokens => &self.argmax[..],
            Want::Drawn => std::slice::from_ref(&self.drawn),
            Want::Candidates => &self.select[..],
            Want::Logits => &[],
        };
        for d in last {
            d.record(pass);
            after(pass, d.bound.name);
        }
    }

    /// Dispatches of the step with its argmax, attention merges included.
    fn dispatches(&self) -> usize {
        2 * self.ops.len() + self.argmax.len()
    }
}

/// One layer's sequence state as a step of rows reads it.
pub(super) enum LayerBufs<'a> {
    /// The key and value caches.
    Kv(&'a wgpu::Buffer, &'a wgpu::Buffer),
    /// The conv-state rings.
    Conv(&'a wgpu::Buffer),
}

/// What a step of rows is recorded over.
pub(super) struct RowsTarget<'a> {
    /// The weights (and the config).
    pub m: &'a GpuLlm,
    pub io: &'a BatchIo,
    /// One per layer.
    pub state: Vec<LayerBufs<'a>>,
    /// Rows of one sequence's conv ring.
    pub ring: usize,
    /// The most ways any row's attention splits.
    pub max_splits: usize,
    /// Set when the rows are consecutive positions of one sequence: row j's
    /// conv block reads the gated inputs rows before it write, so each row's
    /// conv block (and its output projection) runs as its own one-column
    /// product, with row j's record alone and its output in `chain[j]`.
    pub chain: Option<&'a [ChainRow]>,
    /// Set for [`BatchProducts::Gemm`] (independent rows only): the GEMM
    /// the products run on, and each conv layer's block ends (the batched
    /// prefill's conv kernel writes them).
    pub gemm: Option<(GemmKernel, Vec<Option<&'a wgpu::Buffer>>)>,
}

/// A row's own buffers where conv blocks run row by row
/// ([`RowsTarget::chain`]).
pub(super) struct ChainRow {
    /// [ROW_RECORD] u32: the row's record.
    pub record: wgpu::Buffer,
    /// [hidden]: its conv block's output.
    pub conv_out: wgpu::Buffer,
}

#[derive(Clone)]
struct Seq {
    id: SeqId,
    /// Tokens its cache holds.
    pos: usize,
    /// Its blocks of the KV cache, in position order.
    table: Vec<u32>,
    /// Blocks promised to it at `open` and not yet taken.
    reserved: usize,
    /// The tokens of positions 0.. that were computed as a prompt (or taken
    /// from the prefix cache): what a later prompt may reuse, since
    /// computing them again as a prompt gives the same bits.
    prefix: Vec<u32>,
    /// Full blocks of the prefix offered to the prefix cache, and the hash
    /// of the prefix they end.
    registered: usize,
    prefix_hash: u64,
}

/// The sequence the single model holds. Its blocks are written back lazily
/// (before a batched step or another sequence needs them), so a lone
/// sequence's steps on the single path cost no copy each.
#[derive(Clone, Copy)]
struct Held {
    id: SeqId,
    slot: usize,
    /// Positions of the sequence's blocks that hold what the model
    /// computed; the conv rings in the slot are those of this position.
    synced: usize,
}

/// What a batched step reads back.
#[derive(Clone, Copy, PartialEq)]
pub(super) enum Want {
    /// Each row's argmax.
    Tokens,
    /// Each row's token drawn by `sample_rows` (the draws in io.draws).
    Drawn,
    /// Each row's most likely tokens ([`candidates_per_row`]), unordered.
    Candidates,
    Logits,
}

/// Candidates a batched step selects per row for the host's draw.
fn candidates_per_row(vocab: usize) -> usize {
    llm_ops::MAX_TOP_K.min(vocab)
}

pub struct GpuBatch {
    m: GpuLlm,
    /// The GEMM of [`BatchProducts::Gemm`]'s decode steps.
    gemm: Option<GemmKernel>,
    /// The model's config with its context cut to what one sequence may
    /// hold: what the server clamps requests to.
    cfg: LlmConfig,
    /// Positions one sequence may hold.
    max_len: usize,
    ring: usize,
    /// Per slot (a row of the conv rings and of a step's buffers).
    seqs: Vec<Option<Seq>>,
    /// The KV cache's blocks and the prefix cache over them.
    pool: BlockPool,
    /// Whether the model has conv layers (its prompts then always run
    /// through the batched prefill, which keeps each block's conv ends).
    has_conv: bool,
    state: Vec<SlotState>,
    io: BatchIo,
    plans: HashMap<usize, Plan>,
    /// RoPE cos/sin of every position a sequence may hold (the single
    /// path's table).
    rope: Vec<f32>,
    rope_local: Vec<f32>,
    next_id: SeqId,
    /// The sequence whose state `m` holds (at its position).
    held: Option<Held>,
    /// Device timestamps of every batched step, while asked for
    /// ([`BatchedLm::start_profile`]).
    profile: Option<StepProfile>,
    /// The batched prefill's buffers, made at its first use.
    prefill: Option<BatchPrefill>,
}

/// Buffers of a batched prefill (several sequences' prompt chunks in one
/// pass) and its recorded passes.
struct BatchPrefill {
    /// Most rows a pass holds.
    chunk: usize,
    sc: PrefillScratch,
    /// The pass's row table ([`PrefillRows`]) with its block tables.
    table: wgpu::Buffer,
    part: wgpu::Buffer,
    /// [slots, hidden]: each sequence's last row.
    last: wgpu::Buffer,
    /// Per (rows, sequences): the pass's dispatches.
    works: HashMap<(usize, usize), PrefillWork>,
}

impl GpuBatch {
    /// Uploads the model (as [`GpuLlm::new`]) with a KV cache of
    /// `positions` (rounded up to whole blocks) shared by up to `sequences`
    /// sequences at once.
    pub fn new(
        gpu: Arc<crate::gpu::Gpu>,
        cfg: &LlmConfig,
        w: &Weights,
        opts: &super::GpuLlmOptions,
        sequences: usize,
        positions: usize,
    ) -> Result<GpuBatch> {
        let slots = sequences.clamp(1, MAX_SLOTS);
        let blocks = blocks_for(positions.max(1));
        let m = GpuLlm::new(gpu, cfg, w, opts)?;
        let g = &*m.gpu;
        let kvw = cfg.kv_heads * cfg.head_dim;
        let kv_bytes = (blocks * BLOCK * kvw * 4) as u64;
        if kv_bytes > g.caps.max_binding {
            return Err(Error::gpu(format!(
                "a KV cache of {} positions needs {kv_bytes} bytes per layer, more than this \
                 adapter binds at once ({}); ask for less",
                blocks * BLOCK,
                g.caps.max_binding
            )));
        }
        let max_len = (blocks * BLOCK).min(cfg.context.max(1));
        let ring = conv_ring_rows(cfg.conv_kernel);
        let d = cfg.hidden;
        let f32s = |label: &str, n: usize| g.scratch(label, (n.max(1) * 4) as u64);
        let max_splits = llm_ops::attention_splits(max_len);
        let gemm = (opts.batch_products == BatchProducts::Gemm).then(|| m.gemm_kernel());
        let io = BatchIo::new(&m, slots, max_splits, slots * blocks_for(max_len), gemm)?;
        let state = cfg
            .layers
            .iter()
            .map(|k| {
                Ok(match k {
                    LayerKind::Attention => SlotState::Kv {
                        k: f32s("paged k cache", blocks * BLOCK * kvw)?,
                        v: f32s("paged v cache", blocks * BLOCK * kvw)?,
                    },
                    LayerKind::Conv => SlotState::Conv {
                        ring: f32s("slot conv state", slots * ring * d)?,
                        ends: f32s(
                            "block conv ends",
                            blocks * cfg.conv_kernel.saturating_sub(1) * d,
                        )?,
                    },
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let table = |local: bool| cpu::rope_table_freqs(0, max_len, &cfg.rope_freqs(local));
        let rope = if cfg.rope_dim > 0 {
            table(false)
        } else {
            Vec::new()
        };
        let rope_local = if cfg.rope_dim > 0 && cfg.rope_local_theta.is_some() {
            table(true)
        } else {
            Vec::new()
        };
        let mut b = GpuBatch {
            gemm,
            cfg: LlmConfig {
                context: max_len,
                ..cfg.clone()
            },
            m,
            max_len,
            ring,
            seqs: vec![None; slots],
            pool: BlockPool::new(blocks),
            has_conv: cfg.layers.contains(&LayerKind::Conv),
            state,
            io,
            plans: HashMap::new(),
            rope,
            rope_local,
            next_id: 1,
            held: None,
            profile: None,
            prefill: None,
        };
        // Compile the batched kernels now (a rejected one shows at load).
        b.plan(1)?;
        Ok(b)
    }

    /// Positions one sequence can hold.
    pub fn max_len(&self) -> usize {
        self.max_len
    }

    fn slot_of(&self, id: SeqId) -> Result<usize> {
        self.seqs
            .iter()
            .position(|s| s.as_ref().is_some_and(|s| s.id == id))
            .ok_or_else(|| Error::invalid(format!("no open sequence {id}")))
    }

    fn seq(&self, slot: usize) -> &Seq {
        self.seqs[slot].as_ref().expect("open slot")
    }

    fn pos(&self, slot: usize) -> usize {
        self.seq(slot).pos
    }

    /// Makes room for `n` more tokens of `slot`'s sequence: fails when they
    /// would pass the positions a sequence may hold or the cache has no
    /// blocks left for them.
    fn grow(&mut self, slot: usize, n: usize) -> Result<()> {
        let need = self.pos(slot) + n;
        if need > self.max_len {
            return Err(Error::invalid(format!(
                "a sequence of {need} tokens exceeds the {} positions a batched sequence may hold",
                self.max_len
            )));
        }
        let seq = self.seqs[slot].as_mut().expect("open slot");
        while seq.table.len() < blocks_for(need) {
            let reserved = seq.reserved > 0;
            let Some(b) = self.pool.allocate(reserved) else {
                return Err(Error::invalid(format!(
                    "the KV cache is full: a sequence of {need} tokens does not fit beside the \
                     others (--kv-memory)"
                )));
            };
            seq.reserved -= usize::from(reserved);
            seq.table.push(b);
        }
        Ok(())
    }

    /// Gives back the blocks of `slot`'s sequence past its position (taken
    /// for a run that ended early).
    fn trim(&mut self, slot: usize) {
        let seq = self.seqs[slot].as_mut().expect("open slot");
        while seq.table.len() > blocks_for(seq.pos) {
            let b = seq.table.pop().expect("a block");
            self.pool.release(b);
        }
    }

    /// Makes the single-sequence model hold `slot`'s sequence: its KV rows
    /// and conv rings are copied in on the GPU.
    fn hold(&mut self, slot: usize) -> Result<()> {
        let (id, pos) = (self.seq(slot).id, self.pos(slot));
        if self.held.is_some_and(|h| h.id == id) {
            return Ok(());
        }
        self.release();
        self.m.reset();
        self.m.ensure_capacity(pos.max(1))?;
        self.copy_state(slot, 0, pos, false);
        self.m.pos = pos;
        self.m.high = pos;
        self.held = Some(Held {
            id,
            slot,
            synced: pos,
        });
        Ok(())
    }

    /// Copies what the single model computed since its sequence was last in
    /// sync back into the sequence's blocks.
    fn sync(&mut self) {
        let Some(h) = self.held else { return };
        let pos = self.pos(h.slot);
        if pos > h.synced {
            self.copy_state(h.slot, h.synced, pos, true);
            self.held = Some(Held { synced: pos, ..h });
        }
    }

    /// Brings the held sequence's blocks up to date and lets the single
    /// model go.
    fn release(&mut self) {
        self.sync();
        self.held = None;
    }

    /// Sets `slot`'s conv rings for a sequence starting at position `pos`:
    /// from the conv ends of `last`, the cached block before it, or zeros
    /// (positions before 0) at the start.
    fn start_rings(&self, slot: usize, last: Option<u32>, pos: usize) {
        let g = &*self.m.gpu;
        let d = self.m.cfg.hidden;
        let hist = self.m.cfg.conv_kernel.saturating_sub(1);
        let row = (d * 4) as u64;
        let first = (slot * self.ring) as u64;
        let mut enc = g.device.create_command_encoder(&Default::default());
        for s in &self.state {
            let SlotState::Conv { ring, ends } = s else {
                continue;
            };
            match last {
                // Position q's gated input is in ring row q % ring.
                Some(b) => {
                    for j in 0..hist {
                        let q = pos - hist + j;
                        let from = (b as usize * hist + j) as u64 * row;
                        let to = (first + (q % self.ring) as u64) * row;
                        enc.copy_buffer_to_buffer(ends, from, ring, to, row);
                    }
                }
                None => enc.clear_buffer(ring, first * row, Some(self.ring as u64 * row)),
            }
        }
        g.queue.submit([enc.finish()]);
    }

    /// Offers the newly full blocks of `slot`'s prefix to the prefix cache.
    fn register_full(&mut self, slot: usize) {
        let seq = self.seqs[slot].as_mut().expect("open slot");
        while (seq.registered + 1) * BLOCK <= seq.prefix.len() {
            let b = seq.registered;
            let tokens = &seq.prefix[b * BLOCK..(b + 1) * BLOCK];
            self.pool.register(seq.table[b], seq.prefix_hash, tokens);
            seq.prefix_hash = chain(seq.prefix_hash, tokens);
            seq.registered += 1;
        }
    }

    /// Copies positions from..to of the KV caches, and the conv rings,
    /// between the single model and `slot`'s sequence (`to_slot`: from the
    /// model), block by block.
    fn copy_state(&self, slot: usize, from: usize, to: usize, to_slot: bool) {
        let g = &*self.m.gpu;
        let kvw = (self.m.cfg.kv_heads * self.m.cfg.head_dim * 4) as u64;
        let ring_bytes = (self.ring * self.m.cfg.hidden * 4) as u64;
        let table = &self.seq(slot).table;
        // (position in the model, row of the paged cache, rows) of each run
        // of positions within one block.
        let mut runs = Vec::new();
        let mut p = from;
        while p < to {
            let end = to.min((p / BLOCK + 1) * BLOCK);
            let row = table[p / BLOCK] as usize * BLOCK + p % BLOCK;
            runs.push((p as u64, row as u64, (end - p) as u64));
            p = end;
        }
        let mut enc = g.device.create_command_encoder(&Default::default());
        for (mine, theirs) in self.state.iter().zip(&self.m.state) {
            match (mine, theirs) {
                (SlotState::Kv { k, v }, super::GpuState::Kv { k: mk, v: mv }) => {
                    for (s, mm) in [(k, mk), (v, mv)] {
                        for &(at_model, at_cache, rows) in &runs {
                            let (a, c, len) = (at_model * kvw, at_cache * kvw, rows * kvw);
                            if to_slot {
                                enc.copy_buffer_to_buffer(mm, a, s, c, len);
                            } else {
                                enc.copy_buffer_to_buffer(s, c, mm, a, len);
                            }
                        }
                    }
                }
                (SlotState::Conv { ring: s, .. }, super::GpuState::Conv(mm)) => {
                    let at = slot as u64 * ring_bytes;
                    if to_slot {
                        enc.copy_buffer_to_buffer(mm, 0, s, at, ring_bytes);
                    } else {
                        enc.copy_buffer_to_buffer(s, at, mm, 0, ring_bytes);
                    }
                }
                _ => unreachable!("both follow the config's layers"),
            }
        }
        g.queue.submit([enc.finish()]);
    }

    /// Runs `f` on the single model holding `slot`'s sequence, after making
    /// room for `n` more tokens (what it appends reaches the sequence's
    /// blocks at the next [`GpuBatch::sync`]). On failure the sequence's
    /// state is unknown (its conv rings may be half updated and not yet
    /// copied back): it is closed, and later steps of it fail as steps of a
    /// sequence that is not open.
    fn on_single<T>(
        &mut self,
        slot: usize,
        n: usize,
        f: impl FnOnce(&mut GpuLlm) -> Result<T>,
    ) -> Result<T> {
        self.grow(slot, n)?;
        self.hold(slot)?;
        match f(&mut self.m) {
            Ok(v) => {
                self.seqs[slot].as_mut().expect("open slot").pos = self.m.pos;
                Ok(v)
            }
            Err(e) => {
                self.held = None;
                self.drop_seq(slot);
                Err(e)
            }
        }
    }

    /// Closes `slot`'s sequence, giving its blocks back.
    fn drop_seq(&mut self, slot: usize) {
        if let Some(seq) = self.seqs[slot].take() {
            for b in seq.table {
                self.pool.release(b);
            }
            self.pool.unreserve(seq.reserved);
        }
    }

    /// Each layer's sequence state as a step of rows reads it.
    fn layer_bufs(&self) -> Vec<LayerBufs<'_>> {
        self.state
            .iter()
            .map(|s| match s {
                SlotState::Kv { k, v } => LayerBufs::Kv(k, v),
                SlotState::Conv { ring, .. } => LayerBufs::Conv(ring),
            })
            .collect()
    }

    /// Each conv layer's block ends (None for attention layers).
    fn block_ends(&self) -> Vec<Option<&wgpu::Buffer>> {
        self.state
            .iter()
            .map(|s| match s {
                SlotState::Kv { .. } => None,
                SlotState::Conv { ends, .. } => Some(ends),
            })
            .collect()
    }

    /// Records (once per batch size) the step of `n` rows.
    fn plan(&mut self, n: usize) -> Result<()> {
        if self.plans.contains_key(&n) {
            return Ok(());
        }
        let gemm = self.gemm.map(|kernel| (kernel, self.block_ends()));
        let target = RowsTarget {
            m: &self.m,
            io: &self.io,
            state: self.layer_bufs(),
            ring: self.ring,
            max_splits: llm_ops::attention_splits(self.max_len),
            chain: None,
            gemm,
        };
        let plan = Plan::new(target, n)?;
        self.plans.insert(n, plan);
        Ok(())
    }

    /// One decode step of every (slot, token) row in one submission; returns
    /// what `want` asks for, row by row.
    fn decode_rows(&mut self, rows: &[(usize, u32)], want: Want) -> Result<Vec<u8>> {
        let slots: Vec<usize> = rows.iter().map(|r| r.0).collect();
        let tokens: Vec<u32> = rows.iter().map(|r| r.1).collect();
        if self.profile.is_some() {
            return self.decode_rows_profiled(&slots, &tokens, want);
        }
        let (done, len) = self.submit_rows(&slots, Some(&tokens), want, 0)?;
        self.m.gpu.read_staging(self.io.staging(want, 0), len, done)
    }

    /// Writes the inputs of a decode step of the sequences in `slots`, each
    /// consuming its token of `tokens` (none: the tokens the last step's
    /// argmax left on the device) and makes room for it; returns the most
    /// attention splits of any row.
    fn prepare_rows(&mut self, slots: &[usize], tokens: Option<&[u32]>) -> Result<usize> {
        let n = slots.len();
        self.plan(n)?;
        // The rows move on in their slots: the single model's copy of one
        // of them would go stale.
        if self.held.is_some_and(|h| slots.contains(&h.slot)) {
            self.release();
        }
        let vocab = self.m.cfg.vocab;
        if let Some(&token) = tokens.and_then(|t| t.iter().find(|&&t| t as usize >= vocab)) {
            return Err(Error::invalid(format!(
                "token id {token} is outside the {vocab}-token vocabulary"
            )));
        }
        for &slot in slots {
            self.grow(slot, 1)?;
        }
        let cfg = &self.m.cfg;
        let (rd, ring) = (cfg.rope_dim, self.ring);
        let mut records = vec![0u32; n * llm_ops::ROW_RECORD];
        // Each row's block table, after the records.
        let mut tables = Vec::new();
        let mut cs = Vec::with_capacity(n * rd);
        let mut cs_local = Vec::with_capacity(n * rd);
        let mut most_splits = 1;
        for (j, &slot) in slots.iter().enumerate() {
            let pos = self.pos(slot);
            let splits = llm_ops::attention_splits(pos + 1);
            most_splits = most_splits.max(splits);
            let r = &mut records[j * llm_ops::ROW_RECORD..(j + 1) * llm_ops::ROW_RECORD];
            r[0] = slot as u32;
            r[1] = pos as u32;
            r[2] = (pos + 1) as u32;
            r[3] = splits as u32;
            r[4] = (n * llm_ops::ROW_RECORD + tables.len()) as u32;
            r[5] = (slot * ring) as u32;
            tables.extend_from_slice(&self.seq(slot).table);
            if rd > 0 {
                cs.extend_from_slice(&self.rope[pos * rd..(pos + 1) * rd]);
                if !self.rope_local.is_empty() {
                    cs_local.extend_from_slice(&self.rope_local[pos * rd..(pos + 1) * rd]);
                }
            }
        }
        records.extend(tables);
        let g = &*self.m.gpu;
        let io = &self.io;
        if let Some(table) = &io.prefill_rows {
            let segs: Vec<RowsSegment> = slots
                .iter()
                .map(|&slot| RowsSegment {
                    slot,
                    pos: self.pos(slot),
                    len: 1,
                    blocks: &self.seq(slot).table,
                    ring_row: slot * ring,
                })
                .collect();
            let words = PrefillRows::new(&segs).words;
            g.queue.write_buffer(table, 0, bytemuck::cast_slice(&words));
        }
        io.write(g, tokens, &records, &cs, &cs_local);
        Ok(most_splits)
    }

    /// Submits a decode step of the sequences in `slots` (tokens as
    /// [`GpuBatch::prepare_rows`] takes them), what `want` asks for copied
    /// to its staging buffer (of tokens, the `half`th); the rows' positions
    /// move on. Returns the submission and the bytes copied.
    ///
    /// wgpu encodes a command buffer on the host when it is finished, a
    /// large share of a step: the step goes in parts, each submitted as
    /// soon as it is recorded, so the device runs the first parts while the
    /// host encodes the rest. The parts double in size, the first small, so
    /// that the device starts early and the host stays ahead of it.
    fn submit_rows(
        &mut self,
        slots: &[usize],
        tokens: Option<&[u32]>,
        want: Want,
        half: usize,
    ) -> Result<(wgpu::SubmissionIndex, u64)> {
        let most_splits = self.prepare_rows(slots, tokens)?;
        let n = slots.len();
        let (g, io, plan) = (&*self.m.gpu, &self.io, &self.plans[&n]);
        let ops = plan.ops.len();
        let mut start = 0;
        let mut done = None;
        for share in SUBMIT_SHARES {
            let end = (ops * share).div_ceil(SUBMIT_SHARES[SUBMIT_SHARES.len() - 1]);
            if end == start {
                continue;
            }
            let mut enc = g.device.create_command_encoder(&Default::default());
            {
                let mut pass = enc.begin_compute_pass(&Default::default());
                plan.record_part(&mut pass, start..end, most_splits, want, &mut |_, _| {});
            }
            if end == ops {
                let len = io.copy_out(&mut enc, want, n, self.m.cfg.vocab, half);
                done = Some((g.queue.submit([enc.finish()]), len));
            } else {
                g.queue.submit([enc.finish()]);
            }
            start = end;
        }
        for &slot in slots {
            self.seqs[slot].as_mut().expect("open slot").pos += 1;
        }
        Ok(done.expect("the last part ends the step"))
    }

    /// [`GpuBatch::decode_rows`] in one submission with a timestamp after
    /// every dispatch, added to the profile.
    fn decode_rows_profiled(
        &mut self,
        slots: &[usize],
        tokens: &[u32],
        want: Want,
    ) -> Result<Vec<u8>> {
        // The plan is built once per batch size, outside the step's time.
        self.plan(slots.len())?;
        let t0 = web_time::Instant::now();
        let most_splits = self.prepare_rows(slots, Some(tokens))?;
        let n = slots.len();
        let (g, io, plan) = (&*self.m.gpu, &self.io, &self.plans[&n]);
        let t1 = web_time::Instant::now();
        let timer = PassTimer::new(g, plan.dispatches() as u32 + 1)?;
        let mut enc = g.device.create_command_encoder(&Default::default());
        let marks = {
            let mut pass = enc.begin_compute_pass(&Default::default());
            let mut marks = PassMarks::start(&timer, &mut pass);
            plan.record(&mut pass, most_splits, want, &mut |p, name| {
                marks.after(p, name)
            });
            marks
        };
        marks.resolve(&mut enc)?;
        let len = io.copy_out(&mut enc, want, n, self.m.cfg.vocab, 0);
        let t2 = web_time::Instant::now();
        let done = g.queue.submit([enc.finish()]);
        let t3 = web_time::Instant::now();
        let out = g.read_staging(io.staging(want, 0), len, done.clone());
        let prof = self.profile.as_mut().expect("profiling");
        marks.add_to(prof, g, done, [t0, t1, t2, t3])?;
        // The rows' states moved on (or, after a failure, are unknown).
        for &slot in slots {
            self.seqs[slot].as_mut().expect("open slot").pos += 1;
        }
        out
    }

    /// Whether every sequence in `slots` has room for one more token.
    fn room_for_step(&self, slots: &[usize]) -> bool {
        let mut blocks = 0;
        for &slot in slots {
            let s = self.seq(slot);
            if s.pos + 1 > self.max_len {
                return false;
            }
            let more = blocks_for(s.pos + 1).saturating_sub(s.table.len());
            blocks += more.saturating_sub(s.reserved);
        }
        blocks <= self.pool.available()
    }

    /// Greedy decoding of the sequences in `slots` together, the device a
    /// step ahead of the host: step i + 1 is submitted, consuming the
    /// tokens step i's argmax left on the device, before the host reads
    /// step i's tokens and hands them to `emit`. The run ends when `emit`
    /// says so, after `max` steps or when the cache has no room for another
    /// step; the step that ran ahead is then undone (the positions go back;
    /// the KV rows and conv-ring rows it wrote are rewritten by the next
    /// tokens), so the sequences are what a loop of single steps leaves.
    /// Returns the steps produced.
    fn greedy_rows(
        &mut self,
        slots: &[usize],
        tokens: &[u32],
        max: usize,
        emit: &mut dyn FnMut(&[u32]) -> bool,
    ) -> Result<usize> {
        // Each step in flight, oldest first, and its bytes to read back.
        let mut flight = std::collections::VecDeque::new();
        let (mut submitted, mut produced) = (0, 0);
        loop {
            while flight.len() < 2 && submitted < max && self.room_for_step(slots) {
                let host = (submitted == 0).then_some(tokens);
                flight.push_back(self.submit_rows(slots, host, Want::Tokens, submitted % 2)?);
                submitted += 1;
            }
            let Some((done, len)) = flight.pop_front() else {
                return Ok(produced);
            };
            let staging = &self.io.next_staging[produced % 2];
            let next = row_tokens(&self.m.gpu.read_staging(staging, len, done)?)?;
            produced += 1;
            if !emit(&next) || produced == max {
                // The step that ran ahead consumed `next`: take it back. It
                // still runs; whatever is submitted later runs after it, so
                // a block it wrote may go to another sequence at once. (A
                // block it took may have pushed a prefix out of the cache.)
                if flight.pop_front().is_some() {
                    for &slot in slots {
                        let seq = self.seqs[slot].as_mut().expect("open slot");
                        // Its first step consumed the sequence's reserved block.
                        debug_assert_eq!(seq.reserved, 0);
                        seq.pos -= 1;
                        self.trim(slot);
                    }
                }
                return Ok(produced);
            }
        }
    }
}

impl GpuBatch {
    /// Computes the prompt chunks `parts` ((slot, tokens), each of its own
    /// sequence) as a prompt each; returns the next-token logits after each.
    /// One chunk runs on the single model (unless it extends a hybrid
    /// model's `prefix`: only the batched prefill keeps the conv ends of the
    /// blocks it fills); several run as batched prefill passes of a prefill
    /// chunk's rows (the last fewer), each chunk going on in the next pass
    /// where one fills up: a row's result does not depend on where its
    /// chunk was cut.
    fn prompts(&mut self, parts: &[(usize, &[u32])], prefix: bool) -> Result<Vec<Vec<f32>>> {
        if let ([(slot, tokens)], false) = (parts, prefix && self.has_conv) {
            let n = tokens.len();
            return Ok(vec![
                self.on_single(*slot, n, |m| prompt_forward(m, tokens))?
            ]);
        }
        let chunk = self.m.batch_prefill_chunk_len();
        let mut out = vec![Vec::new(); parts.len()];
        // (part, slot, tokens) of each pass.
        let mut passes: Vec<Vec<(usize, usize, &[u32])>> = vec![Vec::new()];
        let mut room = chunk;
        for (i, &(slot, tokens)) in parts.iter().enumerate() {
            let mut rest = tokens;
            while !rest.is_empty() {
                if room == 0 {
                    passes.push(Vec::new());
                    room = chunk;
                }
                let (piece, more) = rest.split_at(rest.len().min(room));
                passes
                    .last_mut()
                    .expect("one pass at least")
                    .push((i, slot, piece));
                room -= piece.len();
                rest = more;
            }
        }
        for pass in passes.iter().filter(|p| !p.is_empty()) {
            let segs: Vec<(usize, &[u32])> = pass.iter().map(|p| (p.1, p.2)).collect();
            for (p, logits) in pass.iter().zip(self.prefill_pass(&segs)?) {
                out[p.0] = logits;
            }
        }
        Ok(out)
    }

    /// Makes the batched prefill's buffers.
    fn prefill_buffers(&mut self) -> Result<()> {
        if self.prefill.is_some() {
            return Ok(());
        }
        let (g, cfg) = (&*self.m.gpu, &self.m.cfg);
        let chunk = self.m.batch_prefill_chunk_len();
        llm_ops::warm_prefill_rows_kernels(g)?;
        let f32s = |label: &str, n: usize| g.scratch(label, (n.max(1) * 4) as u64);
        let part = llm_ops::attention_rows_part_len(cfg.heads, cfg.head_dim, chunk, 1);
        self.prefill = Some(BatchPrefill {
            chunk,
            sc: PrefillScratch::new(&self.m, chunk, 1)?,
            table: f32s(
                "prefill rows",
                10 * chunk + self.seqs.len() * blocks_for(self.max_len),
            )?,
            part: f32s("prefill part", part)?,
            last: f32s("prefill last rows", self.seqs.len() * cfg.hidden)?,
            works: HashMap::new(),
        });
        Ok(())
    }

    /// One batched prefill pass: each (slot, tokens) a prompt chunk of its
    /// own sequence, at most a prefill chunk's rows in all; returns each
    /// one's next-token logits.
    fn prefill_pass(&mut self, parts: &[(usize, &[u32])]) -> Result<Vec<Vec<f32>>> {
        self.prefill_buffers()?;
        // The slots move on: the single model's copy of one would go stale.
        if self
            .held
            .is_some_and(|h| parts.iter().any(|p| p.0 == h.slot))
        {
            self.release();
        }
        let vocab = self.m.cfg.vocab;
        for &(slot, toks) in parts {
            if let Some(t) = toks.iter().find(|&&t| t as usize >= vocab) {
                return Err(Error::invalid(format!(
                    "token id {t} is outside the {vocab}-token vocabulary"
                )));
            }
            self.grow(slot, toks.len())?;
        }
        let (cfg, rd) = (&self.m.cfg, self.m.cfg.rope_dim);
        let mut segs = Vec::with_capacity(parts.len());
        let mut tokens = Vec::new();
        let (mut cs, mut cs_local) = (Vec::new(), Vec::new());
        for &(slot, toks) in parts {
            let seq = self.seqs[slot].as_ref().expect("open slot");
            let pos = seq.pos;
            segs.push(RowsSegment {
                slot,
                pos,
                len: toks.len(),
                blocks: &seq.table,
                ring_row: slot * self.ring,
            });
            tokens.extend_from_slice(toks);
            let span = pos * rd..(pos + toks.len()) * rd;
            cs.extend_from_slice(&self.rope[span.clone()]);
            if !self.rope_local.is_empty() {
                cs_local.extend_from_slice(&self.rope_local[span]);
            }
        }
        let (n, s) = (tokens.len(), segs.len());
        let bp = self.prefill.as_ref().expect("made above");
        assert!(n <= bp.chunk, "a prefill pass of {n} rows");
        let g = &*self.m.gpu;
        let table = PrefillRows::new(&segs);
        g.queue
            .write_buffer(&bp.sc.ids, 0, bytemuck::cast_slice(&tokens));
        g.queue
            .write_buffer(&bp.table, 0, bytemuck::cast_slice(&table.words));
        if !cs.is_empty() {
            g.queue
                .write_buffer(&bp.sc.cs, 0, bytemuck::cast_slice(&cs));
        }
        if !cs_local.is_empty() {
            g.queue
                .write_buffer(&bp.sc.cs_local, 0, bytemuck::cast_slice(&cs_local));
        }
        if !bp.works.contains_key(&(n, s)) {
            let target = PrefillRowsTarget {
                state: self.layer_bufs(),
                block_ends: self.block_ends(),
                table: &bp.table,
                ring: self.ring,
                part: &bp.part,
                seqs: s,
                last: &bp.last,
                logits: &self.io.logits,
            };
            let work = self.m.prefill_rows_work(&bp.sc, &target, n)?;
            let bp = self.prefill.as_mut().expect("made above");
            bp.works.insert((n, s), work);
        }
        let bp = self.prefill.as_ref().expect("made above");
        let work = &bp.works[&(n, s)];
        let (d, vocab) = (cfg.hidden, cfg.vocab);
        let mut enc = g.device.create_command_encoder(&Default::default());
        {
            let mut pass = enc.begin_compute_pass(&Default::default());
            work.record(&mut pass, &mut |_, _| {});
        }
        // Each sequence's last row, for the head.
        let row = (d * 4) as u64;
        let mut end = 0;
        for (j, seg) in segs.iter().enumerate() {
            end += seg.len;
            let at = (end - 1) as u64 * row;
            enc.copy_buffer_to_buffer(&bp.sc.x, at, &bp.last, j as u64 * row, row);
        }
        {
            let mut pass = enc.begin_compute_pass(&Default::default());
            for dsp in &work.head {
                dsp.record(&mut pass);
            }
        }
        let len = self.io.copy_out(&mut enc, Want::Logits, s, vocab, 0);
        let done = g.queue.submit([enc.finish()]);
        let read = g.read_staging(self.io.staging(Want::Logits, 0), len, done);
        // The sequences' states moved on (or, after a failure, are unknown:
        // they are closed).
        let moved: Vec<(usize, usize)> = segs.iter().map(|s| (s.slot, s.len)).collect();
        for (slot, len) in moved {
            if read.is_ok() {
                self.seqs[slot].as_mut().expect("open slot").pos += len;
            } else {
                self.drop_seq(slot);
            }
        }
        let logits: Vec<f32> = bytemuck::pod_collect_to_vec(&read?);
        Ok(logits.chunks_exact(vocab).map(<[f32]>::to_vec).collect())
    }
}

/// Records the recipe's operations for `n` rows over a [`RowsTarget`].
struct BatchRecorder<'a> {
    t: RowsTarget<'a>,
    n: usize,
    ops: Vec<Op>,
    /// The last block's output, the input of its projection.
    y: Option<BlockOut<'a>>,
    /// Whether `io.xh` holds the residual stream's current values.
    xh_current: bool,
}

/// Where a block left its rows' output.
#[derive(Clone, Copy)]
enum BlockOut<'a> {
    /// Row j at j times the block's width.
    Rows(&'a wgpu::Buffer),
    /// Row j in its own buffer ([`RowsTarget::chain`]).
    Chain(&'a [ChainRow]),
    /// Row j at j times the block's width, as f16 pairs (for a GEMM).
    Half(&'a wgpu::Buffer),
}

impl<'a> BatchRecorder<'a> {
    fn fixed(&mut self, ds: Vec<Dispatch>) {
        self.ops.extend(ds.into_iter().map(Op::Fixed));
    }

    /// The residual stream as the GEMMs read it: the f16 copy where it is
    /// current.
    fn residual_input(&self) -> GemmInput<'a> {
        match (&self.t.io.xh, self.xh_current) {
            (Some(xh), true) => GemmInput::F16(xh),
            _ => GemmInput::F32(&self.t.io.x),
        }
    }

    /// The GEMM the products run on, with [`BatchProducts::Gemm`].
    fn gemm_kernel(&self) -> Option<GemmKernel> {
        self.t.gemm.as_ref().map(|g| g.0)
    }

    /// y (+)= W x over the step's rows, as the prefill computes it, split
    /// over k where its tiles are few.
    #[allow(clippy::too_many_arguments)]
    fn gemm(
        &mut self,
        kernel: GemmKernel,
        w: &llm_ops::GpuMatrix,
        mode: GemmMode,
        x: GemmInput<'a>,
        x_stride: usize,
        y: &wgpu::Buffer,
        y_stride: usize,
        out_off: usize,
    ) -> Result<()> {
        let (g, n) = (&self.t.m.gpu, self.n);
        let part = self.t.io.split_part.as_ref().expect("made with the GEMM");
        let plan = self.t.m.gemm_plan(w, n, false);
        let ds = llm_ops::gemm_planned(
            g, kernel, w, mode, x, x_stride, y, y_stride, out_off, n, part, plan,
        )?;
        self.fixed(ds);
        Ok(())
    }

    /// x += W y over the step's rows (a projection into the residual
    /// stream).
    fn gemm_add(
        &mut self,
        kernel: GemmKernel,
        w: &llm_ops::GpuMatrix,
        y: GemmInput<'a>,
    ) -> Result<()> {
        let (io, d) = (self.t.io, self.t.m.cfg.hidden);
        // A split GEMM's sum keeps the f16 copy the next GEMMs read.
        let shadow = io
            .xh
            .as_ref()
            .filter(|_| self.t.m.keeps_residual_f16(w, self.n, false));
        let mode = match shadow {
            Some(yh) => GemmMode::AddShadow { yh },
            None => GemmMode::Add,
        };
        self.gemm(kernel, w, mode, y, w.k, &io.x, d, 0)?;
        self.xh_current = shadow.is_some();
        Ok(())
    }

    /// Columns of a product over `k`-wide rows into `width`-wide rows.
    fn cols(&self, k: usize, width: usize) -> Cols {
        Cols::new(self.n, k, width)
    }

    /// Layer `li`'s caches.
    fn kv(&self, li: usize) -> (&'a wgpu::Buffer, &'a wgpu::Buffer) {
        match self.t.state[li] {
            LayerBufs::Kv(k, v) => (k, v),
            LayerBufs::Conv(_) => unreachable!("the recipe runs attention on attention layers"),
        }
    }
}

/// One column of a product, for row-by-row chains.
const ONE: Cols = Cols::new(1, 0, 0);

impl<'a> DecoderOps for BatchRecorder<'a> {
    fn embed(&mut self) -> Result<()> {
        let (m, io) = (self.t.m, self.t.io);
        self.fixed(llm_ops::embedding(
            &m.gpu,
            &m.embed,
            &io.next,
            0,
            2,
            m.cfg.embed_scale,
            &io.x,
            self.n,
        )?);
        self.xh_current = false;
        Ok(())
    }

    fn attention(&mut self, li: usize) -> Result<()> {
        let (m, io) = (self.t.m, self.t.io);
        let (g, sub, cfg) = (&*m.gpu, m.subgroups, &m.cfg);
        let layer = &m.layers[li];
        let GpuMixer::Attention { qkv, consts, .. } = &layer.mixer else {
            unreachable!("the recipe runs attention on attention layers")
        };
        let (k, v) = self.kv(li);
        let norm1 = GemvEpilogue::Norm {
            nw: &layer.norm1,
            eps: cfg.norm_eps,
        };
        let qkvw = (cfg.heads + 2 * cfg.kv_heads) * cfg.head_dim;
        let cols = self.cols(cfg.hidden, qkvw);
        for (mat, off) in qkv {
            if let Some(kern) = self.gemm_kernel() {
                let mode = GemmMode::Norm {
                    nw: &layer.norm1,
                    eps: cfg.norm_eps,
                };
                self.gemm(
                    kern,
                    mat,
                    mode,
                    self.residual_input(),
                    cfg.hidden,
                    &io.qkv,
                    qkvw,
                    *off,
                )?;
                continue;
            }
            self.fixed(llm_ops::gemv_cols(
                g, mat, &norm1, &io.x, 0, &io.qkv, *off, cols,
            )?);
        }
        let kv = AttnBuffers {
            step: &io.rows,
            k_cache: k,
            v_cache: v,
        };
        let shape = attn_shape(cfg, li);
        let cs = if cfg.uses_local_rope(li) {
            &io.cs_local
        } else {
            &io.cs
        };
        let n = self.n;
        let rope = llm_ops::qk_rope_rows(g, &shape, &io.qkv, consts.as_ref(), cs, &kv, &io.q, n)?;
        self.ops.push(Op::Fixed(rope));
        self.ops.push(Op::Attention(llm_ops::flash_attention_rows(
            g,
            sub,
            &shape,
            &io.q,
            &kv,
            &io.att,
            &io.part,
            n,
            self.t.max_splits,
        )?));
        self.y = Some(BlockOut::Rows(&io.att));
        Ok(())
    }

    fn short_conv(&mut self, li: usize) -> Result<()> {
        let (m, io) = (self.t.m, self.t.io);
        let (g, cfg) = (&*m.gpu, &m.cfg);
        let layer = &m.layers[li];
        let (GpuMixer::Conv { in_proj, conv, .. }, &LayerBufs::Conv(st)) =
            (&layer.mixer, &self.t.state[li])
        else {
            unreachable!("the recipe runs the conv block on conv layers")
        };
        let ring = self.t.ring;
        let epi = |step| GemvEpilogue::Conv {
            nw: &layer.norm1,
            eps: cfg.norm_eps,
            conv,
            state: st,
            step,
            taps: cfg.conv_kernel,
            ring,
        };
        let d = cfg.hidden;
        if let Some(chain) = self.t.chain {
            // Row j reads the gated inputs rows 0..j write: one dispatch
            // each, in order.
            for (j, row) in chain[..self.n].iter().enumerate() {
                self.fixed(llm_ops::gemv_cols(
                    g,
                    in_proj,
                    &epi(&row.record),
                    &io.x,
                    j * d,
                    &row.conv_out,
                    0,
                    ONE,
                )?);
            }
            self.y = Some(BlockOut::Chain(&chain[..self.n]));
            return Ok(());
        }
        if let Some(kern) = self.gemm_kernel() {
            let mode = GemmMode::Norm {
                nw: &layer.norm1,
                eps: cfg.norm_eps,
            };
            self.gemm(
                kern,
                in_proj,
                mode,
                self.residual_input(),
                d,
                &io.gu,
                3 * d,
                0,
            )?;
            // The gated inputs [rows, 3 hidden] go to `gu`, free until the
            // feed-forward block.
            let ends = self.t.gemm.as_ref().and_then(|g| g.1[li]);
            let ends = ends.expect("a conv layer's block ends");
            let table = io.prefill_rows.as_ref().expect("made with the GEMM");
            let (_, tiles) = PrefillRows::most_blocks(self.n, self.n);
            let conv = llm_ops::short_conv_rows(
                g,
                &io.gu,
                conv,
                st,
                table,
                &io.conv_out,
                ends,
                d,
                cfg.conv_kernel,
                ring,
                self.n,
                tiles,
            )?;
            self.ops.push(Op::Fixed(conv));
            self.y = Some(BlockOut::Rows(&io.conv_out));
            return Ok(());
        }
        let cols = self.cols(d, d);
        self.fixed(llm_ops::gemv_cols(
            g,
            in_proj,
            &epi(&io.rows),
            &io.x,
            0,
            &io.conv_out,
            0,
            cols,
        )?);
        self.y = Some(BlockOut::Rows(&io.conv_out));
        Ok(())
    }

    fn ffn(&mut self, li: usize) -> Result<()> {
        let (m, io) = (self.t.m, self.t.io);
        let (g, cfg) = (&*m.gpu, &m.cfg);
        let (layer, eps, act, f) = (&m.layers[li], cfg.norm_eps, cfg.ffn_act, cfg.ffn);
        match &layer.ffn {
            GpuFfn::Fused(mat) => {
                let epi = GemvEpilogue::Swiglu {
                    nw: &layer.norm2,
                    eps,
                    act,
                };
                let cols = self.cols(cfg.hidden, f);
                if let Some(kern) = self.gemm_kernel() {
                    // Its output in f16 pairs where the down projection is a
                    // GEMM that can read them so.
                    let half = io.gh.as_ref().filter(|_| {
                        layer.post_ffn_norm.is_none() && m.gated_f16_out(mat, self.n, false)
                    });
                    let mode = GemmMode::NormSwiglu {
                        nw: &layer.norm2,
                        eps,
                        act,
                        f16_out: half.is_some(),
                    };
                    let x = self.residual_input();
                    let out = half.unwrap_or(&io.g);
                    self.gemm(kern, mat, mode, x, cfg.hidden, out, f, 0)?;
                    self.y = Some(match half {
                        Some(gh) => BlockOut::Half(gh),
                        None => BlockOut::Rows(&io.g),
                    });
                    return Ok(());
                }
                self.fixed(llm_ops::gemv_cols(g, mat, &epi, &io.x, 0, &io.g, 0, cols)?);
            }
            GpuFfn::Split(gate, up) => {
                let norm2 = GemvEpilogue::Norm {
                    nw: &layer.norm2,
                    eps,
                };
                let cols = self.cols(cfg.hidden, 2 * f);
                self.fixed(llm_ops::gemv_cols(
                    g, gate, &norm2, &io.x, 0, &io.gu, 0, cols,
                )?);
                self.fixed(llm_ops::gemv_cols(
                    g, up, &norm2, &io.x, 0, &io.gu, f, cols,
                )?);
                self.ops.push(Op::Fixed(llm_ops::swiglu(
                    g, &io.gu, &io.g, f, self.n, act,
                )?));
            }
        }
        self.y = Some(BlockOut::Rows(&io.g));
        Ok(())
    }

    fn residual(&mut self, li: usize, which: Residual) -> Result<()> {
        let (m, io) = (self.t.m, self.t.io);
        let (g, sub, cfg) = (&*m.gpu, m.subgroups, &m.cfg);
        let layer = &m.layers[li];
        let (w, post) = layer.residual(which);
        let y = self.y.take().expect("a block ran before its projection");
        let d = cfg.hidden;
        // Into the residual stream, or, before a post-norm, into `mix`.
        let (epi, out) = match post {
            None => (GemvEpilogue::Add, &io.x),
            Some(_) => (GemvEpilogue::Store, &io.mix),
        };
        match y {
            BlockOut::Half(y) => {
                let kern = self.gemm_kernel().expect("f16 rows come from a GEMM");
                self.gemm_add(kern, w, GemmInput::F16(y))?;
            }
            BlockOut::Rows(y) => {
                let cols = self.cols(w.k, d);
                match (self.gemm_kernel(), post) {
                    (Some(kern), None) => self.gemm_add(kern, w, y.into())?,
                    _ => {
                        self.fixed(llm_ops::gemv_cols(g, w, &epi, y, 0, out, 0, cols)?);
                        self.xh_current = false;
                    }
                }
            }
            BlockOut::Chain(rows) => {
                self.xh_current = false;
                for (j, row) in rows.iter().enumerate() {
                    self.fixed(llm_ops::gemv_cols(
                        g,
                        w,
                        &epi,
                        &row.conv_out,
                        0,
                        out,
                        j * d,
                        ONE,
                    )?);
                }
            }
        }
        if let Some(pw) = post {
            let variant = super::decode::norm_add_variant(sub);
            let add = ops::rms_norm(g, &variant, &io.mix, pw, &io.x, d, self.n, cfg.norm_eps)?;
            self.ops.push(Op::Fixed(add));
            self.xh_current = false;
        }
        Ok(())
    }

    fn head(&mut self) -> Result<()> {
        let (m, io) = (self.t.m, self.t.io);
        let head = GemvEpilogue::Norm {
            nw: &m.final_norm,
            eps: m.cfg.norm_eps,
        };
        let cols = self.cols(m.cfg.hidden, m.cfg.vocab);
        if let Some(kern) = self.gemm_kernel() {
            let mode = GemmMode::Norm {
                nw: &m.final_norm,
                eps: m.cfg.norm_eps,
            };
            let (d, v) = (m.cfg.hidden, m.cfg.vocab);
            let x = self.residual_input();
            return self.gemm(kern, m.head(), mode, x, d, &io.logits, v, 0);
        }
        self.fixed(llm_ops::gemv_cols(
            &m.gpu,
            m.head(),
            &head,
            &io.x,
            0,
            &io.logits,
            0,
            cols,
        )?);
        Ok(())
    }
}

/// Computes `tokens` as a prompt: a single token too is a prefill of one
/// row (as `forward` runs the last piece of a prompt one past its chunks),
/// not a decode step, whose rounding differs.
fn prompt_forward(m: &mut GpuLlm, tokens: &[u32]) -> Result<Vec<f32>> {
    if let [_] = tokens {
        m.check_tokens(tokens)?;
        m.prefill(tokens, false, true)
    } else {
        m.forward(tokens, false)
    }
}

/// The token of each row of a greedy step's readback ([index, flag] pairs).
pub(super) fn row_tokens(bytes: &[u8]) -> Result<Vec<u32>> {
    bytes.chunks_exact(8).map(super::greedy_token).collect()
}

impl BatchedLm for GpuBatch {
    /// The context is what one sequence may hold.
    fn config(&self) -> &LlmConfig {
        &self.cfg
    }

    fn max_sequences(&self) -> usize {
        self.seqs.len()
    }

    fn open(&mut self, prompt: &[u32]) -> Result<Option<(SeqId, usize)>> {
        if prompt.is_empty() {
            return Err(Error::invalid("the prompt is empty"));
        }
        if prompt.len() + 1 > self.max_len {
            return Err(Error::invalid(format!(
                "a prompt of {} tokens does not fit the {} positions a batched sequence may hold",
                prompt.len(),
                self.max_len
            )));
        }
        let Some(slot) = self.seqs.iter().position(Option::is_none) else {
            return Ok(None);
        };
        // Blocks the single model computed must be in the cache before
        // another sequence may read them.
        self.sync();
        // Every cached block continues: its conv ends are kept with it.
        let (table, prefix_hash) = self.pool.lookup_prefix(prompt, |_, _| true);
        let reserve = blocks_for(prompt.len() + 1) - table.len();
        if !self.pool.reserve(reserve) {
            for b in table {
                self.pool.release(b);
            }
            return Ok(None);
        }
        self.start_rings(slot, table.last().copied(), table.len() * BLOCK);
        let n = table.len() * BLOCK;
        let id = self.next_id;
        self.next_id += 1;
        self.seqs[slot] = Some(Seq {
            id,
            pos: n,
            registered: table.len(),
            table,
            reserved: reserve,
            prefix: prompt[..n].to_vec(),
            prefix_hash,
        });
        Ok(Some((id, n)))
    }

    fn blocks_needed(&self, id: SeqId, n: usize) -> usize {
        self.slot_of(id).map_or(0, |slot| {
            let s = self.seq(slot);
            let more = blocks_for(s.pos + n).saturating_sub(s.table.len());
            more.saturating_sub(s.reserved)
        })
    }

    fn free_blocks(&self) -> usize {
        self.pool.available()
    }

    /// The sequence's full prompt blocks stay cached as a prefix.
    fn close(&mut self, id: SeqId) {
        let Ok(slot) = self.slot_of(id) else { return };
        if self.held.is_some_and(|h| h.id == id) {
            // Rows of its prefix may not be in its blocks yet.
            self.release();
        }
        self.drop_seq(slot);
    }

    fn step(&mut self, work: &[SeqWork]) -> Result<Vec<Vec<f32>>> {
        let mut out: Vec<Vec<f32>> = vec![Vec::new(); work.len()];
        let mut rows = Vec::new();
        let mut at = Vec::new();
        // Prompt chunks, (work index, slot, tokens): those that extend their
        // sequence's prefix, and the rest.
        let mut extend = Vec::new();
        let mut rest = Vec::new();
        for (i, w) in work.iter().enumerate() {
            let slot = self.slot_of(w.id)?;
            match w.tokens {
                [] => return Err(Error::invalid("forward: no tokens")),
                [t] if w.as_decode => {
                    rows.push((slot, *t));
                    at.push(i);
                }
                tokens if w.as_decode => {
                    out[i] = self.on_single(slot, tokens.len(), |m| {
                        let mut last = Vec::new();
                        for t in tokens {
                            last = m.forward(&[*t], false)?;
                        }
                        Ok(last)
                    })?;
                }
                tokens => {
                    // A prompt chunk right after the prefix extends it.
                    let seq = self.seq(slot);
                    if seq.prefix.len() == seq.pos {
                        extend.push((i, slot, tokens));
                    } else {
                        rest.push((i, slot, tokens));
                    }
                }
            }
        }
        if !extend.is_empty() {
            let parts: Vec<_> = extend.iter().map(|&(_, slot, t)| (slot, t)).collect();
            for (&(i, slot, head), logits) in extend.iter().zip(self.prompts(&parts, true)?) {
                out[i] = logits;
                let seq = self.seqs[slot].as_mut().expect("open slot");
                seq.prefix.extend_from_slice(head);
                self.register_full(slot);
            }
        }
        if !rest.is_empty() {
            let parts: Vec<_> = rest.iter().map(|&(_, slot, t)| (slot, t)).collect();
            for (&(i, ..), logits) in rest.iter().zip(self.prompts(&parts, false)?) {
                out[i] = logits;
            }
        }
        if let ([(slot, token)], [i]) = (rows.as_slice(), at.as_slice()) {
            // One decode row and no prompt in the step: the single path's
            // kernels, as `generate` runs them (bit-equal to a batched row,
            // and faster for one).
            if rows.len() == work.len() {
                let (slot, token) = (*slot, *token);
                out[*i] = self.on_single(slot, 1, |m| m.forward(&[token], false))?;
                return Ok(out);
            }
        }
        if !rows.is_empty() {
            let vocab = self.m.cfg.vocab;
            let bytes = self.decode_rows(&rows, Want::Logits)?;
            let logits: &[f32] = bytemuck::cast_slice(&bytes);
            for (j, &i) in at.iter().enumerate() {
                out[i] = logits[j * vocab..(j + 1) * vocab].to_vec();
            }
        }
        Ok(out)
    }

    fn usage(&self) -> BlockUsage {
        self.pool.usage()
    }

    /// vLLM's budget for its API server on large GPUs: many streams'
    /// prompts arriving together are prefilled in one step, not queued
    /// behind one another across steps that also carry the running streams
    /// (64 streams through HTTP on an H100: 19,108-19,944 tok/s, against
    /// 15,256-16,776 with 2048; BENCHMARKS.md, thirty-fourth session). The
    /// prefill's buffers do not grow with it: a step's prompts run in
    /// passes of the prefill chunk.
    fn default_step_tokens(&self) -> usize {
        8192
    }

    fn start_profile(&mut self) -> Result<bool> {
        // Fails here, not mid-run, on an adapter without timestamps.
        PassTimer::new(&self.m.gpu, 2)?;
        self.profile = Some(StepProfile {
            what: "batched decode step".to_string(),
            ..Default::default()
        });
        Ok(true)
    }

    fn take_profile(&mut self) -> Option<StepProfile> {
        self.profile.take().map(StepProfile::finish)
    }

    fn backend_name(&self) -> &'static str {
        "gpu"
    }

    fn step_sampled(
        &mut self,
        id: SeqId,
        token: u32,
        sampler: &mut Sampler,
        history: &[u32],
    ) -> Option<Result<u32>> {
        let mut run = || -> Result<u32> {
            let slot = self.slot_of(id)?;
            self.on_single(slot, 1, |m| {
                if sampler.is_greedy() {
                    m.step_greedy(token)
                } else {
                    m.step_sample(token, sampler, history)
                }
            })
        };
        Some(run())
    }

    fn greedy_run(
        &mut self,
        id: SeqId,
        token: u32,
        max: usize,
        emit: &mut dyn FnMut(u32) -> bool,
    ) -> Option<Result<usize>> {
        let mut run = || -> Result<usize> {
            let slot = self.slot_of(id)?;
            // The last produced token is not consumed: max fits when max
            // positions do, in the sequence's own blocks and free ones.
            let s = self.seq(slot);
            let blocks = s.table.len() + s.reserved + self.pool.available();
            let room = self.max_len.min(blocks * BLOCK).saturating_sub(s.pos);
            let max = max.min(room).max(1);
            let ran = self.on_single(slot, max, |m| m.greedy_run(token, max, emit));
            if ran.is_ok() {
                self.trim(slot);
            }
            ran
        };
        Some(run())
    }

    fn greedy_run_many(
        &mut self,
        rows: &[(SeqId, u32)],
        max: usize,
        emit: &mut dyn FnMut(&[u32]) -> bool,
    ) -> Option<Result<usize>> {
        if rows.len() < 2 || self.profile.is_some() {
            // A batch of one runs ahead on the single path (greedy_run);
            // profiled steps go one at a time.
            return None;
        }
        let mut run = || -> Result<usize> {
            let slots = rows
                .iter()
                .map(|&(id, _)| self.slot_of(id))
                .collect::<Result<Vec<_>>>()?;
            let tokens: Vec<u32> = rows.iter().map(|r| r.1).collect();
            self.greedy_rows(&slots, &tokens, max, emit)
        };
        Some(run())
    }

    fn step_greedy_many(&mut self, rows: &[(SeqId, u32)]) -> Option<Result<Vec<u32>>> {
        let mut run = || -> Result<Vec<u32>> {
            let rows = rows
                .iter()
                .map(|&(id, t)| Ok((self.slot_of(id)?, t)))
                .collect::<Result<Vec<_>>>()?;
            if let [(slot, token)] = rows[..] {
                // A batch of one on the single path's kernels.
                return Ok(vec![self.on_single(slot, 1, |m| m.step_greedy(token))?]);
            }
            row_tokens(&self.decode_rows(&rows, Want::Tokens)?)
        };
        Some(run())
    }

    fn draws_on_device(&self) -> bool {
        true
    }

    fn candidates_on_device(&self) -> usize {
        candidates_per_row(self.m.cfg.vocab)
    }

    fn step_candidates_many(
        &mut self,
        rows: &[(SeqId, u32, usize)],
    ) -> Option<Result<Vec<Candidates>>> {
        let mut run = || -> Result<Vec<Candidates>> {
            let slots = rows
                .iter()
                .map(|&(id, t, _)| Ok((self.slot_of(id)?, t)))
                .collect::<Result<Vec<_>>>()?;
            let k = candidates_per_row(self.m.cfg.vocab);
            let raw: Vec<u32> =
                bytemuck::pod_collect_to_vec(&self.decode_rows(&slots, Want::Candidates)?);
            raw.chunks_exact(2 * k)
                .zip(rows)
                .map(|(row, &(_, _, keep))| super::best_finite_candidates(row, keep))
                .collect()
        };
        Some(run())
    }

    fn step_drawn_many(&mut self, rows: &[(SeqId, u32, Draw)]) -> Option<Result<Vec<u32>>> {
        let mut run = || -> Result<Vec<u32>> {
            let slots = rows
                .iter()
                .map(|&(id, t, _)| Ok((self.slot_of(id)?, t)))
                .collect::<Result<Vec<_>>>()?;
            if let [(slot, token)] = slots[..] {
                // A batch of one on the single path's kernels.
                let draw = rows[0].2;
                return Ok(vec![self.on_single(slot, 1, |m| m.step_drawn(token, draw))?]);
            }
            let draws: Vec<f32> = rows.iter().flat_map(|r| r.2.to_gpu()).collect();
            self.m
                .gpu
                .queue
                .write_buffer(&self.io.draws, 0, bytemuck::cast_slice(&draws));
            row_tokens(&self.decode_rows(&slots, Want::Drawn)?)
        };
        Some(run())
    }
}
