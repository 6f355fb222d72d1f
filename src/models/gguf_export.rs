//! An HF checkpoint directory mapped onto GGUF the way llama.cpp's converter
//! (`convert_hf_to_gguf.py`, `conversion/{llama,qwen,phi,lfm2}.py`, gguf-py's
//! `SpecialVocab`) writes it, for the `llama` (Llama, Mistral), `qwen2`,
//! `qwen3`, `gemma3`, `phi3` and `lfm2` architectures (byte-level BPE
//! vocabularies, and Gemma's SentencePiece `tokenizer.model`):
//!
//! - metadata keys, value types and order as the converter writes them
//!   (`general.*`, the architecture's hyperparameters, then the tokenizer:
//!   tokens, token types, merges, special token ids, add-BOS/EOS flags, chat
//!   template);
//! - tensors under llama.cpp's names, in the converter's order (shards by
//!   file name, tensors by name within a shard), Llama's q/k rows permuted
//!   for ggml's interleaved RoPE, LFM2's conv taps squeezed to 2-D. The names
//!   come from the architecture's HF and GGUF names tables (`models::arch`),
//!   the ones loading reads, role by role.
//!
//! Where the converter would need Python to decide something, this module
//! decides it from the files: the BPE pre-tokenizer name comes from the
//! structure of `tokenizer.json`'s `pre_tokenizer` rather than from hashing
//! a probe's token ids; LFM2's feed-forward width and every hyperparameter
//! come from the values our loaders use (they check them against the weight
//! shapes), so a config the converter would misread (an LFM2
//! `block_ffn_dim_multiplier: null`, a missing `rope_theta`) is still written
//! as the model computes.

use crate::error::{Error, Result};
use crate::formats::gguf::Value;
use crate::formats::hf::HfConfig;
use crate::formats::safetensors::Safetensors;
use crate::formats::TensorSource;
use crate::models::llm::{name_pairs, Arch, LayerKind, LlmConfig, RopeScaling};
use crate::quant::GgmlType;
use crate::tensor::Tensor;
use serde_json::Value as Json;
use std::path::{Path, PathBuf};

/// `general.quantization_version` as ggml writes it (`GGML_QNT_VERSION`).
pub const QUANTIZATION_VERSION: u32 = 2;

/// llama.cpp token types (`enum llama_token_type`).
const TOKEN_NORMAL: i32 = 1;
const TOKEN_CONTROL: i32 = 3;
const TOKEN_USER_DEFINED: i32 = 4;
const TOKEN_UNUSED: i32 = 5;

#[derive(Clone, Debug, Default)]
pub struct ExportOptions {
    /// `tokenizer.ggml.pre` to write instead of the recognised one.
    pub tokenizer_pre: Option<String>,
    /// `general.file_type` (llama.cpp's `llama_ftype`).
    pub file_type: u32,
}

/// One tensor of the GGUF file and where its values come from.
#[derive(Clone, Debug)]
pub struct ExportTensor {
    /// llama.cpp's name.
    pub name: String,
    /// The name in the HF checkpoint.
    pub source: String,
    /// Shape in the GGUF file, outermost first.
    pub shape: Vec<usize>,
    pub source_dtype: GgmlType,
    /// Llama q/k projections: rows permuted within each of this many heads.
    pub rope_permute: Option<usize>,
    /// A tensor the converter computes rather than copies (Llama 3's
    /// `rope_freqs.weight`): its f32 values; `source` is then empty.
    pub computed: Option<Vec<f32>>,
    /// Added to every value: Gemma's `(1 + w)` norms, stored as `w` in HF
    /// checkpoints and as `1 + w` in GGUF.
    pub shift: f32,
}

/// An HF directory ready to be written as GGUF.
pub struct HfExport {
    pub dir: PathBuf,
    pub arch: Arch,
    pub config: LlmConfig,
    /// Every key and value, in the converter's order.
    pub metadata: Vec<(String, Value)>,
    /// Every tensor, in the converter's order.
    pub tensors: Vec<ExportTensor>,
    weights: Safetensors,
}

/// Metadata with the converter's semantics: setting a key again replaces
/// its value in place (gguf-py keeps the first position).
#[derive(Default)]
struct Meta(Vec<(String, Value)>);

impl Meta {
    fn set(&mut self, key: impl Into<String>, value: impl Into<Value>) {
        let (key, value) = (key.into(), value.into());
        match self.0.iter_mut().find(|(k, _)| *k == key) {
            Some((_, v)) => *v = value,
            None => self.0.push((key, value)),
        }
    }
}

fn u32_of(what: &str, n: usize, path: &Path) -> Result<u32> {
    u32::try_from(n).map_err(|_| Error::format(path, format!("{what} {n} does not fit a u32")))
}

impl HfExport {
    /// Reads `dir` (config.json, safetensors weights, tokenizer files) and
    /// plans the GGUF file; nothing is converted yet.
    pub fn open(dir: &Path, opts: &ExportOptions) -> Result<HfExport> {
        let c = HfConfig::open(dir)?;
        let weights = Safetensors::open(dir)?;
        // Our loaders check the config against itself and every weight's
        // shape against the config, so the planned file is a loadable model.
        let (config, names) = crate::models::arch::from_hf(&c)?;
        let arch = config.arch;
        if !matches!(
            arch,
            Arch::Llama
                | Arch::Mistral
                | Arch::Qwen2
                | Arch::Qwen3
                | Arch::Gemma3
                | Arch::Phi3
                | Arch::Lfm2
        ) {
            return Err(Error::unsupported(
                c.path(),
                format!(
                    "{arch:?} checkpoints (gguf-write handles llama, mistral, qwen2, qwen3, gemma3_text, phi3 and lfm2)"
                ),
            ));
        }
        let linear_ok =
            arch == Arch::Gemma3 && matches!(config.rope_scaling, RopeScaling::Linear(_));
        if !(linear_ok
            || matches!(
                config.rope_scaling,
                RopeScaling::None | RopeScaling::Llama3 { .. }
            ))
        {
            return Err(Error::unsupported(
                c.path(),
                format!(
                    "RoPE scaling {:?} (gguf-write writes Llama 3's as rope_freqs.weight)",
                    config.rope_scaling
                ),
            ));
        }
        crate::models::llm::load_weights(&config, &weights, &names)?;
        let tensors = plan_tensors(arch, &config, &weights)?;
        let metadata = metadata(dir, &c, arch, &config, &tensors, opts)?;
        Ok(HfExport {
            dir: dir.to_path_buf(),
            arch,
            config,
            metadata,
            tensors,
            weights,
        })
    }

