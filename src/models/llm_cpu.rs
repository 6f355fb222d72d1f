//! The CPU forward of the decoder recipe ([`super::recipe`]): the reference
//! every GPU kernel is checked against, and (with int8 activations) the
//! tools' CPU backend.
//!
//! One pass runs any number of sequences at once (*segments*: a prompt
//! chunk, or one decode token each): the projections see every row together,
//! so a batched decode step reads each weight row once for all sequences,
//! while attention and the short convolution run per sequence on its own
//! state. Keys and values live in a paged cache ([`super::kv_blocks`]):
//! position p of a sequence is row `table[p / BLOCK] * BLOCK + p % BLOCK`.
//! A single-token row is computed exactly as it would be alone, so a
//! sequence's tokens do not depend on what else shares its step.

use super::batch::{BatchedLm, SeqId, SeqWork};
use super::kv_blocks::{blocks_for, chain, BlockPool, BlockUsage, BLOCK};
use super::llm::{
    attn_shape, check_truncate, conv_ring_rows, conv_rows_kept, ring_row, CausalLm, LayerKind,
    LayerState, LlmConfig, Mixer, SeqState, Weights, REWIND_DEPTH,
};
use super::recipe::{self, DecoderOps, Residual};
use crate::cpu;
use crate::error::{Error, Result};
use crate::tensor::{self, Activations, Tensor};
use crate::util::par;
use std::collections::{BTreeMap, HashMap};

/// Observer of named intermediate activations (`"layer.3.conv_out"`), for
/// finding the first op where two backends diverge. Nothing is formatted or
/// copied when no tap is set.
pub type Tap = Box<dyn FnMut(&str, &[f32]) + Send>;

/// Keys and values of the attention layers, [blocks * BLOCK, kv_heads *
/// head_dim] each, for the blocks a [`BlockPool`] hands out.
struct KvStore {
    kvw: usize,
    /// Per layer; None for conv layers.
    layers: Vec<Option<(Vec<f32>, Vec<f32>)>>,
}

impl KvStore {
    fn new(cfg: &LlmConfig) -> KvStore {
        let layers = cfg
            .layers
            .iter()
            .map(|k| (*k == LayerKind::Attention).then(|| (Vec::new(), Vec::new())))
            .collect();
        KvStore {
            kvw: cfg.kv_heads * cfg.head_dim,
            layers,
        }
    }

    /// Makes room for block ids below `blocks`.
    fn cover(&mut self, blocks: usize) {
        let len = blocks * BLOCK * self.kvw;
        for (k, v) in self.layers.iter_mut().flatten() {
            if k.len() < len {
                k.resize(len, 0.0);
                v.resize(len, 0.0);
            }
        }
    }
}

/// Row of position `p` in a paged cache with block table `table`.
fn cache_row(table: &[u32], p: usize) -> usize {
    table[p / BLOCK] as usize * BLOCK + p % BLOCK
}

/// One sequence's state: its blocks, position and conv states.
#[derive(Clone, Default)]
struct SeqCache {
    table: Vec<u32>,
    pos: usize,
    /// Per layer: the gated inputs B*x of the convolution as a ring
    /// ([`conv_ring_rows`] rows of `[hidden]`, position q in row q % rows,
    /// so a sequence can be rewound); empty for attention layers.
    conv: Vec<Vec<f32>>,
}

impl SeqCache {
    fn new(cfg: &LlmConfig) -> SeqCache {
        let hist = conv_ring_rows(cfg.conv_kernel) * cfg.hidden;
        SeqCache {
            table: Vec::new(),
            pos: 0,
            conv: cfg
                .layers
                .iter()
                .map(|k| match k {
                    LayerKind::Attention => Vec::new(),
                    LayerKind::Conv => vec![0.0; hist],
                })
                .collect(),
        }
    }
}

/// The gated inputs of the `hist` positions before `pos`, oldest first
/// ([hist, hidden]), from a conv ring.
fn ring_history(ring: &[f32], pos: usize, hist: usize, d: usize) -> Vec<f32> {
    let rows = ring.len() / d;
    (1..=hist)
        .rev()
        .flat_map(|back| {
            let r = ring_row(pos, back, rows);
            ring[r * d..(r + 1) * d].iter().copied()
        })
        .collect()
}

