//! Long-form transcription as openai-whisper's `transcribe()`: the audio is
//! cut into 30 s windows; each is decoded (with temperature fallback when the
//! text is too repetitive or too unlikely), split into segments at its
//! timestamp tokens, and the next window starts at the last complete
//! timestamp. The text so far prompts the next window.

pub mod batch;
pub mod decode;
pub mod output;
pub mod profile;
pub mod stream;
pub mod vad;
pub mod words;

use crate::cpu::whisper::{
    self as select, Draw, Picked, RowRule, RuleState, SampleRules, Sampled, SelectRules,
    TimestampRules,
};
use crate::error::{Error, Result};
use crate::models::whisper::mel::{self, HOP, N_FRAMES, SAMPLE_RATE};
use crate::models::whisper::model::{CrossKv, KvCache, Whisper};
use crate::models::whisper::WhisperFiles;
use crate::util::par;
use crate::util::rng::Rng;
use decode::{Decoded, Rules, Strategy, WindowDecoder, TIME_PRECISION};
use words::{Aligner, WindowSegment, Word};

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Task {
    /// Speech to text in the language spoken.
    Transcribe,
    /// Speech to English text.
    Translate,
}

/// Decoding options; the defaults are openai-whisper's `transcribe()`
/// defaults, except `best_of` 5 as its command line uses.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Options {
    /// Language code (`en`, `fr`, ...); None detects it on multilingual models.
    pub language: Option<String>,
    pub task: Task,
    /// Tried in order until a window's result passes the thresholds.
    pub temperatures: Vec<f32>,
    pub best_of: usize,
    /// 1: greedy; more: beam search at temperature 0.
    pub beam_size: usize,
    pub patience: f32,
    pub length_penalty: Option<f32>,
    pub compression_ratio_threshold: Option<f32>,
    pub logprob_threshold: Option<f32>,
    pub no_speech_threshold: Option<f32>,
    pub condition_on_previous_text: bool,
    pub initial_prompt: Option<String>,
    pub without_timestamps: bool,
    pub max_initial_timestamp: Option<f32>,
    pub suppress_blank: bool,
    /// Seed of the sampler used by temperature fallback.
    pub seed: u64,
    /// Place each word in time (faster-whisper's `word_timestamps`).
    pub word_timestamps: bool,
    /// With word timestamps: marks that join the word after them...
    pub prepend_punctuations: String,
    /// ... and marks that join the word before them.
    pub append_punctuations: String,
}

impl Options {
    /// The most sequences one window decodes at once (beams, or samples
    /// on temperature fallback): what a backend must hold.
    pub fn max_sequences(&self) -> usize {
        let sampled = self.temperatures.iter().any(|&t| t > 0.0);
        self.beam_size.max(if sampled { self.best_of } else { 1 })
    }
}

impl Default for Options {
    fn default() -> Options {
        Options {
            language: None,
            task: Task::Transcribe,
            temperatures: vec![0.0, 0.2, 0.4, 0.6, 0.8, 1.0],
            best_of: 5,
            beam_size: 1,
            patience: 1.0,
            length_penalty: None,
            compression_ratio_threshold: Some(2.4),
            logprob_threshold: Some(-1.0),
            no_speech_threshold: Some(0.6),
            condition_on_previous_text: true,
            initial_prompt: None,
            without_timestamps: false,
            max_initial_timestamp: Some(1.0),
            suppress_blank: true,
            seed: 0,
            word_timestamps: false,
            prepend_punctuations: words::PREPEND_PUNCTUATIONS.into(),
            append_punctuations: words::APPEND_PUNCTUATIONS.into(),
        }
    }
}

