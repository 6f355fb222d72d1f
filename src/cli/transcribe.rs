//! `transcribe`: speech to text with Whisper.

use crate::models::silero_vad::SileroVad;
use crate::models::whisper::gpu::GpuBackend;
use crate::models::whisper::mel::SAMPLE_RATE;
use crate::models::whisper::{ComputeType, WhisperFiles};
use crate::run::audio;
use crate::run::transcribe::batch::{self, Batched, Chunk};
use crate::run::transcribe::output::{Format, SubtitleOptions, Writer};
use crate::run::transcribe::profile::{Profile, Profiled, ProfiledFeatures};
use crate::run::transcribe::stream::StreamedMel;
use crate::run::transcribe::vad::{self, VadOptions};
use crate::run::transcribe::{self, Backend, CpuBackend, Options, Task, Transcript};
use crate::util::atomic_write::AtomicFile;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// Transcribe speech with Whisper (CTranslate2 model directories).
///
/// Reads WAV (any sample format, rate and channel count), FLAC, MP3 or Ogg
/// Vorbis, resamples to 16 kHz mono and writes the transcript to stdout.
/// The encoder runs on the GPU unless --cpu is given; decoding follows
/// openai-whisper (timestamp rules, 30 s windows, temperature fallback).
#[derive(clap::Parser, Debug)]
#[command(name = "transcribe", version)]
pub struct Args {
    /// Audio files to transcribe; `-` reads stdin.
    #[arg(required = true, value_name = "AUDIO")]
    pub audio: Vec<PathBuf>,

    /// Write the transcript to FILE instead of stdout (once per input, in
    /// order), or into DIR as <name>.<format> (a directory, or any path
    /// with several inputs).
    #[arg(short, long, value_name = "PATH")]
    pub output: Vec<PathBuf>,

    /// Replace output files that exist.
    #[arg(long)]
    pub force: bool,

    /// Model directory (CTranslate2: model.bin, config.json, tokenizer.json),
    /// or a model name (tiny.en, base, ...) found as whisper-NAME under
    /// samples/models. Default: Whisper tiny.en as fetched by scripts/setup.
    #[arg(short, long)]
    pub model: Option<PathBuf>,

    /// Directory holding mel_80.npy / mel_128.npy (default: the model
    /// directory, then a whisper-mel directory beside it).
    #[arg(long, value_name = "DIR")]
    pub mel_filters: Option<PathBuf>,

    /// Output format.
    #[arg(short, long, value_enum, default_value_t = Format::Txt)]
    pub format: Format,

    /// Spoken language code (en, fr, de, ...); detected when not given.
    #[arg(short, long)]
    pub language: Option<String>,

    /// Transcribe, or translate to English (multilingual models).
    #[arg(long, value_enum, default_value_t = Task::Transcribe)]
    pub task: Task,

    /// Beam search with this many beams (1: greedy decoding).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=32))]
    pub beam_size: u16,

    /// Beam search patience: stop after beam_size * patience finished beams.
    #[arg(long, default_value_t = 1.0, value_parser = super::values::positive_f32)]
    pub patience: f32,

    /// Candidates sampled when falling back to a temperature above 0.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u16).range(1..=32))]
    pub best_of: u16,

    /// Rank candidates by log probability / ((5 + length) / 6)^ALPHA instead of / length.
    #[arg(long, value_name = "ALPHA", value_parser = super::values::finite)]
    pub length_penalty: Option<f32>,

    /// First sampling temperature.
    #[arg(long, default_value_t = 0.0, value_parser = super::values::non_negative)]
    pub temperature: f32,

    /// Temperature step on fallback, up to 1.0 (0 disables fallback).
    #[arg(long, default_value_t = 0.2, value_parser = super::values::non_negative)]
    pub temperature_increment_on_fallback: f32,

    /// Fall back when the text compresses better than this (gzip ratio).
    #[arg(long, default_value_t = 2.4, value_parser = super::values::finite)]
    pub compression_ratio_threshold: f32,

    /// Fall back when the average log probability is below this.
    #[arg(long, default_value_t = -1.0, allow_hyphen_values = true, value_parser = super::values::finite)]
    pub logprob_threshold: f32,

