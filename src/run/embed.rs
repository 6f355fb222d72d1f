//! Sentence embeddings the way sentence-transformers computes them: tokenise
//! (truncating at the model's max_seq_length), run the encoder, pool the
//! token vectors, L2-normalise when the model lists a Normalize module. The
//! encoder runs on the GPU or on the CPU reference; batches are ragged, so
//! sentences of different lengths share a batch without padding.

use crate::cpu::SeqSpan;
use crate::error::{Error, Result};
use crate::gpu::Gpu;
use crate::models::bert::{Batch, Bert, BertConfig, GpuBert};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tokenizers::{Tokenizer, TruncationDirection, TruncationParams, TruncationStrategy};

/// How token vectors become one sentence vector (sentence-transformers' Pooling).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Pooling {
    /// The first token (BERT's CLS).
    Cls,
    /// Mean over the tokens.
    Mean,
    /// Elementwise maximum over the tokens.
    Max,
    /// The last token (SEP for BERT).
    #[value(name = "last")]
    LastToken,
    /// Sum over the tokens divided by sqrt(token count).
    #[value(name = "mean-sqrt-len")]
    MeanSqrtLen,
    /// Mean weighted by position (1, 2, ...).
    #[value(name = "weighted-mean")]
    WeightedMean,
}

impl Pooling {
    /// Name in sentence-transformers' `pooling_mode`.
    pub fn st_name(self) -> &'static str {
        match self {
            Pooling::Cls => "cls",
            Pooling::Mean => "mean",
            Pooling::Max => "max",
            Pooling::LastToken => "lasttoken",
            Pooling::MeanSqrtLen => "mean_sqrt_len_tokens",
            Pooling::WeightedMean => "weightedmean",
        }
    }

    fn from_st(name: &str) -> Option<Pooling> {
        Pooling::ALL.into_iter().find(|p| p.st_name() == name)
    }

    /// In the order sentence-transformers concatenates them.
    const ALL: [Pooling; 6] = [
        Pooling::Cls,
        Pooling::Max,
        Pooling::Mean,
        Pooling::MeanSqrtLen,
        Pooling::WeightedMean,
        Pooling::LastToken,
    ];
}

/// What a sentence-transformers directory says around its encoder.
#[derive(Clone, Debug, PartialEq)]
pub struct SentenceConfig {
    /// Longer inputs are truncated to this many tokens (special tokens included).
    pub max_seq_length: usize,
    /// Concatenated in this order.
    pub pooling: Vec<Pooling>,
    pub normalize: bool,
}

fn read_json(path: &Path) -> Result<Value> {
    let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
    serde_json::from_str(&text).map_err(|e| Error::format(path, format!("not valid JSON: {e}")))
}

impl SentenceConfig {
    /// Reads `modules.json`, the Pooling module's `config.json` and
    /// `sentence_bert_config.json`. A plain Hugging Face directory without
    /// `modules.json` gets what sentence-transformers gives it: mean pooling,
    /// no normalisation.
    pub fn load(dir: &Path, model: &BertConfig) -> Result<SentenceConfig> {
        let modules_path = dir.join("modules.json");
        let mut pooling = vec![Pooling::Mean];
        let mut normalize = false;
        let mut transformer_dir = dir.to_path_buf();
        if modules_path.exists() {
            let modules = read_json(&modules_path)?;
            let list = modules
                .as_array()
                .ok_or_else(|| Error::format(&modules_path, "expected a JSON list of modules"))?;
            let mut seen_transformer = false;
            let mut seen_pooling = false;
            for m in list {
                let ty = m.get("type").and_then(Value::as_str).unwrap_or("");
                let sub = m.get("path").and_then(Value::as_str).unwrap_or("");
                match ty.rsplit('.').next().unwrap_or("") {
                    "Transformer" if !seen_transformer => {
                        seen_transformer = true;
                        transformer_dir = dir.join(sub);
                    }
                    "Pooling" if seen_transformer && !seen_pooling => {
                        seen_pooling = true;
                        pooling = read_pooling(&dir.join(sub).join("config.json"), model)?;
                    }
                    "Normalize" if seen_pooling => normalize = true,
                    _ => {
                        return Err(Error::unsupported(
                            &modules_path,
                            format!(
                                "module {ty:?} at this position (supported: Transformer, \
                                 then Pooling, then an optional Normalize)"
                            ),
                        ))
                    }
                }
            }
            if !seen_pooling {
                return Err(Error::unsupported(
                    &modules_path,
                    "no Pooling module after the Transformer",
                ));
            }
        }
        let st_path = transformer_dir.join("sentence_bert_config.json");
        let max_seq_length = if st_path.exists() {
            let v = read_json(&st_path)?;
            match v.get("max_seq_length") {
                None | Some(Value::Null) => model.max_position_embeddings,
                Some(x) => x
                    .as_u64()
                    .filter(|&n| n >= 2)
                    .map(|n| n as usize)
                    .ok_or_else(|| {
                        Error::format(
                            &st_path,
                            format!("max_seq_length is {x}, expected an integer >= 2"),
                        )
                    })?,
            }
        } else {
            model.max_position_embeddings
        };
        if max_seq_length > model.max_position_embeddings {
            return Err(Error::format(
                &st_path,
                format!(
                    "max_seq_length {max_seq_length} is over the model's {} positions",
                    model.max_position_embeddings
                ),
            ));
        }
        Ok(SentenceConfig {
            max_seq_length,
            pooling,
            normalize,
        })
    }
}