/// The network transcription runs on, the CPU reference or a GPU: it
/// encodes 30 s windows, then runs the decoder over them for a set of
/// sequences (one a window, or the candidates of a beam search or of
/// sampling) that grow one token per step, and reads back what the search
/// asks for: each row's likeliest tokens under Whisper's rules
/// ([`select::whisper_select`], on the device for a GPU), tokens drawn at a
/// temperature ([`select::whisper_sample`], likewise), or its logits. The
/// search itself ([`decode`]) is the same for every backend.
pub trait Backend {
    /// Encodes windows of features ([n_mels, 3000] each) into slots
    /// `0..mels.len()`; a sequence attends to its window's slot until the
    /// next call.
    fn encode(&mut self, mels: &[&[f32]]) -> Result<()>;
    /// Window `w`'s cross-attention state on the host (word alignment reads it).
    fn cross_kv(&mut self, window: usize) -> Result<&CrossKv>;
    /// Runs `prompts[w]` (all of one length) as the only sequence of window
    /// `w`, dropping any others: sequence w of what follows. Returns, per
    /// window, the model's probability of `probe.1` after row `probe.0` of
    /// its prompt (no rules; 0 without a probe), and what `pick` asks for
    /// after its last row.
    fn prompt(
        &mut self,
        prompts: &[&[u32]],
        probe: Option<(usize, u32)>,
        pick: &Pick,
    ) -> Result<(Vec<f32>, Picks)>;
    /// Sequence i becomes a copy of sequence `sources[i]` (and attends to
    /// its window): forks the prompt into candidates, reorders beams, drops
    /// finished windows.
    fn select(&mut self, sources: &[usize]) -> Result<()>;
    /// Appends `tokens[i]` to sequence i; what `pick` asks for after them.
    fn step(&mut self, tokens: &[u32], pick: &Pick) -> Result<Picks>;
    /// Greedy decoding ahead, where the backend can: appends `tokens[i]`
    /// to sequence i and picks its likeliest token under `rows[i]`, then
    /// appends that pick and picks again, up to `n` passes in all, each
    /// later rule following from `states[i]` (the sequence's sampled
    /// tokens, `tokens[i]` included) and the picks ([`RuleState::push`]).
    /// Returns each pass's picks (k = 1), fewer than `n` where the backend
    /// takes fewer at once; None where it steps one token at a time.
    fn greedy_ahead(
        &mut self,
        _tokens: &[u32],
        _rules: &SelectRules,
        _rows: &[RowRule],
        _states: &[RuleState],
        _timestamps: &TimestampRules,
        _n: usize,
    ) -> Result<Option<Vec<Vec<Picked>>>> {
        Ok(None)
    }
    /// Device submissions and bytes read back so far (none on the CPU).
    fn traffic(&self) -> Traffic {
        Traffic::default()
    }
}

/// What a decoder pass reads back for each of its rows.
#[derive(Clone, Copy, Debug)]
pub enum Pick<'a> {
    /// The `k` likeliest tokens under the row's rule and the run's rules,
    /// with their log probabilities ([`select::whisper_select`]).
    Top {
        k: usize,
        rules: &'a SelectRules,
        rows: &'a [RowRule],
    },
    /// For each draw, a token drawn at a temperature from its row under
    /// the row's rule ([`select::whisper_sample`]).
    Sample {
        rules: SampleRules<'a>,
        draws: &'a [Draw],
    },
    /// The logits [rows, n_vocab] (language detection).
    Logits,
}

/// The answer to a [`Pick`].
#[derive(Clone, Debug)]
pub enum Picks {
    Top(Vec<Picked>),
    Sampled(Vec<Sampled>),
    Logits(Vec<f32>),
}

impl Picks {
    /// The picks of a [`Pick::Top`].
    pub fn top(self) -> Vec<Picked> {
        match self {
            Picks::Top(p) => p,
            _ => panic!("decoder: no picks where picks were asked for"),
        }
    }

    /// The draws of a [`Pick::Sample`].
    pub fn sampled(self) -> Vec<Sampled> {
        match self {
            Picks::Sampled(s) => s,
            _ => panic!("decoder: no draws where draws were asked for"),
        }
    }

