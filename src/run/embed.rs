//! Sentence embeddings the way sentence-transformers computes them: tokenise
//! (truncating at the model's max_seq_length), run the encoder, pool the
//! token vectors, L2-normalise when the model lists a Normalize module. The
//! encoder runs on the GPU or on the CPU reference; batches are ragged, so
//! sentences of different lengths share a batch without padding.

use crate::cpu::SeqSpan;
use crate::error::{Error, Result};
use crate::gpu::dense::{PoolMode, SEQ_POOL_MAX_MODES};
use crate::gpu::Gpu;
use crate::models::encoder::{
    Batch, Encoder, EncoderConfig, EncoderGemm, EncoderTimes, GpuEncoder,
};
use crate::util::fs;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use tokenizers::{Tokenizer, TruncationDirection, TruncationParams, TruncationStrategy};
use web_time::Instant;

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
    /// The GPU pooling kernel's code for this mode.
    fn device_mode(self) -> PoolMode {
        match self {
            Pooling::Cls => PoolMode::First,
            Pooling::Mean => PoolMode::Mean,
            Pooling::Max => PoolMode::Max,
            Pooling::LastToken => PoolMode::Last,
            Pooling::MeanSqrtLen => PoolMode::MeanSqrtLen,
            Pooling::WeightedMean => PoolMode::WeightedMean,
        }
    }

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
    /// config_sentence_transformers.json's `prompts`: name -> text prepended.
    pub prompts: Vec<(String, String)>,
    /// The prompt used when none is asked for (`default_prompt_name`).
    pub default_prompt: Option<String>,
    /// A cross-encoder's activation over its logit.
    pub score_activation: ScoreActivation,
}

/// What `CrossEncoder.predict` applies to a one-label logit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ScoreActivation {
    /// Its default for one label.
    Sigmoid,
    Identity,
}

fn read_json(path: &Path) -> Result<Value> {
    let text = fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
    serde_json::from_str(&text).map_err(|e| Error::format(path, format!("not valid JSON: {e}")))
}

impl SentenceConfig {
    /// Reads `modules.json`, the Pooling module's `config.json` and
    /// `sentence_bert_config.json`. A plain Hugging Face directory without
    /// `modules.json` gets what sentence-transformers gives it: mean pooling,
    /// no normalisation.
    pub fn load(dir: &Path, model: &EncoderConfig) -> Result<SentenceConfig> {
        let modules_path = dir.join("modules.json");
        let mut pooling = vec![Pooling::Mean];
        let mut normalize = false;
        let mut transformer_dir = dir.to_path_buf();
        if fs::exists(&modules_path) {
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
        // sentence-transformers 6 keeps max_seq_length as the tokenizer's
        // model_max_length; older versions in sentence_bert_config.json.
        let tokenizer_limit = tokenizer_max_length(&transformer_dir)?
            .map_or(model.max_position_embeddings, |n| {
                n.min(model.max_position_embeddings)
            });
        let max_seq_length = if fs::exists(&st_path) {
            let v = read_json(&st_path)?;
            match v.get("max_seq_length") {
                None | Some(Value::Null) => tokenizer_limit,
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
            tokenizer_limit
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
        let (prompts, default_prompt) =
            read_prompts(&dir.join("config_sentence_transformers.json"))?;
        Ok(SentenceConfig {
            max_seq_length,
            pooling,
            normalize,
            prompts,
            default_prompt,
            score_activation: ScoreActivation::Sigmoid,
        })
    }

    /// A cross-encoder directory as `CrossEncoder` reads it: pairs truncated
    /// at the tokenizer's model_max_length (at most the model's positions),
    /// the score through config.json's `sentence_transformers.activation_fn`
    /// (sigmoid when it names none).
    pub fn load_cross(dir: &Path, model: &EncoderConfig) -> Result<SentenceConfig> {
        let max_seq_length = tokenizer_max_length(dir)?
            .map_or(model.max_position_embeddings, |n| {
                n.min(model.max_position_embeddings)
            });
        let config_path = dir.join("config.json");
        let config = read_json(&config_path)?;
        let activation = config
            .get("sentence_transformers")
            .and_then(|s| s.get("activation_fn"))
            .or_else(|| config.get("sbert_ce_default_activation_function"))
            .and_then(Value::as_str);
        let score_activation = match activation.map(|a| a.rsplit('.').next().unwrap_or(a)) {
            None | Some("Sigmoid") => ScoreActivation::Sigmoid,
            Some("Identity") => ScoreActivation::Identity,
            Some(other) => {
                return Err(Error::unsupported(
                    &config_path,
                    format!("cross-encoder activation_fn {other:?} (Sigmoid, Identity)"),
                ))
            }
        };
        Ok(SentenceConfig {
            max_seq_length,
            pooling: vec![Pooling::Cls],
            normalize: false,
            prompts: Vec::new(),
            default_prompt: None,
            score_activation,
        })
    }

    /// The text of prompt `name`, if the model has it.
    pub fn prompt_named(&self, name: &str) -> Option<&str> {
        self.prompts
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, p)| p.as_str())
    }

    /// The text of prompt `name`, or an error listing the model's prompts.
    pub fn prompt(&self, name: &str, dir: &Path) -> Result<&str> {
        self.prompts
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, p)| p.as_str())
            .ok_or_else(|| {
                let names: Vec<&str> = self.prompts.iter().map(|(n, _)| n.as_str()).collect();
                Error::invalid(format!(
                    "{}: the model has no prompt named {name:?} (its prompts: {})",
                    dir.join("config_sentence_transformers.json").display(),
                    if names.is_empty() {
                        "none".to_string()
                    } else {
                        names.join(", ")
                    }
                ))
            })
    }
}

