//! Batched transcription, as faster-whisper's `BatchedInferencePipeline`:
//! the audio is cut into chunks of at most 30 s before anything is decoded
//! (consecutive 30 s clips, as its `clip_timestamps`, or the speech that
//! VAD finds, merged into pieces of at most 30 s, as its `vad_filter`);
//! each chunk is one window with features of its own (its own log-mel
//! floor), and up to a batch of windows, of one input or of several, are
//! encoded and decoded together: their sequences are the rows of every
//! decoder pass. Every window starts from the same prompt (no previous
//! text: that is what keeps a batch in step), decodes at the first
//! temperature only (no fallback), is never skipped as silence, and is cut
//! into segments at its timestamps.
//!
//! The sequential pipeline (`transcribe`) instead starts each window at the
//! last timestamp of the one before, prompts it with the text so far,
//! falls back to higher temperatures and skips silence; the two give the
//! same text where those rules do not come into play (a clip of at most
//! 30 s that decodes at temperature 0), and otherwise differ as
//! faster-whisper's two pipelines do.

use super::decode::{compression_ratio, Strategy, WindowDecoder};
use super::vad::{get_speech_timestamps, Speech, SpeechMap, VadOptions};
use super::{
    aligner, check_options, detect_language_window, resolve_language, rules, sot_sequence,
    split_segments, Backend, Options, Rules, Segment, Token, Transcript,
};
use crate::error::Result;
use crate::models::silero_vad::SileroVad;
use crate::models::whisper::mel::{self, MelFilters, Span, HOP, N_FRAMES, N_SAMPLES, SAMPLE_RATE};
use crate::models::whisper::WhisperFiles;
use crate::util::rng::Rng;
use rayon::prelude::*;
use std::collections::HashMap;

/// The longest chunk: one 30 s window.
pub const CHUNK_SAMPLES: usize = N_SAMPLES;

/// A piece of one input decoded as one window.
#[derive(Clone, Debug)]
pub struct Chunk {
    /// The input it belongs to (the caller's index).
    pub input: usize,
    /// Where it starts, in seconds of the input's timeline (with VAD, of
    /// the speech joined).
    pub offset: f64,
    /// At most [`CHUNK_SAMPLES`] samples at 16 kHz.
    pub samples: Vec<f32>,
    /// The language token of a multilingual model ([`Batched::language`]).
    pub language: Option<u32>,
}

/// Sequences a window of the batched pipeline decodes at once: its beams,
/// or its samples at a first temperature above 0.
pub fn sequences(opts: &Options) -> usize {
    if opts.temperatures.first().is_some_and(|&t| t > 0.0) {
        opts.best_of
    } else {
        opts.beam_size
    }
}

/// Consecutive clips of at most 30 s of a signal of `len` samples.
pub fn clip_ranges(len: usize) -> Vec<std::ops::Range<usize>> {
    (0..len)
        .step_by(CHUNK_SAMPLES)
        .map(|s| s..(s + CHUNK_SAMPLES).min(len))
        .collect()
}

/// faster-whisper's `collect_chunks`: the speech `speech` of `audio`
/// joined into pieces of at most `max_samples`, each with where it starts
/// in the joined speech (seconds). No speech gives no pieces.
pub fn collect_chunks(
    audio: &[f32],
    speech: &[Speech],
    max_samples: usize,
) -> Vec<(f64, Vec<f32>)> {
    if speech.is_empty() {
        return Vec::new();
    }
    let mut pieces = Vec::new();
    let (mut current, mut total) = (Vec::new(), 0usize);
    for s in speech {
        if current.len() + (s.end - s.start) > max_samples {
            let done = std::mem::take(&mut current);
            let len = done.len();
            pieces.push((total as f64 / SAMPLE_RATE as f64, done));
            total += len;
        }
        current.extend_from_slice(&audio[s.start..s.end]);
    }
    pieces.push((total as f64 / SAMPLE_RATE as f64, current));
    pieces
}

/// A chunk's encoder input as faster-whisper's batched pipeline computes
/// it: the log-mel features of the chunk alone (its STFT frames but the
/// last, floored at their own maximum less 8), zero-filled to 3000 frames.
pub fn chunk_features(filters: &MelFilters, samples: &[f32]) -> Vec<f32> {
    let span = Span {
        start: 0,
        data: samples,
        len: samples.len(),
    };
    // (len + 160) / 160 frames set the floor; all but the last are kept.
    let frames = samples.len() / HOP;
    let max = filters.max_raw(span, 0..frames + 1);
    let kept = frames.min(N_FRAMES);
    let feats = filters.frames(span, max, 0, kept);
    mel::pad_window(filters.n_mels, &feats, kept)
}