    /// The logits of a [`Pick::Logits`].
    pub fn logits(self) -> Vec<f32> {
        match self {
            Picks::Logits(l) => l,
            _ => panic!("decoder: no logits where logits were asked for"),
        }
    }
}

/// What a backend has sent to and read from its device, and how its
/// decoder passes' time splits between recording them on the host and
/// waiting for the device and the readback.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Traffic {
    pub submissions: u64,
    pub bytes_read: u64,
    pub record: std::time::Duration,
    pub wait: std::time::Duration,
}

impl std::ops::Add for Traffic {
    type Output = Traffic;
    fn add(self, o: Traffic) -> Traffic {
        Traffic {
            submissions: self.submissions + o.submissions,
            bytes_read: self.bytes_read + o.bytes_read,
            record: self.record + o.record,
            wait: self.wait + o.wait,
        }
    }
}

impl std::ops::Sub for Traffic {
    type Output = Traffic;
    fn sub(self, o: Traffic) -> Traffic {
        Traffic {
            submissions: self.submissions - o.submissions,
            bytes_read: self.bytes_read - o.bytes_read,
            record: self.record - o.record,
            wait: self.wait - o.wait,
        }
    }
}

/// The log-mel features transcription reads: a signal in memory
/// ([`mel::LogMel`]) or a stream ([`stream::StreamedMel`]).
pub trait Features {
    /// Samples of the signal (16 kHz).
    fn signal_len(&self) -> usize;
    /// Normalised frames `start..start + count` ([n_mels, count]). A
    /// stream reads forward only: asking for frames before those asked
    /// last is an error.
    fn frames(&mut self, start: usize, count: usize) -> Result<Vec<f32>>;
}

/// The CPU reference.
pub struct CpuBackend<'a> {
    model: &'a Whisper,
    windows: Vec<CrossKv>,
    caches: Vec<KvCache>,
    /// The window each sequence attends to.
    seq_windows: Vec<usize>,
}

