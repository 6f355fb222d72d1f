//! `speak`: text to speech with a Piper (VITS) voice.

use crate::models::vits::{Scales, Synthesizer, Vits};
use crate::run::phonemes::{text_to_ids, PhonemeIdMap, SentenceIds};
use crate::run::wav::{self, PcmSink, RawStream, WavFile, WavStream};
use crate::util::atomic_write::{self, AtomicFile};
use crate::util::rng::Rng;
use anyhow::{bail, Context};
use clap::Parser;
use std::io::{IsTerminal, Read, Write};
use std::path::PathBuf;
use std::time::Instant;

/// Where `scripts/setup` puts the default voice, relative to the repo.
pub const DEFAULT_VOICE: &str = "samples/models/piper-joe/en_US-joe-medium.onnx";

/// Speak text with a Piper voice (VITS) on the GPU or the CPU; writes a 16-bit WAV.
#[derive(Parser, Debug)]
#[command(
    name = "speak",
    version,
    long_about = None,
    after_help = "Text is turned into phonemes by espeak-ng (its library must be installed: \
apt-get install espeak-ng), split into sentences, and synthesised sentence by sentence, so \
`-o -` starts a pipe playing before a long text is done. Each sentence is scaled to full \
volume, as Piper does, unless --no-normalize.\n\n\
Examples:\n  speak \"Hello there.\" -o hello.wav\n  \
fortune | speak -o - | aplay\n  speak --cpu --seed 7 --length-scale 1.2 \"Slowly, please.\" -o slow.wav\n\n\
Exit status: 0 on success, 1 on bad input or a failed run, 2 on a bad command line."
)]
pub struct Args {
    /// The text to speak. Without it (or with `-`), the text is read from standard input.
    pub text: Vec<String>,

    /// Speak these phoneme ids instead of text (comma-separated, one
    /// sentence per use of the option; skips espeak-ng), as Piper's
    /// `phoneme_ids` input.
    #[arg(long, value_name = "IDS", conflicts_with = "text")]
    pub phoneme_ids: Vec<String>,

    /// Output WAV file (written to a temporary file and renamed into place),
    /// or `-` for a WAV stream on standard output, written sentence by
    /// sentence; a FIFO or device is streamed to as well.
    #[arg(
        short,
        long,
        value_name = "FILE",
        visible_alias = "output_file",
        required_unless_present = "output_raw"
    )]
    pub output: Option<PathBuf>,

    /// Write raw 16-bit mono samples (no WAV header) to standard output, as
    /// Piper's --output-raw.
    #[arg(long, visible_alias = "output_raw", conflicts_with_all = ["output", "json"])]
    pub output_raw: bool,

    /// Speaker id of a multi-speaker voice (Piper's --speaker); this
    /// engine runs single-speaker voices, so only 0.
    #[arg(long, value_name = "ID")]
    pub speaker: Option<u32>,

    /// Replace the output file if it exists.
    #[arg(long)]
    pub force: bool,

    /// Voice: a Piper .onnx file with its .onnx.json beside it. Default:
    /// en_US-joe-medium as fetched by scripts/setup.
    #[arg(short, long)]
    pub model: Option<PathBuf>,

    /// Phoneme length multiplier (> 1 is slower; 0.05 to 20). Default: the voice's (1.0).
    #[arg(long, visible_alias = "length_scale", value_parser = length_scale)]
    pub length_scale: Option<f32>,

    /// Variation in the voice (noise added to the prior; 0 to 10). Default: the voice's (0.667).
    #[arg(long, visible_alias = "noise_scale", value_parser = noise)]
    pub noise_scale: Option<f32>,

    /// Variation in phoneme durations (0 to 10). Default: the voice's (0.8).
    #[arg(long, visible_alias = "noise_w", value_parser = noise)]
    pub noise_w: Option<f32>,

    /// Random seed; the same seed gives the same samples. Default: from the clock.
    #[arg(long)]
    pub seed: Option<u64>,

    /// Seconds of silence between sentences (0 to 60).
    #[arg(long, visible_alias = "sentence_silence", default_value_t = 0.2, value_parser = silence)]
    pub sentence_silence: f32,

    /// Keep the model's loudness instead of scaling each sentence to full
    /// scale (Piper normalises).
    #[arg(long)]
    pub no_normalize: bool,

    /// Print one JSON object with the phonemes, timings and real-time factor
    /// on standard output (not with `-o -`).
    #[arg(long)]
    pub json: bool,

    #[command(flatten)]
    pub device: super::DeviceArgs,

    #[command(flatten)]
    pub quiet: super::QuietArgs,
}