/// x rounded to 3 decimals as Python's `round(x, 3)`.
fn round3(x: f64) -> f64 {
    format!("{x:.3}").parse().unwrap_or(x)
}

/// The batched pipeline for one set of options.
pub struct Batched<'a> {
    files: &'a WhisperFiles,
    opts: &'a Options,
    rules: Rules,
    rng: Rng,
    /// Time spent computing the chunks' features.
    pub features: std::time::Duration,
}

impl<'a> Batched<'a> {
    pub fn new(files: &'a WhisperFiles, opts: &'a Options) -> Result<Batched<'a>> {
        check_options(files, opts)?;
        Ok(Batched {
            files,
            opts,
            rules: rules(files, opts)?,
            rng: Rng::new(opts.seed),
            features: std::time::Duration::ZERO,
        })
    }

    /// The language token for an input whose first chunk is `first` (the
    /// `--language` given, else detected on that window for a multilingual
    /// model), and its probability when detected.
    pub fn language(
        &self,
        backend: &mut dyn Backend,
        first: &[f32],
    ) -> Result<(Option<u32>, Option<f32>)> {
        match resolve_language(self.files, self.opts)? {
            Some(t) => Ok((Some(t), None)),
            None if self.files.model.config.is_multilingual() => {
                let window = chunk_features(&self.files.mel, first);
                let (t, p) = detect_language_window(self.files, backend, &window)?;
                Ok((Some(t), Some(p)))
            }
            None => Ok((None, None)),
        }
    }

    /// The language code of a chunk's token ("en" without one).
    pub fn language_code(&self, token: Option<u32>) -> String {
        token
            .and_then(|t| self.files.tokenizer.language_code(t))
            .unwrap_or("en")
            .to_string()
    }

    /// Encodes and decodes `chunks` together (at most the backend's
    /// windows), and returns each one's segments, times in its input's
    /// timeline. `last_speech` holds, per input, where its speech last
    /// ended (word timestamps carry it from chunk to chunk).
    pub fn decode(
        &mut self,
        backend: &mut dyn Backend,
        chunks: &[Chunk],
        last_speech: &mut HashMap<usize, f64>,
    ) -> Result<Vec<Vec<Segment>>> {
        let files = self.files;
        let (opts, tok) = (self.opts, &files.tokenizer);
        let s = &tok.specials;
        let c = &files.model.config;
        let t0 = web_time::Instant::now();
        let mels: Vec<Vec<f32>> = chunks
            .par_iter()
            .map(|ch| chunk_features(&files.mel, &ch.samples))
            .collect();
        self.features += t0.elapsed();
        let windows: Vec<&[f32]> = mels.iter().map(Vec::as_slice).collect();
        backend.encode(&windows)?;

        // faster-whisper's prompt: the initial prompt's tokens as they are
        // (no leading space), then the start of transcript.
        let mut previous = Vec::new();
        if let Some(p) = &opts.initial_prompt {
            let t = tok.encode(p)?;
            if !t.is_empty() {
                previous.push(s.sot_prev);
                previous.extend_from_slice(&t[t.len().saturating_sub(c.n_text_ctx / 2 - 1)..]);
            }
        }
        let sot_index = previous.len();
        let prompts: Vec<Vec<u32>> = chunks
            .iter()
            .map(|ch| [previous.as_slice(), &sot_sequence(files, opts, ch.language)].concat())
            .collect();
        let prompt_refs: Vec<&[u32]> = prompts.iter().map(Vec::as_slice).collect();
        let strategy = Strategy {
            temperature: opts.temperatures[0],
            beam_size: opts.beam_size,
            best_of: opts.best_of,
            patience: opts.patience,
            length_penalty: opts.length_penalty,
            sample_len: c.n_text_ctx / 2,
        };
        let decoder = WindowDecoder::new(&files.model, tok, &self.rules);
        let results = decoder.decode(backend, &prompt_refs, sot_index, &strategy, &mut self.rng)?;

        let mut out = Vec::with_capacity(chunks.len());
        for (w, (chunk, result)) in chunks.iter().zip(results).enumerate() {
            let duration = chunk.samples.len() as f64 / SAMPLE_RATE as f64;
            let segment_size = (duration.ceil() as usize) * 100;
            let seek = (chunk.offset * 100.0) as usize;
            let tokens = &result.tokens;
            let split = split_segments(tokens, s.timestamp_begin, chunk.offset, duration);
            let mut spans = split.spans;
            if opts.word_timestamps {
                let language = self.language_code(chunk.language);
                let sot = sot_sequence(files, opts, chunk.language);
                let aligner = aligner(files, opts, &sot, &language)?;
                let cross = backend.cross_kv(w)?;
                let last = last_speech.entry(chunk.input).or_insert(0.0);
                *last = aligner.add_word_timestamps(
                    cross,
                    &mut spans,
                    seek as f64 / 100.0,
                    segment_size,
                    *last,
                );
            }
            let segments = split
                .pieces
                .into_iter()
                .zip(spans)
                .map(|(range, span)| {
                    let ids = &tokens[range.clone()];
                    let text = tok.decode(ids);
                    Segment {
                        id: 0,
                        seek,
                        start: round3(span.start),
                        end: round3(span.end),
                        compression_ratio: compression_ratio(&text),
                        text,
                        tokens: ids
                            .iter()
                            .zip(&result.token_logprobs[range])
                            .map(|(&id, &logprob)| Token {
                                id,
                                text: tok.token_text(id),
                                logprob,
                            })
                            .collect(),
                        temperature: result.temperature,
                        avg_logprob: result.avg_logprob,
                        no_speech_prob: result.no_speech_prob,
                        words: opts.word_timestamps.then_some(span.words),
                    }
                })
                .collect();
            out.push(segments);
        }
        Ok(out)
    }
}

