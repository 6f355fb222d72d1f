//! `generate`: text generation with a causal language model.

use crate::grammar::{json_schema, Constraint, Grammar, TokenTable};
use crate::models::{self, LoadOptions};
use crate::run::chat::{ChatTemplate, Message};
use crate::run::generate::{generate_with, FinishReason, Request};
use crate::run::sampling::{Sampler, SamplingOptions};
use crate::run::speculative::{Drafter, Speculation};
use crate::tensor::Activations;
use anyhow::{bail, Context};
use clap::Parser;
use std::io::{Read, Write};
use std::path::PathBuf;

/// Generate text with a language model (Llama 2/3, Mistral, Qwen2/2.5/3, Gemma-3,
/// Phi-3, LFM2) on the GPU or the CPU.
///
/// llama-cli's common flags work too: --temp, -c/--ctx-size, -t/--threads,
/// -s/--seed, -f/--file, -n/--n-predict, -ngl/--n-gpu-layers (0 runs on the
/// CPU), -sys/--system-prompt.
#[derive(Parser, Debug)]
#[command(
    name = "generate",
    version,
    about = "Generate text with a language model (Llama 2/3, Mistral, Qwen2/3, Gemma-3, Phi-3, LFM2) on the GPU or the CPU",
    after_help = "Examples:\n  generate --temperature 0 -p \"What is the capital of France?\"\n  \
generate --cpu -m model.gguf -p - < question.txt\n  generate --prompt-ids 1,504,3575 -n 16 --json\n\n\
Exit status: 0 on success, 1 on bad input or a failed run, 2 on a bad command line."
)]
pub struct Args {
    /// Model: a .gguf file (architectures llama, qwen2, qwen3, gemma3, phi3,
    /// lfm2) or a Hugging Face directory (config.json + safetensors +
    /// tokenizer.json; model_type llama, mistral, qwen2, qwen3, gemma3_text,
    /// phi3, lfm2). Default: SmolLM2-135M-Instruct as fetched by scripts/setup.
    #[arg(short, long)]
    pub model: Option<PathBuf>,

    /// The prompt; `-` reads it from standard input.
    #[arg(short, long, conflicts_with_all = ["prompt_ids", "file"], value_parser = super::values::non_empty)]
    pub prompt: Option<String>,

    /// Read the prompt from FILE (llama-cli's -f).
    #[arg(short = 'f', long, value_name = "FILE", conflicts_with = "prompt_ids")]
    pub file: Option<PathBuf>,

    /// The prompt as comma-separated token ids (skips the tokenizer and the chat template).
    #[arg(long, value_delimiter = ',')]
    pub prompt_ids: Option<Vec<u32>>,

    /// The conversation so far: a JSON array of {"role", "content"} objects
    /// (OpenAI's messages; `-` reads it from standard input), rendered with
    /// the model's chat template; the model writes the next assistant turn.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["prompt", "prompt_ids", "system", "raw"])]
    pub messages: Option<PathBuf>,

    /// A system message for the chat template.
    #[arg(long, visible_alias = "system-prompt")]
    pub system: Option<String>,

    /// Use the prompt as it is, without the model's chat template.
    #[arg(long)]
    pub raw: bool,

    /// How many tokens to generate at most [default: 256, and never past
    /// the end of the context].
    #[arg(short = 'n', long, visible_alias = "n-predict", value_parser = super::values::positive)]
    pub max_tokens: Option<usize>,

    /// Use at most N tokens of context, prompt included (default: the model's).
    #[arg(short = 'c', long = "ctx-size", value_name = "N", value_parser = super::values::positive)]
    pub ctx_size: Option<usize>,

    /// Stop when this text appears (repeatable); it is not printed.
    #[arg(long, value_parser = super::values::non_empty)]
    pub stop: Vec<String>,

    /// Sampling temperature; 0 picks the most likely token (greedy).
    /// Default: the model's generation_config.json, else 0.8.
    #[arg(long, visible_alias = "temp", value_parser = super::values::non_negative)]
    pub temperature: Option<f32>,

    /// Keep only the k most likely tokens (0 = off). Default: generation_config, else 40.
    #[arg(long)]
    pub top_k: Option<usize>,

