//! Model architectures: one file each, in the order config -> weights ->
//! forward. [`load_llm`] opens any supported language-model checkpoint.

pub mod arch;
pub mod batch;
pub mod encoder;
pub mod gemma3;
pub mod gguf_export;
pub mod kv_blocks;
pub mod layout;
pub mod lfm2;
pub mod llama;
pub mod llm;
pub mod llm_cpu;
pub mod llm_gpu;
pub mod ocr;
pub mod phi3;
pub mod qwen;
pub mod recipe;
pub mod silero_vad;
pub mod vits;
pub mod whisper;

use crate::device::DeviceChoice;
use crate::error::{Error, Result};
use crate::formats::gguf::GgufFile;
use crate::formats::hf::{self, HfConfig};
use crate::formats::TensorSource;
use crate::quant::GgmlType;
use crate::sampling::SamplingOptions;
use crate::tensor::Activations;
use crate::tokenizer::{GgufVocab, Tokenizer};
use llm::{CausalLm, CpuLlm, LlmConfig, Weights};
use llm_gpu::{GpuLlm, GpuLlmOptions};
use std::path::{Path, PathBuf};

/// Where `scripts/setup` puts generate's default model, relative to the repo.
pub const DEFAULT_LLM: &str = "samples/models/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf";

/// The default model: looked up from the working directory, then from the
/// repository that holds the running executable (`target/<profile>/..`).
pub fn default_llm_path() -> Result<PathBuf> {
    let mut candidates = vec![PathBuf::from(DEFAULT_LLM)];
    if let Ok(exe) = std::env::current_exe() {
        for dir in exe.ancestors().skip(1).take(4) {
            candidates.push(dir.join(DEFAULT_LLM));
        }
    }
    candidates.into_iter().find(|p| p.is_file()).ok_or_else(|| {
        Error::invalid(format!(
            "default model {DEFAULT_LLM} not found: run scripts/setup, or pass --model"
        ))
    })
}

pub struct LoadOptions {
    pub device: DeviceChoice,
    /// Convert every matrix to this format after loading (a weight-format
    /// arm for benchmarks and KL-divergence runs).
    pub weight_type: Option<GgmlType>,
    /// How the CPU backend's decode products treat their input (the GPU
    /// ignores it): f32 for reference runs, int8 for speed.
    pub cpu_activations: Activations,
}

/// A loaded language model with what generation needs beside it.
pub struct LoadedLlm {
    pub model: Box<dyn CausalLm>,
    pub tokenizer: Option<Tokenizer>,
    /// generation_config.json's sampling settings, or llama.cpp's defaults.
    pub sampling_defaults: SamplingOptions,
    pub path: PathBuf,
    /// Weight bytes one decoded token reads (see `Weights::bytes_per_token`).
    pub bytes_per_token: usize,
    /// Number of weights.
    pub params: usize,
    /// Bytes of all weights as loaded.
    pub weight_bytes: usize,
    backend: &'static str,
    weight_format: String,
}

impl LoadedLlm {
    /// The format most matrices are stored in ("q4_1", "f16", ...).
    pub fn weight_format(&self) -> &str {
        &self.weight_format
    }

    pub fn backend_name(&self) -> &'static str {
        self.backend
    }

    /// One line for stderr: model, size, weight format, backend.
    pub fn describe(&self) -> String {
        let c = self.model.config();
        format!(
            "model: {} ({:?}, {} layers, d{}, {} weights) on {}",
            self.path.display(),
            c.arch,
            c.layers.len(),
            c.hidden,
            self.weight_format,
            self.backend
        )
    }
}

/// llama.cpp's sampling defaults (temperature 0.8, top-k 40, top-p 0.95,
/// min-p 0.05, no repetition penalty): a GGUF file's, which carries none.
pub fn llama_cpp_defaults() -> SamplingOptions {
    SamplingOptions {
        temperature: 0.8,
        top_k: 40,
        top_p: 0.95,
        min_p: 0.05,
        ..Default::default()
    }
}