/// Writes `history` ([hist, hidden], the inputs of the positions before
/// `pos`, oldest first) into a conv ring.
fn set_ring_history(ring: &mut [f32], pos: usize, history: &[f32], d: usize) {
    let rows = ring.len() / d;
    let hist = history.len() / d;
    for (i, back) in (1..=hist).rev().enumerate() {
        let r = ring_row(pos, back, rows);
        ring[r * d..(r + 1) * d].copy_from_slice(&history[i * d..(i + 1) * d]);
    }
}

/// What the weights and the cache are shared by: everything but the
/// sequences.
struct Engine {
    cfg: LlmConfig,
    w: Weights,
    act: Activations,
    pool: BlockPool,
    kv: KvStore,
    tap: Option<Tap>,
}

/// A sequence's part of one pass.
struct Segment {
    /// Its first row among the pass's tokens, and how many.
    start: usize,
    n: usize,
    state: SeqCache,
    all_logits: bool,
    /// Every row as a decode step computes it (else as a prompt).
    as_decode: bool,
    /// Conv states at the block boundaries this segment crosses (position
    /// -> per-layer state), for the prefix cache of hybrid models.
    snaps: Option<BTreeMap<usize, Vec<Vec<f32>>>>,
}

impl Engine {
    fn new(cfg: LlmConfig, w: Weights, blocks: usize) -> Engine {
        let kv = KvStore::new(&cfg);
        Engine {
            cfg,
            w,
            act: Activations::F32,
            pool: BlockPool::new(blocks),
            kv,
            tap: None,
        }
    }

    /// Decode products with their input treated as `act` says; int8 ones
    /// over the layers' matrices repacked for them.
    fn set_activations(&mut self, act: Activations) {
        self.act = act;
        if act == Activations::Int8 {
            self.w.repack_rows8();
        }
    }

    fn check_tokens(&self, tokens: &[u32]) -> Result<()> {
        if let Some(&tok) = tokens.iter().find(|&&t| t as usize >= self.cfg.vocab) {
            return Err(Error::invalid(format!(
                "token id {tok} is outside the {}-token vocabulary",
                self.cfg.vocab
            )));
        }
        Ok(())
    }

    /// Gives `state` the blocks `extra` more positions need, out of the
    /// `reserved` ones promised to it first.
    fn grow(&mut self, state: &mut SeqCache, extra: usize, reserved: &mut usize) -> Result<()> {
        let need = blocks_for(state.pos + extra);
        while state.table.len() < need {
            let promised = *reserved > 0;
            let id = self
                .pool
                .allocate(promised)
                .ok_or_else(|| Error::invalid("the KV cache is full (every block is in use)"))?;
            if promised {
                *reserved -= 1;
            }
            state.table.push(id);
        }
        self.kv.cover(self.pool.created());
        Ok(())
    }

    /// Runs the recipe over `segs` (their tokens concatenated in `tokens`)
    /// and returns the logits each segment asked for, in order.
    fn pass(&mut self, tokens: &[u32], segs: &mut [Segment]) -> Result<Vec<f32>> {
        let n = tokens.len();
        let d = self.cfg.hidden;
        let mut pass = CpuPass {
            cfg: &self.cfg,
            w: &self.w,
            kv: &mut self.kv,
            tap: &mut self.tap,
            act: self.act,
            tokens,
            segs,
            x: vec![0.0; n * d],
            h: vec![0.0; n * d],
            y: Vec::new(),
            logits: Vec::new(),
        };
        let cfg = &self.cfg;
        par::in_pool(|| recipe::decoder(cfg, &mut pass))?;
        let logits = std::mem::take(&mut pass.logits);
        for s in segs.iter_mut() {
            s.state.pos += s.n;
        }
        Ok(logits)
    }
}

/// The CPU forward of one sequence: the reference, or with
/// [`Activations::Int8`] the faster decode of the CLI tools.
pub struct CpuLlm {
    engine: Engine,
    seq: SeqCache,
    /// The furthest position reached since the last reset: the conv rings
    /// hold the inputs of the [`conv_ring_rows`] positions before it.
    high: usize,
}

impl CpuLlm {
    /// The reference: every product in f32.
    pub fn new(cfg: LlmConfig, w: Weights) -> CpuLlm {
        let blocks = blocks_for(cfg.context);
        let seq = SeqCache::new(&cfg);
        CpuLlm {
            engine: Engine::new(cfg, w, blocks),
            seq,
            high: 0,
        }
    }

    /// Decode products with their input treated as `act` says (prefill's
    /// matrix products stay f32; the vocabulary projection of an int8 run
    /// takes 16-bit inputs).
    pub fn with_activations(mut self, act: Activations) -> CpuLlm {
        self.engine.set_activations(act);
        self
    }