    /// The checkpoint tensor behind `t`, as stored (no permutation), or
    /// the computed one.
    pub fn source_tensor(&self, t: &ExportTensor) -> Result<Tensor> {
        match &t.computed {
            Some(v) => Ok(Tensor::from_f32(t.name.clone(), t.shape.clone(), v.clone())),
            None => self.weights.tensor(&t.source),
        }
    }

    /// The values of `t` as they go into the GGUF file: converted to f32,
    /// Llama's q/k rows permuted.
    pub fn read_f32(&self, t: &ExportTensor) -> Result<Vec<f32>> {
        let mut v = self.source_tensor(t)?.to_f32();
        if t.shift != 0.0 {
            v.iter_mut().for_each(|x| *x += t.shift);
        }
        Ok(match t.rope_permute {
            Some(heads) => permute_rope_rows(&v, heads, t.shape[0], t.shape[1]),
            None => v,
        })
    }
}

/// llama.cpp's `LlamaModel.permute`: within each head, row `s * hd/2 + j`
/// (s = 0, 1 the halves transformers rotates together) moves to `2 j + s`,
/// the adjacent pairs ggml's normal RoPE rotates.
pub fn permute_rope_rows(w: &[f32], heads: usize, rows: usize, cols: usize) -> Vec<f32> {
    let hd = rows / heads;
    let half = hd / 2;
    let mut out = vec![0.0f32; w.len()];
    for h in 0..heads {
        for s in 0..2 {
            for j in 0..half {
                let src = h * hd + s * half + j;
                let dst = h * hd + 2 * j + s;
                out[dst * cols..(dst + 1) * cols].copy_from_slice(&w[src * cols..(src + 1) * cols]);
            }
        }
    }
    out
}

/// HF tensor names to llama.cpp's, from the architecture's two names tables
/// (the ones loading reads), so loading and export cannot disagree.
struct NameMap(std::collections::HashMap<String, String>);

impl NameMap {
    fn new(cfg: &LlmConfig) -> NameMap {
        // Untied: a checkpoint that carries lm_head.weight has it exported.
        let hf = crate::models::arch::hf_names(cfg, false);
        let gguf = crate::models::arch::gguf_names(cfg);
        NameMap(name_pairs(cfg, &hf, &gguf).into_iter().collect())
    }

    /// llama.cpp's name for an HF tensor; `Some(None)` for tensors the
    /// converter drops (rotary buffers).
    fn gguf_name(&self, hf: &str) -> Option<Option<String>> {
        if hf.ends_with(".rotary_emb.inv_freq") || hf.ends_with(".attention.masked_bias") {
            return Some(None);
        }
        self.0.get(hf).map(|n| Some(n.clone()))
    }
}

fn plan_tensors(arch: Arch, cfg: &LlmConfig, weights: &Safetensors) -> Result<Vec<ExportTensor>> {
    // The converter reads shards in file-name order and each shard's
    // tensors in name order (as the safetensors package lists them).
    let mut shards: Vec<_> = weights.shards().iter().collect();
    shards.sort_by_key(|s| s.path().file_name().map(|n| n.to_os_string()));
    let map = NameMap::new(cfg);
    let mut out = Vec::new();
    // The converter's extra tensors come first.
    if let Some(f) = llama3_rope_factors(cfg) {
        out.push(ExportTensor {
            name: "rope_freqs.weight".into(),
            source: String::new(),
            shape: vec![f.len()],
            source_dtype: GgmlType::F32,
            rope_permute: None,
            computed: Some(f),
            shift: 0.0,
        });
    }
    for shard in shards {
        let mut names = shard.names();
        names.sort();
        for source in names {
            let name = match map.gguf_name(&source) {
                Some(Some(n)) => n,
                Some(None) => continue,
                None => {
                    return Err(Error::unsupported(
                        shard.path(),
                        format!("tensor '{source}' has no llama.cpp name for {arch:?}"),
                    ))
                }
            };
            let t = shard.tensor(&source)?;
            let mut shape = t.shape.clone();
            if arch == Arch::Lfm2 && name.ends_with("shortconv.conv.weight") && shape.len() == 3 {
                // [hidden, 1, taps] -> [hidden, taps]: ggml's conv op wants 2-D.
                shape.remove(1);
            }
            // llama.cpp's llama architecture rotates interleaved pairs;
            // Qwen's converters keep transformers' halves (NEOX mode).
            let llama = matches!(arch, Arch::Llama | Arch::Mistral);
            let rope_permute = match name.rsplit('.').nth(1) {
                Some("attn_q") if llama => Some(cfg.heads),
                Some("attn_k") if llama => Some(cfg.kv_heads),
                _ => None,
            };
            if rope_permute.is_some() && (shape.len() != 2 || name.ends_with(".bias")) {
                return Err(Error::unsupported(
                    shard.path(),
                    format!("tensor '{source}' of shape {:?}", t.shape),
                ));
            }
            let shift = if cfg.arch == Arch::Gemma3 && name.ends_with("norm.weight") {
                1.0
            } else {
                0.0
            };
            out.push(ExportTensor {
                name,
                source,
                shape,
                source_dtype: t.dtype,
                rope_permute,
                computed: None,
                shift,
            });
        }
    }
    Ok(out)
}