/// The checkpoint at `path`, its matrices converted as `opts` asks.
fn open_converted(path: &Path, opts: &LoadOptions) -> Result<Opened> {
    if !path.exists() {
        return Err(Error::io(
            path,
            std::io::Error::new(std::io::ErrorKind::NotFound, "no such file or directory"),
        ));
    }
    let (cfg, weights, tokenizer, defaults) = if path.is_dir() {
        open_hf(path)?
    } else {
        open_gguf(path)?
    };
    let weights = match opts.weight_type {
        Some(t) => {
            let (w, fell_back) = weights.converted(t)?;
            if !fell_back.is_empty() {
                let mut by_type: Vec<(GgmlType, usize)> = Vec::new();
                for (_, f) in &fell_back {
                    match by_type.iter_mut().find(|(t, _)| t == f) {
                        Some((_, n)) => *n += 1,
                        None => by_type.push((*f, 1)),
                    }
                }
                let counts: Vec<String> =
                    by_type.iter().map(|(f, n)| format!("{n} to {f}")).collect();
                eprintln!(
                    "{} matrices fall back from {t} (rows do not fit its blocks): {}",
                    fell_back.len(),
                    counts.join(", ")
                );
            }
            w
        }
        None => weights,
    };
    Ok((cfg, weights, tokenizer, defaults))
}

/// A language model loaded for many sequences at once (the server).
pub struct LoadedBatch {
    pub model: Box<dyn batch::BatchedLm>,
    pub tokenizer: Option<Tokenizer>,
    pub sampling_defaults: SamplingOptions,
    pub path: PathBuf,
}

/// How large a batched model's KV cache is.
#[derive(Clone, Copy, Debug)]
pub enum KvSize {
    /// Four full contexts.
    Default,
    /// At most this many bytes (`serve --kv-memory`).
    Bytes(usize),
    /// This many blocks of [`kv_blocks::BLOCK`] positions (`serve
    /// --kv-blocks`).
    Blocks(usize),
    /// Room for this many sequences of this many positions each (a
    /// benchmark's batch).
    Sequences(usize, usize),
}

impl KvSize {
    /// Cached positions in all for `cfg`, `default` where not told.
    fn positions(self, cfg: &LlmConfig, default: usize) -> usize {
        match self {
            KvSize::Default => default,
            KvSize::Bytes(b) => (b / cfg.kv_bytes_per_position().max(1)).max(1),
            KvSize::Blocks(n) => n * kv_blocks::BLOCK,
            KvSize::Sequences(n, len) => n * kv_blocks::blocks_for(len) * kv_blocks::BLOCK,
        }
    }
}

/// KV cache positions a GPU batch has unless told: what 16 sequences of
/// 4096 positions took before the cache was paged.
const GPU_DEFAULT_POSITIONS: usize = 16 * 4096;
/// Sequences a GPU batch runs at once unless told.
const GPU_DEFAULT_SEQUENCES: usize = 64;

/// The GPU batch's sequences at once and KV cache positions for `kv`: a
/// benchmark's batch as asked; otherwise [`GPU_DEFAULT_SEQUENCES`] (or
/// `sequences` where given) over the positions asked for (by default
/// [`GPU_DEFAULT_POSITIONS`]), no more than one binding of the adapter
/// holds per layer.
fn gpu_kv(
    cfg: &LlmConfig,
    kv: KvSize,
    sequences: Option<usize>,
    max_binding: u64,
) -> (usize, usize) {
    let positions = kv.positions(cfg, GPU_DEFAULT_POSITIONS);
    if let KvSize::Sequences(n, _) = kv {
        return (n, positions);
    }
    let per_position = (cfg.kv_heads * cfg.head_dim * 4).max(1) as u64;
    let fit = (max_binding / per_position) as usize / kv_blocks::BLOCK * kv_blocks::BLOCK;
    let sequences = sequences.unwrap_or(GPU_DEFAULT_SEQUENCES);
    (
        sequences.clamp(1, llm_gpu::MAX_SLOTS),
        positions.clamp(kv_blocks::BLOCK, fit.max(kv_blocks::BLOCK)),
    )
}

