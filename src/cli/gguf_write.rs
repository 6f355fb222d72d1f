//! `gguf-write`: an HF checkpoint directory to a GGUF file at f32, f16 or
//! bf16, as llama.cpp's `convert_hf_to_gguf.py` writes it.

use super::quantize::{default_output, report, Report};
use crate::quant::policy::Policy;
use crate::quant::GgmlType;
use crate::run::convert::{self, PlanOptions};
use anyhow::bail;
use clap::Parser;
use std::path::PathBuf;

/// Write a Hugging Face checkpoint as a GGUF file (f32, f16 or bf16).
///
/// Reads an HF model directory (config.json, safetensors weights,
/// tokenizer.json, tokenizer_config.json; Gemma's tokenizer.model) of the
/// llama, mistral, qwen2, qwen3, gemma3_text, phi3 or lfm2 architecture
/// and writes the GGUF file llama.cpp's convert_hf_to_gguf.py writes:
/// llama.cpp's tensor names and order, architecture keys, tokenizer tokens,
/// merges, special ids and chat template. The output is written to a
/// temporary file and renamed into place.
#[derive(Parser, Debug)]
#[command(name = "gguf-write", version)]
pub struct Args {
    /// The HF model directory.
    pub model: PathBuf,

    /// Output file (default: DIR-TYPE.gguf beside the directory).
    #[arg(short, long)]
    pub output: Option<PathBuf>,

    /// Type of the matrices: f32, f16 or bf16 (norms and other 1-D tensors
    /// stay f32, as llama.cpp's converter writes them).
    #[arg(short = 't', long = "type", default_value = "f16", value_parser = float_type)]
    pub dtype: GgmlType,

    /// Replace the output file if it exists.
    #[arg(long)]
    pub force: bool,

    /// llama.cpp's pre-tokenizer name (tokenizer.ggml.pre) when the one in
    /// tokenizer.json is not recognised (e.g. llama-bpe, smollm, lfm2).
    #[arg(long)]
    pub tokenizer_pre: Option<String>,

    /// Print one JSON object describing the file instead of text.
    #[arg(long)]
    pub json: bool,

    #[command(flatten)]
    pub quiet: super::QuietArgs,
}

fn float_type(s: &str) -> Result<GgmlType, String> {
    match GgmlType::from_name(s) {
        Some(t) if !t.is_quantized() => Ok(t),
        Some(t) => Err(format!(
            "{t} is a quantised type; gguf-write writes f32, f16 or bf16 (use quantize for {t})"
        )),
        None => Err(format!("unknown type '{s}' (f32, f16 or bf16)")),
    }
}

pub fn run(args: Args) -> anyhow::Result<()> {
    args.quiet.apply();
    if !args.model.is_dir() {
        bail!(
            "{}: not a directory (gguf-write reads an HF model directory; quantize also reads GGUF and safetensors files)",
            args.model.display()
        );
    }
    let policy = Policy::pure(args.dtype);
    let opts = PlanOptions {
        allow_requantize: false,
        tokenizer_pre: args.tokenizer_pre.clone(),
    };
    let out = args
        .output
        .clone()
        .unwrap_or_else(|| default_output(&args.model, args.dtype.name()));
    crate::util::atomic_write::check_extension(&out, &["gguf"], "GGUF")
        .map_err(|e| super::usage(e.to_string()))?;
    // Before the model is read: a bad output path fails at once.
    crate::util::atomic_write::check(&out, args.force)?;
    let plan = convert::plan(&args.model, &policy, &opts)?;
    let bar = crate::util::progress::bar(plan.tensors.len() as u64, "writing");
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
