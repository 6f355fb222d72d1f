//! `embed`: sentence embeddings with a sentence-transformers model
//! (all-MiniLM-L6-v2 by default), on the GPU or with `--cpu` on the CPU
//! reference; or, with `--query` and `--docs`, the lines of a file ranked by
//! cosine similarity to a query.

use crate::error::Error;
use crate::run::embed::{cosine, EmbedOptions, EmbedStats, Embedder, Pooling};
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

/// Embed sentences with a sentence-transformers model (BERT family).
///
/// Texts come from the arguments, from stdin (`-`, one text a line) or from a
/// file (`--input`, one text a line). Each gets one vector, pooled and
/// normalised as the model's modules.json says (mean pooling and L2
/// normalisation for all-MiniLM-L6-v2). Texts longer than the model's
/// max_seq_length (256 tokens) are truncated, as sentence-transformers does.
///
/// Search: `embed --query "text" --docs FILE` prints the lines of FILE most
/// similar to the query, best first, with their cosine scores.
#[derive(clap::Parser, Debug)]
#[command(
    name = "embed",
    version,
    after_long_help = "Examples:
  embed \"A man is eating food.\" \"A man rides a horse.\"
  embed --input sentences.txt --format npy --output vectors.npy
  grep -v '^#' notes.txt | embed - --cpu --batch-size 64
  embed --query \"how do I reset my password\" --docs faq.txt --top-k 3"
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

    /// Search mode: rank the lines of --docs by cosine similarity to TEXT.
    #[arg(long, value_name = "TEXT", requires = "docs")]
    pub query: Option<String>,

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
    let embedder = load(&args)?;
    crate::notice!(
        "embed: loaded {} in {:.2} s on {}",
        embedder.dir.display(),
        started.elapsed().as_secs_f64(),
        embedder.device_name()
    );
    let opts = EmbedOptions {
        batch_size: args.batch_size as usize,
        pooling: (!args.pooling.is_empty()).then(|| args.pooling.clone()),
        no_normalize: args.no_normalize,
    };

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
    let stats = if let Some(query) = &args.query {
        let q = embedder.embed(&[query.as_str()], &opts)?;
        finite(&q)?;
        let mut scored: Vec<(f32, usize)> = Vec::with_capacity(texts.len());
        let dim = embedder.dim(&opts);
        let stats = embedder.embed_each(&texts, &opts, |start, vectors| {
            for (i, v) in vectors.chunks_exact(dim).enumerate() {
                finite(v)?;
                scored.push((cosine(&q, v), start + i));
            }
            bar.inc((vectors.len() / dim) as u64);
            Ok(())
        })?;
        scored.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
        for (rank, (score, i)) in scored.iter().take(args.top_k as usize).enumerate() {
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
    Ok(())
}

/// Opens the model: on the GPU unless `--cpu`, falling back to the CPU
/// reference when no adapter exists and none was asked for by name.
fn load(args: &Args) -> anyhow::Result<Embedder> {
    let dir = match &args.model {
        Some(d) => d.clone(),
        None => default_model_dir()?,
    };
    let (embedder, _) = args
        .device
        .choice()
        .build(
            || Embedder::load(&dir, None),
            |gpu| Embedder::load(&dir, Some(gpu)),
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
    let mut header =
        format!("{{'descr': '<f4', 'fortran_order': False, 'shape': ({rows}, {cols}), }}");
    // magic (6) + version (2) + length (2) + header + '\n', padded to 64 bytes.
    let unpadded = 10 + header.len() + 1;
    header.push_str(&" ".repeat(unpadded.next_multiple_of(64) - unpadded));
    header.push('\n');
    w.write_all(b"\x93NUMPY\x01\x00")?;
    w.write_all(&(header.len() as u16).to_le_bytes())?;
    w.write_all(header.as_bytes())?;
    for v in data {
        w.write_all(&v.to_le_bytes())?;
    }
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