    pub fn set_tap(&mut self, tap: Option<Tap>) {
        self.engine.tap = tap;
    }
}

impl CausalLm for CpuLlm {
    fn config(&self) -> &LlmConfig {
        &self.engine.cfg
    }

    fn position(&self) -> usize {
        self.seq.pos
    }

    fn reset(&mut self) {
        for &b in &self.seq.table {
            self.engine.pool.release(b);
        }
        self.seq = SeqCache::new(&self.engine.cfg);
        self.high = 0;
    }

    fn forward(&mut self, tokens: &[u32], all_logits: bool) -> Result<Vec<f32>> {
        self.run(tokens, all_logits, tokens.len() == 1)
    }

    fn forward_verify(&mut self, tokens: &[u32]) -> Result<Vec<f32>> {
        self.run(tokens, true, true)
    }

    fn truncate(&mut self, pos: usize) -> Result<()> {
        if pos == 0 {
            self.reset();
            return Ok(());
        }
        check_truncate(pos, self.seq.pos, self.min_truncate_pos())?;
        self.high = self.high.max(self.seq.pos);
        // Keys and values past `pos` are overwritten as the sequence grows
        // again; conv rows of positions before 0 must read zeros.
        let d = self.engine.cfg.hidden;
        let hist = self.engine.cfg.conv_kernel.saturating_sub(1);
        for ring in self.seq.conv.iter_mut().filter(|r| !r.is_empty()) {
            let rows = ring.len() / d;
            for back in pos + 1..=hist {
                let r = ring_row(pos, back, rows);
                ring[r * d..(r + 1) * d].fill(0.0);
            }
        }
        self.seq.pos = pos;
        Ok(())
    }

    fn min_truncate_pos(&self) -> usize {
        if self.engine.cfg.layers.contains(&LayerKind::Conv) {
            self.high.max(self.seq.pos).saturating_sub(REWIND_DEPTH)
        } else {
            0
        }
    }

    fn export_state(&mut self) -> Result<SeqState> {
        let cfg = &self.engine.cfg;
        let (kvw, d) = (cfg.kv_heads * cfg.head_dim, cfg.hidden);
        let pos = self.seq.pos;
        let rows = conv_ring_rows(cfg.conv_kernel);
        let keep = conv_rows_kept(rows, self.high.max(pos), pos);
        let layers = cfg
            .layers
            .iter()
            .enumerate()
            .map(|(li, kind)| match kind {
                LayerKind::Attention => {
                    let (kc, vc) = self.engine.kv.layers[li].as_ref().expect("attention cache");
                    let (mut k, mut v) =
                        (Vec::with_capacity(pos * kvw), Vec::with_capacity(pos * kvw));
                    for p in 0..pos {
                        let r = cache_row(&self.seq.table, p) * kvw;
                        k.extend_from_slice(&kc[r..r + kvw]);
                        v.extend_from_slice(&vc[r..r + kvw]);
                    }
                    LayerState::Kv { k, v }
                }
                LayerKind::Conv => LayerState::Conv(ring_history(&self.seq.conv[li], pos, keep, d)),
            })
            .collect();
        Ok(SeqState { pos, layers })
    }

    fn import_state(&mut self, st: &SeqState) -> Result<()> {
        self.reset();
        st.check(&self.engine.cfg, "import_state")?;
        let (kvw, d) = (
            self.engine.cfg.kv_heads * self.engine.cfg.head_dim,
            self.engine.cfg.hidden,
        );
        let rows = conv_ring_rows(self.engine.cfg.conv_kernel);
        let mut state = SeqCache::new(&self.engine.cfg);
        self.engine.grow(&mut state, st.pos, &mut 0)?;
        let mut kept = rows;
        for (li, l) in st.layers.iter().enumerate() {
            match l {
                LayerState::Kv { k, v } => {
                    let (kc, vc) = self.engine.kv.layers[li].as_mut().expect("attention cache");
                    for p in 0..st.pos {
                        let r = cache_row(&state.table, p) * kvw;
                        kc[r..r + kvw].copy_from_slice(&k[p * kvw..(p + 1) * kvw]);
                        vc[r..r + kvw].copy_from_slice(&v[p * kvw..(p + 1) * kvw]);
                    }
                }
                LayerState::Conv(src) => {
                    let have = (src.len() / d).min(rows);
                    kept = kept.min(have);
                    set_ring_history(&mut state.conv[li], st.pos, &src[src.len() - have * d..], d);
                }
            }
        }
        state.pos = st.pos;
        self.seq = state;
        // Rows before the imported ones are not this sequence's.
        self.high = st.pos + rows - kept;
        Ok(())
    }
}