impl<'a> CpuBackend<'a> {
    pub fn new(model: &'a Whisper) -> CpuBackend<'a> {
        CpuBackend {
            model,
            windows: Vec::new(),
            caches: Vec::new(),
            seq_windows: Vec::new(),
        }
    }

    /// The reference over windows whose cross-attention states are known
    /// already (`Decoder::cross_kv` of encoder outputs), as if encoded.
    pub fn with_windows(model: &'a Whisper, windows: Vec<CrossKv>) -> CpuBackend<'a> {
        CpuBackend {
            model,
            windows,
            caches: Vec::new(),
            seq_windows: Vec::new(),
        }
    }

    /// The decoder over the sequences' new `tokens` (`n_new` each), window
    /// by window; the hidden states [tokens.len(), d].
    fn forward(&mut self, tokens: &[u32]) -> Vec<f32> {
        let m = self.model;
        let n_new = tokens.len() / self.caches.len();
        let mut hidden = Vec::with_capacity(tokens.len() * m.config.d_model);
        let mut s = 0;
        while s < self.caches.len() {
            let w = self.seq_windows[s];
            let end = s + self.seq_windows[s..]
                .iter()
                .take_while(|&&x| x == w)
                .count();
            let cross = self
                .windows
                .get(w)
                .expect("decoder: no window encoded in that slot");
            hidden.extend(m.decoder.forward(
                &m.config,
                &tokens[s * n_new..end * n_new],
                &mut self.caches[s..end],
                cross,
            ));
            s = end;
        }
        hidden
    }

    /// The logits of `hidden`'s rows, or the picks `pick` asks for.
    fn pick(&self, hidden: &[f32], pick: &Pick) -> Picks {
        let m = self.model;
        let logits = m.decoder.logits(&m.config, hidden);
        match pick {
            Pick::Logits => Picks::Logits(logits),
            Pick::Top { k, rules, rows } => Picks::Top(select::read_picks(
                &select::whisper_select(&logits, rules, rows, *k),
                *k,
            )),
            Pick::Sample { rules, draws } => {
                Picks::Sampled(select::whisper_sample(&logits, rules, draws))
            }
        }
    }
}

impl Backend for CpuBackend<'_> {
    fn encode(&mut self, mels: &[&[f32]]) -> Result<()> {
        let m = self.model;
        // Each pass on a worker of the pool: its many short parallel loops
        // then start without waking the caller (`par::in_pool`).
        self.windows = par::in_pool(|| {
            mels.iter()
                .map(|mel| m.decoder.cross_kv(&m.encoder.forward(&m.config, mel)))
                .collect()
        });
        self.caches.clear();
        self.seq_windows.clear();
        Ok(())
    }

    fn cross_kv(&mut self, window: usize) -> Result<&CrossKv> {
        Ok(self
            .windows
            .get(window)
            .expect("decoder: no window encoded in that slot"))
    }

    fn prompt(
        &mut self,
        prompts: &[&[u32]],
        probe: Option<(usize, u32)>,
        pick: &Pick,
    ) -> Result<(Vec<f32>, Picks)> {
        let m = self.model;
        let d = m.config.d_model;
        let n = prompts[0].len();
        assert!(
            n > 0 && prompts.iter().all(|p| p.len() == n),
            "decoder: prompts of one length"
        );
        self.caches = prompts.iter().map(|_| m.decoder.new_cache()).collect();
        self.seq_windows = (0..prompts.len()).collect();
        let tokens: Vec<u32> = prompts.concat();
        let hidden = par::in_pool(|| self.forward(&tokens));
        let row = |w: usize, r: usize| &hidden[(w * n + r) * d..(w * n + r + 1) * d];
        let probs = match probe {
            Some((r, token)) => (0..prompts.len())
                .map(|w| {
                    let logits = m.decoder.logits(&m.config, row(w, r));
                    select::raw_logprob(&logits, token).exp()
                })
                .collect(),
            None => vec![0.0; prompts.len()],
        };
        let last: Vec<f32> = (0..prompts.len())
            .flat_map(|w| row(w, n - 1).iter().copied())
            .collect();
        Ok((probs, self.pick(&last, pick)))
    }

    fn select(&mut self, sources: &[usize]) -> Result<()> {
        self.caches = sources.iter().map(|&s| self.caches[s].clone()).collect();
        self.seq_windows = sources.iter().map(|&s| self.seq_windows[s]).collect();
        Ok(())
    }

    fn step(&mut self, tokens: &[u32], pick: &Pick) -> Result<Picks> {
        assert_eq!(
            tokens.len(),
            self.caches.len(),
            "decoder: one token a sequence"
        );
        Ok(par::in_pool(|| {
            let hidden = self.forward(tokens);
            self.pick(&hidden, pick)
        }))
    }
}

/// One token of a segment, for machine-readable output.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Token {
    pub id: u32,
    pub text: String,
    pub logprob: f32,
}

#[derive(Clone, Debug, serde::Serialize)]
pub struct Segment {
    pub id: usize,
    /// Frame (10 ms) at which the window that produced it started.
    pub seek: usize,
    pub start: f64,
    pub end: f64,
    pub text: String,
    pub tokens: Vec<Token>,
    pub temperature: f32,
    pub avg_logprob: f32,
    pub compression_ratio: f32,
    pub no_speech_prob: f32,
    /// With word timestamps: the words, with their times and probabilities.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub words: Option<Vec<Word>>,
}

#[derive(Clone, Debug, serde::Serialize)]
pub struct Transcript {
    pub text: String,
    pub language: String,
    /// Set when the language was detected.
    pub language_probability: Option<f32>,
    pub duration: f64,
    pub segments: Vec<Segment>,
}

