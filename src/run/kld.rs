//! KL divergence of an arm's next-token distribution from a reference arm's
//! over a text corpus, measured as llama.cpp's perplexity tool measures it
//! with `--kl-divergence`:
//!
//! - the corpus is tokenised once (with BOS when the tokenizer adds one) and
//!   cut into chunks of `ctx` tokens (a partial last chunk is dropped); when
//!   the tokenizer adds BOS, each chunk's first token becomes BOS;
//! - each chunk is evaluated from an empty state, and only its second half
//!   is scored: the distributions at positions `ctx/2 .. ctx-2`, each
//!   predicting the token after it (`ctx - 1 - ctx/2` positions per chunk);
//! - per position: KL(ref || arm) = sum_i p_i (log p_i - log q_i) over the
//!   whole vocabulary, in f64; both arms' negative log-likelihood of the
//!   actual next token (for perplexity); the change in that token's
//!   probability (`q - p`); whether both arms' most likely token agree;
//! - means come with llama.cpp's standard errors; KLD percentiles are
//!   interpolated as llama.cpp does.
//!
//! Reference log-probabilities can be saved once ([`RefWriter`]) and reused
//! ([`RefFile`]); the file format is described at [`REF_MAGIC`]. Saved
//! log-probabilities are quantised to 16 bits, so a run that saves or reuses
//! them computes every statistic from the decoded values (the same numbers
//! either way); a run with neither uses the exact f32 reference.

use crate::error::{Error, Result};
use crate::models::llm::CausalLm;
use crate::quant::GgmlType;
use crate::util::atomic_write::AtomicFile;
use memmap2::Mmap;
use rayon::prelude::*;
use serde::{Deserialize, Serialize};
use std::io::Write;
use std::path::{Path, PathBuf};

/// Where an arm runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ArmDevice {
    Cpu,
    Gpu,
}

/// What an arm's weights are.
#[derive(Clone, Debug, PartialEq)]
pub enum ArmSource {
    /// The model's weights converted to this format on load.
    Type(GgmlType),
    /// Another model file (or HF directory) as stored.
    File(PathBuf),
}

/// An arm: `TYPE[@DEVICE]` or `PATH[@DEVICE]` (`q4_0`, `q4_0@gpu`,
/// `model.gguf@cpu`).
#[derive(Clone, Debug, PartialEq)]
pub struct ArmSpec {
    pub source: ArmSource,
    /// `None`: the tool's default device.
    pub device: Option<ArmDevice>,
}

impl ArmSpec {
    pub fn parse(s: &str) -> Result<ArmSpec> {
        let (what, device) = match s.rsplit_once('@') {
            Some((w, "cpu")) => (w, Some(ArmDevice::Cpu)),
            Some((w, "gpu")) => (w, Some(ArmDevice::Gpu)),
            _ => (s, None),
        };
        if let Some(t) = GgmlType::from_name(what) {
            return Ok(ArmSpec {
                source: ArmSource::Type(t),
                device,
            });
        }
        let path = PathBuf::from(what);
        if path.exists() {
            return Ok(ArmSpec {
                source: ArmSource::File(path),
                device,
            });
        }
        let names: Vec<&str> = GgmlType::ALL.iter().map(|t| t.name()).collect();
        Err(Error::invalid(format!(
            "arm '{s}': neither a weight type ({}) nor an existing model file",
            names.join(", ")
        )))
    }

    /// "q4_0@cpu", "model.gguf@gpu": the arm with the device it ran on.
    pub fn label(&self, device: &str) -> String {
        let what = match &self.source {
            ArmSource::Type(t) => t.name().to_string(),
            ArmSource::File(p) => p.display().to_string(),
        };
        format!("{what}@{device}")
    }
}

/// The corpus cut into chunks.
#[derive(Clone, Debug)]
pub struct Chunks {
    pub ctx: usize,
    /// `count * ctx` tokens, as evaluated (BOS already in place).
    tokens: Vec<u32>,
}