impl CpuLlm {
    /// The forward over `tokens`; `as_decode` computes every product as a
    /// single-token decode does (see [`CausalLm::forward_verify`]).
    fn run(&mut self, tokens: &[u32], all_logits: bool, as_decode: bool) -> Result<Vec<f32>> {
        let n = tokens.len();
        if n == 0 {
            return Err(Error::invalid("forward: no tokens"));
        }
        let context = self.engine.cfg.context;
        if self.seq.pos + n > context {
            return Err(Error::invalid(format!(
                "sequence of {} tokens exceeds the model's context of {context}",
                self.seq.pos + n
            )));
        }
        self.engine.check_tokens(tokens)?;
        let mut state = std::mem::take(&mut self.seq);
        let grown = self.engine.grow(&mut state, n, &mut 0);
        let mut segs = [Segment {
            start: 0,
            n,
            state,
            all_logits,
            as_decode,
            snaps: None,
        }];
        let out = grown.and_then(|_| self.engine.pass(tokens, &mut segs));
        let [seg] = segs;
        self.seq = seg.state;
        self.high = self.high.max(self.seq.pos);
        out
    }
}

/// A sequence of [`CpuBatch`].
struct BatchSeq {
    state: SeqCache,
    /// Every token consumed, for keying its full blocks.
    tokens: Vec<u32>,
    /// Blocks promised to it and not yet taken.
    reserved: usize,
    /// Full blocks already offered to the prefix cache, and the hash of
    /// the prefix they end.
    registered: usize,
    prefix_hash: u64,
    /// Positions computed as a prompt from the start; only blocks below
    /// it are offered to the prefix cache, so that a prefix taken from
    /// the cache holds what computing the prompt alone would.
    prompt_end: usize,
}

/// Many sequences on the CPU: continuous batching's backend.
pub struct CpuBatch {
    engine: Engine,
    seqs: HashMap<SeqId, BatchSeq>,
    next_id: SeqId,
    /// Per block, the conv states at its end (hybrid models), which a
    /// sequence that reuses the block continues from.
    conv_at_block: HashMap<u32, Vec<Vec<f32>>>,
    has_conv: bool,
}

impl CpuBatch {
    /// A batch backend with room for `kv_positions` cached positions in all.
    pub fn new(cfg: LlmConfig, w: Weights, act: Activations, kv_positions: usize) -> CpuBatch {
        let has_conv = cfg.layers.contains(&LayerKind::Conv);
        let mut engine = Engine::new(cfg, w, blocks_for(kv_positions).max(1));
        engine.set_activations(act);
        CpuBatch {
            engine,
            seqs: HashMap::new(),
            next_id: 1,
            conv_at_block: HashMap::new(),
            has_conv,
        }
    }

    /// Offers the sequence's newly full blocks to the prefix cache.
    fn register_full(&mut self, id: SeqId, snaps: Option<BTreeMap<usize, Vec<Vec<f32>>>>) {
        let seq = self.seqs.get_mut(&id).expect("a running sequence");
        let full = seq.prompt_end / BLOCK;
        let mut snaps = snaps.unwrap_or_default();
        while seq.registered < full {
            let b = seq.registered;
            let id = seq.state.table[b];
            let end = (b + 1) * BLOCK;
            let tokens = &seq.tokens[b * BLOCK..end];
            if self.has_conv {
                // A hybrid model resumes a prefix only with its conv state.
                let Some(conv) = snaps.remove(&end) else {
                    seq.registered = full;
                    break;
                };
                if self.engine.pool.register(id, seq.prefix_hash, tokens) {
                    self.conv_at_block.insert(id, conv);
                }
            } else {
                self.engine.pool.register(id, seq.prefix_hash, tokens);
            }
            seq.prefix_hash = chain(seq.prefix_hash, tokens);
            seq.registered += 1;
        }
    }
}

impl BatchedLm for CpuBatch {
    fn config(&self) -> &LlmConfig {
        &self.engine.cfg
    }

    fn max_sequences(&self) -> usize {
        usize::MAX
    }