/// Pooling modes from a Pooling module config: `pooling_mode` (a name or a
/// list) or the older `pooling_mode_*` booleans.
fn read_pooling(path: &Path, model: &BertConfig) -> Result<Vec<Pooling>> {
    let v = read_json(path)?;
    let dim = v
        .get("word_embedding_dimension")
        .or_else(|| v.get("embedding_dimension"))
        .and_then(Value::as_u64);
    if let Some(dim) = dim {
        if dim as usize != model.hidden_size {
            return Err(Error::format(
                path,
                format!(
                    "word_embedding_dimension {dim} but the encoder's hidden_size is {}",
                    model.hidden_size
                ),
            ));
        }
    }
    let unknown = |name: &str| {
        Error::unsupported(
            path,
            format!("pooling mode {name:?} (cls, max, mean, mean_sqrt_len_tokens, weightedmean, lasttoken)"),
        )
    };
    let modes = match v.get("pooling_mode") {
        Some(Value::String(s)) => vec![Pooling::from_st(s).ok_or_else(|| unknown(s))?],
        Some(Value::Array(list)) => list
            .iter()
            .map(|x| {
                let s = x.as_str().unwrap_or("");
                Pooling::from_st(s).ok_or_else(|| unknown(s))
            })
            .collect::<Result<Vec<_>>>()?,
        Some(other) => return Err(Error::format(path, format!("pooling_mode is {other}"))),
        None => {
            let on = |key: &str| v.get(key).and_then(Value::as_bool).unwrap_or(false);
            let legacy = [
                ("pooling_mode_cls_token", Pooling::Cls),
                ("pooling_mode_max_tokens", Pooling::Max),
                ("pooling_mode_mean_tokens", Pooling::Mean),
                ("pooling_mode_mean_sqrt_len_tokens", Pooling::MeanSqrtLen),
                ("pooling_mode_weightedmean_tokens", Pooling::WeightedMean),
                ("pooling_mode_lasttoken", Pooling::LastToken),
            ];
            legacy
                .into_iter()
                .filter(|(k, _)| on(k))
                .map(|(_, p)| p)
                .collect()
        }
    };
    Ok(if modes.is_empty() {
        vec![Pooling::Mean]
    } else {
        modes
    })
}

/// Pools each sequence's rows of `hidden` ([tokens, d]) with every mode in
/// turn; returns [sequences, d * modes.len()].
pub fn pool(hidden: &[f32], d: usize, seqs: &[SeqSpan], modes: &[Pooling]) -> Vec<f32> {
    let width = d * modes.len();
    let mut out = vec![0.0f32; seqs.len() * width];
    for (s, o) in seqs.iter().zip(out.chunks_exact_mut(width.max(1))) {
        assert!(s.q_len > 0, "pool: empty sequence");
        let rows = &hidden[s.q_start * d..(s.q_start + s.q_len) * d];
        for (mode, o) in modes.iter().zip(o.chunks_exact_mut(d)) {
            match mode {
                Pooling::Cls => o.copy_from_slice(&rows[..d]),
                Pooling::LastToken => o.copy_from_slice(&rows[rows.len() - d..]),
                Pooling::Max => {
                    o.fill(f32::NEG_INFINITY);
                    for r in rows.chunks_exact(d) {
                        for (o, v) in o.iter_mut().zip(r) {
                            *o = o.max(*v);
                        }
                    }
                }
                Pooling::Mean | Pooling::MeanSqrtLen | Pooling::WeightedMean => {
                    let mut total = 0.0f32;
                    for (i, r) in rows.chunks_exact(d).enumerate() {
                        let w = if *mode == Pooling::WeightedMean {
                            (i + 1) as f32
                        } else {
                            1.0
                        };
                        total += w;
                        for (o, v) in o.iter_mut().zip(r) {
                            *o += w * v;
                        }
                    }
                    let div = if *mode == Pooling::MeanSqrtLen {
                        total.sqrt()
                    } else {
                        total
                    };
                    for o in o.iter_mut() {
                        *o /= div;
                    }
                }
            }
        }
    }
    out
}