/// tokenizer_config.json's `model_max_length` in `dir`, when it sets a usable one.
fn tokenizer_max_length(dir: &Path) -> Result<Option<usize>> {
    let path = dir.join("tokenizer_config.json");
    if !fs::exists(&path) {
        return Ok(None);
    }
    Ok(read_json(&path)?
        .get("model_max_length")
        .and_then(Value::as_f64)
        .filter(|n| *n >= 2.0)
        .map(|n| n.min(u32::MAX as f64) as usize))
}

/// `prompts` and `default_prompt_name` of config_sentence_transformers.json
/// (none when the file is absent).
/// A model's prompts (name, text) and the text of its default one.
type Prompts = (Vec<(String, String)>, Option<String>);

fn read_prompts(path: &Path) -> Result<Prompts> {
    if !fs::exists(path) {
        return Ok((Vec::new(), None));
    }
    let v = read_json(path)?;
    let mut prompts = Vec::new();
    match v.get("prompts") {
        None | Some(Value::Null) => {}
        Some(Value::Object(map)) => {
            for (name, text) in map {
                let text = text.as_str().ok_or_else(|| {
                    Error::format(
                        path,
                        format!("prompt {name:?} is {text}, expected a string"),
                    )
                })?;
                prompts.push((name.clone(), text.to_string()));
            }
        }
        Some(other) => {
            return Err(Error::format(
                path,
                format!("prompts is {other}, expected an object of strings"),
            ))
        }
    }
    let default = match v.get("default_prompt_name") {
        None | Some(Value::Null) => None,
        Some(Value::String(name)) => {
            let text = prompts.iter().find(|(n, _)| n == name).ok_or_else(|| {
                Error::format(
                    path,
                    format!("default_prompt_name {name:?} is not one of the prompts"),
                )
            })?;
            Some(text.1.clone())
        }
        Some(other) => {
            return Err(Error::format(
                path,
                format!("default_prompt_name is {other}, expected a string"),
            ))
        }
    };
    Ok((prompts, default))
}

/// Pooling modes from a Pooling module config: `pooling_mode` (a name or a
/// list) or the older `pooling_mode_*` booleans.
fn read_pooling(path: &Path, model: &EncoderConfig) -> Result<Vec<Pooling>> {
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
    if v.get("include_prompt").and_then(Value::as_bool) == Some(false) {
        return Err(Error::unsupported(
            path,
            "include_prompt false (pooling that leaves the prompt's tokens out)",
        ));
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
    // Sequences in parallel (a share of the GPU path's host time at batch 256).
    use rayon::prelude::*;
    seqs.par_iter()
        .zip(out.par_chunks_exact_mut(width.max(1)))
        .for_each(|(s, o)| {
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
        });
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
    Gpu(Box<OnGpu>),
}

struct OnGpu {
    gpu: Arc<Gpu>,
    model: GpuEncoder,
}

/// A text's tokens as the encoder sees them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tokens {
    pub ids: Vec<u32>,
    /// The tokenizer's token types (1 for a BERT pair's second text).
    pub type_ids: Vec<u32>,
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
    /// Text prepended to every input (a resolved `--prompt-name` or `--prompt`);
    /// None: the model's default prompt, if it names one.
    pub prompt: Option<String>,
    /// Keep the first N dimensions (Matryoshka), renormalised when the
    /// model normalises.
    pub truncate_dim: Option<usize>,
}