/// The language and task tokens for `opts`, checked against the model.
fn resolve_language(files: &WhisperFiles, opts: &Options) -> Result<Option<u32>> {
    let tok = &files.tokenizer;
    let multilingual = files.model.config.is_multilingual();
    match &opts.language {
        Some(code) => {
            let code = code.to_lowercase();
            let Some(t) = tok.language_token(&code) else {
                let known: Vec<&str> = tok
                    .specials
                    .languages
                    .iter()
                    .map(|(c, _)| c.as_str())
                    .collect();
                return Err(Error::invalid(format!(
                    "unknown language code {code:?}; known: {}",
                    known.join(" ")
                )));
            };
            if !multilingual && code != "en" {
                return Err(Error::invalid(format!(
                    "language {code:?}: this model is English-only (use a multilingual model)"
                )));
            }
            Ok(multilingual.then_some(t))
        }
        None => Ok(None),
    }
}

/// Detects the spoken language from the first 30 s, as openai-whisper does:
/// one decoder step after `<|startoftranscript|>`, restricted to the
/// language tokens. Returns the token and its probability.
pub fn detect_language(
    files: &WhisperFiles,
    backend: &mut dyn Backend,
    mel: &mut dyn Features,
) -> Result<(u32, f32)> {
    // The first 3000 frames of the padded signal (not zero-filled).
    detect_language_window(files, backend, &mel.frames(0, N_FRAMES)?)
}

/// The language of one window of features [n_mels, 3000], and its
/// probability (see [`detect_language`]).
pub fn detect_language_window(
    files: &WhisperFiles,
    backend: &mut dyn Backend,
    window: &[f32],
) -> Result<(u32, f32)> {
    let s = &files.tokenizer.specials;
    backend.encode(&[window])?;
    let (_, picks) = backend.prompt(&[&[s.sot]], None, &Pick::Logits)?;
    let logits = picks.logits();
    let langs: Vec<u32> = s.languages.iter().map(|&(_, t)| t).collect();
    let max = langs
        .iter()
        .map(|&t| logits[t as usize])
        .fold(f32::NEG_INFINITY, f32::max);
    let z: f32 = langs
        .iter()
        .map(|&t| (logits[t as usize] - max).exp())
        .sum();
    let best = langs
        .iter()
        .copied()
        .max_by(|&a, &b| logits[a as usize].total_cmp(&logits[b as usize]))
        .ok_or_else(|| Error::invalid("the tokenizer has no language tokens"))?;
    Ok((best, (logits[best as usize] - max).exp() / z))
}

/// Transcribes 16 kHz mono `samples`. `on_segment` sees each segment as soon
/// as its window is done (for streaming output and progress).
pub fn transcribe(
    files: &WhisperFiles,
    backend: &mut dyn Backend,
    samples: &[f32],
    opts: &Options,
    on_segment: &mut dyn FnMut(&Segment, f64) -> Result<()>,
) -> Result<Transcript> {
    transcribe_features(
        files,
        backend,
        &mut files.mel.log_mel(samples),
        opts,
        on_segment,
    )
}

