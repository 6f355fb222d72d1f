//! `kld`: how far a weight format (or another model file, or another
//! device) moves a model's next-token distributions from a reference, over
//! a text corpus, as llama.cpp's `llama-perplexity --kl-divergence` measures.

use super::{DeviceArgs, DeviceChoice};
use crate::formats::gguf::GgufFile;
use crate::gpu::llm_ops;
use crate::models::llm::CausalLm;
use crate::models::{self, LoadOptions, LoadedLlm};
use crate::quant::{policy, GgmlType};
use crate::run::kld::{
    self, ArmDevice, ArmSource, ArmSpec, Chunks, RefFile, RefHeader, RefWriter, Reference, Report,
    REF_ENCODING, REF_FORMAT_VERSION,
};
use crate::tensor::Activations;
use crate::tokenizer::Tokenizer;
use anyhow::{bail, Context};
use clap::Parser;
use std::io::Write;
use std::path::{Path, PathBuf};

/// KL divergence of weight formats, model files or devices from a reference.
///
/// Evaluates a text corpus in chunks of --ctx tokens, each from an empty
/// cache, and scores the second half of each chunk as llama.cpp's perplexity
/// tool does with --kl-divergence: PPL of the reference and of every arm,
/// mean KLD with its standard error, KLD percentiles, the change in the
/// correct token's probability, and how often the most likely token agrees.
/// An arm is a weight format built from --model on load (f32, f16, bf16,
/// q8_0, q4_0, q4_k, q1_0, ...) or a model file, on the CPU or the GPU:
/// TYPE, TYPE@gpu, model.gguf@cpu.
#[derive(Parser, Debug)]
#[command(name = "kld", version)]
pub struct Args {
    /// The model that weight-format arms are built from (GGUF or HF directory).
    #[arg(short, long)]
    pub model: Option<PathBuf>,

    /// The reference arm.
    #[arg(long = "ref", default_value = "f32", conflicts_with = "ref_file")]
    pub reference: String,

    /// Arms to compare with the reference (repeatable, or comma-separated).
    #[arg(long = "arm", required = true, value_delimiter = ',')]
    pub arms: Vec<String>,

    /// The text to evaluate (UTF-8). Optional with --ref-file, whose tokens
    /// are used; when given it must tokenise to the same tokens.
    #[arg(long, required_unless_present = "ref_file")]
    pub corpus: Option<PathBuf>,

    /// Tokens per chunk (default 512; with --ref-file, the file's).
    #[arg(short = 'c', long, value_parser = super::values::positive)]
    pub ctx: Option<usize>,

    /// Evaluate at most this many chunks (default: all whole chunks).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    pub chunks: Option<u64>,

    /// Tokenise the corpus with this model's tokenizer (a GGUF file or an HF
    /// directory) instead of the reference model's.
    #[arg(long)]
    pub tokenizer: Option<PathBuf>,

    /// Save the reference's log-probabilities to this file for reuse.
    #[arg(long, conflicts_with = "ref_file")]
    pub save_ref: Option<PathBuf>,

    /// Read the reference's log-probabilities from a file written by --save-ref.
    #[arg(long)]
    pub ref_file: Option<PathBuf>,

    /// Replace the --save-ref file if it exists.
    #[arg(long)]
    pub force: bool,

    /// Print one JSON object instead of the tables.
    #[arg(long)]
    pub json: bool,

    #[command(flatten)]
    pub quiet: super::QuietArgs,

    /// The device of arms without @cpu or @gpu.
    #[command(flatten)]
    pub device: DeviceArgs,
}

/// The default chunk length, llama-perplexity's.
const DEFAULT_CTX: usize = 512;

fn device_for(spec: &ArmSpec, default: &DeviceChoice, args: &DeviceArgs) -> DeviceChoice {
    match spec.device {
        None => default.clone(),
        Some(ArmDevice::Cpu) => DeviceChoice::Cpu,
        Some(ArmDevice::Gpu) => DeviceArgs {
            cpu: false,
            ..args.clone()
        }
        .choice(),
    }
}

