//! `embed`: sentence embeddings with a sentence-transformers model
//! (all-MiniLM-L6-v2 by default), on the GPU or with `--cpu` on the CPU
//! reference; or, with `--query` and `--docs`, the lines of a file ranked by
//! cosine similarity to a query.

use crate::error::Error;
use crate::run::embed::{
    cosine, quantize, EmbedOptions, EmbedStats, Embedder, Pooling, Precision, Task,
};
use crate::util::atomic_write::AtomicFile;
use anyhow::{bail, Context};
use clap::CommandFactory;
use std::io::{BufWriter, IsTerminal, Read, Write};
use std::path::{Path, PathBuf};
use std::time::Instant;

/// The model `embed` uses without `--model`, relative to the working directory.
pub const DEFAULT_MODEL: &str = "samples/models/all-minilm-l6-v2";

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// One JSON object a line: {"index", "text", "embedding"} (search: {"rank", "line", "score", "text"}).
    Jsonl,
    /// A NumPy .npy file: float32 [texts, dim].
    Npy,
    /// One vector a line, values separated by tabs (search: score, line, text).
    Tsv,
}

/// Embed sentences with a sentence-transformers model, or rerank with a cross-encoder.
///
/// Texts come from the arguments, from stdin (`-`, one text a line) or from a
/// file (`--input`, one text a line). Each gets one vector, pooled and
/// normalised as the model's modules.json says (mean pooling and L2
/// normalisation for all-MiniLM-L6-v2). Texts longer than the model's
/// max_seq_length (256 tokens) are truncated, as sentence-transformers does.
///
/// Search: `embed --query "text" --docs FILE` prints the lines of FILE most
/// similar to the query, best first, with their cosine scores. Rerank:
/// `embed --rerank --model CROSS_ENCODER --query "text" --docs FILE` prints
/// them by the cross-encoder's score.
///
/// Encoders: BERT, XLM-RoBERTa, NomicBERT, new-style GTE and ModernBERT
/// checkpoints in sentence-transformers directories.
#[derive(clap::Parser, Debug)]
#[command(
    name = "embed",
    version,
    after_long_help = "Examples:
  embed \"A man is eating food.\" \"A man rides a horse.\"
  embed --input sentences.txt --format npy --output vectors.npy
  grep -v '^#' notes.txt | embed - --cpu --batch-size 64
  embed --query \"how do I reset my password\" --docs faq.txt --top-k 3
  embed --model e5-small --prompt-name query --truncate-dim 128 \"a question\"
  embed --input docs.txt --precision ubinary --format npy -o bits.npy
  embed --rerank --model ms-marco-MiniLM --query \"reset password\" --docs faq.txt"
)]
pub struct Args {
    /// Texts to embed; `-` reads one text a line from stdin.
    #[arg(value_name = "TEXT", conflicts_with_all = ["input", "query"])]
    pub texts: Vec<String>,

    /// Read one text a line from FILE.
    #[arg(short, long, value_name = "FILE", conflicts_with = "query")]
    pub input: Option<PathBuf>,

    /// sentence-transformers model directory (config.json, model.safetensors,
    /// tokenizer.json, modules.json, ...) [default: samples/models/all-minilm-l6-v2,
    /// in the working directory or the repository holding the embed binary].
    #[arg(short, long, value_name = "DIR")]
    pub model: Option<PathBuf>,

    /// Output format [default: from the --output name's extension (.npy,
    /// .tsv, .jsonl), else jsonl; tsv with --query].
    #[arg(short, long, value_enum)]
    pub format: Option<Format>,

    /// Write the output to FILE (atomically; `-` is stdout) instead of stdout.
    #[arg(short, long, value_name = "FILE")]
    pub output: Option<PathBuf>,

    /// Overwrite FILE given to --output if it exists.
    #[arg(long)]
    pub force: bool,

    /// Texts per encoder pass.
    #[arg(short, long, value_name = "N", default_value_t = 32, value_parser = clap::value_parser!(u32).range(1..))]
    pub batch_size: u32,

    /// Leave out the model's L2 normalisation (its Normalize module).
    #[arg(long)]
    pub no_normalize: bool,

    /// Pool with MODE instead of the model's own pooling; several
    /// (comma-separated) are concatenated.
    #[arg(long, value_enum, value_name = "MODE", value_delimiter = ',')]
    pub pooling: Vec<Pooling>,