/// Scales `v` to unit length (torch.nn.functional.normalize: divides by
/// max(||v||, 1e-12)).
pub fn normalize(v: &mut [f32]) {
    let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt().max(1e-12);
    for x in v {
        *x /= norm;
    }
}

/// Cosine similarity of two vectors (0 when either is all zeros).
pub fn cosine(a: &[f32], b: &[f32]) -> f32 {
    let dot: f32 = a.iter().zip(b).map(|(x, y)| x * y).sum();
    let na = a.iter().map(|x| x * x).sum::<f32>().sqrt();
    let nb = b.iter().map(|x| x * x).sum::<f32>().sqrt();
    if na == 0.0 || nb == 0.0 {
        0.0
    } else {
        dot / (na * nb)
    }
}

/// Where the encoder runs.
enum Device {
    Cpu,
    Gpu(Box<GpuEncoder>),
}

struct GpuEncoder {
    gpu: Arc<Gpu>,
    model: GpuBert,
}

/// A text's tokens as the encoder sees them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tokens {
    pub ids: Vec<u32>,
    /// The text was longer than max_seq_length and lost its tail.
    pub truncated: bool,
}

/// Per-run choices that override the model's own configuration.
#[derive(Clone, Debug)]
pub struct EmbedOptions {
    /// Texts per encoder pass (the GPU may split a pass that holds too many tokens).
    pub batch_size: usize,
    /// Replaces the model's pooling modes.
    pub pooling: Option<Vec<Pooling>>,
    /// Skip the Normalize module even when the model lists one.
    pub no_normalize: bool,
}

impl Default for EmbedOptions {
    fn default() -> Self {
        EmbedOptions {
            batch_size: 32,
            pooling: None,
            no_normalize: false,
        }
    }
}

/// A sentence-transformers model ready to embed text.
pub struct Embedder {
    pub model: Bert,
    pub sentence: SentenceConfig,
    pub dir: PathBuf,
    tokenizer: Tokenizer,
    device: Device,
}

impl Embedder {
    /// Loads the model in `dir`; with `gpu`, uploads the encoder to it.
    pub fn load(dir: &Path, gpu: Option<Arc<Gpu>>) -> Result<Embedder> {
        if !dir.is_dir() {
            return Err(Error::io(
                dir,
                std::io::Error::new(std::io::ErrorKind::NotFound, "model directory not found"),
            ));
        }
        let model = Bert::load(dir)?;
        let sentence = SentenceConfig::load(dir, &model.config)?;
        let tokenizer = load_tokenizer(&dir.join("tokenizer.json"), &model.config, &sentence)?;
        let device = match gpu {
            None => {
                model.prepare_cpu();
                Device::Cpu
            }
            Some(gpu) => {
                let model = GpuBert::new(&gpu, &model)?;
                Device::Gpu(Box::new(GpuEncoder { gpu, model }))
            }
        };
        Ok(Embedder {
            model,
            sentence,
            dir: dir.to_path_buf(),
            tokenizer,
            device,
        })
    }

    /// "cpu" or the adapter's description.
    pub fn device_name(&self) -> String {
        match &self.device {
            Device::Cpu => "cpu".to_string(),
            Device::Gpu(g) => g.gpu.describe(),
        }
    }

    /// Width of one output vector for these pooling modes.
    pub fn dim(&self, opts: &EmbedOptions) -> usize {
        self.model.config.hidden_size * self.poolings(opts).len()
    }

    fn poolings<'a>(&'a self, opts: &'a EmbedOptions) -> &'a [Pooling] {
        opts.pooling.as_deref().unwrap_or(&self.sentence.pooling)
    }

    /// Tokenises `texts` as sentence-transformers does: `[CLS]` text `[SEP]`,
    /// truncated to max_seq_length.
    pub fn tokenize<S: AsRef<str> + Sync>(&self, texts: &[S]) -> Result<Vec<Tokens>> {
        let inputs: Vec<&str> = texts.iter().map(|t| t.as_ref()).collect();
        let encodings = self
            .tokenizer
            .encode_batch(inputs, true)
            .map_err(|e| Error::invalid(format!("tokenizing: {e}")))?;
        Ok(encodings
            .into_iter()
            .map(|e| Tokens {
                truncated: !e.get_overflowing().is_empty(),
                ids: e.get_ids().to_vec(),
            })
            .collect())
    }