    /// Keep the smallest set of tokens whose probability reaches p (1 = off).
    /// Default: generation_config, else 0.95.
    #[arg(long, value_parser = super::values::probability)]
    pub top_p: Option<f32>,

    /// Drop tokens less likely than min-p times the most likely one (0 = off). Default: 0.05.
    #[arg(long, value_parser = super::values::probability)]
    pub min_p: Option<f32>,

    /// Penalise tokens among the last --repeat-last-n (1 = off). Default: generation_config, else 1.
    #[arg(long, value_parser = super::values::positive_f32)]
    pub repeat_penalty: Option<f32>,

    /// Subtract this from the logit of every token among the last
    /// --repeat-last-n (llama.cpp's --presence-penalty; 0 = off).
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true, value_parser = finite_f32)]
    pub presence_penalty: f32,

    /// Subtract this times its count from the logit of every token among the
    /// last --repeat-last-n (llama.cpp's --frequency-penalty; 0 = off).
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true, value_parser = finite_f32)]
    pub frequency_penalty: f32,

    /// How many of the latest tokens (prompt included) the penalties look at (0 = off).
    #[arg(long, default_value_t = 64)]
    pub repeat_last_n: usize,

    /// Add BIAS to token ID's logit (repeatable; `ID=BIAS`, or llama.cpp's
    /// `ID+BIAS` / `ID-BIAS`; `-inf` bans the token).
    #[arg(long, value_name = "ID=BIAS", allow_hyphen_values = true, value_parser = parse_logit_bias)]
    pub logit_bias: Vec<(u32, f32)>,

    /// With --json: each generated token's log probability and the N most
    /// likely alternatives' (log-softmax of the model's logits, before
    /// bias, penalties and grammar), as OpenAI's logprobs / top_logprobs.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(0..=100))]
    pub logprobs: Option<u16>,

    /// Constrain the output to a GBNF grammar (llama.cpp's format) in FILE.
    #[arg(long, value_name = "FILE", conflicts_with = "json_schema")]
    pub grammar: Option<PathBuf>,

    /// Constrain the output to JSON valid against the JSON Schema in FILE
    /// (turned into a grammar as llama.cpp's json_schema_to_grammar does).
    #[arg(long, value_name = "FILE")]
    pub json_schema: Option<PathBuf>,

    /// Chat: read turns from standard input, one a line (with a prompt on a
    /// terminal), each answered with the chat template applied to the whole
    /// conversation; the KV cache is kept between turns, so only a turn's
    /// new tokens are prefilled. --prompt/--file is the first turn; end of
    /// input (Ctrl-D) ends the chat. With --json, one object per turn.
    #[arg(short = 'i', long, conflicts_with_all = ["messages", "prompt_ids", "prompt_cache"])]
    pub interactive: bool,

    /// Save the state after the prompt in FILE, and on a later run whose
    /// prompt starts with the same tokens load it instead of prefilling
    /// them (llama.cpp's --prompt-cache). The file is tied to the model: one
    /// made by another model, damaged or of another version is an error.
    #[arg(long, value_name = "FILE")]
    pub prompt_cache: Option<PathBuf>,

    /// With --prompt-cache: use the file but never write it.
    #[arg(long, requires = "prompt_cache")]
    pub prompt_cache_ro: bool,

    /// Speculative decoding with prompt lookup: draft the tokens that
    /// followed the latest earlier occurrence of the last 3, 2 or 1 tokens
    /// (prompt and output), and check them in one forward (llama.cpp's
    /// llama-lookup). Greedy output is unchanged; sampled output keeps its
    /// distribution.
    #[arg(long, conflicts_with = "draft_model")]
    pub lookup: bool,

    /// Speculative decoding with a small draft model of the same
    /// vocabulary (GGUF or Hugging Face directory, on the same device),
    /// as llama.cpp's --model-draft.
    #[arg(long, visible_alias = "model-draft", value_name = "PATH")]
    pub draft_model: Option<PathBuf>,

    /// With --lookup or --draft-model: most tokens drafted per check, 1-16
    /// [default: 8].
    #[arg(long, visible_alias = "draft-max", value_name = "N",
          value_parser = clap::value_parser!(u16).range(1..=16))]
    pub draft: Option<u16>,

    /// Random seed; the same seed gives the same output. Default: from the clock.
    #[arg(short = 's', long)]
    pub seed: Option<u64>,

    /// CPU threads (default: one per core).
    #[arg(short = 't', long, value_name = "N", value_parser = super::values::positive)]
    pub threads: Option<usize>,

    /// llama-cli's layer offload count: 0 runs on the CPU (as --cpu), any
    /// other number on the GPU, which always holds every layer.
    #[arg(long = "n-gpu-layers", value_name = "N", conflicts_with = "cpu")]
    pub n_gpu_layers: Option<usize>,

    #[command(flatten)]
    pub quiet: super::QuietArgs,

    /// Print one JSON object at the end (prompt and generated ids, text,
    /// finish reason, timings) instead of streaming text.
    #[arg(long)]
    pub json: bool,

    #[command(flatten)]
    pub device: super::DeviceArgs,
}