/// Llama 3's RoPE scaling as llama.cpp's converter stores it
/// (`LlamaModel.generate_extra_tensors`): per dimension pair, the divisor of
/// the frequency, computed in f32 as torch does there.
fn llama3_rope_factors(cfg: &LlmConfig) -> Option<Vec<f32>> {
    let RopeScaling::Llama3 {
        factor,
        low_freq_factor: low,
        high_freq_factor: high,
        original_context,
    } = cfg.rope_scaling
    else {
        return None;
    };
    let (dim, old) = (cfg.head_dim, original_context as f32);
    let (low_wavelen, high_wavelen) = (old / low, old / high);
    Some(
        (0..dim / 2)
            .map(|i| {
                let freq = 1.0 / cfg.rope_theta.powf((2 * i) as f32 / dim as f32);
                let wavelen = 2.0 * std::f32::consts::PI / freq;
                if wavelen < high_wavelen {
                    1.0
                } else if wavelen > low_wavelen {
                    factor
                } else {
                    let smooth = (old / wavelen - low) / (high - low);
                    1.0 / ((1.0 - smooth) / factor + smooth)
                }
            })
            .collect(),
    )
}

/// gguf-py's `size_label`: the parameter count with two significant digits
/// and a K/M/B/T suffix ("280K", "135M", "1.2B").
pub fn size_label(params: usize) -> String {
    let p = params as f64;
    let (scaled, suffix) = if p > 1e12 {
        (p * 1e-12, "T")
    } else if p > 1e9 {
        (p * 1e-9, "B")
    } else if p > 1e6 {
        (p * 1e-6, "M")
    } else {
        (p * 1e-3, "K")
    };
    let digits = format!("{}", scaled.round() as u64)
        .trim_start_matches('0')
        .len();
    let fix = 2usize.saturating_sub(digits);
    format!("{scaled:.fix$}{suffix}")
}

fn metadata(
    dir: &Path,
    c: &HfConfig,
    arch: Arch,
    cfg: &LlmConfig,
    tensors: &[ExportTensor],
    opts: &ExportOptions,
) -> Result<Vec<(String, Value)>> {
    let a = arch.gguf_name();
    let mut m = Meta::default();
    let params: usize = tensors
        .iter()
        .map(|t| t.shape.iter().product::<usize>())
        .sum();
    let name = dir
        .canonicalize()
        .ok()
        .and_then(|d| d.file_name().map(|n| n.to_string_lossy().to_string()))
        .unwrap_or_else(|| "model".to_string());
    m.set("general.architecture", a);
    m.set("general.type", "model");
    m.set("general.name", name);
    m.set("general.size_label", size_label(params));
    if arch == Arch::Phi3 {
        phi3_metadata(c, cfg, opts, &mut m)?;
    } else {
        text_model_metadata(c, arch, cfg, opts, &mut m)?;
    }
    m.set("general.quantization_version", QUANTIZATION_VERSION);
    tokenizer_metadata(dir, arch, cfg.vocab, opts.tokenizer_pre.as_deref(), &mut m)?;
    if matches!(arch, Arch::Llama | Arch::Mistral) && cfg.vocab == 49152 {
        // The converter's rule for "granite small" vocabularies, which SmolLM2
        // shares: no BOS.
        m.set("tokenizer.ggml.add_bos_token", false);
    }
    Ok(m.0)
}

/// The hyperparameters as `TextModel.set_gguf_parameters` writes them (and
/// the llama and lfm2 converters' additions).
fn text_model_metadata(
    c: &HfConfig,
    arch: Arch,
    cfg: &LlmConfig,
    opts: &ExportOptions,
    m: &mut Meta,
) -> Result<()> {
    let path = c.path();
    let a = arch.gguf_name();
    let key = |k: &str| format!("{a}.{k}");
    let u = |what: &str, n: usize| u32_of(what, n, path);
    m.set(key("block_count"), u("block count", cfg.layers.len())?);
    m.set(key("context_length"), u("context length", cfg.context)?);
    m.set(key("embedding_length"), u("hidden size", cfg.hidden)?);
    m.set(key("feed_forward_length"), u("feed-forward size", cfg.ffn)?);
    m.set(key("attention.head_count"), u("head count", cfg.heads)?);
    match arch {
        Arch::Llama | Arch::Mistral | Arch::Qwen2 | Arch::Qwen3 | Arch::Gemma3 | Arch::Phi3 => m
            .set(
                key("attention.head_count_kv"),
                u("kv head count", cfg.kv_heads)?,
            ),
        Arch::Lfm2 => {
            let kv = i32::try_from(cfg.kv_heads)
                .map_err(|_| Error::format(path, "kv head count does not fit an i32"))?;
            let per_layer: Vec<i32> = cfg
                .layers
                .iter()
                .map(|k| if *k == LayerKind::Attention { kv } else { 0 })
                .collect();
            m.set(key("attention.head_count_kv"), per_layer);
        }
    }
    if let RopeScaling::Linear(f) = cfg.rope_scaling {
        m.set(key("rope.scaling.type"), "linear");
        m.set(key("rope.scaling.factor"), f);
    }
    m.set(key("rope.freq_base"), cfg.rope_theta);
    if let Some(theta) = cfg.rope_local_theta {
        m.set(key("rope.freq_base_swa"), theta);
    }
    m.set(key("attention.layer_norm_rms_epsilon"), cfg.norm_eps);
    if c.get("head_dim").is_some() {
        m.set(key("attention.key_length"), u("head dim", cfg.head_dim)?);
        m.set(key("attention.value_length"), u("head dim", cfg.head_dim)?);
    }
    m.set("general.file_type", opts.file_type);
    if arch == Arch::Gemma3 && cfg.sliding_window > 0 {
        m.set(
            key("attention.sliding_window"),
            u("sliding window", cfg.sliding_window)?,
        );
    }
    let llama = matches!(arch, Arch::Llama | Arch::Mistral);
    if llama || arch == Arch::Lfm2 {
        m.set(key("vocab_size"), u("vocabulary size", cfg.vocab)?);
    }
    if arch == Arch::Lfm2 {
        m.set(key("shortconv.l_cache"), u("conv size", cfg.conv_kernel)?);
    } else if llama {
        m.set(
            key("rope.dimension_count"),
            u("rope dimension", cfg.rope_dim)?,
        );
    }
    Ok(())
}

