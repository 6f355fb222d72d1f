//! `generate`: text generation with a causal language model.

use crate::models::{self, LoadOptions};
use crate::run::chat::{ChatTemplate, Message};
use crate::run::generate::{generate, Request};
use crate::run::sampling::{Sampler, SamplingOptions};
use crate::tensor::Activations;
use anyhow::{bail, Context};
use clap::Parser;
use std::io::{Read, Write};
use std::path::PathBuf;

/// Generate text with a language model (Llama 2/3, Mistral, Qwen2/2.5/3, Gemma-3,
/// Phi-3, LFM2) on the GPU or the CPU.
#[derive(Parser, Debug)]
#[command(name = "generate", version, about, long_about = None)]
pub struct Args {
    /// Model: a .gguf file (architectures llama, qwen2, qwen3, gemma3, phi3,
    /// lfm2) or a Hugging Face directory (config.json + safetensors +
    /// tokenizer.json; model_type llama, mistral, qwen2, qwen3, gemma3_text,
    /// phi3, lfm2). Default: SmolLM2-135M-Instruct as fetched by scripts/setup.
    #[arg(short, long)]
    pub model: Option<PathBuf>,

    /// The prompt; `-` reads it from standard input.
    #[arg(short, long, conflicts_with = "prompt_ids")]
    pub prompt: Option<String>,

    /// The prompt as comma-separated token ids (skips the tokenizer and the chat template).
    #[arg(long, value_delimiter = ',')]
    pub prompt_ids: Option<Vec<u32>>,

    /// A system message for the chat template.
    #[arg(long)]
    pub system: Option<String>,

    /// Use the prompt as it is, without the model's chat template.
    #[arg(long)]
    pub raw: bool,

    /// How many tokens to generate at most.
    #[arg(short = 'n', long, default_value_t = 256)]
    pub max_tokens: usize,

    /// Stop when this text appears (repeatable); it is not printed.
    #[arg(long)]
    pub stop: Vec<String>,

    /// Sampling temperature; 0 picks the most likely token (greedy).
    /// Default: the model's generation_config.json, else 0.8.
    #[arg(long)]
    pub temperature: Option<f32>,

    /// Keep only the k most likely tokens (0 = off). Default: generation_config, else 40.
    #[arg(long)]
    pub top_k: Option<usize>,

    /// Keep the smallest set of tokens whose probability reaches p (1 = off).
    /// Default: generation_config, else 0.95.
    #[arg(long)]
    pub top_p: Option<f32>,

    /// Drop tokens less likely than min-p times the most likely one (0 = off). Default: 0.05.
    #[arg(long)]
    pub min_p: Option<f32>,

    /// Penalise tokens among the last 64 (1 = off). Default: generation_config, else 1.
    #[arg(long)]
    pub repeat_penalty: Option<f32>,

    /// Random seed; the same seed gives the same output. Default: from the clock.
    #[arg(long)]
    pub seed: Option<u64>,

    /// Print one JSON object at the end (prompt and generated ids, text,
    /// finish reason, timings) instead of streaming text.
    #[arg(long)]
    pub json: bool,

    #[command(flatten)]
    pub device: super::DeviceArgs,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let model_path = match &args.model {
        Some(p) => p.clone(),
        None => models::default_llm_path()?,
    };
    // Load errors already name the file.
    let opts = LoadOptions {
        device: args.device.choice(),
        weight_type: None,
        // Decode on the CPU with int8 inputs to the quantised products, as
        // llama.cpp does.
        cpu_activations: Activations::Int8,
    };
    let mut loaded = models::load_llm(&model_path, &opts)?;
    eprintln!("{}", loaded.describe());
    let tokenizer = loaded.tokenizer.as_ref();

    let prompt_ids = match (&args.prompt_ids, &args.prompt) {
        (Some(ids), _) => ids.clone(),
        (None, prompt) => {
            let Some(tok) = tokenizer else {
                bail!(
                    "{}: has no tokenizer; pass --prompt-ids",
                    model_path.display()
                );
            };
            let text = match prompt.as_deref() {
                Some("-") => {
                    let mut s = String::new();
                    std::io::stdin()
                        .read_to_string(&mut s)
                        .context("reading the prompt from stdin")?;
                    s
                }
                Some(p) => p.to_string(),
                None => bail!("no prompt: pass --prompt TEXT (or - for stdin) or --prompt-ids"),
            };
            match (&tok.chat_template, args.raw) {
                (Some(template), false) => {
                    let mut messages = Vec::new();
                    if let Some(sys) = &args.system {
                        messages.push(Message::new("system", sys));
                    }
                    messages.push(Message::new("user", &text));
                    let t = ChatTemplate::new(
                        template,
                        tok.bos_token.as_deref(),
                        tok.eos_token.as_deref(),
                    );
                    tok.encode(&t.render(&messages, true)?, false)?
                }
                _ => tok.encode(&text, true)?,
            }
        }
    };

    let defaults = &loaded.sampling_defaults;
    let opts = SamplingOptions {
        temperature: args.temperature.unwrap_or(defaults.temperature),
        top_k: args.top_k.unwrap_or(defaults.top_k),
        top_p: args.top_p.unwrap_or(defaults.top_p),
        min_p: args.min_p.unwrap_or(defaults.min_p),
        repeat_penalty: args.repeat_penalty.unwrap_or(defaults.repeat_penalty),
        seed: args.seed.unwrap_or_else(clock_seed),
        ..SamplingOptions::default()
    };
    for (name, ok) in [
        (
            "--temperature",
            opts.temperature >= 0.0 && opts.temperature.is_finite(),
        ),
        ("--top-p", (0.0..=1.0).contains(&opts.top_p)),
        ("--min-p", (0.0..=1.0).contains(&opts.min_p)),
        (
            "--repeat-penalty",
            opts.repeat_penalty > 0.0 && opts.repeat_penalty.is_finite(),
        ),
    ] {
        if !ok {
            bail!("{name} is out of range");
        }
    }
    let seed = opts.seed;
    let mut sampler = Sampler::new(opts);
    let eos = tokenizer.map(|t| t.eos_ids.clone()).unwrap_or_default();
    let req = Request {
        prompt_ids,
        max_tokens: args.max_tokens,
        eos_ids: &eos,
        stop: &args.stop,
    };

    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    let streaming = !args.json;
    let gen = generate(
        loaded.model.as_mut(),
        tokenizer,
        &mut sampler,
        &req,
        |piece| {
            if streaming {
                out.write_all(piece.as_bytes())?;
                out.flush()?;
            }
            Ok(())
        },
    )?;
    if args.json {
        let mut v = serde_json::to_value(&gen)?;
        v["seed"] = seed.into();
        v["model"] = model_path.display().to_string().into();
        v["backend"] = loaded.backend_name().into();
        writeln!(out, "{v}")?;
    } else {
        if !gen.text.ends_with('\n') {
            writeln!(out)?;
        }
        let t = &gen.timings;
        eprintln!(
            "\nprompt: {} tokens, {:.1} tok/s | generated: {} tokens, {:.1} tok/s | finish: {:?} | seed {}",
            t.prompt_tokens,
            t.prefill_tok_per_s,
            t.generated_tokens,
            t.decode_tok_per_s,
            gen.finish_reason,
            seed
        );
    }
    Ok(())
}

fn clock_seed() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}