/// The prompt text, read before the model loads (stdin or --file).
fn prompt_text(args: &Args) -> anyhow::Result<Option<String>> {
    let text = match (args.prompt.as_deref(), &args.file) {
        (Some("-"), _) => {
            let mut s = String::new();
            std::io::stdin()
                .read_to_string(&mut s)
                .context("reading the prompt from stdin")?;
            if s.trim().is_empty() {
                bail!("the prompt on standard input is empty");
            }
            s
        }
        (Some(p), _) => p.to_string(),
        (None, Some(path)) => {
            let s = std::fs::read_to_string(path).map_err(|e| crate::Error::io(path, e))?;
            if s.trim().is_empty() {
                bail!("{}: the prompt file is empty", path.display());
            }
            s
        }
        (None, None) => return Ok(None),
    };
    Ok(Some(text))
}

/// Tokens drafted per check without --draft.
pub const DEFAULT_DRAFT: usize = 8;

/// Tokens generated without -n (fewer when the context ends first).
pub const DEFAULT_MAX_TOKENS: usize = 256;

pub fn run(args: Args) -> anyhow::Result<()> {
    args.quiet.apply();
    if args.prompt.is_none()
        && args.file.is_none()
        && args.prompt_ids.is_none()
        && args.messages.is_none()
        && !args.interactive
    {
        return Err(super::usage(
            "no prompt: pass --prompt TEXT (or - for stdin), --file FILE, --messages FILE or --prompt-ids",
        ));
    }
    if args.prompt_ids.as_ref().is_some_and(|ids| ids.is_empty()) {
        return Err(super::usage("--prompt-ids is empty"));
    }
    if !args.lookup && args.draft_model.is_none() && args.draft.is_some() {
        return Err(super::usage("--draft needs --lookup or --draft-model"));
    }
    if let Some(path) = args
        .prompt_cache
        .as_deref()
        .filter(|_| !args.prompt_cache_ro)
    {
        // Before the model loads: a path that cannot be written fails at once.
        crate::util::atomic_write::check(path, true)?;
    }
    if let Some(n) = args.threads {
        // Fails only when a pool exists already (a library caller's); keep it.
        let _ = rayon::ThreadPoolBuilder::new()
            .num_threads(n)
            .build_global();
    }
    if args.interactive && args.prompt.as_deref() == Some("-") {
        return Err(super::usage(
            "--interactive reads its turns from standard input: pass the first one with --prompt TEXT or --file",
        ));
    }
    let text = prompt_text(&args)?;
    let model_path = match &args.model {
        Some(p) => p.clone(),
        None => models::default_llm_path()?,
    };
    let mut device = args.device.clone();
    if args.n_gpu_layers == Some(0) {
        device.cpu = true;
    }
    // Load errors already name the file.
    let opts_load = LoadOptions {
        device: device.choice(),
        weight_type: None,
        // Decode on the CPU with int8 inputs to the quantised products, as
        // llama.cpp does.
        cpu_activations: Activations::Int8,
    };
    let mut loaded = models::load_llm(&model_path, &opts_load)?;
    crate::util::log::notice(&loaded.describe());
    let tokenizer = loaded.tokenizer.as_ref();

    let interactive_first = if args.interactive { text.clone() } else { None };
    let prompt_ids = match (&args.prompt_ids, text) {
        _ if args.interactive => Vec::new(),
        (Some(ids), _) => ids.clone(),
        (None, _) if args.messages.is_some() => {
            let path = args.messages.as_ref().expect("checked");
            let messages = read_messages(path)?;
            let template = tokenizer.and_then(|t| t.chat_template.as_ref().map(|c| (t, c)));
            let Some((tok, template)) = template else {
                bail!(
                    "{}: has no chat template (or tokenizer), which --messages needs",
                    model_path.display()
                );
            };
            let t = ChatTemplate::new(template, tok.bos_token.as_deref(), tok.eos_token.as_deref());
            tok.encode(&t.render(&messages, true)?, false)?
        }
        (None, text) => {
            let Some(tok) = tokenizer else {
                bail!(
                    "{}: has no tokenizer; pass --prompt-ids",
                    model_path.display()
                );
            };
            let text = text.expect("a prompt was checked for above");
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
        presence_penalty: args.presence_penalty,
        frequency_penalty: args.frequency_penalty,
        repeat_last_n: args.repeat_last_n,
        logit_bias: args.logit_bias.clone(),
        logprobs: args.logprobs.map(usize::from),
        seed: args.seed.unwrap_or_else(clock_seed),
    };
    let vocab = loaded.model.config().vocab;
    if let Some(&(id, _)) = opts.logit_bias.iter().find(|(id, _)| *id as usize >= vocab) {
        bail!("--logit-bias: token id {id} is outside the vocabulary ({vocab} tokens)");
    }
    // Defaults from generation_config.json are checked like the flags.
    for (name, ok) in [
        (
            "temperature",
            opts.temperature >= 0.0 && opts.temperature.is_finite(),
        ),
        ("top_p", (0.0..=1.0).contains(&opts.top_p)),
        ("min_p", (0.0..=1.0).contains(&opts.min_p)),
        (
            "repetition_penalty",
            opts.repeat_penalty > 0.0 && opts.repeat_penalty.is_finite(),
        ),
    ] {
        if !ok {
            bail!(
                "{}: the model's default {name} is out of range (pass the flag to override it)",
                model_path.display()
            );
        }
    }
    // Generate until the context is full, never past it.
    let context = args.ctx_size.map_or(loaded.model.config().context, |c| {
        c.min(loaded.model.config().context)
    });
    if args.interactive {
        return interactive(
            &args,
            &model_path,
            &mut loaded,
            &opts_load,
            opts,
            context,
            interactive_first,
        );
    }
    let room = context.saturating_sub(prompt_ids.len());
    if room == 0 {
        bail!(
            "the prompt ({} tokens) fills the context of {context} tokens: nothing left to generate",
            prompt_ids.len()
        );
    }
    // An explicit -n is a request for that many: one that cannot fit is an
    // error, the default stops where the context ends.
    let max_tokens = match args.max_tokens {
        Some(n) if n > room => bail!(
            "the prompt ({} tokens) plus -n {n} exceeds the context of {context} tokens (at most {room} fit)",
            prompt_ids.len()
        ),
        Some(n) => n,
        None => DEFAULT_MAX_TOKENS.min(room),
    };
    let seed = opts.seed;
    let eos = tokenizer.map(|t| t.eos_ids.clone()).unwrap_or_default();
    let grammar = grammar_table(&args, &model_path, tokenizer, vocab)?;
    let mut sampler = new_sampler(opts, grammar.as_ref(), &eos);
    let req = Request {
        prompt_ids,
        max_tokens,
        eos_ids: &eos,
        stop: &args.stop,
    };
    let mut draft = load_draft(&args, &loaded, &opts_load)?;
    let mut spec = speculation(&args, draft.as_mut(), sampler.options());

    let cache = match &args.prompt_cache {
        Some(path) => Some(use_prompt_cache(
            path,
            !args.prompt_cache_ro,
            &model_path,
            loaded.model.as_mut(),
            &req.prompt_ids,
        )?),
        None => None,
    };

    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    let streaming = !args.json;
    let mut gen = generate_with(
        loaded.model.as_mut(),
        tokenizer,
        &mut sampler,
        &req,
        spec.as_mut(),
        |piece| {
            if streaming {
                out.write_all(piece.as_bytes())?;
                out.flush()?;
            }
            Ok(())
        },
    )
    .map_err(|e| match e {
        crate::Error::Invalid(what) if what.contains("NaN") => {
            anyhow::anyhow!("{}: {what}", model_path.display())
        }
        e => e.into(),
    })?;
    if let Some(c) = &cache {
        // The prompt as a whole: what came from the file, and the prefill
        // before the save.
        let t = &mut gen.timings;
        t.cached_tokens = c.reused;
        t.prefill_ms += c.prefill_ms;
        let new = (t.prompt_tokens - c.reused) as f64;
        t.prefill_tok_per_s = if t.prefill_ms > 0.0 {
            new / (t.prefill_ms / 1e3)
        } else {
            0.0
        };
    }
    if args.json {
        let mut v = serde_json::to_value(&gen)?;
        if let Some(c) = &cache {
            v["prompt_cache"] = serde_json::json!({
                "path": c.path.display().to_string(),
                "reused_tokens": c.reused,
                "saved_tokens": c.saved,
            });
        }
        v["seed"] = seed.into();
        v["model"] = model_path.display().to_string().into();
        v["backend"] = loaded.backend_name().into();
        writeln!(out, "{v}")?;
    } else {
        if !gen.text.ends_with('\n') {
            writeln!(out)?;
        }
        let t = &gen.timings;
        let finish = match gen.finish_reason {
            FinishReason::Eos => "end of text",
            FinishReason::Stop => "stop string",
            FinishReason::Length if max_tokens == room => "context full",
            FinishReason::Length => "token limit",
        };
        let spec = gen.speculative.as_ref().map_or(String::new(), |s| {
            format!(
                " | {}: {}/{} drafted accepted ({:.0}%), {:.2} tokens/forward",
                s.drafter,
                s.accepted,
                s.drafted,
                100.0 * s.acceptance_rate,
                s.tokens_per_forward
            )
        });
        crate::util::log::notice(&format!(
            "\nprompt: {} tokens, {:.1} tok/s | generated: {} tokens, {:.1} tok/s | finish: {finish} | seed {}{spec}",
            t.prompt_tokens,
            t.prefill_tok_per_s,
            t.generated_tokens,
            t.decode_tok_per_s,
            seed
        ));
    }
    Ok(())
}

/// --grammar or --json-schema compiled, with the vocabulary's bytes.
type GrammarTable = (Grammar, std::rc::Rc<TokenTable>);

fn grammar_table(
    args: &Args,
    model_path: &std::path::Path,
    tokenizer: Option<&crate::tokenizer::Tokenizer>,
    vocab: usize,
) -> anyhow::Result<Option<GrammarTable>> {
    let Some(grammar) = load_grammar(args)? else {
        return Ok(None);
    };
    let Some(tok) = tokenizer else {
        bail!(
            "{}: has no tokenizer, which --grammar and --json-schema need",
            model_path.display()
        );
    };
    let mut bytes = tok.token_bytes();
    bytes.resize(vocab, None);
    Ok(Some((grammar, std::rc::Rc::new(TokenTable::new(bytes)))))
}

/// A sampler with `opts`, constrained by the grammar when there is one.
fn new_sampler(opts: SamplingOptions, grammar: Option<&GrammarTable>, eos: &[u32]) -> Sampler {
    let mut sampler = Sampler::new(opts);
    if let Some((g, table)) = grammar {
        sampler.set_constraint(Constraint::new(g.clone(), table.clone(), eos.to_vec()));
    }
    sampler
}

/// --draft-model, loaded on the model's device and checked against it.
fn load_draft(
    args: &Args,
    loaded: &models::LoadedLlm,
    opts: &LoadOptions,
) -> anyhow::Result<Option<models::LoadedLlm>> {
    let Some(path) = &args.draft_model else {
        return Ok(None);
    };
    let d = models::load_llm(path, opts)?;
    crate::util::log::notice(&format!("draft {}", d.describe()));
    check_draft_vocab(loaded, &d, path)?;
    Ok(Some(d))
}

/// --lookup or --draft-model as a [`Speculation`]; None without either.
fn speculation<'a>(
    args: &Args,
    draft: Option<&'a mut models::LoadedLlm>,
    opts: &SamplingOptions,
) -> Option<Speculation<'a>> {
    let max_draft = args.draft.map_or(DEFAULT_DRAFT, usize::from);
    if args.lookup {
        return Some(Speculation {
            drafter: Drafter::Lookup,
            max_draft,
        });
    }
    draft.map(|d| Speculation {
        drafter: Drafter::Model {
            model: d.model.as_mut(),
            sampler: Sampler::new(SamplingOptions {
                logprobs: None,
                seed: opts.seed ^ 0x9e37_79b9_7f4a_7c15,
                ..opts.clone()
            }),
            consumed: Vec::new(),
        },
        max_draft,
    })
}

