//! `speak`: text to speech with a Piper (VITS) voice.

use crate::models::vits::{Scales, Synthesizer, Vits};
use crate::run::phonemes::{self, PhonemeIdMap};
use crate::run::wav::{self, PcmSink, WavFile, WavStream};
use crate::util::atomic_write::AtomicFile;
use crate::util::rng::Rng;
use anyhow::{bail, Context};
use clap::Parser;
use std::io::{IsTerminal, Read};
use std::path::{Path, PathBuf};
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

    /// Output WAV file (replaced atomically if it exists), or `-` for a WAV
    /// stream on standard output, written sentence by sentence.
    #[arg(short, long)]
    pub output: PathBuf,

    /// Voice: a Piper .onnx file with its .onnx.json beside it. Default:
    /// en_US-joe-medium as fetched by scripts/setup.
    #[arg(short, long)]
    pub model: Option<PathBuf>,

    /// Phoneme length multiplier (> 1 is slower). Default: the voice's (1.0).
    #[arg(long)]
    pub length_scale: Option<f32>,

    /// Variation in the voice (noise added to the prior). Default: the voice's (0.667).
    #[arg(long)]
    pub noise_scale: Option<f32>,

    /// Variation in phoneme durations. Default: the voice's (0.8).
    #[arg(long)]
    pub noise_w: Option<f32>,

    /// Random seed; the same seed gives the same samples. Default: from the clock.
    #[arg(long)]
    pub seed: Option<u64>,

    /// Seconds of silence between sentences.
    #[arg(long, default_value_t = 0.2)]
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

fn check_scale(name: &str, v: f32, min: f32, max: f32) -> anyhow::Result<f32> {
    if !(v.is_finite() && (min..=max).contains(&v)) {
        bail!("{name} must be between {min} and {max}, not {v}");
    }
    Ok(v)
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let text = read_text(&args)?;
    if text.trim().is_empty() {
        bail!("no text to speak (the text is empty)");
    }
    let model_path = match &args.model {
        Some(p) => p.clone(),
        None => default_voice()?,
    };
    let silence = check_scale("--sentence-silence", args.sentence_silence, 0.0, 60.0)?;
    let to_stdout = args.output == Path::new("-");
    if to_stdout && args.json {
        bail!("--json prints on standard output, which -o - uses for audio");
    }

    // Phonemes first: a text espeak-ng cannot read fails before the model loads.
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
    let mut sentences = phonemes::phonemize(&cfg.espeak_voice, &text)?;
    // A clause espeak-ng could not read leaves only its punctuation: nothing
    // to say (Piper would synthesise a short breath for it).
    sentences.retain(|s| {
        let speakable = s
            .phonemes
            .iter()
            .any(|p| !p.chars().all(|c| c.is_whitespace() || ".,;:!?".contains(c)));
        if !speakable {
            eprintln!("notice: nothing to say in \"{}\"; skipped", s.text());
        }
        speakable
    });
    if sentences.is_empty() {
        bail!(
            "espeak-ng found nothing to say in the text (voice {})",
            cfg.espeak_voice
        );
    }
    let mut ids = Vec::new();
    for s in &sentences {
        let r = id_map.sentence_ids(s);
        if !r.missing.is_empty() {
            eprintln!(
                "notice: skipped phonemes the voice does not know: {} (in \"{}\")",
                r.missing.join(" "),
                s.text()
            );
        }
        ids.push(r.ids);
    }
    let synth = Synthesizer::new(vits, &args.device.choice())?;
    let rate = synth.vits().config.sample_rate;
    let seed = args.seed.unwrap_or_else(clock_seed);
    let mut rng = Rng::new(seed);
    eprintln!(
        "voice: {} ({} Hz) on {}; loaded in {:.2} s",
        model_path.display(),
        rate,
        synth.backend_name(),
        load_start.elapsed().as_secs_f64()
    );

    // The output is opened only now that the input is known to be good.
    let mut file = None;
    let mut sink: Box<dyn PcmSink + '_> = if to_stdout {
        Box::new(WavStream::new(std::io::stdout().lock(), rate)?)
    } else {
        let f = file.insert(AtomicFile::create(&args.output, true)?);
        Box::new(
            WavFile::new(f.writer(), rate)
                .with_context(|| format!("writing {}", args.output.display()))?,
        )
    };
    let gap = vec![0i16; (silence * rate as f32).round() as usize];
    let start = Instant::now();
    let mut samples = 0usize;
    let mut first_audio = None;
    for (i, sentence_ids) in ids.iter().enumerate() {
        let audio = synth.synthesize(sentence_ids, &scales, &mut rng)?;
        let pcm = wav::to_pcm16(&audio, !args.no_normalize);
        if i > 0 {
            sink.write(&gap)?;
            samples += gap.len();
        }
        sink.write(&pcm)?;
        samples += pcm.len();
        first_audio.get_or_insert_with(|| start.elapsed().as_secs_f64());
    }
    sink.finish()
        .with_context(|| format!("writing {}", args.output.display()))?;
    if let Some(f) = file {
        f.commit()?;
    }
    let elapsed = start.elapsed().as_secs_f64();
    let seconds = samples as f64 / rate as f64;
    let rtf = elapsed / seconds.max(1e-9);
    if args.json {
        let v = serde_json::json!({
            "output": args.output.display().to_string(),
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
            "sentences": sentences.iter().zip(&ids).map(|(s, ids)| serde_json::json!({
                "phonemes": s.text(),
                "ids": ids,
            })).collect::<Vec<_>>(),
        });
        println!("{v}");
    }
    eprintln!(
        "{} sentence(s), {:.2} s of audio in {:.2} s (real-time factor {:.3}, first sentence after {:.2} s) | seed {}",
        ids.len(),
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