    /// Prepend the model's prompt NAME (config_sentence_transformers.json's
    /// `prompts`, e.g. `query`) to every text [default: the model's
    /// default_prompt_name, if any].
    #[arg(long, value_name = "NAME", conflicts_with = "prompt")]
    pub prompt_name: Option<String>,

    /// Prepend TEXT to every text (e.g. "query: "). With --query and neither
    /// prompt option, the query gets the model's `query` prompt and the
    /// documents its `document` (or `passage`, `corpus`) prompt, as
    /// sentence-transformers' encode_query / encode_document do.
    #[arg(long, value_name = "TEXT")]
    pub prompt: Option<String>,

    /// Keep the first N dimensions of every vector (Matryoshka models),
    /// renormalised when the model normalises.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub truncate_dim: Option<u32>,

    /// Output values as sentence-transformers' quantize_embeddings makes
    /// them: int8/uint8 (256 buckets per dimension between the minimum and
    /// maximum over the texts embedded together), binary/ubinary (one bit a
    /// dimension, 8 a byte).
    #[arg(long, value_enum, value_name = "P", default_value = "float32")]
    pub precision: Precision,

    /// Truncate texts at N tokens instead of the model's max_seq_length.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(2..))]
    pub max_seq_length: Option<u32>,

    /// Print where the time went on stderr after the run: tokenising, the
    /// host's embedding lookup, the encoder (on the GPU per kernel, from
    /// device timestamps), pooling; per batch.
    #[arg(long)]
    pub profile: bool,

    /// Search mode: rank the lines of --docs by cosine similarity to TEXT
    /// (with --rerank: by a cross-encoder's score of the pair).
    #[arg(long, value_name = "TEXT", requires = "docs")]
    pub query: Option<String>,

    /// Rerank mode: --model is a cross-encoder (a BERT or XLM-RoBERTa
    /// sequence-classification checkpoint); print the lines of --docs by its
    /// score of (--query, line), as CrossEncoder.predict computes it.
    #[arg(long, requires = "query")]
    pub rerank: bool,

    /// Search mode: the documents, one a line (blank lines are skipped).
    #[arg(short, long, value_name = "FILE", requires = "query")]
    pub docs: Option<PathBuf>,

    /// Search mode: how many lines to print.
    #[arg(short = 'k', long, value_name = "N", default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..))]
    pub top_k: u32,

    #[command(flatten)]
    pub device: super::DeviceArgs,

    #[command(flatten)]
    pub quiet: super::QuietArgs,
}

/// A bad combination of arguments: clap's usage error, exit status 2.
fn usage_error(msg: &str) -> ! {
    Args::command()
        .error(clap::error::ErrorKind::ArgumentConflict, msg)
        .exit()
}

/// The format an output name's extension implies, if any.
fn format_of_extension(path: &Path) -> Option<Format> {
    match path.extension()?.to_str()?.to_ascii_lowercase().as_str() {
        "npy" => Some(Format::Npy),
        "tsv" => Some(Format::Tsv),
        "jsonl" | "json" | "ndjson" => Some(Format::Jsonl),
        _ => None,
    }
}

/// `--format`, or what the output name implies; a name whose extension
/// contradicts `--format` (`-o x.npy -f jsonl`) is a bad command line.
fn output_format(args: &Args, search: bool) -> anyhow::Result<Format> {
    let implied = args.output.as_deref().and_then(format_of_extension);
    match (args.format, implied) {
        (Some(f), Some(i)) if f != i => Err(super::usage(format!(
            "--output {} names a {} file, but --format is {}",
            args.output.as_ref().expect("implied from it").display(),
            format_name(i),
            format_name(f)
        ))),
        (Some(f), _) | (None, Some(f)) => Ok(f),
        (None, None) => Ok(if search { Format::Tsv } else { Format::Jsonl }),
    }
}

fn format_name(f: Format) -> &'static str {
    match f {
        Format::Jsonl => "jsonl",
        Format::Npy => "npy",
        Format::Tsv => "tsv",
    }
}