/// `-i`: a chat. Turns come from standard input, one per line (a prompt
/// on a terminal); each is added to the conversation, which is rendered
/// with the chat template, and only the tokens the model does not hold
/// yet are prefilled. Ends at end of input (Ctrl-D).
#[allow(clippy::too_many_arguments)]
fn interactive(
    args: &Args,
    model_path: &std::path::Path,
    loaded: &mut models::LoadedLlm,
    load_opts: &LoadOptions,
    opts: SamplingOptions,
    context: usize,
    first: Option<String>,
) -> anyhow::Result<()> {
    use std::io::{BufRead, IsTerminal};
    // The draft is checked against the tokenizer before it moves out.
    let mut draft = load_draft(args, loaded, load_opts)?;
    let Some(tok) = loaded.tokenizer.take() else {
        bail!(
            "{}: has no tokenizer, which --interactive needs",
            model_path.display()
        );
    };
    let template = match (&tok.chat_template, args.raw) {
        (Some(t), false) => Some(ChatTemplate::new(
            t,
            tok.bos_token.as_deref(),
            tok.eos_token.as_deref(),
        )),
        _ => None,
    };
    let vocab = loaded.model.config().vocab;
    let eos = tok.eos_ids.clone();
    let grammar = grammar_table(args, model_path, Some(&tok), vocab)?;
    let mut spec = speculation(args, draft.as_mut(), &opts);
    let mut messages = Vec::new();
    if let Some(sys) = &args.system {
        messages.push(Message::new("system", sys));
    }
    // The tokens the model has consumed.
    let mut held: Vec<u32> = Vec::new();
    let stdin = std::io::stdin();
    let terminal = stdin.is_terminal();
    let mut lines = stdin.lock().lines();
    let mut pending = first;
    let stdout = std::io::stdout();
    for turn in 0u64.. {
        let line = match pending.take() {
            Some(t) => t,
            None => {
                if terminal {
                    eprint!("> ");
                    std::io::stderr().flush()?;
                }
                match lines.next() {
                    None => break,
                    Some(l) => l.context("reading a turn from standard input")?,
                }
            }
        };
        if line.trim().is_empty() {
            continue;
        }
        messages.push(Message::new("user", &line));
        let ids = match &template {
            Some(t) => tok.encode(&t.render(&messages, true)?, false)?,
            None => {
                let mut ids = held.clone();
                ids.extend(tok.encode(&format!("{line}\n"), held.is_empty())?);
                ids
            }
        };
        let room = context.saturating_sub(ids.len());
        if room == 0 {
            bail!(
                "the conversation ({} tokens) fills the context of {context} tokens",
                ids.len()
            );
        }
        let max_tokens = args.max_tokens.unwrap_or(DEFAULT_MAX_TOKENS).min(room);
        keep_common_prefix(loaded.model.as_mut(), &held, &ids)?;
        let mut sampler = new_sampler(
            SamplingOptions {
                seed: opts.seed.wrapping_add(turn),
                ..opts.clone()
            },
            grammar.as_ref(),
            &eos,
        );
        let req = Request {
            prompt_ids: ids.clone(),
            max_tokens,
            eos_ids: &eos,
            stop: &args.stop,
        };
        let mut out = stdout.lock();
        let gen = generate_with(
            loaded.model.as_mut(),
            Some(&tok),
            &mut sampler,
            &req,
            spec.as_mut(),
            |piece| {
                if !args.json {
                    out.write_all(piece.as_bytes())?;
                    out.flush()?;
                }
                Ok(())
            },
        )?;
        held = ids;
        held.extend_from_slice(&gen.generated_ids);
        held.truncate(loaded.model.position());
        if args.json {
            let mut v = serde_json::to_value(&gen)?;
            v["turn"] = turn.into();
            writeln!(out, "{v}")?;
        } else {
            writeln!(out)?;
            let t = &gen.timings;
            crate::util::log::notice(&format!(
                "[prompt: {} new tokens ({} kept), {:.1} tok/s | generated: {} tokens, {:.1} tok/s]",
                t.prompt_tokens - t.cached_tokens,
                t.cached_tokens,
                t.prefill_tok_per_s,
                t.generated_tokens,
                t.decode_tok_per_s
            ));
        }
        messages.push(Message::new("assistant", &gen.text));
    }
    Ok(())
}