impl Chunks {
    /// Cuts `tokens` into at most `max_chunks` chunks of `ctx`; `bos`
    /// replaces each chunk's first token.
    pub fn new(
        tokens: &[u32],
        ctx: usize,
        max_chunks: Option<usize>,
        bos: Option<u32>,
    ) -> Result<Chunks> {
        if ctx < 4 {
            return Err(Error::invalid(format!(
                "--ctx {ctx} is too short: a chunk needs at least 4 tokens"
            )));
        }
        let available = tokens.len() / ctx;
        if available == 0 {
            return Err(Error::invalid(format!(
                "the corpus is {} tokens, fewer than one chunk of --ctx {ctx}",
                tokens.len()
            )));
        }
        let count = max_chunks.map_or(available, |m| m.clamp(1, available));
        let mut t = tokens[..count * ctx].to_vec();
        if let Some(b) = bos {
            t.chunks_exact_mut(ctx).for_each(|c| c[0] = b);
        }
        Ok(Chunks { ctx, tokens: t })
    }

    pub fn count(&self) -> usize {
        self.tokens.len() / self.ctx
    }

    /// First scored position of a chunk.
    pub fn first(&self) -> usize {
        self.ctx / 2
    }

    /// Scored positions per chunk.
    pub fn scored(&self) -> usize {
        self.ctx - 1 - self.first()
    }

    pub fn chunk(&self, i: usize) -> &[u32] {
        &self.tokens[i * self.ctx..(i + 1) * self.ctx]
    }

    /// The tokens each scored position of chunk `i` predicts.
    pub fn targets(&self, i: usize) -> &[u32] {
        &self.chunk(i)[self.first() + 1..]
    }

    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    /// FNV-1a (64-bit) over the tokens as little-endian u32: identifies the
    /// evaluated token stream in a reference file.
    pub fn fingerprint(&self) -> u64 {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in self.tokens.iter().flat_map(|t| t.to_le_bytes()) {
            h ^= b as u64;
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
        h
    }
}

/// The logits of the scored positions of `chunk`, `[scored, vocab]`, from
/// an empty state: the first half goes in without logits, the rest (all
/// but the last token, which is only a target) with.
pub fn scored_logits(model: &mut dyn CausalLm, chunk: &[u32], first: usize) -> Result<Vec<f32>> {
    model.reset();
    model.forward(&chunk[..first], false)?;
    model.forward(&chunk[first..chunk.len() - 1], true)
}

/// (log-sum-exp, argmax) of a row of logits, summed in f64.
fn lse_argmax(x: &[f32]) -> (f64, usize) {
    let mut best = 0;
    for (i, &v) in x.iter().enumerate() {
        if v > x[best] {
            best = i;
        }
    }
    let max = x[best] as f64;
    let sum: f64 = x.iter().map(|&v| (v as f64 - max).exp()).sum();
    (max + sum.ln(), best)
}

/// The reference's distributions at the scored positions of one chunk:
/// log p = `values - lse`, computed in f64.
#[derive(Clone, Debug, PartialEq)]
pub struct RefChunk {
    pub vocab: usize,
    /// `[positions, vocab]`: the logits (exact reference) or the decoded
    /// log-probabilities (saved reference; `-inf` where a token was left
    /// out, more than 16 nats below the top one).
    pub values: Vec<f32>,
    /// Per position: log-sum-exp of `values` (0 for saved log-probabilities).
    pub lse: Vec<f64>,
    /// Log-probability of the actual next token, exact.
    pub target_logp: Vec<f64>,
    pub argmax: Vec<u32>,
}

/// Saved log-probabilities cover this many nats below each position's top.
const REF_RANGE: f32 = 16.0;
const REF_STEPS: f32 = 65535.0;

impl RefChunk {
    /// From the reference's logits `[positions, vocab]` and the targets.
    pub fn from_logits(logits: &[f32], vocab: usize, targets: &[u32]) -> RefChunk {
        let rows: Vec<(f64, usize)> = logits.par_chunks(vocab).map(lse_argmax).collect();
        RefChunk {
            vocab,
            values: logits.to_vec(),
            target_logp: rows
                .iter()
                .zip(targets)
                .enumerate()
                .map(|(j, (&(lse, _), &t))| logits[j * vocab + t as usize] as f64 - lse)
                .collect(),
            lse: rows.iter().map(|r| r.0).collect(),
            argmax: rows.iter().map(|r| r.1 as u32).collect(),
        }
    }