/// Loads an arm; `text` is how the user wrote it, for errors.
fn load_arm(
    spec: &ArmSpec,
    text: &str,
    model: Option<&Path>,
    args: &Args,
) -> anyhow::Result<(String, LoadedLlm)> {
    let device = device_for(spec, &args.device.choice(), &args.device);
    let (path, weight_type) = match &spec.source {
        ArmSource::Type(t) => match model {
            Some(m) => (m.to_path_buf(), Some(*t)),
            None => bail!("arm '{text}' is a weight format: pass --model to build it from"),
        },
        ArmSource::File(p) => (p.clone(), None),
    };
    let loaded = models::load_llm(
        &path,
        &LoadOptions {
            device,
            weight_type,
            // The weights' own error: inputs stay f32.
            cpu_activations: Activations::F32,
        },
    )
    .with_context(|| format!("arm '{text}'"))?;
    if loaded.backend_name() == "gpu" {
        let unread = gpu_unreadable(&spec.source, &loaded)?;
        if !unread.is_empty() {
            let names: Vec<&str> = unread.iter().map(|t| t.name()).collect();
            bail!(
                "arm '{text}': no GPU kernel reads {} weights (the GPU path would run them as \
                 f16, a different arm); run this one @cpu",
                names.join(", ")
            );
        }
    }
    if spec.device == Some(ArmDevice::Gpu) && loaded.backend_name() == "cpu" {
        bail!(
            "arm '{text}': asked for the GPU, but the model runs on the CPU here (the GPU path \
             for language models is not in this build, or no GPU was found)"
        );
    }
    Ok((spec.label(loaded.backend_name()), loaded))
}

/// The matrix types of an arm that no GPU kernel reads (the GPU path would
/// convert them to f16): a weight-format arm's type and its fallbacks for
/// the model's row lengths, or a GGUF file's quantised tensor types.
fn gpu_unreadable(source: &ArmSource, loaded: &LoadedLlm) -> anyhow::Result<Vec<GgmlType>> {
    let mut types: Vec<GgmlType> = match source {
        ArmSource::Type(t) => {
            let c = loaded.model.config();
            [c.hidden, c.heads * c.head_dim, c.ffn]
                .iter()
                .map(|&row| policy::fallback(*t, row))
                .collect()
        }
        ArmSource::File(p) if p.is_file() => GgufFile::open(p)?
            .tensor_infos()
            .iter()
            .filter(|t| policy::role(&t.name, &t.shape) != policy::Role::Kept)
            .map(|t| t.dtype)
            .collect(),
        // HF checkpoints hold f32, f16 or bf16, which the GPU reads.
        ArmSource::File(_) => Vec::new(),
    };
    types.retain(|&t| llm_ops::format_defines(t).is_none());
    types.sort_by_key(|t| t.id());
    types.dedup();
    Ok(types)
}

fn tokenizer_from(path: &Path) -> anyhow::Result<Tokenizer> {
    if path.is_dir() {
        Ok(Tokenizer::from_hf_dir(path)?)
    } else {
        Ok(models::gguf_tokenizer(&GgufFile::open(path)?)?)
    }
}

/// The BOS id when the tokenizer puts one before every text.
fn adds_bos(tok: &Tokenizer) -> anyhow::Result<Option<u32>> {
    let with = tok.encode("a", true)?;
    let without = tok.encode("a", false)?;
    Ok(tok
        .bos_id
        .filter(|&b| with.len() == without.len() + 1 && with.first() == Some(&b)))
}