/// Phi-3's hyperparameters in `Phi3MiniModel.set_gguf_parameters`' order.
fn phi3_metadata(c: &HfConfig, cfg: &LlmConfig, opts: &ExportOptions, m: &mut Meta) -> Result<()> {
    let path = c.path();
    let key = |k: &str| format!("phi3.{k}");
    let u = |what: &str, n: usize| u32_of(what, n, path);
    let original = c
        .get("rope_parameters.original_max_position_embeddings")
        .and_then(Json::as_u64)
        .or(c
            .get_usize_opt("original_max_position_embeddings")?
            .map(|v| v as u64))
        .ok_or_else(|| Error::format(path, "no original_max_position_embeddings"))?;
    m.set(key("context_length"), u("context length", cfg.context)?);
    m.set(
        key("rope.scaling.original_context_length"),
        u("original context", original as usize)?,
    );
    m.set(key("embedding_length"), u("hidden size", cfg.hidden)?);
    m.set(key("feed_forward_length"), u("feed-forward size", cfg.ffn)?);
    m.set(key("block_count"), u("block count", cfg.layers.len())?);
    m.set(key("attention.head_count"), u("head count", cfg.heads)?);
    m.set(
        key("attention.head_count_kv"),
        u("kv head count", cfg.kv_heads)?,
    );
    m.set(key("attention.layer_norm_rms_epsilon"), cfg.norm_eps);
    m.set(
        key("rope.dimension_count"),
        u("rope dimension", cfg.rope_dim)?,
    );
    m.set(key("rope.freq_base"), cfg.rope_theta);
    m.set("general.file_type", opts.file_type);
    m.set(
        key("attention.sliding_window"),
        u("sliding window", cfg.sliding_window)?,
    );
    Ok(())
}

fn read_json(path: &Path) -> Result<Option<Json>> {
    if !path.is_file() {
        return Ok(None);
    }
    let text = std::fs::read(path).map_err(|e| Error::io(path, e))?;
    serde_json::from_slice(&text)
        .map(Some)
        .map_err(|e| Error::format(path, format!("not valid JSON: {e}")))
}

/// Two pre-tokenizer JSON values equal for llama.cpp's purposes: same
/// structure and values, ignoring `trim_offsets` (it only moves offsets).
fn same_pre_tokenizer(a: &Json, b: &Json) -> bool {
    match (a, b) {
        (Json::Object(x), Json::Object(y)) => {
            let keys = |o: &serde_json::Map<String, Json>| {
                let mut k: Vec<String> =
                    o.keys().filter(|k| *k != "trim_offsets").cloned().collect();
                k.sort();
                k
            };
            keys(x) == keys(y)
                && x.iter()
                    .filter(|(k, _)| *k != "trim_offsets")
                    .all(|(k, v)| same_pre_tokenizer(v, &y[k]))
        }
        (Json::Array(x), Json::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(a, b)| same_pre_tokenizer(a, b))
        }
        _ => a == b,
    }
}

/// The `tokenizer.ggml.pre` name llama.cpp uses for a `tokenizer.json`
/// pre-tokenizer, for the pre-tokenizers of the models lfm handles.
pub fn recognise_pre_tokenizer(pre: &Json, arch: Arch) -> Option<&'static str> {
    use serde_json::json;
    const LLAMA3: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
    const QWEN2: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
    let byte_level = |use_regex: bool| json!({"type": "ByteLevel", "add_prefix_space": false, "use_regex": use_regex});
    let split = |pattern: &str| json!({"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated", "invert": false});
    let llama3 = if arch == Arch::Lfm2 {
        "lfm2"
    } else {
        "llama-bpe"
    };
    let known = [
        (byte_level(true), "gpt-2"),
        (
            json!({"type": "Sequence", "pretokenizers": [{"type": "Digits", "individual_digits": true}, byte_level(true)]}),
            "smollm",
        ),
        (
            json!({"type": "Sequence", "pretokenizers": [split(LLAMA3), byte_level(false)]}),
            llama3,
        ),
        (
            json!({"type": "Sequence", "pretokenizers": [split(QWEN2), byte_level(false)]}),
            "qwen2",
        ),
    ];
    known
        .into_iter()
        .find(|(k, _)| same_pre_tokenizer(pre, k))
        .map(|(_, name)| name)
}

/// The merges of a BPE `tokenizer.json` as gguf-py writes them: "a b",
/// with a space inside a part written as U+0120 (gguf-py's encoding).
fn merges(model: &Json, path: &Path) -> Result<Vec<String>> {
    let Some(list) = model.get("merges").and_then(Json::as_array) else {
        return Ok(Vec::new());
    };
    list.iter()
        .map(|m| match m {
            Json::String(s) => Ok(s.clone()),
            Json::Array(pair) if pair.len() == 2 => {
                let part = |p: &Json| -> Option<String> {
                    Some(
                        p.as_str()?
                            .chars()
                            .map(|c| if c == ' ' { '\u{0120}' } else { c })
                            .collect(),
                    )
                };
                match (part(&pair[0]), part(&pair[1])) {
                    (Some(a), Some(b)) => Ok(format!("{a} {b}")),
                    _ => Err(Error::format(path, format!("merge {m} is not two strings"))),
                }
            }
            _ => Err(Error::format(
                path,
                format!("merge {m} is neither \"a b\" nor [a, b]"),
            )),
        })
        .collect()
}