    fn open(&mut self, prompt: &[u32]) -> Result<Option<(SeqId, usize)>> {
        if prompt.is_empty() {
            return Err(Error::invalid("the prompt is empty"));
        }
        self.engine.check_tokens(prompt)?;
        let mut state = SeqCache::new(&self.engine.cfg);
        // Full blocks of the prompt already computed.
        let (has_conv, conv_at_block, d) =
            (self.has_conv, &self.conv_at_block, self.engine.cfg.hidden);
        let (table, parent) = self.engine.pool.lookup_prefix(prompt, |id, end| {
            if !has_conv {
                return true;
            }
            let Some(conv) = conv_at_block.get(&id) else {
                return false;
            };
            for (ring, history) in state.conv.iter_mut().zip(conv) {
                if !history.is_empty() {
                    set_ring_history(ring, end, history, d);
                }
            }
            true
        });
        state.pos = table.len() * BLOCK;
        state.table = table;
        let reserve = blocks_for(prompt.len() + 1) - state.table.len();
        if !self.engine.pool.reserve(reserve) {
            for &b in &state.table {
                self.engine.pool.release(b);
            }
            return Ok(None);
        }
        let id = self.next_id;
        self.next_id += 1;
        let reused = state.pos;
        let registered = state.table.len();
        self.seqs.insert(
            id,
            BatchSeq {
                state,
                tokens: prompt[..reused].to_vec(),
                reserved: reserve,
                registered,
                prefix_hash: parent,
                prompt_end: reused,
            },
        );
        Ok(Some((id, reused)))
    }

    fn blocks_needed(&self, id: SeqId, n: usize) -> usize {
        self.seqs.get(&id).map_or(0, |s| {
            let more = blocks_for(s.state.pos + n).saturating_sub(s.state.table.len());
            more.saturating_sub(s.reserved)
        })
    }

    fn free_blocks(&self) -> usize {
        self.engine.pool.available()
    }

    fn close(&mut self, id: SeqId) {
        if let Some(seq) = self.seqs.remove(&id) {
            for &b in &seq.state.table {
                self.engine.pool.release(b);
            }
            self.engine.pool.unreserve(seq.reserved);
        }
    }

    fn step(&mut self, work: &[SeqWork]) -> Result<Vec<Vec<f32>>> {
        let mut tokens = Vec::new();
        let mut segs: Vec<Segment> = Vec::with_capacity(work.len());
        let context = self.engine.cfg.context;
        for wk in work {
            self.engine.check_tokens(wk.tokens)?;
            let seq = self
                .seqs
                .get_mut(&wk.id)
                .ok_or_else(|| Error::invalid(format!("no open sequence {}", wk.id)))?;
            if wk.tokens.is_empty() || seq.state.pos + wk.tokens.len() > context {
                return Err(Error::invalid(format!(
                    "sequence {} cannot take {} more tokens at position {} (context {context})",
                    wk.id,
                    wk.tokens.len(),
                    seq.state.pos
                )));
            }
            let mut state = std::mem::take(&mut seq.state);
            let grown = self
                .engine
                .grow(&mut state, wk.tokens.len(), &mut seq.reserved);
            if let Err(e) = grown {
                seq.state = state;
                for (wk, seg) in work.iter().zip(segs) {
                    self.seqs.get_mut(&wk.id).expect("present").state = seg.state;
                }
                return Err(e);
            }
            segs.push(Segment {
                start: tokens.len(),
                n: wk.tokens.len(),
                state,
                all_logits: false,
                as_decode: wk.as_decode,
                snaps: self.has_conv.then(BTreeMap::new),
            });
            tokens.extend_from_slice(wk.tokens);
        }
        let result = self.engine.pass(&tokens, &mut segs);
        let vocab = self.engine.cfg.vocab;
        let mut snaps = Vec::with_capacity(segs.len());
        for (wk, seg) in work.iter().zip(segs) {
            let seq = self.seqs.get_mut(&wk.id).expect("present");
            seq.state = seg.state;
            if result.is_ok() {
                if !wk.as_decode && seq.prompt_end == seq.tokens.len() {
                    seq.prompt_end += wk.tokens.len();
                }
                seq.tokens.extend_from_slice(wk.tokens);
            }
            snaps.push(seg.snaps);
        }
        let logits = result?;
        for (wk, s) in work.iter().zip(snaps) {
            self.register_full(wk.id, s);
        }
        Ok(logits.chunks_exact(vocab).map(|l| l.to_vec()).collect())
    }

    fn usage(&self) -> BlockUsage {
        self.engine.pool.usage()
    }

    fn backend_name(&self) -> &'static str {
        "cpu"
    }
}