/// The default voice: looked up from the working directory, then from the
/// repository that holds the running executable (`target/<profile>/..`).
fn default_voice() -> anyhow::Result<PathBuf> {
    let mut candidates = vec![PathBuf::from(DEFAULT_VOICE)];
    if let Ok(exe) = std::env::current_exe() {
        for dir in exe.ancestors().skip(1).take(4) {
            candidates.push(dir.join(DEFAULT_VOICE));
        }
    }
    candidates
        .into_iter()
        .find(|p| p.is_file())
        .with_context(|| {
            format!("default voice {DEFAULT_VOICE} not found: run scripts/setup, or pass --model")
        })
}

fn read_text(args: &Args) -> anyhow::Result<String> {
    if args.text.is_empty() || args.text == ["-"] {
        if std::io::stdin().is_terminal() {
            bail!("no text: pass it as arguments or on standard input");
        }
        let mut s = String::new();
        std::io::stdin()
            .read_to_string(&mut s)
            .context("reading the text from standard input")?;
        Ok(s)
    } else {
        Ok(args.text.join(" "))
    }
}

fn in_range(s: &str, min: f32, max: f32) -> Result<f32, String> {
    let v: f32 = s
        .trim()
        .parse()
        .map_err(|_| format!("{s:?} is not a number"))?;
    if v.is_finite() && (min..=max).contains(&v) {
        Ok(v)
    } else {
        Err(format!("must be between {min} and {max}, not {s}"))
    }
}

fn length_scale(s: &str) -> Result<f32, String> {
    in_range(s, 0.05, 20.0)
}

fn noise(s: &str) -> Result<f32, String> {
    in_range(s, 0.0, 10.0)
}

fn silence(s: &str) -> Result<f32, String> {
    in_range(s, 0.0, 60.0)
}

fn check_scale(name: &str, v: f32, min: f32, max: f32) -> anyhow::Result<f32> {
    if !(v.is_finite() && (min..=max).contains(&v)) {
        bail!("{name} must be between {min} and {max}, not {v}");
    }
    Ok(v)
}

/// `--phoneme-ids` values: one sentence each.
fn parse_ids(values: &[String]) -> anyhow::Result<Vec<SentenceIds>> {
    values
        .iter()
        .map(|v| {
            let ids = v
                .split(',')
                .map(|x| x.trim().parse::<i64>())
                .collect::<Result<Vec<_>, _>>()
                .with_context(|| {
                    format!("--phoneme-ids {v:?}: expected comma-separated integers")
                })?;
            Ok(SentenceIds {
                phonemes: None,
                ids,
                continues: false,
            })
        })
        .collect()
}