pub fn run(args: Args) -> anyhow::Result<()> {
    args.quiet.apply();
    let search = args.query.is_some();
    let format = output_format(&args, search)?;
    if search && format == Format::Npy {
        usage_error("--format npy has no meaning with --query: use tsv or jsonl");
    }
    if search && args.precision != Precision::Float32 {
        usage_error("--precision has no meaning with --query: scores are computed in float32");
    }
    if args.rerank
        && (args.truncate_dim.is_some()
            || args.prompt.is_some()
            || args.prompt_name.is_some()
            || !args.pooling.is_empty()
            || args.no_normalize)
    {
        usage_error(
            "--rerank scores text pairs: --truncate-dim, --prompt, --prompt-name, --pooling \
             and --no-normalize have no meaning with it",
        );
    }
    if !search && args.texts.is_empty() && args.input.is_none() {
        usage_error("no input: give texts as arguments, `-` to read stdin, or --input FILE");
    }
    let to_stdout = args
        .output
        .as_deref()
        .is_none_or(crate::util::atomic_write::is_stdout);
    if format == Format::Npy && to_stdout && std::io::stdout().is_terminal() {
        bail!("refusing to write binary .npy data to a terminal: use --output FILE or a pipe");
    }

    // Read everything first: a bad input fails before the model loads.
    let (texts, line_numbers) = if let Some(docs) = &args.docs {
        let lines = read_lines_from_file(docs)?;
        let (numbers, texts): (Vec<usize>, Vec<String>) = lines
            .into_iter()
            .enumerate()
            .filter(|(_, l)| !l.trim().is_empty())
            .map(|(i, l)| (i + 1, l))
            .unzip();
        if texts.is_empty() {
            bail!(
                "{}: no documents (the file has no non-blank line)",
                docs.display()
            );
        }
        (texts, numbers)
    } else {
        let texts = match &args.input {
            Some(path) => read_lines_from_file(path)?,
            None => texts_from_args(&args.texts)?,
        };
        if texts.is_empty() {
            bail!(
                "no input texts: {} is empty",
                args.input
                    .as_ref()
                    .map_or("stdin".to_string(), |p| p.display().to_string())
            );
        }
        (texts, Vec::new())
    };

    // Before the model loads, so that an existing output is refused at once.
    let mut out = Output::open(args.output.as_deref(), args.force)?;
    let started = Instant::now();
    let mut embedder = load(&args)?;
    if let Some(n) = args.max_seq_length {
        embedder.set_max_seq_length(n as usize)?;
    }
    crate::notice!(
        "embed: loaded {} in {:.2} s on {}",
        embedder.dir.display(),
        started.elapsed().as_secs_f64(),
        embedder.device_name()
    );
    let prompt = match (&args.prompt_name, &args.prompt) {
        (Some(name), _) => Some(embedder.sentence.prompt(name, &embedder.dir)?.to_string()),
        (None, Some(text)) => Some(text.clone()),
        (None, None) => None,
    };
    let mut opts = EmbedOptions {
        batch_size: args.batch_size as usize,
        pooling: (!args.pooling.is_empty()).then(|| args.pooling.clone()),
        no_normalize: args.no_normalize,
        prompt,
        truncate_dim: None,
    };
    if let Some(n) = args.truncate_dim {
        let full = embedder.full_dim(&opts);
        if n as usize > full {
            bail!(
                "--truncate-dim {n} is larger than the {full} dimensions the model in {} makes",
                embedder.dir.display()
            );
        }
        opts.truncate_dim = Some(n as usize);
    }

    if args.profile {
        embedder.start_profile();
    }
    let started = Instant::now();
    let weights = embedder.dir.join("model.safetensors");
    let finite = |v: &[f32]| -> crate::Result<()> {
        if v.iter().all(|x| x.is_finite()) {
            Ok(())
        } else {
            Err(Error::format(
                &weights,
                "the model produced NaN or infinite embeddings (damaged weights?)",
            ))
        }
    };
    let bar = crate::util::progress::bar(texts.len() as u64, "embed");
    let stats = if let (true, Some(query)) = (args.rerank, &args.query) {
        let (scores, stats) = embedder.rerank(query, &texts, opts.batch_size)?;
        finite(&scores)?;
        bar.inc(texts.len() as u64);
        let scored: Vec<(f32, usize)> = scores.into_iter().zip(0..).collect();
        print_ranked(&mut out, format, scored, &texts, &line_numbers, args.top_k)?;
        stats
    } else if let Some(query) = &args.query {
        // Without a prompt asked for, the query and the documents get the
        // model's own ones, as encode_query / encode_document pick them.
        let asked = opts.prompt.is_some();
        let role_prompt = |names: &[&str]| {
            let found = names.iter().find_map(|n| embedder.sentence.prompt_named(n));
            match (asked, found) {
                (false, Some(p)) => Some(p.to_string()),
                _ => opts.prompt.clone(),
            }
        };
        let query_opts = EmbedOptions {
            prompt: role_prompt(&["query"]),
            ..opts.clone()
        };
        let doc_opts = EmbedOptions {
            prompt: role_prompt(&["document", "passage", "corpus"]),
            ..opts.clone()
        };
        let q = embedder.embed(&[query.as_str()], &query_opts)?;
        finite(&q)?;
        let mut scored: Vec<(f32, usize)> = Vec::with_capacity(texts.len());
        let dim = embedder.dim(&opts);
        let stats = embedder.embed_each(&texts, &doc_opts, |start, vectors| {
            for (i, v) in vectors.chunks_exact(dim).enumerate() {
                finite(v)?;
                scored.push((cosine(&q, v), start + i));
            }
            bar.inc((vectors.len() / dim) as u64);
            Ok(())
        })?;
        print_ranked(&mut out, format, scored, &texts, &line_numbers, args.top_k)?;
        stats
    } else if args.precision != Precision::Float32 {
        let dim = embedder.dim(&opts);
        let mut all = Vec::with_capacity(texts.len() * dim);
        let stats = embedder.embed_each(&texts, &opts, |_, vectors| {
            bar.inc((vectors.len() / dim) as u64);
            finite(vectors)?;
            all.extend_from_slice(vectors);
            Ok(())
        })?;
        let q = quantize(&all, dim, args.precision)?;
        let width = args.precision.width(dim);
        write_quantized(&mut out, format, &q, width, &texts, args.precision)
            .map_err(|e| out.error(e))?;
        stats
    } else {
        let dim = embedder.dim(&opts);
        let mut npy = Vec::new();
        let stats = embedder.embed_each(&texts, &opts, |start, vectors| {
            bar.inc((vectors.len() / dim) as u64);
            for (i, v) in vectors.chunks_exact(dim).enumerate() {
                finite(v)?;
                let r = match format {
                    Format::Jsonl => {
                        let record = Record {
                            index: start + i,
                            text: &texts[start + i],
                            embedding: v,
                        };
                        writeln!(out, "{}", json(&record))
                    }
                    Format::Tsv => {
                        let line: Vec<String> = v.iter().map(f32::to_string).collect();
                        writeln!(out, "{}", line.join("\t"))
                    }
                    Format::Npy => {
                        npy.extend_from_slice(v);
                        Ok(())
                    }
                };
                r.map_err(|e| out.error(e))?;
            }
            Ok(())
        })?;
        if format == Format::Npy {
            write_npy(&mut out, &npy, texts.len(), dim).map_err(|e| out.error(e))?;
        }
        stats
    };
    bar.finish_and_clear();
    out.finish()?;
    report(&stats, started.elapsed().as_secs_f64(), &embedder);
    if let Some(p) = embedder.take_profile() {
        eprintln!("{}", p.table());
    }
    Ok(())
}