/// Opens a checkpoint for batched serving: continuous batching over a paged
/// cache of `kv` (on the GPU, up to `sequences` at once where given, its
/// decode steps' products computed as `products` says;
/// [`llm_gpu::GpuBatch`]).
pub fn load_batched_llm(
    path: &Path,
    opts: &LoadOptions,
    kv: KvSize,
    sequences: Option<usize>,
    products: llm_gpu::BatchProducts,
) -> Result<LoadedBatch> {
    let (cfg, weights, tokenizer, defaults) = open_converted(path, opts)?;
    // Four full contexts on the CPU unless told.
    let positions = kv.positions(&cfg, 4 * cfg.context);
    let (model, _) = opts.device.build(
        || -> Result<Box<dyn batch::BatchedLm>> {
            Ok(Box::new(llm_cpu::CpuBatch::new(
                cfg.clone(),
                weights.clone(),
                opts.cpu_activations,
                positions,
            )))
        },
        |gpu| -> Result<Box<dyn batch::BatchedLm>> {
            let (sequences, positions) = gpu_kv(&cfg, kv, sequences, gpu.caps.max_binding);
            Ok(Box::new(llm_gpu::GpuBatch::new(
                gpu,
                &cfg,
                &weights,
                &GpuLlmOptions {
                    batch_products: products,
                    ..Default::default()
                },
                sequences,
                positions,
            )?))
        },
    )?;
    Ok(LoadedBatch {
        model,
        tokenizer,
        sampling_defaults: defaults,
        path: path.to_path_buf(),
    })
}

/// Opens an HF directory or a GGUF file as a language model.
pub fn load_llm(path: &Path, opts: &LoadOptions) -> Result<LoadedLlm> {
    let (cfg, weights, tokenizer, defaults) = open_converted(path, opts)?;
    let bytes_per_token = weights.bytes_per_token();
    let (params, weight_bytes) = weights.totals();
    let weight_format = weights
        .layers
        .first()
        .map(|l| l.gate.dtype.name())
        .unwrap_or("none")
        .to_string();
    // Matrices share their storage: a clone for the CPU fallback copies
    // only the norm vectors.
    let (model, on_gpu) = opts.device.build(
        || -> Result<Box<dyn CausalLm>> {
            let m = CpuLlm::new(cfg.clone(), weights.clone());
            Ok(Box::new(m.with_activations(opts.cpu_activations)))
        },
        |gpu| -> Result<Box<dyn CausalLm>> {
            Ok(Box::new(GpuLlm::new(
                gpu,
                &cfg,
                &weights,
                &GpuLlmOptions::default(),
            )?))
        },
    )?;
    let backend = if on_gpu { "gpu" } else { "cpu" };
    Ok(LoadedLlm {
        model,
        tokenizer,
        sampling_defaults: defaults,
        path: path.to_path_buf(),
        bytes_per_token,
        params,
        weight_bytes,
        backend,
        weight_format,
    })
}

type Opened = (LlmConfig, Weights, Option<Tokenizer>, SamplingOptions);

/// The config and weights of an HF directory or GGUF file, as [`load_llm`]
/// reads them, for tools that build a backend themselves (e.g. to run the
/// GPU and the CPU on the same weights).
pub fn open_llm(path: &Path) -> Result<(LlmConfig, Weights)> {
    let (cfg, w, _, _) = if path.is_dir() {
        open_hf(path)?
    } else {
        open_gguf(path)?
    };
    Ok((cfg, w))
}

fn open_hf(dir: &Path) -> Result<Opened> {
    llm_from_hf_dir(dir)
}

/// The config, weights, tokenizer and generation_config.json's sampling
/// settings of an HF directory, as [`load_llm`] reads them (in a browser
/// tab: the files the page handed over, see `util::fs`).
pub fn llm_from_hf_dir(
    dir: &Path,
) -> Result<(LlmConfig, Weights, Option<Tokenizer>, SamplingOptions)> {
    let c = HfConfig::open(dir)?;
    let (cfg, names) = arch::from_hf(&c)?;
    let src = hf::open_checkpoint(dir)?;
    let weights = llm::load_weights(&cfg, src.as_ref(), &names)?;
    let tokenizer = if crate::util::fs::is_file(&dir.join("tokenizer.json")) {
        Some(Tokenizer::from_hf_dir(dir)?)
    } else {
        None
    };
    Ok((cfg, weights, tokenizer, hf_sampling_defaults(dir)?))
}