pub fn run(args: Args) -> anyhow::Result<()> {
    args.quiet.apply();
    let text = if args.phoneme_ids.is_empty() {
        Some(read_text(&args)?)
    } else {
        None
    };
    let model_path = match &args.model {
        Some(p) => p.clone(),
        None => default_voice()?,
    };
    let silence = args.sentence_silence;
    if args.speaker.is_some_and(|s| s != 0) {
        return Err(super::usage(
            "--speaker: this engine runs single-speaker voices (speaker 0 only)",
        ));
    }
    let output = args.output.clone().unwrap_or_else(|| PathBuf::from("-"));
    let to_stdout = atomic_write::is_stdout(&output);
    if to_stdout && args.json {
        return Err(super::usage(
            "--json prints on standard output, which -o - uses for audio",
        ));
    }
    atomic_write::check_extension(&output, &["wav", "wave"], "WAV")
        .map_err(|e| super::usage(e.to_string()))?;
    // Before the voice loads, so that a bad output path fails at once.
    atomic_write::check(&output, args.force)?;

    let load_start = Instant::now();
    let vits =
        Vits::open(&model_path).with_context(|| format!("loading {}", model_path.display()))?;
    let cfg = &vits.config;
    let scales = Scales {
        noise_scale: check_scale(
            "--noise-scale",
            args.noise_scale.unwrap_or(cfg.noise_scale),
            0.0,
            10.0,
        )?,
        length_scale: check_scale(
            "--length-scale",
            args.length_scale.unwrap_or(cfg.length_scale),
            0.05,
            20.0,
        )?,
        noise_w: check_scale("--noise-w", args.noise_w.unwrap_or(cfg.noise_w), 0.0, 10.0)?,
    };
    let id_map = PhonemeIdMap::from_config(&cfg.path, &cfg.json)?;
    let sentences = match &text {
        Some(text) => text_to_ids(text, &cfg.espeak_voice, &id_map)?,
        None => parse_ids(&args.phoneme_ids)?,
    };
    let synth = Synthesizer::new(vits, &args.device.choice())?;
    let rate = synth.vits().config.sample_rate;
    let seed = args.seed.unwrap_or_else(clock_seed);
    let mut rng = Rng::new(seed);
    crate::notice!(
        "voice: {} ({} Hz) on {}; loaded in {:.2} s",
        model_path.display(),
        rate,
        synth.backend_name(),
        load_start.elapsed().as_secs_f64()
    );

    // The output is opened only now that the input is known to be good.
    // A regular file gets its sizes in the header; stdout, a FIFO or a
    // device gets the streaming header.
    let mut file = AtomicFile::create(&output, args.force)?;
    let seekable = file.is_file();
    let mut sink: Box<dyn PcmSink + '_> = if args.output_raw {
        Box::new(RawStream::new(file.writer()))
    } else if seekable {
        Box::new(
            WavFile::new(file.writer(), rate)
                .with_context(|| format!("writing {}", output.display()))?,
        )
    } else {
        Box::new(
            WavStream::new(file.writer(), rate)
                .with_context(|| format!("writing {}", output.display()))?,
        )
    };
    let gap = vec![0i16; (silence * rate as f32).round() as usize];
    let start = Instant::now();
    let mut samples = 0usize;
    let mut first_audio = None;
    let mut timings = Vec::new();
    let bar = crate::util::progress::bar(sentences.len() as u64, "speaking");
    for (i, sentence) in sentences.iter().enumerate() {
        let t0 = Instant::now();
        let audio = synth.synthesize(&sentence.ids, &scales, &mut rng)?;
        timings.push((t0.elapsed().as_secs_f64(), audio.len() as f64 / rate as f64));
        let pcm = wav::to_pcm16(&audio, !args.no_normalize);
        if i > 0 && !sentence.continues {
            sink.write(&gap)?;
            samples += gap.len();
        }
        bar.inc(1);
        sink.write(&pcm)?;
        samples += pcm.len();
        first_audio.get_or_insert_with(|| start.elapsed().as_secs_f64());
    }
    bar.finish_and_clear();
    sink.finish()
        .with_context(|| format!("writing {}", output.display()))?;
    file.commit()?;
    let elapsed = start.elapsed().as_secs_f64();
    let seconds = samples as f64 / rate as f64;
    let rtf = elapsed / seconds.max(1e-9);
    if args.json {
        let v = serde_json::json!({
            "output": output.display().to_string(),
            "model": model_path.display().to_string(),
            "backend": synth.backend_name(),
            "sample_rate": rate,
            "samples": samples,
            "audio_seconds": seconds,
            "synthesis_seconds": elapsed,
            "first_sentence_seconds": first_audio,
            "real_time_factor": rtf,
            "seed": seed,
            "noise_scale": scales.noise_scale,
            "length_scale": scales.length_scale,
            "noise_w": scales.noise_w,
            "sentences": sentences.iter().zip(&timings).map(|(s, (secs, audio))| serde_json::json!({
                "phonemes": s.phonemes,
                "ids": s.ids,
                "synthesis_seconds": secs,
                "audio_seconds": audio,
            })).collect::<Vec<_>>(),
        });
        writeln!(std::io::stdout(), "{v}")?;
    }
    crate::notice!(
        "{} sentence(s), {:.2} s of audio in {:.2} s (real-time factor {:.3}, first sentence after {:.2} s) | seed {}",
        sentences.len(),
        seconds,
        elapsed,
        rtf,
        first_audio.unwrap_or(0.0),
        seed
    );
    Ok(())
}

fn clock_seed() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}
