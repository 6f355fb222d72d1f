//! One module per tool: a clap `Args` struct and a `run` function. The
//! binaries in `src/bin` and the umbrella `lfm` are thin shims over these.
//!
//! Conventions shared by every tool: results on stdout, progress and timings
//! on stderr, `--json` (or `--format`) for machines, and exit codes
//! 0 success, 1 error (bad input file, failed run), 2 bad command line.

use std::io::Write;
use std::process::ExitCode;

/// Exit status for a run that failed (bad input, unusable model, device error).
pub const EXIT_FAILURE: u8 = 1;

/// Exit status for a bad command line (clap's own errors exit with it too).
pub const EXIT_USAGE: u8 = 2;

/// A bad command line that clap's parsers cannot see (a combination of
/// flags, an output name whose extension contradicts `--format`): exit 2.
#[derive(Debug)]
pub struct UsageError(pub String);

impl std::fmt::Display for UsageError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for UsageError {}

/// A [`UsageError`] as an `anyhow::Error`.
pub fn usage(msg: impl Into<String>) -> anyhow::Error {
    anyhow::Error::new(UsageError(msg.into()))
}

/// Runs a tool's `run` and turns its result into an exit code: errors are
/// printed as one line on stderr; a closed stdout (`tool | head`) ends the
/// program quietly with success, as Unix filters do.
pub fn finish(result: anyhow::Result<()>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if is_broken_pipe(&e) => ExitCode::SUCCESS,
        Err(e) if e.downcast_ref::<UsageError>().is_some() => {
            let _ = writeln!(std::io::stderr(), "error: {}", one_line(&e));
            ExitCode::from(EXIT_USAGE)
        }
        Err(e) => {
            let _ = writeln!(std::io::stderr(), "error: {}", one_line(&e));
            ExitCode::from(EXIT_FAILURE)
        }
    }
}

/// The error and its causes as one line, without repeating a cause that the
/// message above it already quotes.
pub fn one_line(e: &anyhow::Error) -> String {
    let mut out = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if out.contains(&text) {
            continue;
        }
        if !out.is_empty() {
            out.push_str(": ");
        }
        out.push_str(&text);
    }
    out.replace('\n', " ")
}

/// clap value parsers shared by the tools, so that a bad number is a bad
/// command line (exit 2) found before any model loads.
pub mod values {
    fn number<T: std::str::FromStr>(s: &str) -> Result<T, String> {
        s.trim()
            .parse::<T>()
            .map_err(|_| format!("{s:?} is not a number"))
    }

    /// An integer of at least 1.
    pub fn positive(s: &str) -> Result<usize, String> {
        match number::<usize>(s)? {
            0 => Err("must be at least 1".into()),
            n => Ok(n),
        }
    }

    /// A finite number of at least 0.
    pub fn non_negative(s: &str) -> Result<f32, String> {
        let v = number::<f32>(s)?;
        if v.is_finite() && v >= 0.0 {
            Ok(v)
        } else {
            Err(format!("must be a finite number of at least 0, not {s}"))
        }
    }

    /// A finite number above 0.
    pub fn positive_f32(s: &str) -> Result<f32, String> {
        let v = number::<f32>(s)?;
        if v.is_finite() && v > 0.0 {
            Ok(v)
        } else {
            Err(format!("must be a finite number above 0, not {s}"))
        }
    }

    /// A finite number.
    pub fn finite(s: &str) -> Result<f32, String> {
        let v = number::<f32>(s)?;
        if v.is_finite() {
            Ok(v)
        } else {
            Err(format!("must be a finite number, not {s}"))
        }
    }

    /// A probability: a number from 0 to 1.
    pub fn probability(s: &str) -> Result<f32, String> {
        let v = number::<f32>(s)?;
        if (0.0..=1.0).contains(&v) {
            Ok(v)
        } else {
            Err(format!("must be between 0 and 1, not {s}"))
        }
    }

    /// Text that is not empty.
    pub fn non_empty(s: &str) -> Result<String, String> {
        if s.is_empty() {
            Err("must not be empty".into())
        } else {
            Ok(s.to_string())
        }
    }
}

fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}

/// `-q/--quiet`, shared by every tool.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct QuietArgs {
    /// Print only results and errors: no notices, timings or progress bars.
    #[arg(short, long)]
    pub quiet: bool,
}

impl QuietArgs {
    /// Applies the flag to the process's notices and progress bars.
    pub fn apply(&self) {
        crate::util::log::set_quiet(self.quiet);
    }
}

/// The command line, with the single-dash long flags of the anchors
/// (llama-cli's `-ngl`, `-sys`), which clap would read as `-n gl`, spelt
/// as the long flags that take them. Only before `--`, and only for the
/// tool that knows them.
///
/// It also keeps the GPU probe quiet on headless machines
/// ([`crate::gpu::quiet_headless_probe`]). Called first thing in `main`,
/// before any thread starts.
pub fn argv() -> Vec<std::ffi::OsString> {
    crate::gpu::quiet_headless_probe();
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let program = args
        .first()
        .and_then(|a| std::path::Path::new(a).file_name())
        .map(|n| n.to_string_lossy().to_string())
        .unwrap_or_default();
    let tool = if program == "lfm" {
        args.get(1).map(|a| a.to_string_lossy().to_string())
    } else {
        Some(program)
    };
    if tool.as_deref() != Some("generate") {
        return args;
    }
    let mut out = Vec::with_capacity(args.len());
    let mut rest = false;
    for a in args {
        rest |= a == "--";
        out.push(match a.to_str() {
            Some("-ngl") if !rest => "--n-gpu-layers".into(),
            Some("-sys") if !rest => "--system-prompt".into(),
            _ => a,
        });
    }
    out
}

