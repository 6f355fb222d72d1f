//! `quantize`: a checkpoint (HF directory, safetensors file or GGUF) to a
//! GGUF file whose matrices are in a ggml block format.

use crate::quant::policy::{Mix, Policy, Special};
use crate::quant::GgmlType;
use crate::run::convert::{self, Plan, PlanOptions, Written};
use clap::Parser;
use serde_json::json;
use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

/// Quantise a model to a ggml block format (q8_0, q4_0, q4_k, q1_0, ...).
///
/// Reads an HF directory, a safetensors file or a GGUF file and writes a
/// GGUF file tensor by tensor, quantising on every core, with
/// llama-quantize's policy: norms and other 1-D tensors keep their type, a
/// tensor whose rows do not fit the format's blocks falls back to a
/// compatible type (reported on stderr), every other matrix gets the target
/// type. The output is written to a temporary file and renamed into place.
#[derive(Parser, Debug)]
#[command(name = "quantize", version)]
pub struct Args {
    /// The model: an HF directory, a .safetensors file or a .gguf file.
    pub input: PathBuf,

    /// llama-quantize's form: `quantize IN OUT TYPE` (or `IN TYPE`), the
    /// same as -o OUT --to TYPE.
    #[arg(value_name = "OUT TYPE", num_args = 0..=2, hide = true)]
    pub positional: Vec<String>,

    /// Target type of the matrices: q8_0, q4_0, q4_1, q5_0, q5_1, q2_k,
    /// q3_k, q4_k, q5_k, q6_k, q1_0 (1-bit signs, 1.125 bits per weight),
    /// or f32, f16, bf16; or one of llama-quantize's mixes, which raise some
    /// tensors as it does: q3_k_s, q3_k_m, q3_k_l, q4_k_s, q4_k_m, q5_k_s,
    /// q5_k_m (and q2_k_mix, q6_k_mix, since q2_k and q6_k name the pure
    /// types here). Upper-case names (Q4_K_M) work too.
    #[arg(long, value_parser = target_name)]
    pub to: Option<Target>,

    /// Output file (default: INPUT-TYPE.gguf beside the input).
    #[arg(short, long)]
    pub output: Option<PathBuf>,

    /// Keep the token embedding (embed) or the output head (head) in the
    /// input's type.
    #[arg(long, value_enum, value_delimiter = ',')]
    pub keep: Vec<Kept>,

    /// Type of the token embedding (token_embd.weight).
    #[arg(long, value_parser = type_name)]
    pub embed_type: Option<GgmlType>,

    /// Type of the output head (output.weight; a model with tied embeddings
    /// has none: its head is the embedding).
    #[arg(long, value_parser = type_name)]
    pub head_type: Option<GgmlType>,

    /// Quantise tensors that are already in another block format
    /// (dequantised to f32 first, which adds the new format's error to the
    /// old one's). Dequantising to f32, f16 or bf16 needs no flag.
    #[arg(long)]
    pub allow_requantize: bool,

    /// Replace the output file if it exists.
    #[arg(long)]
    pub force: bool,

    /// Print one JSON object describing the file (every tensor's type)
    /// instead of text.
    #[arg(long)]
    pub json: bool,

    #[command(flatten)]
    pub quiet: super::QuietArgs,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kept {
    /// The token embedding.
    Embed,
    /// The output head.
    Head,
}

/// Parses a ggml type name (any case); the error lists every name.
pub fn type_name(s: &str) -> Result<GgmlType, String> {
    GgmlType::from_name(s).ok_or_else(|| {
        let names: Vec<&str> = GgmlType::ALL.iter().map(|t| t.name()).collect();
        format!("unknown type '{s}' (known: {})", names.join(", "))
    })
}

/// What `--to` asks for: a block type for every matrix, or a mix.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Target {
    pub base: GgmlType,
    pub mix: Option<Mix>,
}

impl Target {
    fn name(&self) -> &'static str {
        self.mix.map_or_else(|| self.base.name(), Mix::name)
    }
}

/// A type name or a llama-quantize mix name (any case).
pub fn target_name(s: &str) -> Result<Target, String> {
    if let Some(mix) = Mix::from_name(s) {
        return Ok(Target {
            base: mix.base(),
            mix: Some(mix),
        });
    }
    type_name(s)
        .map(|base| Target { base, mix: None })
        .map_err(|e| {
            let mixes: Vec<&str> = Mix::ALL.iter().map(|m| m.name()).collect();
            format!("{e}; mixes: {}", mixes.join(", "))
        })
}

/// INPUT-TYPE.gguf beside the input (a directory's sibling, a file's
/// neighbour without its extension).
pub fn default_output(input: &Path, t: &str) -> PathBuf {
    let stem = if input.is_dir() {
        input
            .canonicalize()
            .ok()
            .and_then(|p| p.file_name().map(|n| n.to_string_lossy().to_string()))
    } else {
        input.file_stem().map(|n| n.to_string_lossy().to_string())
    }
    .unwrap_or_else(|| "model".to_string());
    let parent = if input.is_dir() {
        input
            .canonicalize()
            .ok()
            .and_then(|p| p.parent().map(Path::to_path_buf))
    } else {
        input.parent().map(Path::to_path_buf)
    }
    .unwrap_or_default();
    parent.join(format!("{stem}-{t}.gguf"))
}