pub fn run(args: Args) -> anyhow::Result<()> {
    args.quiet.apply();
    let start = std::time::Instant::now();
    let ref_spec = ArmSpec::parse(&args.reference).map_err(|e| super::usage(e.to_string()))?;
    let arm_specs = args
        .arms
        .iter()
        .map(|a| ArmSpec::parse(a).map(|s| (s, a.as_str())))
        .collect::<crate::Result<Vec<_>>>()
        .map_err(|e| super::usage(e.to_string()))?;
    // Before any model loads: a bad --save-ref path fails at once.
    if let Some(path) = &args.save_ref {
        crate::util::atomic_write::check(path, args.force)?;
    }
    let ref_file = args.ref_file.as_deref().map(RefFile::open).transpose()?;
    let model = args.model.as_deref();
    if let (Some(f), Some(ctx)) = (&ref_file, args.ctx) {
        if ctx != f.header.ctx {
            bail!(
                "--ctx {ctx} differs from the {} of {}",
                f.header.ctx,
                f.path.display()
            );
        }
    }

    let mut reference = match &ref_file {
        Some(_) => None,
        None => Some(load_arm(&ref_spec, &args.reference, model, &args)?),
    };
    let mut arms: Vec<(String, LoadedLlm)> = Vec::with_capacity(arm_specs.len());
    for (spec, text) in &arm_specs {
        arms.push(load_arm(spec, text, model, &args)?);
    }
    let vocab = match (&ref_file, &reference) {
        (Some(f), _) => f.header.vocab,
        (None, Some((_, r))) => r.model.config().vocab,
        (None, None) => unreachable!("a reference model is loaded without a file"),
    };
    for (label, a) in &arms {
        let v = a.model.config().vocab;
        if v != vocab {
            bail!("arm {label}: vocabulary of {v} tokens, the reference has {vocab}");
        }
    }

    // Tokens: from the corpus (checked against a reference file's), or the file's.
    let chunks = match &args.corpus {
        Some(corpus) => {
            let own;
            let from_models = reference
                .iter()
                .chain(arms.iter())
                .find_map(|(_, m)| m.tokenizer.as_ref());
            let tok = match (&args.tokenizer, from_models) {
                (Some(p), _) => {
                    own = tokenizer_from(p)?;
                    &own
                }
                (None, Some(t)) => t,
                (None, None) => bail!("no model here has a tokenizer: pass --tokenizer"),
            };
            let text = std::fs::read_to_string(corpus).with_context(|| {
                format!("{}: cannot read the corpus as UTF-8 text", corpus.display())
            })?;
            let tokens = tok.encode(&text, true)?;
            if let Some(&t) = tokens.iter().find(|&&t| t as usize >= vocab) {
                bail!(
                    "{}: token {t} is outside the model's {vocab}-token vocabulary",
                    corpus.display()
                );
            }
            let ctx = args
                .ctx
                .or(ref_file.as_ref().map(|f| f.header.ctx))
                .unwrap_or(DEFAULT_CTX);
            let max = match (args.chunks.map(|c| c as usize), &ref_file) {
                (Some(c), Some(f)) => Some(c.min(f.header.chunks)),
                (c, f) => c.or(f.as_ref().map(|f| f.header.chunks)),
            };
            let chunks = Chunks::new(&tokens, ctx, max, adds_bos(tok)?)
                .with_context(|| corpus.display().to_string())?;
            if let Some(f) = &ref_file {
                let from_file = f.chunks()?;
                if from_file.tokens()[..chunks.tokens().len()] != *chunks.tokens() {
                    bail!(
                        "{}: tokenises differently from the tokens in {}",
                        corpus.display(),
                        f.path.display()
                    );
                }
            }
            chunks
        }
        None => {
            let f = ref_file
                .as_ref()
                .expect("clap requires --corpus without --ref-file");
            let all = f.chunks()?;
            let n = args
                .chunks
                .map_or(all.count(), |c| (c as usize).min(all.count()));
            Chunks::new(&all.tokens()[..n * all.ctx], all.ctx, None, None)?
        }
    };
    for (label, m) in reference.iter().chain(arms.iter()) {
        let context = m.model.config().context;
        if chunks.ctx > context {
            bail!(
                "--ctx {} exceeds the context of {label} ({context} tokens)",
                chunks.ctx
            );
        }
    }
    crate::notice!(
        "{} chunks of {} tokens, {} scored positions each ({} in all); reference {}, {} arms",
        chunks.count(),
        chunks.ctx,
        chunks.scored(),
        chunks.count() * chunks.scored(),
        match (&reference, &ref_file) {
            (Some((l, _)), _) => l.clone(),
            (_, Some(f)) => f.path.display().to_string(),
            _ => unreachable!(),
        },
        arms.len()
    );

    let save = match (&args.save_ref, &reference) {
        (Some(path), Some((label, r))) => {
            let header = RefHeader {
                format_version: REF_FORMAT_VERSION,
                model: r.path.display().to_string(),
                arm: label.clone(),
                ctx: chunks.ctx,
                chunks: chunks.count(),
                vocab,
                tokens_fnv1a64: format!("{:016x}", chunks.fingerprint()),
                corpus: args
                    .corpus
                    .as_ref()
                    .map(|c| c.display().to_string())
                    .unwrap_or_default(),
                encoding: REF_ENCODING.to_string(),
            };
            Some(RefWriter::create(path, args.force, &header, &chunks)?)
        }
        _ => None,
    };
    let reference = match (&mut reference, &ref_file) {
        (Some((label, r)), _) => Reference::Model {
            label: label.clone(),
            model: r.model.as_mut(),
            save,
        },
        (None, Some(f)) => Reference::File(f),
        (None, None) => unreachable!(),
    };
    let mut arm_models: Vec<(String, &mut dyn CausalLm)> = arms
        .iter_mut()
        .map(|(label, a)| (label.clone(), &mut *a.model as &mut dyn CausalLm))
        .collect();
    let bar = crate::util::progress::bar(chunks.count() as u64, "chunks");
    let report = kld::evaluate(reference, &mut arm_models, &chunks, vocab, |_| bar.inc(1))?;
    bar.finish_and_clear();
    crate::notice!("evaluated in {:.1} s", start.elapsed().as_secs_f64());
    if args.json {
        writeln!(std::io::stdout(), "{}", serde_json::to_string(&report)?)?;
    } else {
        write!(std::io::stdout(), "{}", tables(&report))?;
    }
    Ok(())
}