/// Opens the model: on the GPU unless `--cpu`, falling back to the CPU
/// reference when no adapter exists and none was asked for by name.
fn load(args: &Args) -> anyhow::Result<Embedder> {
    let dir = match &args.model {
        Some(d) => d.clone(),
        None => default_model_dir()?,
    };
    let task = if args.rerank {
        Task::Rerank
    } else {
        Task::Embed
    };
    let (embedder, _) = args
        .device
        .choice()
        .build(
            || Embedder::load_for(&dir, None, task),
            |gpu| Embedder::load_for(&dir, Some(gpu), task),
        )
        .with_context(|| format!("loading the model in {}", dir.display()))?;
    Ok(embedder)
}

/// [`DEFAULT_MODEL`] in the working directory, else in the repository that
/// holds the running executable (`target/<profile>/embed`).
fn default_model_dir() -> crate::Result<PathBuf> {
    let mut candidates = vec![PathBuf::from(DEFAULT_MODEL)];
    if let Ok(exe) = std::env::current_exe() {
        for dir in exe.ancestors().skip(1).take(4) {
            candidates.push(dir.join(DEFAULT_MODEL));
        }
    }
    candidates.into_iter().find(|p| p.is_dir()).ok_or_else(|| {
        Error::invalid(format!(
            "default model {DEFAULT_MODEL} not found: run scripts/setup, or pass --model"
        ))
    })
}