pub fn run(mut args: Args) -> anyhow::Result<()> {
    args.quiet.apply();
    // llama-quantize's `IN OUT TYPE` / `IN TYPE`.
    let (out_arg, type_arg) = match args.positional.as_slice() {
        [] => (None, None),
        [t] => (None, Some(t.clone())),
        [o, t] => (Some(PathBuf::from(o)), Some(t.clone())),
        _ => unreachable!("clap takes at most two"),
    };
    if let Some(t) = type_arg {
        if args.to.is_some() {
            return Err(super::usage(format!(
                "the type is given twice: {t} and --to"
            )));
        }
        args.to = Some(target_name(&t).map_err(super::usage)?);
    }
    if let Some(o) = out_arg {
        if args.output.is_some() {
            return Err(super::usage("the output is given twice: OUT and -o"));
        }
        args.output = Some(o);
    }
    let Some(to) = args.to else {
        return Err(super::usage(
            "no target type: pass --to TYPE (q8_0, q4_0, q4_k, ...)",
        ));
    };
    for (kept, t, flag) in [
        (Kept::Embed, args.embed_type, "embed"),
        (Kept::Head, args.head_type, "head"),
    ] {
        if args.keep.contains(&kept) && t.is_some() {
            return Err(super::usage(format!(
                "--keep {flag} and --{flag}-type contradict each other"
            )));
        }
    }
    let special = |kept: Kept, t: Option<GgmlType>| {
        if args.keep.contains(&kept) {
            Special::Keep
        } else {
            t.map_or(Special::Target, Special::Type)
        }
    };
    let policy = Policy {
        target: to.base,
        embedding: special(Kept::Embed, args.embed_type),
        output: special(Kept::Head, args.head_type),
        mix: to.mix,
    };
    let opts = PlanOptions {
        allow_requantize: args.allow_requantize,
        tokenizer_pre: None,
    };
    let out = args
        .output
        .clone()
        .unwrap_or_else(|| default_output(&args.input, to.name()));
    crate::util::atomic_write::check_extension(&out, &["gguf"], "GGUF")
        .map_err(|e| super::usage(e.to_string()))?;
    // Before the model is read: a bad output path fails at once.
    crate::util::atomic_write::check(&out, args.force)?;
    let plan = convert::plan(&args.input, &policy, &opts)?;
    if matches!(plan.input, convert::Input::Tensors(_)) {
        crate::notice!(
            "{}: no config.json beside it: tensors keep their names and the GGUF carries no \
             model metadata (llama.cpp cannot run it as a model)",
            args.input.display()
        );
    }
    let bar = crate::util::progress::bar(plan.tensors.len() as u64, "quantizing");
    let written = convert::write(&plan, &out, args.force, |_| bar.inc(1))?;
    bar.finish_and_clear();
    report(
        &Report {
            plan: &plan,
            output: &out,
            written: &written,
        },
        args.json,
    )
}

/// What `gguf-write` and `quantize` print when done.
pub struct Report<'a> {
    pub plan: &'a Plan,
    pub output: &'a Path,
    pub written: &'a Written,
}

/// Fallbacks and the type mix on stderr, one summary line (or the JSON
/// object) on stdout.
pub fn report(r: &Report, json: bool) -> anyhow::Result<()> {
    let w = r.written;
    let bpw = if w.params > 0 {
        (w.bytes_out * 8) as f64 / w.params as f64
    } else {
        0.0
    };
    if json {
        let tensors: Vec<_> = r
            .plan
            .tensors
            .iter()
            .map(|t| {
                json!({"name": t.name, "shape": t.shape, "from": t.from.name(), "to": t.to.name(),
                       "fell_back_from": t.fell_back_from.map(|f| f.name())})
            })
            .collect();
        let v = json!({
            "input": r.plan.input_path.display().to_string(),
            "output": r.output.display().to_string(),
            "tensors": tensors,
            "params": w.params,
            "bytes_in": w.bytes_in,
            "bytes_out": w.bytes_out,
            "bits_per_weight": bpw,
            "seconds": w.seconds,
        });
        writeln!(std::io::stdout(), "{v}")?;
        return Ok(());
    }
    let fallbacks: Vec<_> = r
        .plan
        .tensors
        .iter()
        .filter_map(|t| t.fell_back_from.map(|f| (t, f)))
        .collect();
    for (t, asked) in &fallbacks {
        crate::notice!(
            "{}: rows of {} do not fit {asked} blocks of {}: {} instead",
            t.name,
            t.shape.last().copied().unwrap_or(1),
            asked.block_size(),
            t.to
        );
    }
    if !fallbacks.is_empty() {
        crate::notice!(
            "{} of {} tensors fell back to another type",
            fallbacks.len(),
            r.plan.tensors.len()
        );
    }
    let mut mix: BTreeMap<&str, usize> = BTreeMap::new();
    for t in &r.plan.tensors {
        *mix.entry(t.to.name()).or_default() += 1;
    }
    let mix: Vec<String> = mix.iter().map(|(t, n)| format!("{n} {t}")).collect();
    crate::notice!("tensor types: {}", mix.join(", "));
    writeln!(
        std::io::stdout(),
        "{}: {} tensors, {} weights, {:.1} MB -> {:.1} MB ({bpw:.3} bits per weight) in {:.1} s",
        r.output.display(),
        w.tensors,
        w.params,
        w.bytes_in as f64 / 1e6,
        w.bytes_out as f64 / 1e6,
        w.seconds
    )?;
    Ok(())
}