impl Default for EmbedOptions {
    fn default() -> Self {
        EmbedOptions {
            batch_size: 32,
            pooling: None,
            no_normalize: false,
            prompt: None,
            truncate_dim: None,
        }
    }
}

/// What a model directory is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Task {
    /// A bi-encoder: one vector a text.
    Embed,
    /// A cross-encoder: one relevance score a (query, document) pair.
    Rerank,
}

/// A sentence-transformers model ready to embed text, or a cross-encoder
/// ready to score pairs.
pub struct Embedder {
    pub model: Encoder,
    pub sentence: SentenceConfig,
    pub dir: PathBuf,
    pub task: Task,
    tokenizer: Tokenizer,
    device: Device,
    /// Where the time goes, while [`Embedder::start_profile`] has asked.
    profile: Mutex<Option<EmbedProfile>>,
}

/// Host phases of embedding, and the GPU passes per kernel, summed over the
/// batches of a run (`embed --profile`).
#[derive(Clone, Debug, Default)]
pub struct EmbedProfile {
    pub batches: usize,
    pub texts: usize,
    pub tokens: usize,
    pub tokenize_us: f64,
    /// The embedding lookup on the host (GPU path).
    pub embedding_sum_us: f64,
    /// The encoder: the whole CPU forward, or the GPU pass and readback.
    pub encoder_us: f64,
    pub pool_us: f64,
    pub gpu: Option<EncoderTimes>,
}

impl EmbedProfile {
    /// A markdown summary for stderr: host phases per batch, then the GPU
    /// pass's kernels.
    pub fn table(&self) -> String {
        let n = self.batches.max(1) as f64;
        let mut s = format!(
            "embed profile: {} batches, {} texts, {} tokens ({:.0} a batch)\n\n\
             | phase | ms/batch |\n|---|---:|\n\
             | tokenize | {:.3} |\n| embedding sum (host) | {:.3} |\n\
             | encoder | {:.3} |\n| pool (CPU) + normalise | {:.3} |\n",
            self.batches,
            self.texts,
            self.tokens,
            self.tokens as f64 / n,
            self.tokenize_us / n / 1e3,
            self.embedding_sum_us / n / 1e3,
            self.encoder_us / n / 1e3,
            self.pool_us / n / 1e3,
        );
        if let Some(g) = &self.gpu {
            s += &format!(
                "\nencoder on the GPU: upload of the embedding sum {:.3} ms/batch (in prepare), \
                 readback {:.3} ms/batch\n\n{}",
                g.upload_us / n / 1e3,
                g.readback_us / n / 1e3,
                g.pass.clone().finish().table()
            );
        }
        s
    }
}

impl Embedder {
    /// Loads the bi-encoder in `dir`; with `gpu`, uploads the encoder to it.
    pub fn load(dir: &Path, gpu: Option<Arc<Gpu>>) -> Result<Embedder> {
        Embedder::load_for(dir, gpu, Task::Embed)
    }