    /// Skip a window as silence when <|nospeech|> is likelier than this
    /// and the log probability is below the threshold above.
    #[arg(long, default_value_t = 0.6, value_parser = super::values::probability)]
    pub no_speech_threshold: f32,

    /// Do not prompt each window with the text before it.
    #[arg(long)]
    pub no_condition_on_previous_text: bool,

    /// Text to prompt the first window with (names, spelling, style).
    #[arg(long)]
    pub initial_prompt: Option<String>,

    /// Decode without timestamp tokens (one segment per 30 s window).
    #[arg(long)]
    pub without_timestamps: bool,

    /// Seed for temperature sampling.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,

    /// Decode up to N windows at once, of one input or several, as
    /// faster-whisper's batched pipeline: the audio is cut into 30 s clips
    /// before decoding (a cut may split a word; with --vad, as
    /// faster-whisper's default, the speech is cut at silences and joined
    /// into pieces of at most 30 s), and every window is decoded from the
    /// same prompt (no previous text), at the first temperature only (no
    /// fallback), never skipped as silence. Without it, windows follow each
    /// other (openai-whisper's sequential transcription).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..=256))]
    pub batch_size: Option<u16>,

    /// Place every word in time (json: start, end and probability per word;
    /// srt/vtt: cues built from the words), as faster-whisper does.
    #[arg(long)]
    pub word_timestamps: bool,

    /// With --word-timestamps: marks that join the word after them.
    #[arg(long, value_name = "CHARS", default_value = transcribe::words::PREPEND_PUNCTUATIONS)]
    pub prepend_punctuations: String,

    /// With --word-timestamps: marks that join the word before them.
    #[arg(long, value_name = "CHARS", default_value = transcribe::words::APPEND_PUNCTUATIONS)]
    pub append_punctuations: String,

    /// srt/vtt with --word-timestamps: at most N characters a line.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub max_line_width: Option<u32>,

    /// srt/vtt with --max-line-width: at most N lines a cue (cues then
    /// follow the lines, not the segments).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub max_line_count: Option<u32>,

    /// srt/vtt with --word-timestamps: one cue per word, the word
    /// underlined (karaoke).
    #[arg(long)]
    pub highlight_words: bool,

    /// Transcribe only the speech that voice activity detection (Silero VAD
    /// v6) finds, as faster-whisper's vad_filter; times stay those of the
    /// whole recording.
    #[arg(long)]
    pub vad: bool,

    /// Silero VAD ONNX file. Default: samples/models/silero-vad/silero_vad_v6.onnx
    /// as fetched by scripts/setup.
    #[arg(long, value_name = "FILE", requires = "vad")]
    pub vad_model: Option<PathBuf>,

    /// A 32 ms window is speech from this probability on.
    #[arg(long, default_value_t = 0.5, requires = "vad", value_parser = super::values::probability)]
    pub vad_threshold: f32,

    /// Speech ends below this probability (default: threshold - 0.15, at least 0.01).
    #[arg(long, requires = "vad", value_parser = super::values::probability)]
    pub vad_neg_threshold: Option<f32>,

    /// Speech chunks shorter than this are dropped.
    #[arg(long, value_name = "MS", default_value_t = 0, requires = "vad")]
    pub vad_min_speech_duration_ms: u32,

    /// Speech chunks longer than this are split (default: no limit).
    #[arg(long, value_name = "S", requires = "vad", value_parser = super::values::positive_f32)]
    pub vad_max_speech_duration_s: Option<f32>,

    /// A speech chunk ends after this much silence (default 2000; 160
    /// with --batch-size, as faster-whisper's batched pipeline).
    #[arg(long, value_name = "MS", requires = "vad")]
    pub vad_min_silence_duration_ms: Option<u32>,

    /// Audio kept on each side of a speech chunk.
    #[arg(long, value_name = "MS", default_value_t = 400, requires = "vad")]
    pub vad_speech_pad_ms: u32,

    /// What the model computes in, with faster-whisper's names: float32
    /// (the reference) or int8 (Q8_0 weights and inputs rounded to 8 bits
    /// in the encoder's and decoder's linears, the cross-attention keys and
    /// values and the vocabulary head; the convolutions stay f32). int8
    /// runs on the CPU only: give --cpu.
    #[arg(long, value_enum, default_value_t = ComputeType::Float32)]
    pub compute_type: ComputeType,