    pub fn positions(&self) -> usize {
        self.argmax.len()
    }

    /// Bytes of one saved position.
    fn record_bytes(vocab: usize) -> usize {
        16 + 2 * vocab
    }

    /// The saved form: per position the argmax (u32), the target's
    /// log-probability (f64), the top log-probability (f32), then every
    /// token's log-probability as a u16 step of 16/65535 nats above
    /// `top - 16` (0: at or below it, left out).
    pub fn encode(&self) -> Vec<u8> {
        let step = REF_RANGE / REF_STEPS;
        let mut out = Vec::with_capacity(self.positions() * Self::record_bytes(self.vocab));
        for (j, row) in self.values.chunks_exact(self.vocab).enumerate() {
            let lse = self.lse[j];
            let top = (row[self.argmax[j] as usize] as f64 - lse) as f32;
            out.extend_from_slice(&self.argmax[j].to_le_bytes());
            out.extend_from_slice(&self.target_logp[j].to_le_bytes());
            out.extend_from_slice(&top.to_le_bytes());
            let floor = top as f64 - REF_RANGE as f64;
            for &v in row {
                let lp = v as f64 - lse;
                let code = ((lp - floor) / step as f64)
                    .round()
                    .clamp(0.0, REF_STEPS as f64) as u16;
                out.extend_from_slice(&code.to_le_bytes());
            }
        }
        out
    }

    /// The inverse of [`RefChunk::encode`] for `positions` records.
    pub fn decode(bytes: &[u8], vocab: usize) -> RefChunk {
        let rb = Self::record_bytes(vocab);
        let n = bytes.len() / rb;
        let step = REF_RANGE / REF_STEPS;
        let mut c = RefChunk {
            vocab,
            values: Vec::with_capacity(n * vocab),
            lse: vec![0.0; n],
            target_logp: Vec::with_capacity(n),
            argmax: Vec::with_capacity(n),
        };
        let word = |b: &[u8]| u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        for r in bytes.chunks_exact(rb) {
            c.argmax.push(word(&r[0..4]));
            c.target_logp
                .push(f64::from_le_bytes(r[4..12].try_into().expect("8 bytes")));
            let floor = f32::from_bits(word(&r[12..16])) - REF_RANGE;
            c.values.extend(r[16..].chunks_exact(2).map(|b| {
                match u16::from_le_bytes([b[0], b[1]]) {
                    0 => f32::NEG_INFINITY,
                    code => floor + code as f32 * step,
                }
            }));
        }
        c
    }
}

/// One scored position compared.
#[derive(Clone, Copy, Debug)]
pub struct Position {
    pub kld: f64,
    pub nll_ref: f64,
    pub nll_arm: f64,
    /// Probability of the actual next token, arm minus reference.
    pub p_diff: f64,
    pub same_top: bool,
}

/// Compares the arm's logits at position `j` of a reference chunk.
pub fn compare(r: &RefChunk, j: usize, arm_logits: &[f32], target: u32) -> Position {
    let row = &r.values[j * r.vocab..(j + 1) * r.vocab];
    let ref_lse = r.lse[j];
    let (lse, best) = lse_argmax(arm_logits);
    let mut kld = 0.0f64;
    for (&v, &q) in row.iter().zip(arm_logits) {
        if v > f32::NEG_INFINITY {
            let lp = v as f64 - ref_lse;
            kld += lp.exp() * (lp - (q as f64 - lse));
        }
    }
    let nll_ref = -r.target_logp[j];
    let nll_arm = lse - arm_logits[target as usize] as f64;
    Position {
        kld,
        nll_ref,
        nll_arm,
        p_diff: (-nll_arm).exp() - (-nll_ref).exp(),
        same_top: best as u32 == r.argmax[j],
    }
}

/// llama.cpp's `mean_and_uncertainty`: the mean and its standard error
/// (0 for ten values or fewer).
fn mean_se(sum: f64, sum2: f64, n: usize) -> (f64, f64) {
    if n == 0 {
        return (0.0, 0.0);
    }
    let f = sum / n as f64;
    let var = sum2 / n as f64 - f * f;
    let se = if var > 0.0 && n > 10 {
        (var / (n - 1) as f64).sqrt()
    } else {
        0.0
    };
    (f, se)
}

/// llama.cpp's percentile of sorted values: linear interpolation between
/// the two nearest ranks.
fn percentile(sorted: &[f32], fraction: f64) -> f64 {
    if fraction <= 0.0 {
        return sorted[0] as f64;
    }
    if fraction >= 1.0 {
        return sorted[sorted.len() - 1] as f64;
    }
    let p = fraction * (sorted.len() - 1) as f64;
    let i = p as usize;
    let t = p - i as f64;
    (1.0 - t) * sorted[i] as f64 + t * sorted[(i + 1).min(sorted.len() - 1)] as f64
}

/// Running sums for one arm.
#[derive(Default)]
pub struct Accumulator {
    n: usize,
    nll: (f64, f64),
    kld: (f64, f64),
    p_diff: (f64, f64),
    p_diff4: f64,
    same_top: usize,
    klds: Vec<f32>,
}

impl Accumulator {
    pub fn add(&mut self, p: &Position) {
        self.n += 1;
        self.nll.0 += p.nll_arm;
        self.nll.1 += p.nll_arm * p.nll_arm;
        self.kld.0 += p.kld;
        self.kld.1 += p.kld * p.kld;
        let d2 = p.p_diff * p.p_diff;
        self.p_diff.0 += p.p_diff;
        self.p_diff.1 += d2;
        self.p_diff4 += d2 * d2;
        self.same_top += p.same_top as usize;
        self.klds.push(p.kld as f32);
    }