/// Transcribes the signal `mel` computes features of (a stream for a long
/// file): as [`transcribe`].
pub fn transcribe_features(
    files: &WhisperFiles,
    backend: &mut dyn Backend,
    mel: &mut dyn Features,
    opts: &Options,
    on_segment: &mut dyn FnMut(&Segment, f64) -> Result<()>,
) -> Result<Transcript> {
    let m = &files.model;
    let c = &m.config;
    let tok = &files.tokenizer;
    let s = &tok.specials;
    let multilingual = c.is_multilingual();
    check_options(files, opts)?;
    let content_frames = mel::content_frames(mel.signal_len());
    let duration = mel.signal_len() as f64 / SAMPLE_RATE as f64;
    let n_mels = files.mel.n_mels;

    let mut language_probability = None;
    let language_token = match resolve_language(files, opts)? {
        Some(t) => Some(t),
        None if multilingual => {
            let (t, p) = detect_language(files, backend, mel)?;
            language_probability = Some(p);
            Some(t)
        }
        None => None,
    };
    let language = language_token
        .and_then(|t| tok.language_code(t))
        .unwrap_or("en")
        .to_string();

    let sot_sequence = sot_sequence(files, opts, language_token);
    let rules = rules(files, opts)?;
    let decoder = WindowDecoder::new(m, tok, &rules);
    let aligner = aligner(files, opts, &sot_sequence, &language)?;
    let mut last_speech = 0.0;
    let sample_len = c.n_text_ctx / 2;
    let input_stride = N_FRAMES / c.n_audio_ctx;
    let mut rng = Rng::new(opts.seed);

    let mut all_tokens: Vec<u32> = Vec::new();
    if let Some(p) = &opts.initial_prompt {
        all_tokens.extend(tok.encode(&format!(" {}", p.trim()))?);
    }
    let mut prompt_reset_since = 0;
    let mut segments: Vec<Segment> = Vec::new();
    let mut seek = 0;
    while seek < content_frames {
        let time_offset = (seek * HOP) as f64 / SAMPLE_RATE as f64;
        let segment_size = N_FRAMES.min(content_frames - seek);
        let segment_duration = (segment_size * HOP) as f64 / SAMPLE_RATE as f64;
        let frames = mel.frames(seek, segment_size)?;
        backend.encode(&[&mel::pad_window(n_mels, &frames, segment_size)])?;

        let previous = &all_tokens[prompt_reset_since..];
        let mut prompt = Vec::new();
        if !previous.is_empty() {
            prompt.push(s.sot_prev);
            prompt.extend_from_slice(
                &previous[previous.len().saturating_sub(c.n_text_ctx / 2 - 1)..],
            );
        }
        let sot_index = prompt.len();
        prompt.extend_from_slice(&sot_sequence);

        let result = decode_with_fallback(
            &decoder, backend, &prompt, sot_index, opts, sample_len, &mut rng,
        )?;
        if let Some(threshold) = opts.no_speech_threshold {
            let confident = opts
                .logprob_threshold
                .is_some_and(|lt| result.avg_logprob > lt);
            if result.no_speech_prob > threshold && !confident {
                seek += segment_size;
                continue;
            }
        }

        let previous_seek = seek;
        let tokens = &result.tokens;
        let split = split_segments(tokens, s.timestamp_begin, time_offset, segment_duration);
        let (pieces, mut spans, single_timestamp_ending) =
            (split.pieces, split.spans, split.single_timestamp_ending);
        seek += match split.last_timestamp {
            Some(ts) if !single_timestamp_ending => ts as usize * input_stride,
            _ => segment_size,
        };
        if opts.word_timestamps {
            let cross = backend.cross_kv(0)?;
            aligner.add_word_timestamps(cross, &mut spans, time_offset, segment_size, last_speech);
            if !single_timestamp_ending {
                if let Some(end) = words::get_end(&spans).filter(|&e| e > time_offset) {
                    seek = (end * 100.0).round_ties_even() as usize;
                }
            }
            if let Some(end) = words::get_end(&spans) {
                last_speech = end;
            }
        }

        for (range, span) in pieces.into_iter().zip(spans) {
            let (start, end) = (span.start, span.end);
            let ids = &tokens[range.clone()];
            let text = tok.decode(ids);
            // An instantaneous or empty segment is dropped with its tokens.
            if start == end || text.trim().is_empty() {
                continue;
            }
            all_tokens.extend_from_slice(ids);
            let seg = Segment {
                id: segments.len(),
                seek: previous_seek,
                start,
                end,
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
                compression_ratio: result.compression_ratio,
                no_speech_prob: result.no_speech_prob,
                words: opts.word_timestamps.then_some(span.words),
            };
            on_segment(
                &seg,
                (seek.min(content_frames) * HOP) as f64 / SAMPLE_RATE as f64,
            )?;
            segments.push(seg);
        }
        if !opts.condition_on_previous_text || result.temperature > 0.5 {
            prompt_reset_since = all_tokens.len();
        }
    }
    Ok(Transcript {
        text: segments.iter().map(|s| s.text.as_str()).collect(),
        language,
        language_probability,
        duration,
        segments,
    })
}

