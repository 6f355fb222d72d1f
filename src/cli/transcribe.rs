//! `transcribe`: speech to text with Whisper.

use super::Device;
use crate::models::whisper::gpu::GpuEncoder;
use crate::models::whisper::mel::SAMPLE_RATE;
use crate::models::whisper::WhisperFiles;
use crate::run::audio;
use crate::run::transcribe::output::{Format, Writer};
use crate::run::transcribe::{self, AudioEncoder, CpuEncoder, Options, Task};
use std::io::Write;
use std::path::PathBuf;
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
    /// Audio file to transcribe; `-` reads stdin.
    pub audio: PathBuf,

    /// Model directory (CTranslate2: model.bin, config.json, tokenizer.json).
    /// Default: Whisper tiny.en as fetched by scripts/setup.
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
    #[arg(long, default_value_t = 1.0)]
    pub patience: f32,

    /// Candidates sampled when falling back to a temperature above 0.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u16).range(1..=32))]
    pub best_of: u16,

    /// Rank candidates by log probability / ((5 + length) / 6)^ALPHA instead of / length.
    #[arg(long, value_name = "ALPHA")]
    pub length_penalty: Option<f32>,

    /// First sampling temperature.
    #[arg(long, default_value_t = 0.0)]
    pub temperature: f32,

    /// Temperature step on fallback, up to 1.0 (0 disables fallback).
    #[arg(long, default_value_t = 0.2)]
    pub temperature_increment_on_fallback: f32,

    /// Fall back when the text compresses better than this (gzip ratio).
    #[arg(long, default_value_t = 2.4)]
    pub compression_ratio_threshold: f32,

    /// Fall back when the average log probability is below this.
    #[arg(long, default_value_t = -1.0, allow_hyphen_values = true)]
    pub logprob_threshold: f32,

    /// Skip a window as silence when <|nospeech|> is likelier than this
    /// and the log probability is below the threshold above.
    #[arg(long, default_value_t = 0.6)]
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

    #[command(flatten)]
    pub device: super::DeviceArgs,

    /// No timing line on stderr.
    #[arg(short, long)]
    pub quiet: bool,
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
        })
    }
}

/// Where `scripts/setup` puts the default model, relative to the repository.
pub const DEFAULT_MODEL: &str = "samples/models/whisper-tiny.en";

/// The default model: looked up from the working directory, then from the
/// repository that holds the running executable (`target/<profile>/..`).
fn default_model() -> anyhow::Result<PathBuf> {
    let mut candidates = vec![PathBuf::from(DEFAULT_MODEL)];
    if let Ok(exe) = std::env::current_exe() {
        for dir in exe.ancestors().skip(1).take(4) {
            candidates.push(dir.join(DEFAULT_MODEL));
        }
    }
    candidates
        .into_iter()
        .find(|p| p.join("model.bin").is_file())
        .ok_or_else(|| {
            anyhow::anyhow!(
                "default model {DEFAULT_MODEL} not found: run scripts/setup, or pass --model"
            )
        })
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let opts = args.options()?;
    let t0 = Instant::now();
    let model = match &args.model {
        Some(m) => m.clone(),
        None => default_model()?,
    };
    let files = WhisperFiles::load(&model, args.mel_filters.as_deref())?;
    let audio = audio::load(&args.audio, SAMPLE_RATE as u32)?;
    let t_loaded = Instant::now();

    let mut cpu_encoder;
    let mut gpu_encoder;
    let (encoder, device): (&mut dyn AudioEncoder, String) = match args.device.choice().open()? {
        Device::Cpu => {
            cpu_encoder = CpuEncoder(&files.model);
            (&mut cpu_encoder, "cpu".into())
        }
        Device::Gpu(gpu) => {
            let name = format!("gpu encoder ({})", gpu.info.name);
            gpu_encoder = GpuEncoder::new(gpu, &files.model)?;
            (&mut gpu_encoder, name)
        }
    };

    let stdout = std::io::stdout();
    let mut writer = Writer::new(args.format, stdout.lock());
    let bar = crate::util::progress::bar((audio.seconds().ceil() as u64).max(1), "transcribing");
    let mut on_segment = |seg: &transcribe::Segment, done: f64| -> crate::Result<()> {
        bar.set_position(done as u64);
        writer
            .segment(seg)
            .map_err(|e| crate::Error::io("<stdout>", e))
    };
    let transcript =
        transcribe::transcribe(&files, encoder, &audio.samples, &opts, &mut on_segment)?;
    bar.finish_and_clear();
    let _stdout = writer
        .finish(&transcript)
        .map_err(|e| crate::Error::io("<stdout>", e))?;
    if !args.quiet {
        let secs = t_loaded.elapsed().as_secs_f64();
        let _ = writeln!(
            std::io::stderr(),
            "transcribe: {:.1} s of audio in {:.2} s (real-time factor {:.3}; load {:.2} s), {} segments, language {}, {}",
            transcript.duration,
            secs,
            secs / transcript.duration.max(1e-9),
            (t_loaded - t0).as_secs_f64(),
            transcript.segments.len(),
            transcript.language,
            device
        );
    }
    Ok(())
}