    #[command(flatten)]
    pub device: super::DeviceArgs,

    #[command(flatten)]
    pub quiet: super::QuietArgs,
}

impl Args {
    fn options(&self) -> anyhow::Result<Options> {
        let mut temperatures = vec![self.temperature];
        let inc = self.temperature_increment_on_fallback;
        anyhow::ensure!(
            inc >= 0.0 && self.temperature >= 0.0,
            "temperatures and their increment must not be negative"
        );
        if inc > 0.0 {
            let mut t = self.temperature + inc;
            while t <= 1.0 + 1e-6 {
                temperatures.push(t);
                t += inc;
            }
        }
        Ok(Options {
            language: self.language.clone(),
            task: self.task,
            temperatures,
            best_of: self.best_of as usize,
            beam_size: self.beam_size as usize,
            patience: self.patience,
            length_penalty: self.length_penalty,
            compression_ratio_threshold: Some(self.compression_ratio_threshold),
            logprob_threshold: Some(self.logprob_threshold),
            no_speech_threshold: Some(self.no_speech_threshold),
            condition_on_previous_text: !self.no_condition_on_previous_text,
            initial_prompt: self.initial_prompt.clone(),
            without_timestamps: self.without_timestamps,
            max_initial_timestamp: Some(1.0),
            suppress_blank: true,
            seed: self.seed,
            word_timestamps: self.word_timestamps,
            prepend_punctuations: self.prepend_punctuations.clone(),
            append_punctuations: self.append_punctuations.clone(),
        })
    }

    /// The VAD options, as faster-whisper's `VadOptions` (its numbers in
    /// f64, as Python holds them).
    fn vad_options(&self) -> Option<VadOptions> {
        let wide = |v: f32| format!("{v}").parse::<f64>().unwrap_or(v as f64);
        self.vad.then(|| VadOptions {
            threshold: wide(self.vad_threshold),
            neg_threshold: self.vad_neg_threshold.map(wide),
            min_speech_duration_ms: self.vad_min_speech_duration_ms,
            max_speech_duration_s: self.vad_max_speech_duration_s.map_or(f64::INFINITY, wide),
            min_silence_duration_ms: self
                .vad_min_silence_duration_ms
                .unwrap_or(if self.batch_size.is_some() { 160 } else { 2000 }),
            speech_pad_ms: self.vad_speech_pad_ms,
        })
    }

    /// The subtitle layout flags, checked against each other.
    fn subtitles(&self) -> anyhow::Result<SubtitleOptions> {
        let layout = [
            ("--max-line-width", self.max_line_width.is_some()),
            ("--max-line-count", self.max_line_count.is_some()),
            ("--highlight-words", self.highlight_words),
        ];
        for (flag, given) in layout {
            if given && !self.word_timestamps {
                return Err(super::usage(format!("{flag} needs --word-timestamps")));
            }
            if given && !matches!(self.format, Format::Srt | Format::Vtt) {
                return Err(super::usage(format!("{flag} applies to -f srt and -f vtt")));
            }
        }
        if self.max_line_count.is_some() && self.max_line_width.is_none() {
            return Err(super::usage("--max-line-count needs --max-line-width"));
        }
        Ok(SubtitleOptions {
            max_line_width: self.max_line_width.map(|n| n as usize),
            max_line_count: self.max_line_count.map(|n| n as usize),
            highlight_words: self.highlight_words,
        })
    }
}

/// Where `scripts/setup` puts the default model, relative to the repository.
pub const DEFAULT_MODEL: &str = "samples/models/whisper-tiny.en";
/// Where `scripts/setup` puts Silero VAD.
pub const DEFAULT_VAD_MODEL: &str = "samples/models/silero-vad/silero_vad_v6.onnx";

/// `--vad-model`, or the default found as `find_model` finds models.
fn vad_model(arg: Option<&Path>) -> anyhow::Result<SileroVad> {
    if let Some(p) = arg {
        return Ok(SileroVad::load(p)?);
    }
    let rel = Path::new(DEFAULT_VAD_MODEL);
    let mut candidates = vec![rel.to_path_buf()];
    if let Ok(exe) = std::env::current_exe() {
        for dir in exe.ancestors().skip(1).take(4) {
            candidates.push(dir.join(rel));
        }
    }
    let found = candidates.into_iter().find(|p| p.is_file()).ok_or_else(|| {
        anyhow::anyhow!(
            "{DEFAULT_VAD_MODEL} not found: run scripts/setup (scripts/fetch_models.py silero-vad), or pass --vad-model"
        )
    })?;
    Ok(SileroVad::load(&found)?)
}