/// One forward of the CPU reference over the segments' tokens: the
/// recipe's operations computed at once.
struct CpuPass<'a> {
    cfg: &'a LlmConfig,
    w: &'a Weights,
    kv: &'a mut KvStore,
    tap: &'a mut Option<Tap>,
    act: Activations,
    tokens: &'a [u32],
    segs: &'a mut [Segment],
    /// [n, hidden]: the residual stream.
    x: Vec<f32>,
    /// [n, hidden]: a normed copy of x.
    h: Vec<f32>,
    /// The last block's output before its projection ([n, heads * head_dim]
    /// after attention, [n, hidden] after the conv, [n, ffn] after the
    /// feed-forward).
    y: Vec<f32>,
    logits: Vec<f32>,
}

/// Copies rows `rows` (of `width`) of `src` into one matrix.
fn gather(src: &[f32], width: usize, rows: &[usize]) -> Vec<f32> {
    let mut out = Vec::with_capacity(rows.len() * width);
    for &r in rows {
        out.extend_from_slice(&src[r * width..][..width]);
    }
    out
}

impl CpuPass<'_> {
    fn n(&self) -> usize {
        self.tokens.len()
    }

    /// Rows of single-token segments (decode) and of the others (prefill).
    fn row_kinds(&self) -> (Vec<usize>, Vec<usize>) {
        let (mut one, mut many) = (Vec::new(), Vec::new());
        for s in self.segs.iter() {
            let rows = s.start..s.start + s.n;
            if s.as_decode {
                one.extend(rows);
            } else {
                many.extend(rows);
            }
        }
        (one, many)
    }

    /// y = x W^T over every row: single-token rows as `act` says (each as it
    /// would be alone), prompt rows in f32.
    fn product(&self, w: &Tensor, x: &[f32], y: &mut [f32]) {
        let m = self.n();
        let (one, many) = self.row_kinds();
        if many.is_empty() {
            return tensor::matvec_rows(w, x, m, y, self.act);
        }
        if one.is_empty() {
            return tensor::matmul(w, x, m, y);
        }
        let (k, out) = (w.row_len(), w.rows());
        for (rows, single) in [(one, true), (many, false)] {
            let xs = gather(x, k, &rows);
            let mut ys = vec![0.0f32; rows.len() * out];
            if single {
                tensor::matvec_rows(w, &xs, rows.len(), &mut ys, self.act);
            } else {
                tensor::matmul(w, &xs, rows.len(), &mut ys);
            }
            for (i, &r) in rows.iter().enumerate() {
                y[r * out..][..out].copy_from_slice(&ys[i * out..][..out]);
            }
        }
    }

    /// Several products of the same input (q/k/v, gate/up).
    fn products(&self, ws: &[&Tensor], x: &[f32], ys: &mut [&mut Vec<f32>]) {
        if self.segs.iter().all(|s| s.as_decode) {
            let mut outs: Vec<&mut [f32]> = ys.iter_mut().map(|y| y.as_mut_slice()).collect();
            tensor::matvec_rows_same_input(ws, x, self.n(), &mut outs, self.act);
        } else {
            for (w, y) in ws.iter().zip(ys.iter_mut()) {
                self.product(w, x, y);
            }
        }
    }

    fn tap(&mut self, name: impl FnOnce() -> String, which: &[f32]) {
        if let Some(t) = self.tap.as_mut() {
            t(&name(), which);
        }
    }
}