/// The options checked against the model, before any work.
fn check_options(files: &WhisperFiles, opts: &Options) -> Result<()> {
    if opts.task == Task::Translate && !files.model.config.is_multilingual() {
        return Err(Error::invalid(
            "--task translate needs a multilingual model; this one is English-only",
        ));
    }
    if opts.temperatures.is_empty() || opts.temperatures.iter().any(|t| !(0.0..=10.0).contains(t)) {
        return Err(Error::invalid("temperatures must be between 0 and 10"));
    }
    if opts.beam_size == 0 || opts.best_of == 0 {
        return Err(Error::invalid(
            "--beam-size and --best-of must be at least 1",
        ));
    }
    Ok(())
}

/// `<|startoftranscript|>`, the language and task of a multilingual model,
/// and `<|notimestamps|>` when asked for.
fn sot_sequence(files: &WhisperFiles, opts: &Options, language_token: Option<u32>) -> Vec<u32> {
    let s = &files.tokenizer.specials;
    let mut sot_sequence = vec![s.sot];
    if files.model.config.is_multilingual() {
        sot_sequence.push(language_token.expect("multilingual models always have a language"));
        sot_sequence.push(match opts.task {
            Task::Transcribe => s.transcribe,
            Task::Translate => s.translate,
        });
    }
    if opts.without_timestamps {
        sot_sequence.push(s.no_timestamps);
    }
    sot_sequence
}

/// The logit rules of `opts` for this model.
fn rules(files: &WhisperFiles, opts: &Options) -> Result<Rules> {
    let tok = &files.tokenizer;
    let s = &tok.specials;
    let suppress_begin = if files.generation.suppress_ids_begin.is_empty() {
        let mut v = tok.encode(" ")?;
        v.push(s.eot);
        v
    } else {
        files.generation.suppress_ids_begin.clone()
    };
    let mut suppress = files.generation.suppress_ids.clone();
    // Whatever the config says, the task and start tokens are never sampled.
    suppress.extend([s.transcribe, s.translate, s.sot, s.sot_prev, s.sot_lm]);
    suppress.extend(s.no_speech);
    suppress.sort_unstable();
    suppress.dedup();
    Ok(Rules {
        suppress,
        suppress_begin: if opts.suppress_blank {
            suppress_begin
        } else {
            Vec::new()
        },
        timestamps: !opts.without_timestamps,
        max_initial_timestamp: opts
            .max_initial_timestamp
            .map(|t| (t as f64 / TIME_PRECISION).round() as u32),
    })
}

/// The word aligner for a transcript in `language`, its heads checked
/// against the model.
fn aligner<'a>(
    files: &'a WhisperFiles,
    opts: &Options,
    sot_sequence: &[u32],
    language: &str,
) -> Result<Aligner<'a>> {
    let c = &files.model.config;
    let s = &files.tokenizer.specials;
    let aligner = Aligner {
        model: &files.model,
        tokenizer: &files.tokenizer,
        sot_sequence: sot_sequence
            .iter()
            .copied()
            .filter(|&t| t != s.no_timestamps)
            .collect(),
        heads: if files.generation.alignment_heads.is_empty() {
            (c.n_text_layers / 2..c.n_text_layers)
                .flat_map(|l| (0..c.n_text_heads).map(move |h| (l, h)))
                .collect()
        } else {
            files.generation.alignment_heads.clone()
        },
        split_on_unicode: ["zh", "ja", "th", "lo", "my", "yue"].contains(&language),
        prepend_punctuations: opts.prepend_punctuations.clone(),
        append_punctuations: opts.append_punctuations.clone(),
    };
    if let Some(&(l, h)) = aligner
        .heads
        .iter()
        .find(|&&(l, h)| l >= c.n_text_layers || h >= c.n_text_heads)
    {
        return Err(Error::format(
            files.dir.join("config.json"),
            format!(
                "alignment head ({l}, {h}) outside the decoder's {} layers of {} heads",
                c.n_text_layers, c.n_text_heads
            ),
        ));
    }
    Ok(aligner)
}