/// `rel` (a model directory relative to the repository) in the working
/// directory, else in the repository that holds the running executable
/// (`target/<profile>/..`).
fn find_model(rel: &Path) -> Option<PathBuf> {
    let mut candidates = vec![rel.to_path_buf()];
    if let Ok(exe) = std::env::current_exe() {
        for dir in exe.ancestors().skip(1).take(4) {
            candidates.push(dir.join(rel));
        }
    }
    candidates
        .into_iter()
        .find(|p| p.join("model.bin").is_file())
}

/// `--model`: a directory, or a name such as `tiny.en` (faster-whisper's
/// sizes) for samples/models/whisper-NAME.
fn model_dir(arg: Option<&Path>) -> anyhow::Result<PathBuf> {
    let Some(m) = arg else {
        return find_model(Path::new(DEFAULT_MODEL)).ok_or_else(|| {
            anyhow::anyhow!(
                "default model {DEFAULT_MODEL} not found: run scripts/setup, or pass --model"
            )
        });
    };
    if m.exists() || m.components().count() > 1 {
        return Ok(m.to_path_buf());
    }
    let name = m.to_string_lossy();
    let name = name.strip_prefix("whisper-").unwrap_or(&name);
    find_model(&Path::new("samples/models").join(format!("whisper-{name}"))).ok_or_else(|| {
        anyhow::anyhow!(
            "{}: no such model directory, nor samples/models/whisper-{name} (fetch it with scripts/fetch_models.py)",
            m.display()
        )
    })
}

/// Where each input's transcript goes: stdout, a file per input, or a
/// directory of <name>.<format>.
fn outputs(args: &Args) -> anyhow::Result<Vec<Option<PathBuf>>> {
    let ext = match args.format {
        Format::Txt => "txt",
        Format::Srt => "srt",
        Format::Vtt => "vtt",
        Format::Json => "json",
    };
    let n = args.audio.len();
    let stdin_count = args.audio.iter().filter(|a| a.as_os_str() == "-").count();
    if stdin_count > 1 {
        return Err(super::usage("`-` (stdin) given twice"));
    }
    match args.output.as_slice() {
        [] if n == 1 => Ok(vec![None]),
        [] => Err(super::usage(format!(
            "{n} inputs need -o DIR (one <name>.{ext} each) or one -o FILE per input"
        ))),
        [dir] if n > 1 || dir.is_dir() => {
            std::fs::create_dir_all(dir).map_err(|e| crate::Error::io(dir, e))?;
            let mut seen = std::collections::HashSet::new();
            args.audio
                .iter()
                .map(|a| {
                    let stem = if a.as_os_str() == "-" {
                        "stdin".into()
                    } else {
                        a.file_stem()
                            .unwrap_or_default()
                            .to_string_lossy()
                            .to_string()
                    };
                    let out = dir.join(format!("{stem}.{ext}"));
                    if !seen.insert(out.clone()) {
                        return Err(super::usage(format!(
                            "two inputs would both write {}",
                            out.display()
                        )));
                    }
                    Ok(Some(out))
                })
                .collect()
        }
        files if files.len() == n => Ok(files.iter().cloned().map(Some).collect()),
        files => Err(super::usage(format!(
            "{} -o for {n} inputs: give one per input, or one directory",
            files.len()
        ))),
    }
}