/// The roff man page for a clap command (used by `scripts/man` and the test
/// that keeps `man/` in sync).
pub fn man_page(cmd: clap::Command) -> String {
    let umbrella = cmd.get_name() == "lfm";
    let mut out = Vec::new();
    clap_mangen::Man::new(cmd)
        .render(&mut out)
        .expect("rendering to a Vec cannot fail");
    let mut page = String::from_utf8(out).expect("clap_mangen writes UTF-8");
    if umbrella {
        // clap_mangen cites subcommands as lfm-NAME(1); the pages are NAME.1.
        for (name, _) in tools() {
            page = page.replace(
                &format!("lfm\\-{}(1)", name.replace('-', "\\-")),
                &format!("{}(1)", name.replace('-', "\\-")),
            );
        }
    }
    page
}

pub mod embed;
pub mod generate;
pub mod gguf_write;
pub mod kld;
pub mod ocr_layout;
pub mod quantize;
pub mod scoreboard;
pub mod serve;
pub mod speak;
pub mod transcribe;

pub use crate::device::{Device, DeviceChoice};
use crate::gpu::{Backend, GpuOptions};

/// Where to run, shared by every tool: `--cpu`, `--backend`, `--adapter`.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct DeviceArgs {
    /// Run on the CPU reference path instead of the GPU.
    #[arg(long, help_heading = "Device")]
    pub cpu: bool,

    /// Graphics API for the GPU path (default: the best available).
    #[arg(long, value_enum, help_heading = "Device", conflicts_with = "cpu")]
    pub backend: Option<Backend>,

    /// Use the GPU adapter whose name contains this text.
    #[arg(long, help_heading = "Device", conflicts_with = "cpu")]
    pub adapter: Option<String>,

    /// Insist on a GPU: use a software one (lavapipe) if it is the only
    /// adapter, and fail instead of falling back to the CPU.
    #[arg(long, help_heading = "Device", conflicts_with = "cpu")]
    pub gpu: bool,
}

impl DeviceArgs {
    pub fn choice(&self) -> DeviceChoice {
        if self.cpu {
            DeviceChoice::Cpu
        } else {
            DeviceChoice::Gpu(GpuOptions {
                backend: self.backend,
                adapter: self.adapter.clone(),
                portable: false,
                required: self.gpu,
                ..Default::default()
            })
        }
    }
}

/// Every tool, by name, as the umbrella `lfm` exposes it (used for man pages).
pub fn tools() -> Vec<(&'static str, clap::Command)> {
    use clap::CommandFactory;
    vec![
        ("embed", embed::Args::command()),
        ("generate", generate::Args::command()),
        ("gguf-write", gguf_write::Args::command()),
        ("kld", kld::Args::command()),
        ("ocr-layout", ocr_layout::Args::command()),
        ("quantize", quantize::Args::command()),
        ("scoreboard", scoreboard::Args::command()),
        ("serve", serve::Args::command()),
        ("speak", speak::Args::command()),
        ("transcribe", transcribe::Args::command()),
    ]
}

/// The umbrella command: every tool as a subcommand.
#[derive(clap::Parser, Debug)]
#[command(
    name = "lfm",
    version,
    about = "Run neural networks on any GPU: every lfm tool as a subcommand"
)]
pub struct Lfm {
    #[command(subcommand)]
    pub tool: Tool,
}

#[derive(clap::Subcommand, Debug)]
pub enum Tool {
    /// Embed sentences with a sentence-transformers model, or search lines by meaning.
    Embed(embed::Args),
    /// Generate text with a language model.
    Generate(generate::Args),
    /// Write a Hugging Face checkpoint as a GGUF file (f32, f16, bf16).
    GgufWrite(gguf_write::Args),
    /// KL divergence of weight formats, files or devices from a reference.
    Kld(kld::Args),
    /// Find the layout regions of document page images.
    OcrLayout(ocr_layout::Args),
    /// Quantise a model to a ggml block format.
    Quantize(quantize::Args),
    /// Benchmark language models across formats, backends and depths.
    Scoreboard(scoreboard::Args),
    /// Serve models over OpenAI's HTTP API.
    Serve(serve::Args),
    /// Speak text with a Piper voice (writes a WAV file or stream).
    Speak(speak::Args),
    /// Transcribe speech with Whisper.
    Transcribe(transcribe::Args),
}

impl Lfm {
    pub fn run(self) -> anyhow::Result<()> {
        match self.tool {
            Tool::Embed(a) => embed::run(a),
            Tool::Generate(a) => generate::run(a),
            Tool::GgufWrite(a) => gguf_write::run(a),
            Tool::Kld(a) => kld::run(a),
            Tool::OcrLayout(a) => ocr_layout::run(a),
            Tool::Quantize(a) => quantize::run(a),
            Tool::Scoreboard(a) => scoreboard::run(a),
            Tool::Serve(a) => serve::run(a),
            Tool::Speak(a) => speak::run(a),
            Tool::Transcribe(a) => transcribe::run(a),
        }
    }
}