/// A window's tokens cut into segments at its timestamps, as
/// openai-whisper's and faster-whisper's `_split_segments_by_timestamps`.
struct Split {
    /// Each segment's tokens, as a range of the window's.
    pieces: Vec<std::ops::Range<usize>>,
    /// The segments with their times.
    spans: Vec<WindowSegment>,
    /// The window ends in a single timestamp: no speech after it.
    single_timestamp_ending: bool,
    /// With segments closed by pairs of timestamps: the last complete
    /// timestamp's position (20 ms steps), where the next window starts.
    last_timestamp: Option<u32>,
}

fn split_segments(tokens: &[u32], timestamp_begin: u32, time_offset: f64, duration: f64) -> Split {
    let is_ts: Vec<bool> = tokens.iter().map(|&t| t >= timestamp_begin).collect();
    let ts_pos = |t: u32| (t - timestamp_begin) as f64;
    let single_timestamp_ending =
        is_ts.len() >= 2 && !is_ts[is_ts.len() - 2] && is_ts[is_ts.len() - 1];
    // Slices end after each pair of consecutive timestamps.
    let mut slices: Vec<usize> = (1..tokens.len())
        .filter(|&i| is_ts[i - 1] && is_ts[i])
        .collect();
    let mut split = Split {
        pieces: Vec::new(),
        spans: Vec::new(),
        single_timestamp_ending,
        last_timestamp: None,
    };
    let mut piece = |start: f64, end: f64, range: std::ops::Range<usize>| {
        split.spans.push(WindowSegment {
            start,
            end,
            tokens: tokens[range.clone()].to_vec(),
            words: Vec::new(),
        });
        split.pieces.push(range);
    };
    if !slices.is_empty() {
        if single_timestamp_ending {
            slices.push(tokens.len());
        }
        let mut last = 0;
        for &cur in &slices {
            let start = time_offset + ts_pos(tokens[last]) * TIME_PRECISION;
            let end = time_offset + ts_pos(tokens[cur - 1]) * TIME_PRECISION;
            piece(start, end, last..cur);
            last = cur;
        }
        split.last_timestamp = Some(tokens[last - 1] - timestamp_begin);
    } else {
        let mut end = duration;
        if let Some(&last_ts) = tokens.iter().rev().find(|&&t| t >= timestamp_begin) {
            if last_ts != timestamp_begin {
                end = ts_pos(last_ts) * TIME_PRECISION;
            }
        }
        piece(time_offset, time_offset + end, 0..tokens.len());
    }
    split
}

/// Decodes a window at each temperature in turn until the result is neither
/// too repetitive nor too unlikely (or is judged silence).
fn decode_with_fallback(
    decoder: &WindowDecoder,
    backend: &mut dyn Backend,
    prompt: &[u32],
    sot_index: usize,
    opts: &Options,
    sample_len: usize,
    rng: &mut Rng,
) -> Result<Decoded> {
    let mut result = Decoded::default();
    for &temperature in &opts.temperatures {
        let strategy = Strategy {
            temperature,
            beam_size: opts.beam_size,
            best_of: opts.best_of,
            patience: opts.patience,
            length_penalty: opts.length_penalty,
            sample_len,
        };
        result = decoder
            .decode(backend, &[prompt], sot_index, &strategy, rng)?
            .remove(0);
        let too_repetitive = opts
            .compression_ratio_threshold
            .is_some_and(|t| result.compression_ratio > t);
        let too_unlikely = opts
            .logprob_threshold
            .is_some_and(|t| result.avg_logprob < t);
        // Likely silence: no fallback (the window will be skipped).
        let silence = opts
            .no_speech_threshold
            .is_some_and(|t| result.no_speech_prob > t)
            && opts
                .logprob_threshold
                .is_some_and(|t| result.avg_logprob < t);
        if silence || !(too_repetitive || too_unlikely) {
            break;
        }
    }
    Ok(result)
}