/// The chunks of one signal: 30 s clips, or with `vad` its speech joined
/// into pieces of at most 30 s (faster-whisper's batched `vad_filter`,
/// whose longest speech chunk is the 30 s of a window); the map of the
/// speech back to the signal's time.
pub fn chunks_of(
    samples: &[f32],
    vad: Option<(&SileroVad, &VadOptions)>,
) -> (Vec<(f64, Vec<f32>)>, Option<SpeechMap>) {
    match vad {
        None => (
            clip_ranges(samples.len())
                .into_iter()
                .map(|r| (r.start as f64 / SAMPLE_RATE as f64, samples[r].to_vec()))
                .collect(),
            None,
        ),
        Some((model, o)) => {
            let o = VadOptions {
                max_speech_duration_s: o
                    .max_speech_duration_s
                    .min(CHUNK_SAMPLES as f64 / SAMPLE_RATE as f64),
                ..o.clone()
            };
            let speech = get_speech_timestamps(&model.speech_probs(samples), samples.len(), &o);
            (
                collect_chunks(samples, &speech, CHUNK_SAMPLES),
                Some(SpeechMap::new(&speech)),
            )
        }
    }
}

/// Transcribes 16 kHz mono `signals` with the batched pipeline, up to
/// `batch_size` windows at once, across signals: one transcript each.
pub fn transcribe_batched(
    files: &WhisperFiles,
    backend: &mut dyn Backend,
    signals: &[&[f32]],
    opts: &Options,
    vad: Option<(&SileroVad, &VadOptions)>,
    batch_size: usize,
) -> Result<Vec<Transcript>> {
    assert!(batch_size > 0, "batch size 0");
    let mut batched = Batched::new(files, opts)?;
    let mut chunks = Vec::new();
    let mut transcripts = Vec::with_capacity(signals.len());
    let mut maps = Vec::with_capacity(signals.len());
    for (i, samples) in signals.iter().enumerate() {
        let (pieces, map) = chunks_of(samples, vad);
        let (language, probability) = match pieces.first() {
            Some((_, first)) => batched.language(backend, first)?,
            None => (None, None),
        };
        chunks.extend(pieces.into_iter().map(|(offset, samples)| Chunk {
            input: i,
            offset,
            samples,
            language,
        }));
        transcripts.push(Transcript {
            text: String::new(),
            language: batched.language_code(language),
            language_probability: probability,
            duration: samples.len() as f64 / SAMPLE_RATE as f64,
            segments: Vec::new(),
        });
        maps.push(map);
    }
    let mut last_speech = HashMap::new();
    for batch in chunks.chunks(batch_size) {
        let segments = batched.decode(backend, batch, &mut last_speech)?;
        for (chunk, segs) in batch.iter().zip(segments) {
            let t = &mut transcripts[chunk.input];
            for mut seg in segs {
                if let Some(map) = &maps[chunk.input] {
                    map.restore(&mut seg);
                }
                seg.id = t.segments.len();
                t.text.push_str(&seg.text);
                t.segments.push(seg);
            }
        }
    }
    Ok(transcripts)
}