/// Sampling settings from generation_config.json, falling back to
/// llama.cpp's defaults for what it does not set.
fn hf_sampling_defaults(dir: &Path) -> Result<SamplingOptions> {
    let path = dir.join("generation_config.json");
    let mut d = llama_cpp_defaults();
    if !crate::util::fs::is_file(&path) {
        return Ok(d);
    }
    let g = HfConfig::open(&path)?;
    if g.get_bool_opt("do_sample")? == Some(false) {
        d.temperature = 0.0;
    } else if let Some(t) = g.get_f32_opt("temperature")? {
        d.temperature = t;
    }
    if let Some(k) = g.get_usize_opt("top_k")? {
        d.top_k = k;
    }
    if let Some(p) = g.get_f32_opt("top_p")? {
        d.top_p = p;
    }
    if let Some(p) = g.get_f32_opt("min_p")? {
        d.min_p = p;
    }
    if let Some(r) = g.get_f32_opt("repetition_penalty")? {
        d.repeat_penalty = r;
    }
    Ok(d)
}

fn open_gguf(path: &Path) -> Result<Opened> {
    let (cfg, weights, tokenizer) = llm_from_gguf(&GgufFile::open(path)?)?;
    Ok((cfg, weights, tokenizer, llama_cpp_defaults()))
}

/// The config, weights and tokenizer of an opened GGUF file (one read from
/// bytes, in a browser tab), as [`load_llm`] reads them.
pub fn llm_from_gguf(g: &GgufFile) -> Result<(LlmConfig, Weights, Option<Tokenizer>)> {
    let path = g.path();
    let (cfg, names) = arch::from_gguf(g)?;
    let weights = llm::load_weights(&cfg, g, &names)?;
    if let Some(tokens) = g.get_str_array_opt("tokenizer.ggml.tokens")? {
        let rows = weights.embed.rows();
        if tokens.len() != rows {
            return Err(Error::format(
                path,
                format!(
                    "a vocabulary of {} tokens for an embedding of {rows} rows",
                    tokens.len()
                ),
            ));
        }
    }
    let tokenizer = match g.get_str_opt("tokenizer.ggml.model")? {
        Some(_) => Some(gguf_tokenizer(g)?),
        None => None,
    };
    Ok((cfg, weights, tokenizer))
}

/// The tokenizer stored in a GGUF file's `tokenizer.ggml.*` metadata.
pub fn gguf_tokenizer(g: &GgufFile) -> Result<Tokenizer> {
    let id = |k: &str| -> Result<Option<u32>> { g.get_u32_opt(k) };
    let extra_eos = ["tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"]
        .iter()
        .map(|k| id(k))
        .collect::<Result<Vec<_>>>()?
        .into_iter()
        .flatten()
        .collect();
    let vocab = GgufVocab {
        model: g.get_str("tokenizer.ggml.model")?.to_string(),
        pre: g
            .get_str_opt("tokenizer.ggml.pre")?
            .unwrap_or("default")
            .to_string(),
        tokens: g.get_str_array("tokenizer.ggml.tokens")?.to_vec(),
        merges: g
            .get_str_array_opt("tokenizer.ggml.merges")?
            .map(<[String]>::to_vec)
            .unwrap_or_default(),
        scores: gguf_scores(g)?,
        token_types: g
            .get_i32_array_opt("tokenizer.ggml.token_type")?
            .map(<[i32]>::to_vec)
            .unwrap_or_default(),
        bos_id: id("tokenizer.ggml.bos_token_id")?,
        eos_id: id("tokenizer.ggml.eos_token_id")?,
        extra_eos_ids: extra_eos,
        add_bos: g.get_bool_opt("tokenizer.ggml.add_bos_token")?,
        add_eos: g.get_bool_opt("tokenizer.ggml.add_eos_token")?,
        add_space_prefix: g.get_bool_opt("tokenizer.ggml.add_space_prefix")?,
        chat_template: g
            .get_str_opt("tokenizer.chat_template")?
            .map(str::to_string),
    };
    Tokenizer::from_gguf_vocab(g.path(), vocab)
}

/// `tokenizer.ggml.scores`: f32, or i32 as llama.cpp also accepts.
fn gguf_scores(g: &GgufFile) -> Result<Vec<f32>> {
    const KEY: &str = "tokenizer.ggml.scores";
    if let Ok(Some(ints)) = g.get_i32_array_opt(KEY) {
        return Ok(ints.iter().map(|&s| s as f32).collect());
    }
    Ok(g.get_f32_array_opt(KEY)?
        .map(<[f32]>::to_vec)
        .unwrap_or_default())
}