pub fn run(args: Args) -> anyhow::Result<()> {
    args.quiet.apply();
    let opts = args.options()?;
    let subtitles = args.subtitles()?;
    let vad_opts = args.vad_options();
    if let Some(v) = &vad_opts {
        v.check()?;
    }
    if args.compute_type != ComputeType::Float32 && !args.device.cpu {
        return Err(super::usage(
            "--compute-type int8 runs on the CPU only: add --cpu",
        ));
    }
    let outputs = outputs(&args)?;
    for out in outputs.iter().flatten() {
        crate::util::atomic_write::check(out, args.force)?;
    }
    let t0 = Instant::now();
    let model = model_dir(args.model.as_deref())?;
    let mut files = WhisperFiles::load(&model, args.mel_filters.as_deref())?;
    files.model.set_compute_type(args.compute_type)?;
    let vad = match &vad_opts {
        Some(o) => Some((vad_model(args.vad_model.as_deref())?, o.clone())),
        None => None,
    };
    let t_loaded = Instant::now();

    let mut cpu_backend = CpuBackend::new(&files.model);
    let (mut gpu_backend, _) = args.device.choice().build(
        || Ok(None),
        |gpu| {
            let name = format!("gpu ({})", gpu.info.name);
            let (seqs, windows) = match args.batch_size {
                Some(n) => (n as usize * batch::sequences(&opts), n as usize),
                None => (opts.max_sequences(), 1),
            };
            Ok(Some((
                GpuBackend::new(gpu, &files.model, seqs, windows)?,
                name,
            )))
        },
    )?;
    let (backend, device): (&mut dyn Backend, String) = match &mut gpu_backend {
        Some((b, name)) => (b, name.clone()),
        None => (&mut cpu_backend, "cpu".into()),
    };
    if let Some(n) = args.batch_size {
        let setup = Setup {
            opts: &opts,
            subtitles,
            files: &files,
            vad: vad.as_ref(),
        };
        return run_batched(&args, &setup, backend, &outputs, n as usize, &device);
    }

    let mut failed = 0usize;
    for (input, output) in args.audio.iter().zip(&outputs) {
        let setup = Setup {
            opts: &opts,
            subtitles,
            files: &files,
            vad: vad.as_ref(),
        };
        let result = transcribe_one(&args, &setup, backend, input, output.as_deref());
        match result {
            Ok(t) => {
                crate::util::log::notice(&format!(
                    "transcribe: {}: {:.1} s of audio in {:.2} s (real-time factor {:.3}; load {:.2} s), {} segments{}, language {}, {}",
                    input.display(),
                    t.duration,
                    t.seconds,
                    t.seconds / t.duration.max(1e-9),
                    (t_loaded - t0).as_secs_f64(),
                    t.segments,
                    t.speech.map_or(String::new(), |(n, s)| format!(
                        " from {n} speech chunks ({s:.1} s)"
                    )),
                    t.language,
                    device
                ));
                crate::util::log::notice(&format!(
                    "transcribe: {}: {}",
                    input.display(),
                    t.profile.summary(t.elapsed)
                ));
            }
            Err(e) if args.audio.len() == 1 => return Err(e),
            Err(e) => {
                failed += 1;
                eprintln!("error: {}", super::one_line(&e));
            }
        }
    }
    if failed > 0 {
        anyhow::bail!("{failed} of {} inputs failed", args.audio.len());
    }
    Ok(())
}

/// Where one transcript goes.
enum Out {
    Stdout(std::io::StdoutLock<'static>),
    File(AtomicFile),
}

impl Write for Out {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self {
            Out::Stdout(s) => s.write(buf),
            Out::File(f) => f.write(buf),
        }
    }
    fn flush(&mut self) -> std::io::Result<()> {
        match self {
            Out::Stdout(s) => s.flush(),
            Out::File(f) => f.flush(),
        }
    }
}

/// What one input's run reports.
struct Done {
    duration: f64,
    seconds: f64,
    segments: usize,
    language: String,
    /// With --vad: the speech chunks found and their seconds.
    speech: Option<(usize, f64)>,
    /// Where the time went.
    profile: Profile,
    elapsed: std::time::Duration,
}

/// What every input is transcribed with.
struct Setup<'a> {
    opts: &'a Options,
    subtitles: SubtitleOptions,
    files: &'a WhisperFiles,
    vad: Option<&'a (SileroVad, VadOptions)>,
}

