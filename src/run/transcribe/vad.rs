//! Voice activity detection before transcription, as faster-whisper's
//! `vad_filter`: Silero VAD scores every 512-sample window, its
//! `get_speech_timestamps` turns the scores into speech chunks (hysteresis
//! between two thresholds, a minimum silence before a chunk ends, a
//! minimum chunk length, padding on both sides), the chunks are joined and
//! transcribed as one signal, and every time is mapped back to the
//! original audio (`SpeechTimestampsMap`, `restore_speech_timestamps`).

use super::{transcribe, Backend, Options, Segment, Transcript};
use crate::error::{Error, Result};
use crate::models::silero_vad::{SileroVad, SAMPLE_RATE, WINDOW};
use crate::models::whisper::WhisperFiles;

/// faster-whisper's `VadOptions` (its defaults).
#[derive(Clone, Debug, serde::Serialize)]
pub struct VadOptions {
    /// A window whose probability reaches this is speech.
    pub threshold: f64,
    /// Speech ends below this (None: threshold - 0.15, at least 0.01).
    pub neg_threshold: Option<f64>,
    /// Chunks shorter than this are dropped.
    pub min_speech_duration_ms: u32,
    /// Chunks longer than this are split (at a silence of 98 ms or more when
    /// there is one).
    pub max_speech_duration_s: f64,
    /// A chunk ends after this much silence.
    pub min_silence_duration_ms: u32,
    /// Added on each side of a chunk.
    pub speech_pad_ms: u32,
}

impl Default for VadOptions {
    fn default() -> VadOptions {
        VadOptions {
            threshold: 0.5,
            neg_threshold: None,
            min_speech_duration_ms: 0,
            max_speech_duration_s: f64::INFINITY,
            min_silence_duration_ms: 2000,
            speech_pad_ms: 400,
        }
    }
}

impl VadOptions {
    pub fn check(&self) -> Result<()> {
        let ok = (0.0..=1.0).contains(&self.threshold)
            && self.neg_threshold.is_none_or(|t| (0.0..=1.0).contains(&t))
            && self.max_speech_duration_s > 0.0;
        if !ok {
            return Err(Error::invalid(
                "VAD thresholds must lie in 0..1 and the longest chunk must be positive",
            ));
        }
        Ok(())
    }
}

/// A chunk of speech, in samples of the 16 kHz audio.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Speech {
    pub start: usize,
    pub end: usize,
}