/// gguf-py's `does_token_look_special`.
fn looks_special(t: &str) -> bool {
    matches!(t, "<pad>" | "<mask>" | "<2mass>" | "[@BOS@]")
        || (t.starts_with("<|") && t.ends_with("|>"))
        || (t.starts_with("<\u{ff5c}") && t.ends_with("\u{ff5c}>"))
        || (t.starts_with("<unused") && t.ends_with('>'))
}

/// The special-token kinds gguf-py's `SpecialVocab` looks for, with their
/// GGUF keys (`cls` has no key and is skipped, as gguf-py does).
const SPECIAL_KINDS: [(&str, Option<&str>); 7] = [
    ("bos", Some("tokenizer.ggml.bos_token_id")),
    ("eos", Some("tokenizer.ggml.eos_token_id")),
    ("unk", Some("tokenizer.ggml.unknown_token_id")),
    ("sep", Some("tokenizer.ggml.seperator_token_id")),
    ("pad", Some("tokenizer.ggml.padding_token_id")),
    ("cls", None),
    ("mask", Some("tokenizer.ggml.mask_token_id")),
];

struct Added {
    content: String,
    special: bool,
}

/// tokenizer.json's added tokens as (id, content, special).
fn added_tokens(tj: &Json, path: &Path) -> Result<Vec<(usize, Added)>> {
    let mut added: Vec<(usize, Added)> = Vec::new();
    for a in tj
        .get("added_tokens")
        .and_then(Json::as_array)
        .into_iter()
        .flatten()
    {
        let (Some(id), Some(content)) = (
            a.get("id").and_then(Json::as_u64),
            a.get("content").and_then(Json::as_str),
        ) else {
            return Err(Error::format(
                path,
                format!("added token {a} has no id or content"),
            ));
        };
        added.push((
            id as usize,
            Added {
                content: content.to_string(),
                special: a.get("special").and_then(Json::as_bool).unwrap_or(false),
            },
        ));
    }
    Ok(added)
}