    /// Loads `dir` for `task`, refusing a model made for the other one.
    pub fn load_for(dir: &Path, gpu: Option<Arc<Gpu>>, task: Task) -> Result<Embedder> {
        if !fs::is_dir(dir) {
            return Err(Error::io(
                dir,
                std::io::Error::new(std::io::ErrorKind::NotFound, "model directory not found"),
            ));
        }
        let model = Encoder::load(dir)?;
        let weights = dir.join("model.safetensors");
        match (task, &model.head) {
            (Task::Embed, Some(_)) => {
                return Err(Error::invalid(format!(
                    "{}: a cross-encoder (its sequence-classification head scores text \
                     pairs, it makes no embeddings): rank with it through --rerank",
                    weights.display()
                )))
            }
            (Task::Rerank, None) => {
                return Err(Error::invalid(format!(
                    "{}: not a cross-encoder (no sequence-classification head): --rerank \
                     needs one; embed or search with this model without --rerank",
                    weights.display()
                )))
            }
            (Task::Rerank, Some(h)) if h.labels != 1 => {
                return Err(Error::unsupported(
                    &weights,
                    format!(
                        "a classification head of {} labels (reranking needs one score a pair)",
                        h.labels
                    ),
                ))
            }
            _ => {}
        }
        let sentence = match task {
            Task::Embed => SentenceConfig::load(dir, &model.config)?,
            Task::Rerank => SentenceConfig::load_cross(dir, &model.config)?,
        };
        let tokenizer = load_tokenizer(&dir.join("tokenizer.json"), &model.config, &sentence)?;
        let device = match gpu {
            None => {
                model.prepare_cpu();
                Device::Cpu
            }
            Some(gpu) => {
                let model = GpuEncoder::new(&gpu, &model)?;
                Device::Gpu(Box::new(OnGpu { gpu, model }))
            }
        };
        Ok(Embedder {
            model,
            sentence,
            dir: dir.to_path_buf(),
            task,
            tokenizer,
            device,
            profile: Mutex::new(None),
        })
    }

    /// Starts collecting an [`EmbedProfile`] (device timestamps need the
    /// adapter's timestamp queries; without them the GPU pass fails).
    pub fn start_profile(&self) {
        let gpu = matches!(self.device, Device::Gpu(_)).then(|| EncoderTimes {
            pass: crate::gpu::profile::StepProfile {
                what: "encoder pass".to_string(),
                ..Default::default()
            },
            upload_us: 0.0,
            readback_us: 0.0,
        });
        *self.profile.lock().expect("profile lock") = Some(EmbedProfile {
            gpu,
            ..Default::default()
        });
    }

    /// The profile collected since [`Embedder::start_profile`], ending it.
    pub fn take_profile(&self) -> Option<EmbedProfile> {
        self.profile.lock().expect("profile lock").take()
    }

    /// Adds `f`'s time to the profile's phase `phase`, when one is running.
    fn timed<T>(&self, phase: fn(&mut EmbedProfile) -> &mut f64, f: impl FnOnce() -> T) -> T {
        let start = Instant::now();
        let out = f();
        if let Some(p) = self.profile.lock().expect("profile lock").as_mut() {
            *phase(p) += start.elapsed().as_secs_f64() * 1e6;
        }
        out
    }

    /// Truncates inputs at `n` tokens instead of the model's max_seq_length.
    pub fn set_max_seq_length(&mut self, n: usize) -> Result<()> {
        let most = self.model.config.max_position_embeddings;
        if n < 2 || n > most {
            return Err(Error::invalid(format!(
                "--max-seq-length {n}: the model in {} takes 2 to {most} tokens",
                self.dir.display()
            )));
        }
        self.sentence.max_seq_length = n;
        set_truncation(&mut self.tokenizer, n, &self.dir.join("tokenizer.json"))
    }

    /// Which kernel runs the GPU encoder's linear layers (the CPU ignores it).
    pub fn set_gpu_gemm(&mut self, gemm: EncoderGemm) {
        if let Device::Gpu(g) = &mut self.device {
            g.model.set_gemm(gemm);
        }
    }

    /// "cpu" or the adapter's description.
    pub fn device_name(&self) -> String {
        match &self.device {
            Device::Cpu => "cpu".to_string(),
            Device::Gpu(g) => g.gpu.describe(),
        }
    }

    /// Width of one output vector for these options.
    pub fn dim(&self, opts: &EmbedOptions) -> usize {
        let full = self.model.config.hidden_size * self.poolings(opts).len();
        opts.truncate_dim.map_or(full, |t| t.min(full))
    }

    /// Width before `--truncate-dim`.
    pub fn full_dim(&self, opts: &EmbedOptions) -> usize {
        self.model.config.hidden_size * self.poolings(opts).len()
    }

    fn poolings<'a>(&'a self, opts: &'a EmbedOptions) -> &'a [Pooling] {
        opts.pooling.as_deref().unwrap_or(&self.sentence.pooling)
    }