impl DecoderOps for CpuPass<'_> {
    fn embed(&mut self) -> Result<()> {
        cpu::embedding(&self.w.embed, self.tokens, &mut self.x);
        if self.cfg.embed_scale != 1.0 {
            let s = self.cfg.embed_scale;
            self.x.iter_mut().for_each(|v| *v *= s);
        }
        Ok(())
    }

    fn attention(&mut self, li: usize) -> Result<()> {
        let cfg = self.cfg;
        let (n, hd) = (self.n(), cfg.head_dim);
        let (qw, kvw) = (cfg.heads * hd, cfg.kv_heads * hd);
        let layer = &self.w.layers[li];
        let Mixer::Attention(a) = &layer.mixer else {
            unreachable!("the recipe runs attention on attention layers")
        };
        cpu::rms_norm(&self.x, &layer.norm1, cfg.norm_eps, &mut self.h);
        let (mut q, mut k, mut v) = (vec![0.0; n * qw], vec![0.0; n * kvw], vec![0.0; n * kvw]);
        self.products(&[&a.q, &a.k, &a.v], &self.h, &mut [&mut q, &mut k, &mut v]);
        let shape = attn_shape(cfg, li);
        let freqs = cfg.rope_freqs(cfg.uses_local_rope(li));
        let (kc, vc) = self.kv.layers[li]
            .as_mut()
            .expect("attention layers have a cache");
        self.y = vec![0.0; n * qw];
        // Segments of one new token attend together, in one parallel step
        // after the loop (a batch's decode step: one step, not one a sequence).
        let (mut last_segs, mut last_q, mut last_lens) = (Vec::new(), Vec::new(), Vec::new());
        for (si, s) in self.segs.iter().enumerate() {
            let (sn, pos) = (s.n, s.state.pos);
            let mut qkv = Vec::with_capacity(sn * (qw + 2 * kvw));
            for t in s.start..s.start + sn {
                qkv.extend_from_slice(&q[t * qw..][..qw]);
                qkv.extend_from_slice(&k[t * kvw..][..kvw]);
                qkv.extend_from_slice(&v[t * kvw..][..kvw]);
            }
            let table = cpu::rope_table_freqs(pos, sn, &freqs);
            let (mut q_roped, mut kn, mut vn) =
                (vec![0.0; sn * qw], vec![0.0; sn * kvw], vec![0.0; sn * kvw]);
            cpu::qk_rope(
                &qkv,
                sn,
                &shape,
                a.q_norm.as_deref(),
                a.k_norm.as_deref(),
                a.qkv_bias.as_deref(),
                &table,
                0,
                &mut q_roped,
                &mut kn,
                &mut vn,
            );
            let blocks = &s.state.table;
            for t in 0..sn {
                let r = cache_row(blocks, pos + t) * kvw;
                kc[r..r + kvw].copy_from_slice(&kn[t * kvw..][..kvw]);
                vc[r..r + kvw].copy_from_slice(&vn[t * kvw..][..kvw]);
            }
            if sn == 1 {
                last_segs.push(si);
                last_q.extend_from_slice(&q_roped);
                last_lens.push(pos + 1);
                continue;
            }
            cpu::flash_attention_at(
                &q_roped,
                kc,
                vc,
                sn,
                pos + sn,
                &shape,
                &mut self.y[s.start * qw..(s.start + sn) * qw],
                |p| cache_row(blocks, p),
            );
        }
        if !last_segs.is_empty() {
            let mut out = vec![0.0; last_segs.len() * qw];
            let segs = &self.segs;
            cpu::flash_attention_last(&last_q, kc, vc, &last_lens, &shape, &mut out, |i, p| {
                cache_row(&segs[last_segs[i]].state.table, p)
            });
            for (&si, o) in last_segs.iter().zip(out.chunks_exact(qw)) {
                let r = self.segs[si].start;
                self.y[r * qw..(r + 1) * qw].copy_from_slice(o);
            }
        }
        Ok(())
    }

    fn short_conv(&mut self, li: usize) -> Result<()> {
        let cfg = self.cfg;
        let (n, d) = (self.n(), cfg.hidden);
        let layer = &self.w.layers[li];
        let Mixer::Conv(c) = &layer.mixer else {
            unreachable!("the recipe runs the conv block on conv layers")
        };
        cpu::rms_norm(&self.x, &layer.norm1, cfg.norm_eps, &mut self.h);
        let mut bcx = vec![0.0f32; n * 3 * d];
        self.product(&c.in_proj, &self.h, &mut bcx);
        self.y = vec![0.0f32; n * d];
        let hist = cfg.conv_kernel - 1;
        let layers = cfg.layers.len();
        for s in self.segs.iter_mut() {
            let rows = &bcx[s.start * 3 * d..(s.start + s.n) * 3 * d];
            let pos = s.state.pos;
            let ring = &mut s.state.conv[li];
            let mut state = ring_history(ring, pos, hist, d);
            if let Some(snaps) = s.snaps.as_mut() {
                // The state at a boundary b inside the segment: the gated
                // inputs of positions b - hist .. b.
                let mut seq = state.clone();
                for r in rows.chunks_exact(3 * d) {
                    seq.extend((0..d).map(|i| r[i] * r[2 * d + i]));
                }
                let mut b = (pos / BLOCK + 1) * BLOCK;
                while b <= pos + s.n {
                    let at = (b - pos) * d;
                    let snap = snaps.entry(b).or_insert_with(|| vec![Vec::new(); layers]);
                    snap[li] = seq[at..at + hist * d].to_vec();
                    b += BLOCK;
                }
            }
            cpu::short_conv(
                rows,
                &c.conv,
                cfg.conv_kernel,
                d,
                &mut state,
                &mut self.y[s.start * d..(s.start + s.n) * d],
            );
            // Every new position's gated input into its row (the last
            // `ring_rows` of them).
            let ring_rows = ring.len() / d;
            for t in s.n.saturating_sub(ring_rows)..s.n {
                let (src, r) = (&rows[t * 3 * d..(t + 1) * 3 * d], (pos + t) % ring_rows);
                for (i, o) in ring[r * d..(r + 1) * d].iter_mut().enumerate() {
                    *o = src[i] * src[2 * d + i];
                }
            }
        }
        Ok(())
    }

    fn ffn(&mut self, li: usize) -> Result<()> {
        let cfg = self.cfg;
        let (n, f) = (self.n(), cfg.ffn);
        let layer = &self.w.layers[li];
        cpu::rms_norm(&self.x, &layer.norm2, cfg.norm_eps, &mut self.h);
        let (mut g, mut u) = (vec![0.0f32; n * f], vec![0.0f32; n * f]);
        self.products(&[&layer.gate, &layer.up], &self.h, &mut [&mut g, &mut u]);
        // A prompt's activations in parallel pieces.
        par::for_each_chunk_mut(&mut [&mut g], 1 << 14, |_, start, part| {
            for (g, u) in part.iter_mut().zip(&u[start..]) {
                *g = cpu::ffn_act(cfg.ffn_act, *g) * u;
            }
        });
        self.y = g;
        Ok(())
    }

    fn residual(&mut self, li: usize, which: Residual) -> Result<()> {
        let cfg = self.cfg;
        let (n, d) = (self.n(), cfg.hidden);
        let layer = &self.w.layers[li];
        let (w, post) = layer.residual(which);
        let mut out = vec![0.0f32; n * d];
        self.product(w, &self.y, &mut out);
        if let Some(pw) = post {
            let src = out.clone();
            cpu::rms_norm(&src, pw, cfg.norm_eps, &mut out);
        }
        match which {
            Residual::Mixer => self.tap(|| format!("layer.{li}.mixer_out"), &out),
            Residual::Ffn => self.tap(|| format!("layer.{li}.ffn_out"), &out),
        }
        cpu::add_assign(&mut self.x, &out);
        if which == Residual::Ffn {
            let x = std::mem::take(&mut self.x);
            self.tap(|| format!("layer.{li}.out"), &x);
            self.x = x;
        }
        Ok(())
    }

    fn head(&mut self) -> Result<()> {
        let d = self.cfg.hidden;
        let vocab = self.cfg.vocab;
        let eps = self.cfg.norm_eps;
        // The vocabulary projection never takes 8-bit inputs: rounding the
        // final hidden state (large outliers) to 8 bits moves logits by
        // enough to change SmolLM2's first greedy token
        // (tests/smollm2_reference.rs); the int8 runs give it 16-bit ones.
        let head_act = match self.act {
            Activations::Int8 => Activations::Int16,
            a => a,
        };
        // The last rows of all segments go through one product, each row as
        // a matrix-vector product alone would compute it.
        let last: Vec<usize> = self
            .segs
            .iter()
            .filter(|s| !s.all_logits)
            .map(|s| s.start + s.n - 1)
            .collect();
        let mut normed = vec![0.0f32; last.len() * d];
        cpu::rms_norm(
            &gather(&self.x, d, &last),
            &self.w.final_norm,
            eps,
            &mut normed,
        );
        let mut lasts = vec![0.0f32; last.len() * vocab];
        tensor::matvec_rows(&self.w.head, &normed, last.len(), &mut lasts, head_act);
        let mut next_last = 0;
        for s in self.segs.iter() {
            if s.all_logits {
                let rows = &self.x[s.start * d..(s.start + s.n) * d];
                let mut normed = vec![0.0f32; s.n * d];
                cpu::rms_norm(rows, &self.w.final_norm, eps, &mut normed);
                let mut logits = vec![0.0f32; s.n * vocab];
                if s.as_decode {
                    // Each row as the single-token forward computes it.
                    tensor::matvec_rows(&self.w.head, &normed, s.n, &mut logits, head_act);
                } else {
                    tensor::matmul(&self.w.head, &normed, s.n, &mut logits);
                }
                self.logits.extend_from_slice(&logits);
            } else {
                self.logits
                    .extend_from_slice(&lasts[next_last * vocab..(next_last + 1) * vocab]);
                next_last += 1;
            }
        }
        Ok(())
    }
}