fn tokenizer_metadata(
    dir: &Path,
    arch: Arch,
    vocab_size: usize,
    pre_override: Option<&str>,
    m: &mut Meta,
) -> Result<()> {
    let path = dir.join("tokenizer.json");
    let tj = read_json(&path)?.ok_or_else(|| {
        Error::invalid(format!(
            "{}: no tokenizer.json (a GGUF model needs its tokenizer)",
            dir.display()
        ))
    })?;
    let out_of_range = |id: u64| {
        Error::format(
            &path,
            format!("token id {id} is outside the model's {vocab_size}-token vocabulary"),
        )
    };
    let config = read_json(&dir.join("tokenizer_config.json"))?;
    let tc = config.as_ref().and_then(Json::as_object);
    let added = added_tokens(&tj, &path)?;
    // Gemma's converter takes the SentencePiece model when there is one.
    let spm = dir.join("tokenizer.model");
    if arch == Arch::Gemma3 && spm.is_file() {
        sentencepiece_vocab(&spm, vocab_size, tc, m)?;
    } else {
        bpe_vocab(&tj, &path, arch, vocab_size, tc, &added, pre_override, m)?;
    }
    // Special token ids and add-BOS/EOS flags, in gguf-py's order: what the
    // post-processor says, then tokenizer_config.json, then config.json ids.
    let token_content = |kind: &str| -> Option<String> {
        match tc?.get(&format!("{kind}_token"))? {
            Json::String(s) => Some(s.clone()),
            Json::Object(o) => o.get("content")?.as_str().map(str::to_string),
            _ => None,
        }
    };
    let mut add_flags: Vec<(String, bool)> = Vec::new();
    let set_flag =
        |flags: &mut Vec<(String, bool)>, kind: &str, v: bool, overwrite: bool| match flags
            .iter_mut()
            .find(|(k, _)| k == kind)
        {
            Some((_, old)) if overwrite => *old = v,
            Some(_) => {}
            None => flags.push((kind.to_string(), v)),
        };
    if let Some(post) = tj.get("post_processor").filter(|p| !p.is_null()) {
        let procs: Vec<&Json> = match post.get("processors").and_then(Json::as_array) {
            Some(list) => list.iter().collect(),
            None => vec![post],
        };
        for p in procs {
            match p.get("type").and_then(Json::as_str) {
                Some("ByteLevel") => {
                    set_flag(&mut add_flags, "bos", false, false);
                    set_flag(&mut add_flags, "eos", false, false);
                }
                Some("RobertaProcessing") => {
                    for k in ["bos", "eos", "sep"] {
                        set_flag(&mut add_flags, k, true, true);
                    }
                }
                Some("TemplateProcessing") => {
                    let single = p
                        .get("single")
                        .and_then(Json::as_array)
                        .cloned()
                        .unwrap_or_default();
                    let special_id = |e: Option<&Json>| -> Option<String> {
                        e?.get("SpecialToken")?
                            .get("id")?
                            .as_str()
                            .map(str::to_string)
                    };
                    if single.len() > 1 {
                        // Without a tokenizer_config.json gguf-py takes the
                        // template's own tokens as BOS and EOS.
                        if let Some(first) = special_id(single.first()) {
                            let is_bos = tc.is_none()
                                || [token_content("bos"), token_content("cls")]
                                    .contains(&Some(first));
                            set_flag(&mut add_flags, "bos", is_bos, true);
                        }
                        if let Some(last) = special_id(single.last()) {
                            let is_eos = tc.is_none() || token_content("eos") == Some(last);
                            set_flag(&mut add_flags, "eos", is_eos, true);
                        }
                    }
                    // The pair template: a separator between A and B (beyond
                    // the single template's own first and last tokens).
                    let (first, last) = if single.len() > 1 {
                        (special_id(single.first()), special_id(single.last()))
                    } else {
                        (None, None)
                    };
                    let pair = p
                        .get("pair")
                        .and_then(Json::as_array)
                        .cloned()
                        .unwrap_or_default();
                    if !pair.is_empty() {
                        let start =
                            usize::from(first.is_some() && special_id(pair.first()) == first);
                        let stop = pair.len()
                            - usize::from(last.is_some() && special_id(pair.last()) == last);
                        let inner = &pair[start..stop.max(start)];
                        let seq = |e: Option<&Json>| {
                            e.and_then(|e| e.get("Sequence")?.get("id")?.as_str())
                                .map(str::to_string)
                        };
                        if inner.len() > 2
                            && seq(inner.first()).as_deref() == Some("A")
                            && seq(inner.last()).as_deref() == Some("B")
                        {
                            let mid = &inner[1..inner.len() - 1];
                            let separators = [token_content("sep"), token_content("eos")];
                            let is_sep = |e: Option<&Json>| {
                                special_id(e).is_some_and(|id| separators.contains(&Some(id)))
                            };
                            let add_sep = (is_sep(mid.first()) && last.is_none())
                                || (mid.len() == 2 && is_sep(mid.get(1)));
                            set_flag(&mut add_flags, "sep", add_sep, true);
                        }
                    }
                }
                _ => {}
            }
        }
    }
    let mut ids: Vec<(&str, u32)> = Vec::new();
    if let Some(tc) = tc {
        for (kind, _) in SPECIAL_KINDS {
            if let Some(b) = tc.get(&format!("add_{kind}_token")).and_then(Json::as_bool) {
                set_flag(&mut add_flags, kind, b, false);
            }
            let id = token_content(kind).and_then(|content| {
                added
                    .iter()
                    .find(|(_, a)| a.content == content)
                    .map(|(i, _)| *i)
            });
            if let Some(id) = id {
                ids.push((kind, id as u32));
            }
        }
    }
    if let Some(cfg) = read_json(&dir.join("config.json"))? {
        for (kind, _) in SPECIAL_KINDS {
            let id = cfg.get(format!("{kind}_token_id")).and_then(Json::as_u64);
            if let (Some(id), false) = (id, ids.iter().any(|(k, _)| *k == kind)) {
                let id = u32::try_from(id).map_err(|_| out_of_range(id))?;
                ids.push((kind, id));
            }
        }
    }
    // gguf-py's SpecialVocab drops ids past the vocabulary.
    for (kind, id) in ids
        .into_iter()
        .filter(|(_, id)| (*id as usize) < vocab_size)
    {
        if let Some((_, Some(key))) = SPECIAL_KINDS.iter().find(|(k, _)| *k == kind) {
            m.set(*key, id);
        }
    }
    for (kind, v) in add_flags {
        if matches!(kind.as_str(), "bos" | "eos" | "sep") {
            m.set(format!("tokenizer.ggml.add_{kind}_token"), v);
        }
    }
    if let Some(tc) = tc {
        let template = match tc.get("chat_template") {
            Some(Json::String(s)) => Some(s.clone()),
            _ => {
                let jinja = dir.join("chat_template.jinja");
                if jinja.is_file() {
                    Some(std::fs::read_to_string(&jinja).map_err(|e| Error::io(&jinja, e))?)
                } else {
                    read_json(&dir.join("chat_template.json"))?
                        .and_then(|j| j.get("chat_template")?.as_str().map(str::to_string))
                }
            }
        };
        if let Some(t) = template {
            m.set("tokenizer.chat_template", t);
        }
    }
    if arch == Arch::Gemma3 && spm.is_file() {
        m.set("tokenizer.ggml.add_space_prefix", false);
    } else if let Some(n) = tj.get("normalizer").filter(|n| !n.is_null()) {
        normalizer_flags(n, m);
    }
    Ok(())
}