/// Keeps what `model` holds of `prompt`: the common prefix of `held` (the
/// tokens it has consumed) and `prompt`, less the prompt's last token;
/// starts over when the model cannot rewind that far.
fn keep_common_prefix(
    model: &mut dyn crate::models::llm::CausalLm,
    held: &[u32],
    prompt: &[u32],
) -> anyhow::Result<()> {
    let shared = crate::run::prompt_cache::common_prefix(held, prompt).min(prompt.len() - 1);
    if shared >= model.min_truncate_pos() {
        model.truncate(shared)?;
    } else {
        model.reset();
    }
    Ok(())
}

/// What --prompt-cache did.
struct CacheUse {
    path: PathBuf,
    /// Prompt tokens loaded from the file.
    reused: usize,
    /// Prompt tokens whose state was written (None: not written).
    saved: Option<usize>,
    /// Time spent prefilling before the save.
    prefill_ms: f64,
}

/// Loads the longest usable prefix of `prompt` from the cache at `path`
/// into `model`, then (when `write`) prefills the prompt up to its last
/// token and saves that state, unless the file holds it already. The last
/// token is left for the generation, which needs its logits.
fn use_prompt_cache(
    path: &std::path::Path,
    write: bool,
    model_path: &std::path::Path,
    model: &mut dyn crate::models::llm::CausalLm,
    prompt: &[u32],
) -> anyhow::Result<CacheUse> {
    use crate::run::prompt_cache::{common_prefix, model_fingerprint, PromptCache};
    let cfg = model.config().clone();
    let fingerprint = model_fingerprint(model_path, &cfg)?;
    let upto = prompt.len() - 1;
    let mut reused = 0;
    let mut held_tokens = None;
    if path.exists() {
        let pc = PromptCache::read(path, fingerprint, &cfg)?;
        let shared = common_prefix(&pc.tokens, prompt).min(upto);
        if shared > 0 {
            match pc.state.truncated(shared, &cfg) {
                Some(st) => {
                    model.import_state(&st)?;
                    reused = shared;
                }
                None => crate::util::log::notice(&format!(
                    "{}: shares {shared} tokens with the prompt, but its conv state cannot be cut back to them; prefilling",
                    path.display()
                )),
            }
        }
        crate::util::log::notice(&format!(
            "prompt cache {}: {reused} of {} prompt tokens loaded",
            path.display(),
            prompt.len()
        ));
        held_tokens = Some(pc.tokens);
    } else {
        crate::util::log::notice(&format!(
            "prompt cache {}: not found{}",
            path.display(),
            if write { ", will be created" } else { "" }
        ));
    }
    let t0 = std::time::Instant::now();
    let mut saved = None;
    if write && upto > 0 && held_tokens.as_deref() != Some(&prompt[..upto]) {
        let pos = model.position();
        if pos < upto {
            model.forward(&prompt[pos..upto], false)?;
        }
        let state = model.export_state()?;
        let bytes = PromptCache {
            tokens: prompt[..upto].to_vec(),
            state,
        }
        .encode(fingerprint);
        crate::util::atomic_write::write_atomic(path, &bytes, true)?;
        saved = Some(upto);
    }
    Ok(CacheUse {
        path: path.to_path_buf(),
        reused,
        saved,
        prefill_ms: t0.elapsed().as_secs_f64() * 1e3,
    })
}

