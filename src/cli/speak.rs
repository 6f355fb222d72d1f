//! `speak`: text to speech with a Piper (VITS) voice.

use crate::models::vits::{PhonemeType, Scales, Synthesizer, Vits, VoiceConfig};
use crate::run::phonemes::{PhonemeIdMap, Phonemes, SentenceIds, SentenceStream};
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
`-o -` and --output-raw start a pipe playing before a long text is done (the text is read \
clause by clause, so the first sentence is spoken before the rest is read). Each sentence is \
scaled to full volume, as Piper does, unless --no-normalize. A multi-speaker voice speaks as \
--speaker (a name from its speaker_id_map, or an id; --list-speakers shows them).\n\n\
Examples:\n  speak \"Hello there.\" -o hello.wav\n  \
fortune | speak -o - | aplay\n  \
speak --output-raw \"Hello there.\" | aplay -r 22050 -f S16_LE -t raw -\n  \
speak -m en_US-libritts_r-medium.onnx --speaker p3922 \"Hi.\" -o hi.wav\n  \
speak --cpu --seed 7 --length-scale 1.2 \"Slowly, please.\" -o slow.wav\n\n\
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
        required_unless_present_any = ["output_raw", "list_speakers"]
    )]
    pub output: Option<PathBuf>,

    /// Write raw 16-bit mono samples (no WAV header) to standard output, as
    /// Piper's --output-raw.
    #[arg(long, visible_alias = "output_raw", conflicts_with_all = ["output", "json"])]
    pub output_raw: bool,

    /// Speaker of a multi-speaker voice: a name from its speaker_id_map or
    /// an id (Piper's --speaker). Default: the voice's default_speaker_id (0).
    #[arg(short, long, value_name = "ID|NAME")]
    pub speaker: Option<String>,

    /// Print the voice's speakers (id, a tab, the name), one a line, and exit.
    #[arg(long, conflicts_with_all = ["output", "output_raw", "phoneme_ids", "json"])]
    pub list_speakers: bool,

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

/// `--list-speakers`: id and name per line (an id without a name alone).
fn list_speakers(cfg: &VoiceConfig) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    for id in 0..cfg.num_speakers as u32 {
        let names: Vec<&str> = cfg
            .speakers
            .iter()
            .filter(|(_, i)| *i == id)
            .map(|(n, _)| n.as_str())
            .collect();
        if names.is_empty() {
            writeln!(out, "{id}")?;
        }
        for n in names {
            writeln!(out, "{id}\t{n}")?;
        }
    }
    Ok(())
}

fn voice_json(model: &std::path::Path) -> PathBuf {
    let mut json = model.as_os_str().to_owned();
    json.push(".json");
    PathBuf::from(json)
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let run_start = Instant::now();
    args.quiet.apply();
    crate::util::alloc::reuse_freed_memory();
    let model_path = match &args.model {
        Some(p) => p.clone(),
        None => default_voice()?,
    };
    // The config first: it answers --list-speakers and checks --speaker
    // before anything heavy loads.
    let voice_config = VoiceConfig::open(&voice_json(&model_path))?;
    if args.list_speakers {
        return list_speakers(&voice_config);
    }
    let speaker = match &args.speaker {
        None => voice_config.default_speaker,
        Some(s) => voice_config
            .speaker(s)
            .map_err(|e| super::usage(format!("--speaker: {e}")))?,
    };
    let text = if args.phoneme_ids.is_empty() {
        Some(read_text(&args)?)
    } else {
        None
    };
    let silence = args.sentence_silence;
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
    let vits = Vits::open_with_config(&model_path, voice_config)
        .with_context(|| format!("loading {}", model_path.display()))?;
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
    let offsets = vits.speaker_offsets(speaker)?;
    // Sentences are read as they are spoken; the first one is read here, so
    // that text with nothing to say fails before the output is opened.
    type Sentences<'a> = Box<dyn Iterator<Item = crate::error::Result<SentenceIds>> + 'a>;
    let mut sentences: Sentences = match &text {
        Some(text) => {
            let phonemes = match cfg.phoneme_type {
                PhonemeType::Espeak => Phonemes::Espeak(&cfg.espeak_voice),
                PhonemeType::Text => Phonemes::Text,
            };
            Box::new(SentenceStream::new(text, phonemes, &id_map)?)
        }
        None => Box::new(parse_ids(&args.phoneme_ids)?.into_iter().map(Ok)),
    };
    let first = sentences
        .next()
        .transpose()?
        .context("no sentences to speak")?;
    let sentences = std::iter::once(Ok(first)).chain(sentences);
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
    let mut first_audio_since_start = None;
    let mut count = 0usize;
    // How many sentences a text has is known only once it is read.
    let bar = crate::util::progress::counter("speaking", "sentences");
    // A sentence's time is the time since the audio before it: on the GPU
    // the next sentences are already on their way while one is emitted.
    let mut last_emit = Instant::now();
    synth.speak(
        sentences,
        offsets.as_ref(),
        &scales,
        &mut rng,
        &mut |sentence, audio, stages| {
            let pcm = wav::to_pcm16(&audio, !args.no_normalize);
            let io = |e| crate::Error::io(&output, e);
            if count > 0 && !sentence.continues {
                sink.write(&gap).map_err(io)?;
                samples += gap.len();
            }
            bar.inc(1);
            sink.write(&pcm).map_err(io)?;
            samples += pcm.len();
            count += 1;
            first_audio.get_or_insert_with(|| start.elapsed().as_secs_f64());
            first_audio_since_start.get_or_insert_with(|| run_start.elapsed().as_secs_f64());
            if args.json {
                timings.push(serde_json::json!({
                    "phonemes": sentence.phonemes,
                    "ids": sentence.ids,
                    "synthesis_seconds": last_emit.elapsed().as_secs_f64(),
                    "prior_seconds": stages.prior,
                    "flow_and_decoder_seconds": stages.flow_and_decoder,
                    "device_seconds": stages.device.map(|d| serde_json::json!({
                        "prior": d.prior,
                        "regulation": d.regulation,
                        "flow": d.flow,
                        "decoder": d.decoder,
                    })),
                    "audio_seconds": audio.len() as f64 / rate as f64,
                }));
            }
            last_emit = Instant::now();
            Ok(())
        },
    )?;
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
            "time_to_first_audio_seconds": first_audio_since_start,
            "real_time_factor": rtf,
            "speaker": offsets.as_ref().map(|_| speaker),
            "seed": seed,
            "noise_scale": scales.noise_scale,
            "length_scale": scales.length_scale,
            "noise_w": scales.noise_w,
            "sentences": timings,
        });
        writeln!(std::io::stdout(), "{v}")?;
    }
    crate::notice!(
        "{} sentence(s), {:.2} s of audio in {:.2} s (real-time factor {:.3}, first sentence after {:.2} s, first audio {:.2} s after start) | seed {}",
        count,
        seconds,
        elapsed,
        rtf,
        first_audio.unwrap_or(0.0),
        first_audio_since_start.unwrap_or(0.0),
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