/// One input's audio: whole in memory for the VAD, else a stream.
enum Signal<'a> {
    Whole(audio::Audio, &'a (SileroVad, VadOptions)),
    Streamed(StreamedMel<'a>),
}

fn transcribe_one(
    args: &Args,
    setup: &Setup,
    backend: &mut dyn Backend,
    input: &Path,
    output: Option<&Path>,
) -> anyhow::Result<Done> {
    let Setup {
        opts,
        subtitles,
        files,
        vad,
    } = *setup;
    let input = audio::Input::open(input)?;
    // VAD reads the whole signal; without it the file is streamed (a first
    // pass for its length and features' maximum), so hours of audio cost
    // one window of samples.
    let mut signal = match vad {
        Some(v) => Signal::Whole(input.load(SAMPLE_RATE as u32)?, v),
        None => Signal::Streamed(StreamedMel::open(&files.mel, &input)?),
    };
    let (warnings, len) = match &signal {
        Signal::Whole(a, _) => (&a.warnings, a.samples.len()),
        Signal::Streamed(m) => (&m.info().warnings, m.info().len),
    };
    for w in warnings {
        crate::util::log::notice(w);
    }
    let seconds = len as f64 / SAMPLE_RATE as f64;
    let start = Instant::now();
    let (sink, label) = match output {
        Some(p) => (
            Out::File(AtomicFile::create(p, args.force)?),
            p.to_path_buf(),
        ),
        None => (
            Out::Stdout(std::io::stdout().lock()),
            PathBuf::from("<stdout>"),
        ),
    };
    let mut writer = Writer::with_subtitles(args.format, sink, subtitles);
    let bar = crate::util::progress::bar((seconds.ceil() as u64).max(1), "transcribing");
    let weights = files.dir.join("model.bin");
    let damaged = || {
        crate::Error::format(
            &weights,
            "the model produced NaN or infinite log probabilities (damaged weights?)",
        )
    };
    let mut on_segment = |seg: &transcribe::Segment, done: f64| -> crate::Result<()> {
        if !seg.avg_logprob.is_finite() || seg.tokens.iter().any(|t| !t.logprob.is_finite()) {
            return Err(damaged());
        }
        bar.set_position(done as u64);
        // Above the bar on a terminal, not through it.
        bar.suspend(|| writer.segment(seg))
            .map_err(|e| crate::Error::io(&label, e))
    };
    let mut profiled = Profiled::new(backend);
    let mut features_time = std::time::Duration::ZERO;
    let (transcript, speech) = match &mut signal {
        Signal::Whole(audio, (model, vad_opts)) => {
            let t = vad::transcribe_speech(
                files,
                &mut profiled,
                model,
                &audio.samples,
                opts,
                vad_opts,
                &mut on_segment,
            )?;
            let seconds =
                t.speech.iter().map(|s| s.end - s.start).sum::<usize>() as f64 / SAMPLE_RATE as f64;
            (t.transcript, Some((t.speech.len(), seconds)))
        }
        Signal::Streamed(mel) => {
            let mut mel = ProfiledFeatures {
                inner: mel,
                time: std::time::Duration::ZERO,
            };
            let t = transcribe::transcribe_features(
                files,
                &mut profiled,
                &mut mel,
                opts,
                &mut on_segment,
            )?;
            features_time = mel.time;
            (t, None)
        }
    };
    let mut profile = profiled.finish();
    profile.features = features_time;
    bar.finish_and_clear();
    if transcript
        .language_probability
        .is_some_and(|p| !p.is_finite())
    {
        return Err(damaged().into());
    }
    let sink = writer
        .finish(&transcript)
        .map_err(|e| crate::Error::io(&label, e))?;
    if let Out::File(f) = sink {
        f.commit()?;
    }
    Ok(Done {
        duration: transcript.duration,
        seconds: start.elapsed().as_secs_f64(),
        segments: transcript.segments.len(),
        language: transcript.language.clone(),
        speech,
        profile,
        elapsed: start.elapsed(),
    })
}

/// One input of a batched run: where its chunks come from and where its
/// transcript goes.
struct Job {
    input: PathBuf,
    label: PathBuf,
    writer: Writer<Out>,
    /// Its 30 s clips as they are read, or its speech pieces (VAD).
    source: ChunkSource,
    transcript: Transcript,
    /// The language token, once found on the first chunk.
    language: Option<Option<u32>>,
    /// With --vad: the map back to the recording's time, and the speech.
    map: Option<transcribe::vad::SpeechMap>,
    speech: Option<(usize, f64)>,
    /// Chunks read but not decoded yet; whether the source is done.
    pending: usize,
    exhausted: bool,
}

enum ChunkSource {
    Stream {
        stream: audio::Stream,
        buf: Vec<f32>,
        /// Samples handed out so far.
        read: usize,
        ended: bool,
    },
    Pieces(std::collections::VecDeque<(f64, Vec<f32>)>),
}

impl ChunkSource {
    /// The next chunk and where it starts (seconds), if any.
    fn next(&mut self) -> crate::Result<Option<(f64, Vec<f32>)>> {
        match self {
            ChunkSource::Pieces(p) => Ok(p.pop_front()),
            ChunkSource::Stream {
                stream,
                buf,
                read,
                ended,
            } => {
                while buf.len() < batch::CHUNK_SAMPLES && !*ended {
                    match stream.next_piece()? {
                        Some(p) => buf.extend_from_slice(&p),
                        None => *ended = true,
                    }
                }
                if buf.is_empty() {
                    return Ok(None);
                }
                let take = buf.len().min(batch::CHUNK_SAMPLES);
                let offset = *read as f64 / SAMPLE_RATE as f64;
                *read += take;
                Ok(Some((offset, buf.drain(..take).collect())))
            }
        }
    }
}

/// Opens one input of a batched run: its output, and its chunks (a stream
/// of 30 s clips, or with VAD its speech pieces, read whole).
fn open_job(
    args: &Args,
    setup: &Setup,
    input: &Path,
    output: Option<&Path>,
) -> anyhow::Result<Job> {
    let audio_in = audio::Input::open(input)?;
    let (source, map, speech, duration) = match setup.vad {
        Some((model, o)) => {
            let a = audio_in.load(SAMPLE_RATE as u32)?;
            for w in &a.warnings {
                crate::util::log::notice(w);
            }
            let (pieces, map) = batch::chunks_of(&a.samples, Some((model, o)));
            let seconds =
                pieces.iter().map(|(_, p)| p.len()).sum::<usize>() as f64 / SAMPLE_RATE as f64;
            let n = pieces.len();
            (
                ChunkSource::Pieces(pieces.into()),
                map,
                Some((n, seconds)),
                a.seconds(),
            )
        }
        None => (
            ChunkSource::Stream {
                stream: audio_in.stream(SAMPLE_RATE as u32)?,
                buf: Vec::new(),
                read: 0,
                ended: false,
            },
            None,
            None,
            0.0,
        ),
    };
    let (sink, label) = match output {
        Some(p) => (
            Out::File(AtomicFile::create(p, args.force)?),
            p.to_path_buf(),
        ),
        None => (
            Out::Stdout(std::io::stdout().lock()),
            PathBuf::from("<stdout>"),
        ),
    };
    Ok(Job {
        input: input.to_path_buf(),
        label,
        writer: Writer::with_subtitles(args.format, sink, setup.subtitles),
        source,
        transcript: Transcript {
            text: String::new(),
            language: String::new(),
            language_probability: None,
            duration,
            segments: Vec::new(),
        },
        language: None,
        map,
        speech,
        pending: 0,
        exhausted: false,
    })
}

/// `--batch-size N`: the inputs' chunks decoded N windows at a time, in
/// input order; each transcript is written when its last chunk is done.
/// An input that cannot be read is reported and the others go on.
fn run_batched(
    args: &Args,
    setup: &Setup,
    backend: &mut dyn Backend,
    outputs: &[Option<PathBuf>],
    batch_size: usize,
    device: &str,
) -> anyhow::Result<()> {
    let files = setup.files;
    let start = Instant::now();
    let mut profiled = Profiled::new(backend);
    let mut batched = Batched::new(files, setup.opts)?;
    let weights = files.dir.join("model.bin");
    let mut jobs: Vec<Option<Job>> = Vec::new();
    let mut next_input = 0;
    let mut failed = 0usize;
    let mut audio_seconds = 0.0;
    let mut last_speech = std::collections::HashMap::new();
    let fail = |input: &Path, e: &dyn std::fmt::Display, failed: &mut usize| {
        *failed += 1;
        eprintln!("error: {}: {e}", input.display());
    };
    loop {
        // Fill a batch: the chunks of the earliest inputs first.
        let mut chunks: Vec<Chunk> = Vec::new();
        while chunks.len() < batch_size {
            let reading = jobs
                .iter()
                .position(|j| j.as_ref().is_some_and(|j| !j.exhausted));
            let Some(j) = reading else {
                if next_input == args.audio.len() {
                    break;
                }
                let (input, output) = (&args.audio[next_input], &outputs[next_input]);
                next_input += 1;
                match open_job(args, setup, input, output.as_deref()) {
                    Ok(job) => jobs.push(Some(job)),
                    Err(e) => {
                        fail(input, &super::one_line(&e), &mut failed);
                        jobs.push(None);
                    }
                }
                continue;
            };
            let job = jobs[j].as_mut().expect("an open job");
            match job.source.next() {
                Ok(Some((offset, samples))) => {
                    let language = match job.language {
                        Some(l) => l,
                        None => {
                            let (token, p) = batched.language(&mut profiled, &samples)?;
                            job.transcript.language_probability = p;
                            *job.language.insert(token)
                        }
                    };
                    job.pending += 1;
                    chunks.push(Chunk {
                        input: j,
                        offset,
                        samples,
                        language,
                    });
                }
                Ok(None) => job.exhausted = true,
                Err(e) => {
                    fail(&job.input, &e, &mut failed);
                    chunks.retain(|c| c.input != j);
                    jobs[j] = None;
                }
            }
        }
        if chunks.is_empty() && jobs.iter().all(Option::is_none) {
            break;
        }
        if !chunks.is_empty() {
            let results = batched.decode(&mut profiled, &chunks, &mut last_speech)?;
            for (chunk, segs) in chunks.iter().zip(results) {
                let Some(job) = jobs[chunk.input].as_mut() else {
                    continue;
                };
                job.pending -= 1;
                if job.map.is_none() {
                    job.transcript.duration += chunk.samples.len() as f64 / SAMPLE_RATE as f64;
                }
                for mut seg in segs {
                    if !seg.avg_logprob.is_finite()
                        || seg.tokens.iter().any(|t| !t.logprob.is_finite())
                    {
                        anyhow::bail!(crate::Error::format(
                            &weights,
                            "the model produced NaN or infinite log probabilities (damaged weights?)",
                        ));
                    }
                    if let Some(map) = &job.map {
                        map.restore(&mut seg);
                    }
                    seg.id = job.transcript.segments.len();
                    job.writer
                        .segment(&seg)
                        .map_err(|e| crate::Error::io(&job.label, e))?;
                    job.transcript.text.push_str(&seg.text);
                    job.transcript.segments.push(seg);
                }
            }
        }
        // Inputs read to their end and decoded: their transcripts are done.
        for slot in jobs.iter_mut() {
            if slot.as_ref().is_some_and(|j| j.exhausted && j.pending == 0) {
                let mut job = slot.take().expect("checked");
                job.transcript.language = batched.language_code(job.language.flatten());
                audio_seconds += job.transcript.duration;
                let (input, label) = (job.input.clone(), job.label.clone());
                let finished = job
                    .writer
                    .finish(&job.transcript)
                    .map_err(|e| crate::Error::io(&label, e))
                    .and_then(|sink| match sink {
                        Out::File(f) => f.commit(),
                        Out::Stdout(_) => Ok(()),
                    });
                match finished {
                    Ok(()) => crate::util::log::notice(&format!(
                        "transcribe: {}: {:.1} s of audio, {} segments{}, language {}",
                        input.display(),
                        job.transcript.duration,
                        job.transcript.segments.len(),
                        job.speech.map_or(String::new(), |(n, s)| format!(
                            " from {n} speech chunks ({s:.1} s)"
                        )),
                        job.transcript.language,
                    )),
                    Err(e) => fail(&input, &e, &mut failed),
                }
            }
        }
    }
    let elapsed = start.elapsed();
    let mut profile = profiled.finish();
    profile.features = batched.features;
    crate::util::log::notice(&format!(
        "transcribe: {} inputs, {audio_seconds:.1} s of audio in {:.2} s (real-time factor {:.3}), batches of {batch_size}, {device}",
        args.audio.len() - failed,
        elapsed.as_secs_f64(),
        elapsed.as_secs_f64() / audio_seconds.max(1e-9),
    ));
    crate::util::log::notice(&format!("transcribe: {}", profile.summary(elapsed)));
    if failed > 0 {
        anyhow::bail!("{failed} of {} inputs failed", args.audio.len());
    }
    Ok(())
}