/// A draft model must share the model's vocabulary: the same size and,
/// where both have tokenizers, the same bytes for every id.
fn check_draft_vocab(
    model: &models::LoadedLlm,
    draft: &models::LoadedLlm,
    path: &std::path::Path,
) -> anyhow::Result<()> {
    let (mv, dv) = (model.model.config().vocab, draft.model.config().vocab);
    if mv != dv {
        bail!(
            "{}: the draft model's vocabulary has {dv} tokens, the model's {mv}",
            path.display()
        );
    }
    if let (Some(a), Some(b)) = (&model.tokenizer, &draft.tokenizer) {
        let (ta, tb) = (a.token_bytes(), b.token_bytes());
        if let Some(id) = (0..ta.len().max(tb.len())).find(|&i| ta.get(i) != tb.get(i)) {
            bail!(
                "{}: the draft model's vocabulary differs from the model's (token {id})",
                path.display()
            );
        }
    }
    Ok(())
}

/// --messages: a JSON array of {role, content} objects; errors name the file.
fn read_messages(path: &PathBuf) -> anyhow::Result<Vec<Message>> {
    #[derive(serde::Deserialize)]
    struct In {
        role: String,
        content: String,
    }
    let (what, text) = if path.as_os_str() == "-" {
        let mut s = String::new();
        std::io::stdin()
            .read_to_string(&mut s)
            .context("reading --messages from stdin")?;
        ("<stdin>".to_string(), s)
    } else {
        let what = path.display().to_string();
        let text = std::fs::read_to_string(path).with_context(|| format!("{what}: cannot read"))?;
        (what, text)
    };
    let list: Vec<In> = serde_json::from_str(&text).map_err(|e| {
        anyhow::anyhow!("{what}: not a JSON array of {{\"role\", \"content\"}} messages ({e})")
    })?;
    if list.is_empty() {
        bail!("{what}: the message list is empty");
    }
    Ok(list
        .into_iter()
        .map(|m| Message::new(&m.role, &m.content))
        .collect())
}