fn report(stats: &EmbedStats, seconds: f64, embedder: &Embedder) {
    if stats.truncated > 0 {
        crate::notice!(
            "embed: {} of {} texts were longer than {} tokens and were truncated \
             (the model's max_seq_length)",
            stats.truncated,
            stats.texts,
            embedder.sentence.max_seq_length
        );
    }
    crate::notice!(
        "embed: {} texts, {} tokens in {:.3} s: {:.1} texts/s",
        stats.texts,
        stats.tokens,
        seconds,
        stats.texts as f64 / seconds.max(1e-9)
    );
}

/// Texts from the command line; `-` stands for the lines of stdin.
fn texts_from_args(args: &[String]) -> anyhow::Result<Vec<String>> {
    let mut texts = Vec::new();
    let mut read_stdin = false;
    for a in args {
        if a == "-" {
            if read_stdin {
                usage_error("`-` (stdin) given twice");
            }
            read_stdin = true;
            let mut bytes = Vec::new();
            std::io::stdin()
                .lock()
                .read_to_end(&mut bytes)
                .map_err(|e| Error::io("stdin", e))?;
            texts.extend(split_lines(&bytes, "stdin")?);
        } else {
            texts.push(a.clone());
        }
    }
    Ok(texts)
}

fn read_lines_from_file(path: &Path) -> anyhow::Result<Vec<String>> {
    let bytes = std::fs::read(path).map_err(|e| Error::io(path, e))?;
    Ok(split_lines(&bytes, &path.display().to_string())?)
}

/// One text a line (`\n` or `\r\n`); a final newline does not start another
/// text. Invalid UTF-8 is an error naming the line.
pub fn split_lines(bytes: &[u8], name: &str) -> crate::Result<Vec<String>> {
    let bytes = bytes.strip_suffix(b"\n").unwrap_or(bytes);
    if bytes.is_empty() {
        return Ok(Vec::new());
    }
    bytes
        .split(|&b| b == b'\n')
        .enumerate()
        .map(|(i, line)| {
            let line = line.strip_suffix(b"\r").unwrap_or(line);
            std::str::from_utf8(line).map(str::to_string).map_err(|e| {
                Error::invalid(format!(
                    "{name}: line {} is not valid UTF-8 (byte {})",
                    i + 1,
                    e.valid_up_to() + 1
                ))
            })
        })
        .collect()
}

/// Prints the best `top_k` of (score, index) pairs, best first (ties by
/// position in the file).
fn print_ranked(
    out: &mut Output,
    format: Format,
    mut scored: Vec<(f32, usize)>,
    texts: &[String],
    line_numbers: &[usize],
    top_k: u32,
) -> crate::Result<()> {
    scored.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
    for (rank, (score, i)) in scored.iter().take(top_k as usize).enumerate() {
        let line = line_numbers[*i];
        let text = &texts[*i];
        match format {
            Format::Jsonl => {
                let hit = Hit {
                    rank: rank + 1,
                    line,
                    score: *score,
                    text,
                };
                writeln!(out, "{}", json(&hit))
            }
            _ => writeln!(out, "{score:.4}\t{line}\t{}", escape_tsv(text)),
        }
        .map_err(|e| out.error(e))?;
    }
    Ok(())
}

/// One quantised vector a line (jsonl: integers; tsv), or an int8/uint8 .npy.
fn write_quantized(
    w: &mut impl Write,
    format: Format,
    q: &[i16],
    width: usize,
    texts: &[String],
    precision: Precision,
) -> std::io::Result<()> {
    match format {
        Format::Npy => {
            let rows = q.len() / width.max(1);
            let descr = if precision.signed() { "|i1" } else { "|u1" };
            write_npy_header(w, descr, rows, width)?;
            let bytes: Vec<u8> = q.iter().map(|&v| v as u8).collect();
            w.write_all(&bytes)
        }
        Format::Jsonl => {
            for (i, v) in q.chunks_exact(width).enumerate() {
                let record = QuantizedRecord {
                    index: i,
                    text: &texts[i],
                    embedding: v,
                };
                writeln!(w, "{}", json(&record))?;
            }
            Ok(())
        }
        Format::Tsv => {
            for v in q.chunks_exact(width) {
                let line: Vec<String> = v.iter().map(i16::to_string).collect();
                writeln!(w, "{}", line.join("\t"))?;
            }
            Ok(())
        }
    }
}