    /// The prompt these options prepend: theirs, else the model's default.
    fn prompt<'a>(&'a self, opts: &'a EmbedOptions) -> Option<&'a str> {
        opts.prompt
            .as_deref()
            .or(self.sentence.default_prompt.as_deref())
            .filter(|p| !p.is_empty())
    }

    /// Tokenises `texts` as sentence-transformers does: `[CLS]` text `[SEP]`
    /// (`<s>` text `</s>` for XLM-R), truncated to max_seq_length.
    pub fn tokenize<S: AsRef<str> + Sync>(&self, texts: &[S]) -> Result<Vec<Tokens>> {
        let inputs: Vec<&str> = texts.iter().map(|t| t.as_ref()).collect();
        let encodings = self
            .tokenizer
            .encode_batch(inputs, true)
            .map_err(|e| Error::invalid(format!("tokenizing: {e}")))?;
        Ok(encodings.into_iter().map(tokens_of).collect())
    }

    /// Tokenises (query, document) pairs as a cross-encoder reads them,
    /// truncating the longer text first.
    pub fn tokenize_pairs(&self, query: &str, docs: &[String]) -> Result<Vec<Tokens>> {
        let inputs: Vec<tokenizers::EncodeInput> = docs
            .iter()
            .map(|d| (query.to_string(), d.clone()).into())
            .collect();
        let encodings = self
            .tokenizer
            .encode_batch(inputs, true)
            .map_err(|e| Error::invalid(format!("tokenizing: {e}")))?;
        Ok(encodings.into_iter().map(tokens_of).collect())
    }

    /// The last hidden state of one ragged batch, [tokens, d].
    fn hidden(&self, batch: &Batch) -> Result<Vec<f32>> {
        self.encode(batch, None)
    }

    /// The last hidden state of one ragged batch ([tokens, d]), or with
    /// `pool` each sequence's pooled vectors ([sequences, modes * d]; on
    /// the GPU pooled there, so only those come back).
    fn encode(&self, batch: &Batch, pool_modes: Option<&[Pooling]>) -> Result<Vec<f32>> {
        if let Some(p) = self.profile.lock().expect("profile lock").as_mut() {
            p.batches += 1;
            p.texts += batch.seqs.len();
            p.tokens += batch.tokens();
        }
        self.encode_uncounted(batch, pool_modes)
    }

    fn encode_uncounted(&self, batch: &Batch, pool_modes: Option<&[Pooling]>) -> Result<Vec<f32>> {
        match &self.device {
            Device::Cpu => {
                let hidden = self.timed(|p| &mut p.encoder_us, || self.model.forward_cpu(batch))?;
                Ok(match pool_modes {
                    Some(modes) => self.timed(
                        |p| &mut p.pool_us,
                        || pool(&hidden, self.model.config.hidden_size, &batch.seqs, modes),
                    ),
                    None => hidden,
                })
            }
            Device::Gpu(_) if pool_modes.is_some_and(|m| m.len() > SEQ_POOL_MAX_MODES) => {
                let hidden = self.encode_uncounted(batch, None)?;
                let modes = pool_modes.expect("checked above");
                let d = self.model.config.hidden_size;
                Ok(pool(&hidden, d, &batch.seqs, modes))
            }
            Device::Gpu(g) => {
                let sum = self.timed(
                    |p| &mut p.embedding_sum_us,
                    || self.model.embedding_sum(batch),
                )?;
                let device_modes: Option<Vec<PoolMode>> =
                    pool_modes.map(|m| m.iter().map(|m| m.device_mode()).collect());
                let start = Instant::now();
                let mut guard = self.profile.lock().expect("profile lock");
                let times = guard.as_mut().and_then(|p| p.gpu.as_mut());
                let out =
                    g.model
                        .forward_timed(&g.gpu, batch, &sum, device_modes.as_deref(), times);
                if let Some(p) = guard.as_mut() {
                    p.encoder_us += start.elapsed().as_secs_f64() * 1e6;
                }
                out
            }
        }
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
        let modes = self.poolings(opts);
        let mut out = self.encode(&batch, Some(modes))?;
        let normalized = self.sentence.normalize && !opts.no_normalize;
        if normalized {
            self.timed(
                |p| &mut p.pool_us,
                || {
                    for v in out.chunks_exact_mut(d * modes.len()) {
                        normalize(v);
                    }
                },
            );
        }
        let full = d * modes.len();
        let dim = self.dim(opts);
        if dim < full {
            let mut cut = Vec::with_capacity(seqs.len() * dim);
            for v in out.chunks_exact(full) {
                let start = cut.len();
                cut.extend_from_slice(&v[..dim]);
                if normalized {
                    normalize(&mut cut[start..]);
                }
            }
            out = cut;
        }
        Ok(out)
    }