/// The grammar of --grammar or --json-schema; errors name the file.
fn load_grammar(args: &Args) -> anyhow::Result<Option<Grammar>> {
    let read = |path: &PathBuf| {
        std::fs::read_to_string(path).with_context(|| format!("{}: cannot read", path.display()))
    };
    if let Some(path) = &args.grammar {
        return Ok(Some(Grammar::parse(
            &read(path)?,
            &path.display().to_string(),
        )?));
    }
    if let Some(path) = &args.json_schema {
        let what = path.display().to_string();
        let schema: serde_json::Value = serde_json::from_str(&read(path)?)
            .with_context(|| format!("{what}: not valid JSON"))?;
        let gbnf = json_schema::to_gbnf(&schema, &what)?;
        return Ok(Some(Grammar::parse(&gbnf, &what)?));
    }
    Ok(None)
}

/// `ID=BIAS`, or llama.cpp's `ID+BIAS` / `ID-BIAS`.
fn parse_logit_bias(s: &str) -> Result<(u32, f32), String> {
    let bad = || format!("{s:?} is not ID=BIAS (e.g. 15043=-2.5, or 15043=-inf)");
    let (id, bias) = match s.find('=') {
        Some(at) => (&s[..at], &s[at + 1..]),
        None => {
            let at = s.find(['+', '-']).filter(|&at| at > 0).ok_or_else(bad)?;
            (&s[..at], &s[at..])
        }
    };
    let id: u32 = id.trim().parse().map_err(|_| bad())?;
    let bias: f32 = bias.trim().parse().map_err(|_| bad())?;
    if bias.is_nan() || bias == f32::INFINITY {
        return Err(bad());
    }
    Ok((id, bias))
}

fn finite_f32(s: &str) -> Result<f32, String> {
    match s.parse::<f32>() {
        Ok(v) if v.is_finite() => Ok(v),
        _ => Err(format!("{s:?} is not a finite number")),
    }
}

fn clock_seed() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}