/// The report as two markdown tables.
pub fn tables(r: &Report) -> String {
    let mut s = format!(
        "{} chunks of {} tokens, {} scored positions\nreference {}: PPL {:.4} ± {:.4}\n\n",
        r.chunks, r.ctx, r.positions, r.reference.arm, r.reference.ppl, r.reference.ppl_se
    );
    s += "| arm | PPL | mean KLD | same top-1 % | mean Δp % | RMS Δp % |\n|---|---|---|---|---|---|\n";
    for a in &r.arms {
        s += &format!(
            "| {} | {:.4} ± {:.4} | {:.6} ± {:.6} | {:.3} ± {:.3} | {:.3} ± {:.3} | {:.3} ± {:.3} |\n",
            a.arm,
            a.ppl,
            a.ppl_se,
            a.kld_mean,
            a.kld_se,
            100.0 * a.same_top,
            100.0 * a.same_top_se,
            100.0 * a.delta_p_mean,
            100.0 * a.delta_p_se,
            100.0 * a.delta_p_rms,
            100.0 * a.delta_p_rms_se
        );
    }
    s += "\nKLD percentiles\n\n| arm | max | 99.9 | 99 | 95 | 90 | median | 10 | 5 | 1 | 0.1 | min |\n";
    s += "|---|---|---|---|---|---|---|---|---|---|---|---|\n";
    for a in &r.arms {
        let p = &a.kld_percentiles;
        let v = [
            p.max, p.p99_9, p.p99, p.p95, p.p90, p.median, p.p10, p.p5, p.p1, p.p0_1, p.min,
        ];
        let cells: Vec<String> = v.iter().map(|x| format!("{x:.6}")).collect();
        s += &format!("| {} | {} |\n", a.arm, cells.join(" | "));
    }
    s
}