    /// Up to `batch_size` sequences from `start`, fewer when the GPU could
    /// not hold their tokens: the end of the batch.
    fn batch_end(&self, tokens: &[Tokens], start: usize, batch_size: usize) -> usize {
        let max_tokens = match &self.device {
            Device::Cpu => usize::MAX,
            Device::Gpu(g) => g.model.max_tokens(&g.gpu),
        };
        let mut end = start;
        let mut count = 0;
        while end < tokens.len() && end - start < batch_size {
            let n = tokens[end].ids.len();
            if end > start && count + n > max_tokens {
                break;
            }
            count += n;
            end += 1;
        }
        end
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
        let tokens = self.timed(
            |p| &mut p.tokenize_us,
            || match self.prompt(opts) {
                Some(p) => {
                    let prompted: Vec<String> =
                        texts.iter().map(|t| format!("{p}{}", t.as_ref())).collect();
                    self.tokenize(&prompted)
                }
                None => self.tokenize(texts),
            },
        )?;
        let stats = EmbedStats {
            texts: texts.len(),
            tokens: tokens.iter().map(|t| t.ids.len()).sum(),
            truncated: tokens.iter().filter(|t| t.truncated).count(),
        };
        let mut start = 0;
        while start < tokens.len() {
            let end = self.batch_end(&tokens, start, opts.batch_size);
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

    /// A cross-encoder's score of (query, doc) for every doc, as
    /// `CrossEncoder.predict` computes it (the logit through the model's
    /// activation: sigmoid unless its config names another).
    pub fn rerank(
        &self,
        query: &str,
        docs: &[String],
        batch_size: usize,
    ) -> Result<(Vec<f32>, EmbedStats)> {
        assert!(batch_size > 0, "batch_size is 0");
        let head = self
            .model
            .head
            .as_ref()
            .expect("load_for(Task::Rerank) checked the head");
        let tokens = self.tokenize_pairs(query, docs)?;
        let stats = EmbedStats {
            texts: docs.len(),
            tokens: tokens.iter().map(|t| t.ids.len()).sum(),
            truncated: tokens.iter().filter(|t| t.truncated).count(),
        };
        let d = self.model.config.hidden_size;
        let mut scores = Vec::with_capacity(docs.len());
        let mut start = 0;
        while start < tokens.len() {
            let end = self.batch_end(&tokens, start, batch_size);
            let mut batch = Batch::default();
            for t in &tokens[start..end] {
                let types = (self.model.config.type_vocab_size > 1).then_some(&t.type_ids[..]);
                batch.push(&t.ids, types);
            }
            let hidden = self.hidden(&batch)?;
            for logit in head.logits(&hidden, d, &batch.seqs) {
                scores.push(match self.sentence.score_activation {
                    ScoreActivation::Sigmoid => 1.0 / (1.0 + (-logit).exp()),
                    ScoreActivation::Identity => logit,
                });
            }
            start = end;
        }
        Ok((scores, stats))
    }
}

fn tokens_of(e: tokenizers::Encoding) -> Tokens {
    Tokens {
        truncated: !e.get_overflowing().is_empty(),
        ids: e.get_ids().to_vec(),
        type_ids: e.get_type_ids().to_vec(),
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
fn load_tokenizer(
    path: &Path,
    model: &EncoderConfig,
    sentence: &SentenceConfig,
) -> Result<Tokenizer> {
    if !fs::exists(path) {
        return Err(Error::io(
            path,
            std::io::Error::new(std::io::ErrorKind::NotFound, "tokenizer not found"),
        ));
    }
    let mut tokenizer: Tokenizer = crate::formats::hf::read_tokenizer_json(path)?;
    // Ids past the embedding table cannot be looked up; a table larger than
    // the vocabulary is common (ModernBERT pads it to a multiple of 64).
    let vocab = tokenizer
        .get_vocab(true)
        .values()
        .max()
        .map_or(0, |&m| m as usize + 1);
    if vocab > model.vocab_size {
        return Err(Error::format(
            path,
            format!(
                "tokenizer has {vocab} tokens but config.json's vocab_size is {}: \
                 they do not belong to the same model",
                model.vocab_size
            ),
        ));
    }
    set_truncation(&mut tokenizer, sentence.max_seq_length, path)?;
    tokenizer.with_padding(None);
    Ok(tokenizer)
}

fn set_truncation(tokenizer: &mut Tokenizer, max_length: usize, path: &Path) -> Result<()> {
    tokenizer
        .with_truncation(Some(TruncationParams {
            max_length,
            strategy: TruncationStrategy::LongestFirst,
            stride: 0,
            direction: TruncationDirection::Right,
        }))
        .map_err(|e| Error::format(path, format!("cannot truncate: {e}")))?;
    Ok(())
}

/// sentence-transformers' output precisions (`quantize_embeddings`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Precision {
    Float32,
    /// Per dimension, 256 buckets between the minimum and maximum over the
    /// texts embedded, shifted to -128..=127.
    Int8,
    /// As int8, 0..=255.
    Uint8,
    /// One bit a dimension (> 0), packed 8 a byte, big-endian, minus 128 (int8).
    Binary,
    /// As binary, unsigned bytes.
    Ubinary,
}

impl Precision {
    /// Width of one quantised vector of `dim` floats.
    pub fn width(self, dim: usize) -> usize {
        match self {
            Precision::Binary | Precision::Ubinary => dim.div_ceil(8),
            _ => dim,
        }
    }

    /// Whether the values are signed bytes.
    pub fn signed(self) -> bool {
        matches!(self, Precision::Int8 | Precision::Binary)
    }
}

/// `vectors` ([n, dim]) quantised as `quantize_embeddings(vectors, precision)`
/// does, with int8/uint8 ranges from `vectors` themselves: [n, width] bytes
/// (signed ones as their i8 value in an i16).
pub fn quantize(vectors: &[f32], dim: usize, precision: Precision) -> Result<Vec<i16>> {
    let n = vectors.len() / dim.max(1);
    Ok(match precision {
        Precision::Float32 => {
            return Err(Error::invalid(
                "float32 vectors are not quantised: write them as they are",
            ))
        }
        Precision::Int8 | Precision::Uint8 => {
            if n < 2 {
                return Err(Error::invalid(format!(
                    "--precision {}: the buckets come from the texts' own range of \
                     values, and one text has none: embed two or more together",
                    if precision == Precision::Int8 {
                        "int8"
                    } else {
                        "uint8"
                    }
                )));
            }
            let mut lo = vec![f32::INFINITY; dim];
            let mut hi = vec![f32::NEG_INFINITY; dim];
            for v in vectors.chunks_exact(dim) {
                for i in 0..dim {
                    lo[i] = lo[i].min(v[i]);
                    hi[i] = hi[i].max(v[i]);
                }
            }
            let steps: Vec<f32> = lo
                .iter()
                .zip(&hi)
                .map(|(l, h)| {
                    let s = (h - l) / 255.0;
                    if s == 0.0 {
                        1.0
                    } else {
                        s
                    }
                })
                .collect();
            let shift = if precision == Precision::Int8 { 128 } else { 0 };
            vectors
                .chunks_exact(dim)
                .flat_map(|v| {
                    (0..dim).map(|i| {
                        let q = ((v[i] - lo[i]) / steps[i]).floor().clamp(0.0, 255.0);
                        q as i16 - shift
                    })
                })
                .collect()
        }
        Precision::Binary | Precision::Ubinary => {
            let shift = if precision == Precision::Binary {
                128
            } else {
                0
            };
            vectors
                .chunks_exact(dim)
                .flat_map(|v| {
                    v.chunks(8).map(|bits| {
                        let byte = bits
                            .iter()
                            .enumerate()
                            .fold(0u8, |b, (i, x)| b | (((*x > 0.0) as u8) << (7 - i)));
                        byte as i16 - shift
                    })
                })
                .collect()
        }
    })
}