    pub fn summary(&self, arm: String) -> ArmSummary {
        let n = self.n;
        let (log_ppl, log_ppl_se) = mean_se(self.nll.0, self.nll.1, n);
        let ppl = log_ppl.exp();
        let (kld_mean, kld_se) = mean_se(self.kld.0, self.kld.1, n);
        let (dp_mean, dp_se) = mean_se(self.p_diff.0, self.p_diff.1, n);
        let (msd, msd_se) = mean_se(self.p_diff.1, self.p_diff4, n);
        let rms = msd.sqrt();
        let same = if n > 0 {
            self.same_top as f64 / n as f64
        } else {
            0.0
        };
        let mut sorted = self.klds.clone();
        sorted.sort_by(f32::total_cmp);
        let median = match sorted.len() {
            0 => 0.0,
            l if l % 2 == 0 => 0.5 * (sorted[l / 2] as f64 + sorted[l / 2 - 1] as f64),
            l => sorted[l / 2] as f64,
        };
        let pc = |f: f64| {
            if sorted.is_empty() {
                0.0
            } else {
                percentile(&sorted, f)
            }
        };
        ArmSummary {
            arm,
            positions: n,
            ppl,
            ppl_se: ppl * log_ppl_se,
            kld_mean,
            kld_se,
            kld_percentiles: KldPercentiles {
                max: pc(1.0),
                p99_9: pc(0.999),
                p99: pc(0.99),
                p95: pc(0.95),
                p90: pc(0.90),
                median,
                p10: pc(0.10),
                p5: pc(0.05),
                p1: pc(0.01),
                p0_1: pc(0.001),
                min: pc(0.0),
            },
            delta_p_mean: dp_mean,
            delta_p_se: dp_se,
            delta_p_rms: rms,
            delta_p_rms_se: if rms > 0.0 { 0.5 / rms * msd_se } else { 0.0 },
            same_top: same,
            same_top_se: if n > 1 {
                (same * (1.0 - same) / (n - 1) as f64).sqrt()
            } else {
                0.0
            },
        }
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct KldPercentiles {
    pub max: f64,
    pub p99_9: f64,
    pub p99: f64,
    pub p95: f64,
    pub p90: f64,
    pub median: f64,
    pub p10: f64,
    pub p5: f64,
    pub p1: f64,
    pub p0_1: f64,
    pub min: f64,
}

/// One arm's result. Probabilities are fractions (not percent).
#[derive(Clone, Debug, Serialize)]
pub struct ArmSummary {
    pub arm: String,
    pub positions: usize,
    pub ppl: f64,
    pub ppl_se: f64,
    pub kld_mean: f64,
    pub kld_se: f64,
    pub kld_percentiles: KldPercentiles,
    pub delta_p_mean: f64,
    pub delta_p_se: f64,
    pub delta_p_rms: f64,
    pub delta_p_rms_se: f64,
    pub same_top: f64,
    pub same_top_se: f64,
}

#[derive(Clone, Debug, Serialize)]
pub struct RefSummary {
    pub arm: String,
    pub ppl: f64,
    pub ppl_se: f64,
}

#[derive(Clone, Debug, Serialize)]
pub struct Report {
    pub ctx: usize,
    pub chunks: usize,
    pub positions: usize,
    pub reference: RefSummary,
    pub arms: Vec<ArmSummary>,
}

/// Where the reference distributions come from.
pub enum Reference<'a> {
    /// Computed by this model; saved to the writer when there is one.
    Model {
        label: String,
        model: &'a mut dyn CausalLm,
        save: Option<RefWriter>,
    },
    /// Read from a saved file.
    File(&'a RefFile),
}

/// Evaluates every arm against the reference over every chunk;
/// `on_chunk` is called after each chunk with its index.
pub fn evaluate(
    mut reference: Reference,
    arms: &mut [(String, &mut dyn CausalLm)],
    chunks: &Chunks,
    vocab: usize,
    mut on_chunk: impl FnMut(usize),
) -> Result<Report> {
    let mut accs: Vec<Accumulator> = arms.iter().map(|_| Accumulator::default()).collect();
    let mut ref_nll = (0.0f64, 0.0f64, 0usize);
    let first = chunks.first();
    for c in 0..chunks.count() {
        let targets = chunks.targets(c);
        let r = match &mut reference {
            Reference::Model { model, save, .. } => {
                let logits = scored_logits(&mut **model, chunks.chunk(c), first)?;
                let exact = RefChunk::from_logits(&logits, vocab, targets);
                match save {
                    Some(w) => {
                        let bytes = exact.encode();
                        w.write_chunk(&bytes)?;
                        RefChunk::decode(&bytes, vocab)
                    }
                    None => exact,
                }
            }
            Reference::File(f) => f.chunk(c)?,
        };
        for &t in &r.target_logp {
            ref_nll.0 -= t;
            ref_nll.1 += t * t;
            ref_nll.2 += 1;
        }
        for ((_, model), acc) in arms.iter_mut().zip(&mut accs) {
            let logits = scored_logits(&mut **model, chunks.chunk(c), first)?;
            let positions: Vec<Position> = (0..r.positions())
                .into_par_iter()
                .map(|j| compare(&r, j, &logits[j * vocab..(j + 1) * vocab], targets[j]))
                .collect();
            positions.iter().for_each(|p| acc.add(p));
        }
        on_chunk(c);
    }
    let ref_label = match reference {
        Reference::Model { label, save, .. } => {
            if let Some(w) = save {
                w.finish()?;
            }
            label
        }
        Reference::File(f) => format!("{} ({})", f.header.arm, f.path.display()),
    };
    let (log_ppl, log_ppl_se) = mean_se(ref_nll.0, ref_nll.1, ref_nll.2);
    Ok(Report {
        ctx: chunks.ctx,
        chunks: chunks.count(),
        positions: ref_nll.2,
        reference: RefSummary {
            arm: ref_label,
            ppl: log_ppl.exp(),
            ppl_se: log_ppl.exp() * log_ppl_se,
        },
        arms: arms
            .iter()
            .zip(&accs)
            .map(|((label, _), a)| a.summary(label.clone()))
            .collect(),
    })
}

/// A saved reference starts with these 8 bytes. The layout (little-endian):
///
/// | bytes | what |
/// |---|---|
/// | 8 | magic `LFMKLDRF` |
/// | 4 | u32 format version (1) |
/// | 4 | u32 length H of the JSON header |
/// | H | JSON [`RefHeader`]: model, reference arm, ctx, chunks, vocab, token fingerprint |
/// | 4 * chunks * ctx | the evaluated tokens (u32) |
/// | chunks * (ctx - 1 - ctx/2) * (16 + 2 * vocab) | one record per scored position ([`RefChunk::encode`]) |
pub const REF_MAGIC: &[u8; 8] = b"LFMKLDRF";
pub const REF_FORMAT_VERSION: u32 = 1;

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct RefHeader {
    pub format_version: u32,
    /// The model the reference arm was built from.
    pub model: String,
    /// The reference arm ("f32@cpu").
    pub arm: String,
    pub ctx: usize,
    pub chunks: usize,
    pub vocab: usize,
    /// [`Chunks::fingerprint`] of the tokens, as 16 hex digits.
    pub tokens_fnv1a64: String,
    /// The corpus file the tokens came from.
    pub corpus: String,
    pub encoding: String,
}

/// How [`RefChunk::encode`] stores a position, for the header.
pub const REF_ENCODING: &str = "per position: u32 argmax, f64 log-prob of the next token, f32 top \
    log-prob, then u16 per vocabulary entry: log-prob = top - 16 + code * 16/65535 (code 0: more \
    than 16 nats below the top, left out)";

/// Writes a reference file chunk by chunk (atomically).
pub struct RefWriter {
    path: PathBuf,
    file: AtomicFile,
}

impl RefWriter {
    pub fn create(
        path: &Path,
        overwrite: bool,
        header: &RefHeader,
        chunks: &Chunks,
    ) -> Result<Self> {
        let mut file = AtomicFile::create(path, overwrite)?;
        let json = serde_json::to_vec(header).expect("the header serialises");
        let w = file.writer();
        let mut head = Vec::with_capacity(16 + json.len() + chunks.tokens().len() * 4);
        head.extend_from_slice(REF_MAGIC);
        head.extend_from_slice(&REF_FORMAT_VERSION.to_le_bytes());
        head.extend_from_slice(&(json.len() as u32).to_le_bytes());
        head.extend_from_slice(&json);
        for t in chunks.tokens() {
            head.extend_from_slice(&t.to_le_bytes());
        }
        w.write_all(&head).map_err(|e| Error::io(path, e))?;
        Ok(RefWriter {
            path: path.to_path_buf(),
            file,
        })
    }

    fn write_chunk(&mut self, bytes: &[u8]) -> Result<()> {
        self.file
            .writer()
            .write_all(bytes)
            .map_err(|e| Error::io(&self.path, e))
    }

    fn finish(self) -> Result<()> {
        self.file.commit()
    }
}

/// A saved reference, memory-mapped.
pub struct RefFile {
    pub path: PathBuf,
    pub header: RefHeader,
    map: Mmap,
    tokens_at: usize,
    records_at: usize,
}

impl RefFile {
    /// Opens and checks a reference file: every size in the header is
    /// checked against the file's length before anything is read.
    pub fn open(path: &Path) -> Result<RefFile> {
        let file = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
        // SAFETY: read-only mapping; the file must not change while open.
        let map = unsafe { Mmap::map(&file) }.map_err(|e| Error::io(path, e))?;
        let bad = |what: String| Error::format(path, what);
        if map.len() < 16 || &map[..8] != REF_MAGIC {
            return Err(bad("not an lfm KLD reference file (bad magic)".into()));
        }
        let word = |at: usize| u32::from_le_bytes(map[at..at + 4].try_into().expect("4 bytes"));
        let version = word(8);
        if version != REF_FORMAT_VERSION {
            return Err(bad(format!(
                "format version {version}; this lfm reads version {REF_FORMAT_VERSION}"
            )));
        }
        let hlen = word(12) as usize;
        if hlen > map.len() - 16 {
            return Err(bad(format!("header of {hlen} bytes runs past the end")));
        }
        let header: RefHeader = serde_json::from_slice(&map[16..16 + hlen])
            .map_err(|e| bad(format!("header is not valid: {e}")))?;
        let (ctx, chunks, vocab) = (header.ctx, header.chunks, header.vocab);
        if ctx < 4 || chunks == 0 || vocab == 0 {
            return Err(bad(format!(
                "header has ctx {ctx}, chunks {chunks}, vocab {vocab}"
            )));
        }
        let scored = ctx - 1 - ctx / 2;
        let tokens_at = 16 + hlen;
        let sizes = chunks
            .checked_mul(ctx)
            .and_then(|n| n.checked_mul(4))
            .zip(
                chunks
                    .checked_mul(scored)
                    .and_then(|n| n.checked_mul(RefChunk::record_bytes(vocab))),
            )
            .and_then(|(t, r)| {
                t.checked_add(r)
                    .and_then(|s| s.checked_add(tokens_at))
                    .map(|end| (t, end))
            });
        let Some((token_bytes, end)) = sizes.filter(|&(_, end)| end == map.len()) else {
            return Err(bad(format!(
                "{} bytes, but a header of {chunks} chunks of {ctx} tokens over {vocab} tokens \
                 needs a different size",
                map.len()
            )));
        };
        debug_assert_eq!(end, map.len());
        let f = RefFile {
            path: path.to_path_buf(),
            header,
            map,
            tokens_at,
            records_at: tokens_at + token_bytes,
        };
        let fp = format!("{:016x}", f.chunks()?.fingerprint());
        if fp != f.header.tokens_fnv1a64 {
            return Err(bad(format!(
                "tokens do not match the header's fingerprint ({fp} vs {})",
                f.header.tokens_fnv1a64
            )));
        }
        Ok(f)
    }

    /// The evaluated tokens as chunks.
    pub fn chunks(&self) -> Result<Chunks> {
        let n = self.header.chunks * self.header.ctx;
        let tokens: Vec<u32> = self.map[self.tokens_at..self.tokens_at + 4 * n]
            .chunks_exact(4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        if let Some(&t) = tokens.iter().find(|&&t| t as usize >= self.header.vocab) {
            return Err(Error::format(
                &self.path,
                format!(
                    "token {t} is outside the {}-token vocabulary",
                    self.header.vocab
                ),
            ));
        }
        Ok(Chunks {
            ctx: self.header.ctx,
            tokens,
        })
    }

    /// The reference distributions of chunk `i`.
    pub fn chunk(&self, i: usize) -> Result<RefChunk> {
        let h = &self.header;
        let scored = h.ctx - 1 - h.ctx / 2;
        let rb = RefChunk::record_bytes(h.vocab);
        let at = self.records_at + i * scored * rb;
        let c = RefChunk::decode(&self.map[at..at + scored * rb], h.vocab);
        if let Some(&a) = c.argmax.iter().find(|&&a| a as usize >= h.vocab) {
            return Err(Error::format(
                &self.path,
                format!("chunk {i}: argmax {a} is outside the vocabulary"),
            ));
        }
        Ok(c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::util::rng::Rng;

    #[test]
    fn arm_specs() {
        let p = |s: &str| ArmSpec::parse(s).unwrap();
        assert_eq!(p("q4_0").source, ArmSource::Type(GgmlType::Q4_0));
        assert_eq!(p("Q4_K@gpu").device, Some(ArmDevice::Gpu));
        assert_eq!(p("f32@cpu").device, Some(ArmDevice::Cpu));
        let here = env!("CARGO_MANIFEST_DIR");
        let spec = p(&format!("{here}/Cargo.toml@cpu"));
        assert_eq!(
            spec.source,
            ArmSource::File(format!("{here}/Cargo.toml").into())
        );
        assert_eq!(spec.label("cpu"), format!("{here}/Cargo.toml@cpu"));
        let e = ArmSpec::parse("q9_9").unwrap_err().to_string();
        assert!(e.contains("'q9_9'") && e.contains("q1_0"), "{e}");
    }

    #[test]
    fn chunks_score_the_second_half() {
        let tokens: Vec<u32> = (0..25).collect();
        let c = Chunks::new(&tokens, 8, None, Some(99)).unwrap();
        assert_eq!((c.count(), c.first(), c.scored()), (3, 4, 3));
        assert_eq!(c.chunk(1), &[99, 9, 10, 11, 12, 13, 14, 15]);
        assert_eq!(c.targets(1), &[13, 14, 15]);
        assert_eq!(Chunks::new(&tokens, 8, Some(2), None).unwrap().count(), 2);
        let e = Chunks::new(&tokens, 32, None, None)
            .unwrap_err()
            .to_string();
        assert!(e.contains("fewer than one chunk"), "{e}");
    }

    #[test]
    fn kld_of_a_distribution_with_itself_is_zero_and_known_values_match() {
        let vocab = 50;
        let logits = Rng::new(3).vec(2 * vocab, -4.0, 4.0);
        let r = RefChunk::from_logits(&logits, vocab, &[7, 9]);
        let same = compare(&r, 1, &logits[vocab..], 9);
        assert_eq!((same.kld, same.p_diff, same.same_top), (0.0, 0.0, true));
        // Two-token distributions: p = (0.5, 0.5), q = (0.9, 0.1).
        let r = RefChunk::from_logits(&[0.0, 0.0], 2, &[0]);
        let q = [0.9f32.ln(), 0.1f32.ln()];
        let pos = compare(&r, 0, &q, 0);
        let want = 0.5 * (0.5f64 / 0.9).ln() + 0.5 * (0.5f64 / 0.1).ln();
        assert!((pos.kld - want).abs() < 1e-6, "{} vs {want}", pos.kld);
        assert!((pos.p_diff - 0.4).abs() < 1e-6);
        assert!((pos.nll_ref - 2f64.ln()).abs() < 1e-6);
    }

    #[test]
    fn encoded_reference_round_trips_within_its_step() {
        let vocab = 1000;
        let logits = Rng::new(5).vec(3 * vocab, -12.0, 12.0);
        let r = RefChunk::from_logits(&logits, vocab, &[1, 2, 3]);
        let d = RefChunk::decode(&r.encode(), vocab);
        assert_eq!(d.argmax, r.argmax);
        assert_eq!(d.target_logp, r.target_logp);
        let step = (REF_RANGE / REF_STEPS) as f64;
        for (i, (&v, &b)) in r.values.iter().zip(&d.values).enumerate() {
            let j = i / vocab;
            let a = v as f64 - r.lse[j];
            let top = r.values[j * vocab + r.argmax[j] as usize] as f64 - r.lse[j];
            if a > top - REF_RANGE as f64 + step {
                assert!((a - b as f64).abs() <= step * 0.51 + 1e-5, "{a} vs {b}");
            } else {
                assert!(b == f32::NEG_INFINITY || (a - b as f64).abs() <= step);
            }
        }
        // KLD against the decoded reference is close to the exact one.
        let arm = Rng::new(6).vec(vocab, -12.0, 12.0);
        let (exact, saved) = (compare(&r, 0, &arm, 1), compare(&d, 0, &arm, 1));
        assert!(
            (exact.kld - saved.kld).abs() < 1e-3 * exact.kld.max(1e-3),
            "{} vs {}",
            exact.kld,
            saved.kld
        );
    }

    #[test]
    fn statistics_match_llama_cpp_formulas() {
        let mut a = Accumulator::default();
        for i in 0..100 {
            a.add(&Position {
                kld: i as f64 * 0.01,
                nll_ref: 1.0,
                nll_arm: 1.0 + (i % 2) as f64 * 0.1,
                p_diff: if i % 2 == 0 { 0.1 } else { -0.1 },
                same_top: i % 4 != 0,
            });
        }
        let s = a.summary("x".into());
        assert!((s.kld_mean - 0.495).abs() < 1e-12);
        assert!((s.kld_percentiles.max - 0.99).abs() < 1e-6);
        assert!((s.kld_percentiles.median - 0.495).abs() < 1e-6);
        assert!((s.kld_percentiles.p90 - 0.891).abs() < 1e-6);
        assert!((s.same_top - 0.75).abs() < 1e-12);
        assert!((s.delta_p_rms - 0.1).abs() < 1e-9 && s.delta_p_mean.abs() < 1e-12);
        assert!((s.ppl - (1.05f64).exp()).abs() < 1e-9);
        // Standard error of the mean of 0, 0.01, ..., 0.99.
        let var: f64 = (0..100)
            .map(|i| (i as f64 * 0.01 - 0.495).powi(2))
            .sum::<f64>()
            / 100.0;
        assert!((s.kld_se - (var / 99.0).sqrt()).abs() < 1e-9);
    }
}