/// faster-whisper's `get_speech_timestamps`, from the window probabilities
/// `probs` of `audio_len` samples.
pub fn get_speech_timestamps(probs: &[f32], audio_len: usize, o: &VadOptions) -> Vec<Speech> {
    let sr = SAMPLE_RATE as f64;
    let ws = WINDOW as i64;
    let min_speech_samples = sr * o.min_speech_duration_ms as f64 / 1000.0;
    let speech_pad_samples = sr * o.speech_pad_ms as f64 / 1000.0;
    let max_speech_samples = sr * o.max_speech_duration_s - ws as f64 - 2.0 * speech_pad_samples;
    let min_silence_samples = sr * o.min_silence_duration_ms as f64 / 1000.0;
    let min_silence_samples_at_max_speech = sr * 98.0 / 1000.0;
    let audio_len = audio_len as i64;
    // numpy compares its f32 probabilities with the thresholds in f32.
    let threshold = o.threshold as f32;
    let neg_threshold = o.neg_threshold.unwrap_or((o.threshold - 0.15).max(0.01)) as f32;

    let mut triggered = false;
    let mut speeches: Vec<(i64, i64)> = Vec::new();
    let mut current: Option<i64> = None;
    let (mut temp_end, mut prev_end, mut next_start) = (0i64, 0i64, 0i64);
    for (i, &p) in probs.iter().enumerate() {
        let pos = ws * i as i64;
        if p >= threshold && temp_end != 0 {
            temp_end = 0;
            if next_start < prev_end {
                next_start = pos;
            }
        }
        if p >= threshold && !triggered {
            triggered = true;
            current = Some(pos);
            continue;
        }
        if let (true, Some(start)) = (triggered, current) {
            if (pos - start) as f64 > max_speech_samples {
                if prev_end != 0 {
                    speeches.push((start, prev_end));
                    current = None;
                    // Reached silence before and not speech since.
                    if next_start < prev_end {
                        triggered = false;
                    } else {
                        current = Some(next_start);
                    }
                    (prev_end, next_start, temp_end) = (0, 0, 0);
                } else {
                    speeches.push((start, pos));
                    current = None;
                    (prev_end, next_start, temp_end) = (0, 0, 0);
                    triggered = false;
                    continue;
                }
            }
        }
        if p < neg_threshold && triggered {
            if temp_end == 0 {
                temp_end = pos;
            }
            if (pos - temp_end) as f64 > min_silence_samples_at_max_speech {
                prev_end = temp_end;
            }
            if ((pos - temp_end) as f64) < min_silence_samples {
                continue;
            }
            if let Some(start) = current {
                if (temp_end - start) as f64 > min_speech_samples {
                    speeches.push((start, temp_end));
                }
            }
            current = None;
            (prev_end, next_start, temp_end) = (0, 0, 0);
            triggered = false;
        }
    }
    if let Some(start) = current {
        if (audio_len - start) as f64 > min_speech_samples {
            speeches.push((start, audio_len));
        }
    }

    let n = speeches.len();
    for i in 0..n {
        if i == 0 {
            speeches[0].0 = (speeches[0].0 as f64 - speech_pad_samples).max(0.0) as i64;
        }
        if i + 1 < n {
            let silence = speeches[i + 1].0 - speeches[i].1;
            if (silence as f64) < 2.0 * speech_pad_samples {
                speeches[i].1 += silence.div_euclid(2);
                speeches[i + 1].0 = (speeches[i + 1].0 - silence.div_euclid(2)).max(0);
            } else {
                speeches[i].1 =
                    (audio_len as f64).min(speeches[i].1 as f64 + speech_pad_samples) as i64;
                speeches[i + 1].0 = (speeches[i + 1].0 as f64 - speech_pad_samples).max(0.0) as i64;
            }
        } else {
            speeches[i].1 =
                (audio_len as f64).min(speeches[i].1 as f64 + speech_pad_samples) as i64;
        }
    }
    speeches
        .into_iter()
        .map(|(s, e)| Speech {
            start: s.clamp(0, audio_len) as usize,
            end: e.clamp(0, audio_len) as usize,
        })
        .collect()
}

/// faster-whisper's `SpeechTimestampsMap`: times in the joined speech back
/// to times in the original audio.
pub struct SpeechMap {
    chunk_end_sample: Vec<i64>,
    total_silence_before: Vec<f64>,
}

impl SpeechMap {
    pub fn new(chunks: &[Speech]) -> SpeechMap {
        let (mut previous_end, mut silent) = (0i64, 0i64);
        let mut chunk_end_sample = Vec::new();
        let mut total_silence_before = Vec::new();
        for c in chunks {
            silent += c.start as i64 - previous_end;
            previous_end = c.end as i64;
            chunk_end_sample.push(c.end as i64 - silent);
            total_silence_before.push(silent as f64 / SAMPLE_RATE as f64);
        }
        SpeechMap {
            chunk_end_sample,
            total_silence_before,
        }
    }

    pub fn chunk_index(&self, time: f64, is_end: bool) -> usize {
        let sample = (time * SAMPLE_RATE as f64) as i64;
        if is_end {
            if let Some(i) = self.chunk_end_sample.iter().position(|&e| e == sample) {
                return i;
            }
        }
        let after = self.chunk_end_sample.partition_point(|&e| e <= sample);
        after.min(self.chunk_end_sample.len().saturating_sub(1))
    }

    pub fn original_time(&self, time: f64, chunk: usize) -> f64 {
        let before = self.total_silence_before.get(chunk).copied().unwrap_or(0.0);
        super::words::round2(before + time)
    }