/// The byte-level BPE vocabulary as `_set_vocab_gpt2` writes it.
#[allow(clippy::too_many_arguments)]
fn bpe_vocab(
    tj: &Json,
    path: &Path,
    arch: Arch,
    vocab_size: usize,
    tc: Option<&serde_json::Map<String, Json>>,
    added: &[(usize, Added)],
    pre_override: Option<&str>,
    m: &mut Meta,
) -> Result<()> {
    let model = tj.get("model").cloned().unwrap_or(Json::Null);
    let kind = model.get("type").and_then(Json::as_str).unwrap_or("");
    let byte_fallback = model
        .get("byte_fallback")
        .and_then(Json::as_bool)
        .unwrap_or(false);
    if kind != "BPE" || byte_fallback {
        return Err(Error::unsupported(
            path,
            format!(
                "tokenizer model '{kind}'{} (gguf-write writes byte-level BPE tokenizers, and \
                 Gemma's tokenizer.model)",
                if byte_fallback {
                    " with byte fallback"
                } else {
                    ""
                }
            ),
        ));
    }
    if let Some(b) = tc
        .and_then(|t| t.get("add_prefix_space"))
        .and_then(Json::as_bool)
    {
        if matches!(arch, Arch::Llama | Arch::Mistral) {
            m.set("tokenizer.ggml.add_space_prefix", b);
        }
    }

    // Tokens: the BPE vocabulary, added tokens over it, padded to the
    // model's vocabulary size with "[PAD{i}]" (unused), as the converter does.
    let mut tokens: Vec<Option<String>> = vec![None; vocab_size];
    let out_of_range = |id: u64| {
        Error::format(
            path,
            format!("token id {id} is outside the model's {vocab_size}-token vocabulary"),
        )
    };
    let vocab = model
        .get("vocab")
        .and_then(Json::as_object)
        .ok_or_else(|| Error::format(path, "model.vocab is not an object"))?;
    for (tok, id) in vocab {
        let id = id
            .as_u64()
            .ok_or_else(|| Error::format(path, format!("vocab id of {tok:?} is not an integer")))?;
        *tokens
            .get_mut(id as usize)
            .ok_or_else(|| out_of_range(id))? = Some(tok.clone());
    }
    for (id, a) in added {
        *tokens
            .get_mut(*id)
            .ok_or_else(|| out_of_range(*id as u64))? = Some(a.content.clone());
    }
    let mut list = Vec::with_capacity(vocab_size);
    let mut types = Vec::with_capacity(vocab_size);
    for (i, tok) in tokens.into_iter().enumerate() {
        match tok {
            None => {
                list.push(format!("[PAD{i}]"));
                types.push(TOKEN_UNUSED);
            }
            Some(t) => match added.iter().find(|(_, a)| a.content == t) {
                Some((_, a)) if a.special || looks_special(&t) => {
                    list.push(t);
                    types.push(TOKEN_CONTROL);
                }
                Some(_) => {
                    list.push(t.replace('\u{2581}', " "));
                    types.push(TOKEN_USER_DEFINED);
                }
                None => {
                    list.push(t);
                    types.push(TOKEN_NORMAL);
                }
            },
        }
    }

    let pre = match pre_override {
        Some(p) => p.to_string(),
        None => {
            let pre_json = tj.get("pre_tokenizer").cloned().unwrap_or(Json::Null);
            recognise_pre_tokenizer(&pre_json, arch)
                .ok_or_else(|| {
                    Error::unsupported(
                        path,
                        "pre-tokenizer not recognised (known: gpt-2, smollm, llama-bpe/lfm2, \
                         qwen2); name llama.cpp's with --tokenizer-pre",
                    )
                })?
                .to_string()
        }
    };
    m.set("tokenizer.ggml.model", "gpt2");
    m.set("tokenizer.ggml.pre", pre);
    m.set("tokenizer.ggml.tokens", list);
    m.set("tokenizer.ggml.token_type", types);
    let merges = merges(&model, path)?;
    if !merges.is_empty() {
        m.set("tokenizer.ggml.merges", merges);
    }

    Ok(())
}

/// gguf-py's `_parse_normalizer`: lower-casing and accent stripping.
fn normalizer_flags(n: &Json, m: &mut Meta) {
    match n.get("type").and_then(Json::as_str) {
        Some("Lowercase") => m.set("tokenizer.ggml.normalizer.lowercase", true),
        Some("StripAccents") => m.set("tokenizer.ggml.normalizer.strip_accents", true),
        Some("BertNormalizer") => {
            if let Some(b) = n.get("lowercase").and_then(Json::as_bool) {
                m.set("tokenizer.ggml.normalizer.lowercase", b);
            }
            if let Some(b) = n.get("strip_accents").and_then(Json::as_bool) {
                m.set("tokenizer.ggml.normalizer.strip_accents", b);
            }
        }
        Some("Sequence") => {
            for inner in n
                .get("normalizers")
                .and_then(Json::as_array)
                .into_iter()
                .flatten()
            {
                normalizer_flags(inner, m);
            }
        }
        _ => {}
    }
}

/// SentencePiece piece types (`sentencepiece_model.proto`).
const SP_UNKNOWN: u64 = 2;
const SP_CONTROL: u64 = 3;
const SP_UNUSED: u64 = 5;
const SP_BYTE: u64 = 6;
/// llama.cpp's byte token type.
const TOKEN_BYTE: i32 = 6;
const TOKEN_UNKNOWN: i32 = 2;

/// The pieces of a SentencePiece `tokenizer.model` (the `ModelProto`'s
/// field 1): (piece, score, type).
fn read_sentencepiece(path: &Path) -> Result<Vec<(String, f32, u64)>> {
    let bytes = std::fs::read(path).map_err(|e| Error::io(path, e))?;
    let bad = |what: &str| Error::format(path, format!("not a SentencePiece model: {what}"));
    let mut pieces = Vec::new();
    let mut r = ProtoReader(&bytes);
    while let Some((field, value)) = r.next().map_err(&bad)? {
        if let (1, ProtoValue::Bytes(msg)) = (field, value) {
            let (mut piece, mut score, mut kind) = (None, 0.0f32, 1u64);
            let mut m = ProtoReader(msg);
            while let Some((f, v)) = m.next().map_err(&bad)? {
                match (f, v) {
                    (1, ProtoValue::Bytes(b)) => {
                        piece = Some(
                            String::from_utf8(b.to_vec())
                                .map_err(|_| bad("a piece is not UTF-8"))?,
                        )
                    }
                    (2, ProtoValue::Fixed32(x)) => score = f32::from_bits(x),
                    (3, ProtoValue::Varint(t)) => kind = t,
                    _ => {}
                }
            }
            pieces.push((
                piece.ok_or_else(|| bad("a piece without text"))?,
                score,
                kind,
            ));
        }
    }
    if pieces.is_empty() {
        return Err(bad("no pieces"));
    }
    Ok(pieces)
}

enum ProtoValue<'a> {
    Varint(u64),
    Fixed32(u32),
    Bytes(&'a [u8]),
}

/// The protobuf wire format, field by field (enough for a SentencePiece
/// model; 64-bit fixed values are skipped).
struct ProtoReader<'a>(&'a [u8]);