    /// Embeds token sequences as one encoder pass; [sequences, dim].
    pub fn embed_tokens<S: AsRef<[u32]>>(
        &self,
        seqs: &[S],
        opts: &EmbedOptions,
    ) -> Result<Vec<f32>> {
        if let Some(i) = seqs.iter().position(|s| s.as_ref().is_empty()) {
            return Err(Error::invalid(format!("sequence {i} has no tokens")));
        }
        let batch = Batch::new(seqs);
        let d = self.model.config.hidden_size;
        let hidden = match &self.device {
            Device::Cpu => self.model.forward_cpu(&batch)?,
            Device::Gpu(g) => {
                let sum = self.model.embedding_sum(&batch)?;
                g.model.forward(&g.gpu, &batch, &sum)?
            }
        };
        let modes = self.poolings(opts);
        let mut out = pool(&hidden, d, &batch.seqs, modes);
        if self.sentence.normalize && !opts.no_normalize {
            for v in out.chunks_exact_mut(d * modes.len()) {
                normalize(v);
            }
        }
        Ok(out)
    }

    /// Embeds `texts` batch by batch, handing each batch's vectors
    /// ([batch, dim]) to `sink` with the index of its first text.
    pub fn embed_each<S: AsRef<str> + Sync>(
        &self,
        texts: &[S],
        opts: &EmbedOptions,
        mut sink: impl FnMut(usize, &[f32]) -> Result<()>,
    ) -> Result<EmbedStats> {
        assert!(opts.batch_size > 0, "batch_size is 0");
        let tokens = self.tokenize(texts)?;
        let stats = EmbedStats {
            texts: texts.len(),
            tokens: tokens.iter().map(|t| t.ids.len()).sum(),
            truncated: tokens.iter().filter(|t| t.truncated).count(),
        };
        let max_tokens = match &self.device {
            Device::Cpu => usize::MAX,
            Device::Gpu(g) => g.model.max_tokens(&g.gpu),
        };
        let mut start = 0;
        while start < tokens.len() {
            // Up to batch_size texts, fewer when the GPU could not hold their tokens.
            let mut end = start;
            let mut count = 0;
            while end < tokens.len() && end - start < opts.batch_size {
                let n = tokens[end].ids.len();
                if end > start && count + n > max_tokens {
                    break;
                }
                count += n;
                end += 1;
            }
            let ids: Vec<&[u32]> = tokens[start..end]
                .iter()
                .map(|t| t.ids.as_slice())
                .collect();
            let vectors = self.embed_tokens(&ids, opts)?;
            sink(start, &vectors)?;
            start = end;
        }
        Ok(stats)
    }

    /// All embeddings at once: [texts, dim].
    pub fn embed<S: AsRef<str> + Sync>(
        &self,
        texts: &[S],
        opts: &EmbedOptions,
    ) -> Result<Vec<f32>> {
        let mut all = Vec::with_capacity(texts.len() * self.dim(opts));
        self.embed_each(texts, opts, |_, v| {
            all.extend_from_slice(v);
            Ok(())
        })?;
        Ok(all)
    }
}

/// What one [`Embedder::embed_each`] run processed.
#[derive(Clone, Copy, Debug, Default)]
pub struct EmbedStats {
    pub texts: usize,
    pub tokens: usize,
    /// Texts cut at max_seq_length.
    pub truncated: usize,
}

/// The model's tokenizer, truncating at max_seq_length and never padding,
/// checked against the encoder's vocabulary.
fn load_tokenizer(path: &Path, model: &BertConfig, sentence: &SentenceConfig) -> Result<Tokenizer> {
    if !path.exists() {
        return Err(Error::io(
            path,
            std::io::Error::new(std::io::ErrorKind::NotFound, "tokenizer not found"),
        ));
    }
    let mut tokenizer: Tokenizer = crate::formats::hf::read_tokenizer_json(path)?;
    let vocab = tokenizer.get_vocab_size(true);
    if vocab != model.vocab_size {
        return Err(Error::format(
            path,
            format!(
                "tokenizer has {vocab} tokens but config.json's vocab_size is {}: \
                 they do not belong to the same model",
                model.vocab_size
            ),
        ));
    }
    tokenizer
        .with_truncation(Some(TruncationParams {
            max_length: sentence.max_seq_length,
            strategy: TruncationStrategy::LongestFirst,
            stride: 0,
            direction: TruncationDirection::Right,
        }))
        .map_err(|e| Error::format(path, format!("cannot truncate: {e}")))?;
    tokenizer.with_padding(None);
    Ok(tokenizer)
}