    /// faster-whisper's `restore_speech_timestamps` for one segment.
    pub fn restore(&self, seg: &mut Segment) {
        if self.chunk_end_sample.is_empty() {
            return;
        }
        match seg.words.as_mut().filter(|w| !w.is_empty()) {
            Some(words) => {
                for w in words.iter_mut() {
                    // Both ends of a word map through the same chunk.
                    let chunk = self.chunk_index((w.start + w.end) / 2.0, false);
                    w.start = self.original_time(w.start, chunk);
                    w.end = self.original_time(w.end, chunk);
                }
                seg.start = words[0].start;
                seg.end = words[words.len() - 1].end;
            }
            None => {
                seg.start = self.original_time(seg.start, self.chunk_index(seg.start, false));
                seg.end = self.original_time(seg.end, self.chunk_index(seg.end, true));
            }
        }
    }
}

/// What transcribing the speech of a recording gives.
pub struct SpeechTranscript {
    pub transcript: Transcript,
    pub speech: Vec<Speech>,
}

/// Transcribes only the speech of 16 kHz mono `samples`: faster-whisper's
/// `transcribe(..., vad_filter=True)`. Segment times are in the original
/// audio, also those `on_segment` sees.
pub fn transcribe_speech(
    files: &WhisperFiles,
    backend: &mut dyn Backend,
    vad: &SileroVad,
    samples: &[f32],
    opts: &Options,
    vad_opts: &VadOptions,
    on_segment: &mut dyn FnMut(&Segment, f64) -> Result<()>,
) -> Result<SpeechTranscript> {
    vad_opts.check()?;
    let probs = vad.speech_probs(samples);
    let speech = get_speech_timestamps(&probs, samples.len(), vad_opts);
    let joined: Vec<f32> = speech
        .iter()
        .flat_map(|s| samples[s.start..s.end].iter().copied())
        .collect();
    let map = SpeechMap::new(&speech);
    let mut transcript = if joined.is_empty() {
        Transcript {
            text: String::new(),
            language: opts.language.clone().unwrap_or_else(|| "en".into()),
            language_probability: None,
            duration: 0.0,
            segments: Vec::new(),
        }
    } else {
        let mut restored = |seg: &Segment, done: f64| {
            let mut seg = seg.clone();
            map.restore(&mut seg);
            let chunk = map.chunk_index(done, true);
            on_segment(&seg, map.original_time(done, chunk))
        };
        transcribe(files, backend, &joined, opts, &mut restored)?
    };
    for seg in &mut transcript.segments {
        map.restore(seg);
    }
    transcript.duration = samples.len() as f64 / SAMPLE_RATE as f64;
    Ok(SpeechTranscript { transcript, speech })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_are_padded_and_joined_across_short_silences() {
        // 0.5 s of speech, 0.3 s of silence, 1 s of speech, then silence.
        let mut probs = vec![0.0f32; 200];
        let w = |s: f64| (s * 16_000.0 / 512.0) as usize;
        probs[w(1.0)..w(1.5)].fill(0.9);
        probs[w(1.8)..w(2.8)].fill(0.9);
        let o = VadOptions {
            min_silence_duration_ms: 100,
            speech_pad_ms: 200,
            ..VadOptions::default()
        };
        let s = get_speech_timestamps(&probs, 200 * 512, &o);
        assert_eq!(s.len(), 2, "{s:?}");
        // The 0.3 s gap is under twice the padding: split in the middle.
        assert_eq!(s[0].end, s[1].start, "{s:?}");
        assert_eq!(s[0].start, w(1.0) * 512 - 3200);
        assert_eq!(s[1].end, w(2.8) * 512 + 3200);
    }

    #[test]
    fn times_map_back_past_the_removed_silence() {
        let map = SpeechMap::new(&[
            Speech {
                start: 16_000,
                end: 32_000,
            },
            Speech {
                start: 64_000,
                end: 80_000,
            },
        ]);
        // 0.5 s into the joined audio: chunk 0, after 1 s of silence.
        assert_eq!(map.original_time(0.5, map.chunk_index(0.5, false)), 1.5);
        // 1.5 s: chunk 1, after 3 s of silence in all.
        assert_eq!(map.original_time(1.5, map.chunk_index(1.5, false)), 4.5);
        // The end of chunk 0 stays in chunk 0 as an end.
        assert_eq!(map.original_time(1.0, map.chunk_index(1.0, true)), 2.0);
    }
}