impl<'a> ProtoReader<'a> {
    fn varint(&mut self) -> std::result::Result<u64, &'static str> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let (&b, rest) = self.0.split_first().ok_or("truncated varint")?;
            self.0 = rest;
            v |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err("varint too long")
    }

    fn take(&mut self, n: usize) -> std::result::Result<&'a [u8], &'static str> {
        if n > self.0.len() {
            return Err("truncated field");
        }
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        Ok(a)
    }

    fn next(&mut self) -> std::result::Result<Option<(u64, ProtoValue<'a>)>, &'static str> {
        while !self.0.is_empty() {
            let tag = self.varint()?;
            let field = tag >> 3;
            match tag & 7 {
                0 => return Ok(Some((field, ProtoValue::Varint(self.varint()?)))),
                1 => {
                    self.take(8)?;
                }
                2 => {
                    let n = usize::try_from(self.varint()?).map_err(|_| "field too long")?;
                    return Ok(Some((field, ProtoValue::Bytes(self.take(n)?))));
                }
                5 => {
                    let b = self.take(4)?;
                    return Ok(Some((
                        field,
                        ProtoValue::Fixed32(u32::from_le_bytes([b[0], b[1], b[2], b[3]])),
                    )));
                }
                _ => return Err("unknown wire type"),
            }
        }
        Ok(None)
    }
}

/// The SentencePiece vocabulary as `_create_vocab_sentencepiece` writes it:
/// every piece with its score and type ("[PAD{i}]" unused past the model's
/// pieces), then `added_tokens.json` (user-defined) and tokenizer_config's
/// `added_tokens_decoder` (control when special) over them.
fn sentencepiece_vocab(
    path: &Path,
    vocab_size: usize,
    tc: Option<&serde_json::Map<String, Json>>,
    m: &mut Meta,
) -> Result<()> {
    let pieces = read_sentencepiece(path)?;
    let mut tokens: Vec<String> = (0..vocab_size).map(|i| format!("[PAD{i}]")).collect();
    let mut scores = vec![-10000.0f32; vocab_size];
    let mut types = vec![TOKEN_UNUSED; vocab_size];
    for (id, (piece, score, kind)) in pieces.into_iter().enumerate().take(vocab_size) {
        types[id] = match kind {
            SP_UNKNOWN => TOKEN_UNKNOWN,
            SP_CONTROL => TOKEN_CONTROL,
            SP_UNUSED => TOKEN_UNUSED,
            SP_BYTE => TOKEN_BYTE,
            _ => TOKEN_NORMAL,
        };
        tokens[id] = piece;
        scores[id] = score;
    }
    let dir = path.parent().unwrap_or(Path::new("."));
    if let Some(Json::Object(a)) = read_json(&dir.join("added_tokens.json"))? {
        for (tok, id) in a {
            match id.as_u64().map(|v| v as usize) {
                Some(id) if id < vocab_size => {
                    tokens[id] = tok.clone();
                    scores[id] = -1000.0;
                    types[id] = TOKEN_USER_DEFINED;
                }
                _ => {}
            }
        }
    }
    if let Some(Json::Object(dec)) = tc.and_then(|t| t.get("added_tokens_decoder")) {
        for (id, data) in dec {
            let (Ok(id), Some(content)) = (
                id.parse::<usize>(),
                data.get("content").and_then(Json::as_str),
            ) else {
                continue;
            };
            if id >= vocab_size {
                continue;
            }
            let special = data.get("special").and_then(Json::as_bool).unwrap_or(false);
            if special || looks_special(content) {
                tokens[id] = content.to_string();
                types[id] = TOKEN_CONTROL;
            } else {
                tokens[id] = content.replace('\u{2581}', " ");
                types[id] = TOKEN_USER_DEFINED;
            }
            scores[id] = -1000.0;
        }
    }
    m.set("tokenizer.ggml.model", "llama");
    m.set("tokenizer.ggml.pre", "default");
    m.set("tokenizer.ggml.tokens", tokens);
    m.set("tokenizer.ggml.scores", scores);
    m.set("tokenizer.ggml.token_type", types);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn size_labels_match_gguf_py() {
        assert_eq!(size_label(279_936), "280K");
        assert_eq!(size_label(134_515_008), "135M");
        assert_eq!(size_label(1_170_340_608), "1.2B");
        assert_eq!(size_label(354_483_968), "354M");
        assert_eq!(size_label(9_400), "9.4K");
    }

    #[test]
    fn rope_permutation_interleaves_the_halves_of_each_head() {
        // 2 heads of 4 rows, 1 column: rows (0 1 | 2 3) (4 5 | 6 7).
        let w: Vec<f32> = (0..8).map(|i| i as f32).collect();
        assert_eq!(
            permute_rope_rows(&w, 2, 8, 1),
            vec![0., 2., 1., 3., 4., 6., 5., 7.]
        );
    }

    #[test]
    fn names_map_like_the_converter() {
        let cfg = |arch| LlmConfig {
            arch,
            layers: vec![LayerKind::Attention; 13],
            ..LlmConfig::default()
        };
        let (llama, lfm2) = (
            NameMap::new(&cfg(Arch::Llama)),
            NameMap::new(&cfg(Arch::Lfm2)),
        );
        assert_eq!(
            llama.gguf_name("model.layers.12.self_attn.o_proj.weight"),
            Some(Some("blk.12.attn_output.weight".into()))
        );
        assert_eq!(
            lfm2.gguf_name("model.layers.0.feed_forward.w2.weight"),
            Some(Some("blk.0.ffn_down.weight".into()))
        );
        assert_eq!(
            lfm2.gguf_name("model.embedding_norm.weight"),
            Some(Some("token_embd_norm.weight".into()))
        );
        assert_eq!(
            llama.gguf_name("model.layers.0.self_attn.rotary_emb.inv_freq"),
            Some(None)
        );
        assert_eq!(llama.gguf_name("model.layers.0.mystery.weight"), None);
        assert_eq!(llama.gguf_name("model.embedding_norm.weight"), None);
    }
}