/// A `--precision` line of `--format jsonl` output.
#[derive(serde::Serialize)]
struct QuantizedRecord<'a> {
    index: usize,
    text: &'a str,
    embedding: &'a [i16],
}

/// One line of `--format jsonl` output, fields in this order.
#[derive(serde::Serialize)]
struct Record<'a> {
    index: usize,
    text: &'a str,
    embedding: &'a [f32],
}

/// One line of search output with `--format jsonl`.
#[derive(serde::Serialize)]
struct Hit<'a> {
    rank: usize,
    line: usize,
    score: f32,
    text: &'a str,
}

fn json(v: &impl serde::Serialize) -> String {
    serde_json::to_string(v).expect("plain structs of numbers and strings serialise")
}

/// A text on one TSV line: tabs and line breaks written as `\t`, `\n`, `\r`.
fn escape_tsv(text: &str) -> String {
    text.replace('\\', "\\\\")
        .replace('\t', "\\t")
        .replace('\n', "\\n")
        .replace('\r', "\\r")
}

/// Writes a float32 [rows, cols] array in NumPy's .npy format (version 1.0).
fn write_npy(w: &mut impl Write, data: &[f32], rows: usize, cols: usize) -> std::io::Result<()> {
    write_npy_header(w, "<f4", rows, cols)?;
    for v in data {
        w.write_all(&v.to_le_bytes())?;
    }
    Ok(())
}

/// The .npy (version 1.0) header of a [rows, cols] array of `descr` values.
fn write_npy_header(
    w: &mut impl Write,
    descr: &str,
    rows: usize,
    cols: usize,
) -> std::io::Result<()> {
    let mut header =
        format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': ({rows}, {cols}), }}");
    // magic (6) + version (2) + length (2) + header + '\n', padded to 64 bytes.
    let unpadded = 10 + header.len() + 1;
    header.push_str(&" ".repeat(unpadded.next_multiple_of(64) - unpadded));
    header.push('\n');
    w.write_all(b"\x93NUMPY\x01\x00")?;
    w.write_all(&(header.len() as u16).to_le_bytes())?;
    w.write_all(header.as_bytes())?;
    Ok(())
}

/// Where results go: stdout, or a file published only when complete.
enum Output {
    Stdout(BufWriter<std::io::Stdout>),
    File(Box<AtomicFile>, PathBuf),
}

impl Output {
    fn open(path: Option<&Path>, force: bool) -> crate::Result<Output> {
        Ok(match path {
            None => Output::Stdout(BufWriter::new(std::io::stdout())),
            Some(p) => Output::File(Box::new(AtomicFile::create(p, force)?), p.to_path_buf()),
        })
    }

    /// A write error, naming where the output was going.
    fn error(&self, e: std::io::Error) -> Error {
        match self {
            Output::Stdout(_) => Error::io("stdout", e),
            Output::File(_, p) => Error::io(p, e),
        }
    }

    fn finish(self) -> crate::Result<()> {
        match self {
            Output::Stdout(mut w) => w.flush().map_err(|e| Error::io("stdout", e)),
            Output::File(f, _) => f.commit(),
        }
    }
}

impl Write for Output {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self {
            Output::Stdout(w) => w.write(buf),
            Output::File(f, _) => f.write(buf),
        }
    }
    fn flush(&mut self) -> std::io::Result<()> {
        match self {
            Output::Stdout(w) => w.flush(),
            Output::File(f, _) => f.flush(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_and_their_errors() {
        assert_eq!(
            split_lines(b"a\r\nb\n\nc\n", "x").unwrap(),
            ["a", "b", "", "c"]
        );
        assert!(split_lines(b"", "x").unwrap().is_empty());
        assert!(split_lines(b"\n", "x").unwrap().is_empty());
        let e = split_lines(b"ok\nbad \xff here\n", "stdin")
            .unwrap_err()
            .to_string();
        assert!(e.contains("stdin: line 2 is not valid UTF-8"), "{e}");
    }

    #[test]
    fn npy_header_is_aligned() {
        let mut buf = Vec::new();
        write_npy(&mut buf, &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], 2, 3).unwrap();
        let header_len = u16::from_le_bytes([buf[8], buf[9]]) as usize;
        assert_eq!((10 + header_len) % 64, 0);
        assert_eq!(buf.len(), 10 + header_len + 24);
        assert!(std::str::from_utf8(&buf[10..10 + header_len])
            .unwrap()
            .contains("'shape': (2, 3)"));
    }
}
