//! Word timestamps, as faster-whisper computes them (its
//! `add_word_timestamps` over CTranslate2's `align`, itself openai-whisper's
//! `find_alignment`): the window's text is run once more through the decoder
//! after `<|notimestamps|>`; the cross-attention of the model's alignment
//! heads, softmaxed over the frames that hold audio, normalised along the
//! tokens and median-filtered along time, averaged over the heads, is
//! aligned to the tokens by dynamic time warping; tokens are grouped into
//! words (at spaces, or at characters for languages written without them),
//! punctuation joins its neighbour, and over-long words at pauses and
//! sentence ends are clipped to twice the median word length.

use crate::models::whisper::model::{CrossKv, CrossScores, Whisper};
use crate::models::whisper::tokens::Tokenizer;

/// Python's `string.punctuation`.
const PUNCTUATION: &str = "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~";
const SENTENCE_END: &str = ".。!！?？";
/// faster-whisper's defaults.
pub const PREPEND_PUNCTUATIONS: &str = "\"'“¿([{-";
pub const APPEND_PUNCTUATIONS: &str = "\"'.。,，!！?？:：”)]}、";
/// Encoder positions (20 ms each) per second.
const TOKENS_PER_SECOND: f64 = 50.0;
const MEDIAN_FILTER_WIDTH: usize = 7;

/// One word of a segment, with its time in the audio and the mean
/// probability of its tokens.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Word {
    pub word: String,
    pub start: f64,
    pub end: f64,
    pub probability: f64,
}

/// One segment of a window while its words are placed: its times (which
/// the words may move) and its tokens (timestamps included).
#[derive(Clone, Debug)]
pub struct WindowSegment {
    pub start: f64,
    pub end: f64,
    pub tokens: Vec<u32>,
    pub words: Vec<Word>,
}

/// A word as aligned, relative to the window.
#[derive(Clone, Debug, Default)]
struct Timing {
    word: String,
    tokens: Vec<u32>,
    start: f64,
    end: f64,
    probability: f64,
}

pub struct Aligner<'a> {
    pub model: &'a Whisper,
    pub tokenizer: &'a Tokenizer,
    /// `<|startoftranscript|>`, and the language and task tokens of
    /// multilingual models (not the previous text).
    pub sot_sequence: Vec<u32>,
    /// (decoder layer, head).
    pub heads: Vec<(usize, usize)>,
    /// Words are runs of characters, not of letters between spaces (zh, ja, th, ...).
    pub split_on_unicode: bool,
    pub prepend_punctuations: String,
    pub append_punctuations: String,
}

/// x rounded to 2 decimals as Python's `round(x, 2)` (the nearest of the
/// decimal values, from the exact binary value).
pub(crate) fn round2(x: f64) -> f64 {
    format!("{x:.2}").parse().unwrap_or(x)
}

/// numpy's median (the mean of the middle two of an even count).
fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// openai-whisper's `dtw` of a cost matrix x [n, m]: the monotone path from
/// (0, 0) to (n-1, m-1) of least total cost, as (row, column) pairs in order.
/// Ties prefer a step along the columns, as the reference's comparisons do.
pub fn dtw(x: &[f32], n: usize, m: usize) -> Vec<(usize, usize)> {
    assert_eq!(x.len(), n * m, "dtw: cost matrix shape");
    let w = m + 1;
    let mut cost = vec![f32::INFINITY; (n + 1) * w];
    let mut trace = vec![2u8; (n + 1) * w];
    cost[0] = 0.0;
    for j in 1..=m {
        for i in 1..=n {
            let c0 = cost[(i - 1) * w + j - 1];
            let c1 = cost[(i - 1) * w + j];
            let c2 = cost[i * w + j - 1];
            let (c, t) = if c0 < c1 && c0 < c2 {
                (c0, 0)
            } else if c1 < c0 && c1 < c2 {
                (c1, 1)
            } else {
                (c2, 2)
            };
            cost[i * w + j] = x[(i - 1) * m + j - 1] + c;
            trace[i * w + j] = t;
        }
    }
    // The path reaches row 0 or column 0 only at (0, 0).
    let (mut i, mut j) = (n, m);
    let mut path = Vec::with_capacity(n + m);
    while i > 0 && j > 0 {
        path.push((i - 1, j - 1));
        match trace[i * w + j] {
            0 => {
                i -= 1;
                j -= 1;
            }
            1 => i -= 1,
            _ => j -= 1,
        }
    }
    path.reverse();
    path
}

/// The median of each run of `width` values along rows of `x` [rows, n],
/// mirrored at the ends (`reflect`, as openai-whisper and CTranslate2 pad);
/// rows no longer than width / 2 are left as they are.
pub fn median_filter(x: &mut [f32], n: usize, width: usize) {
    let rank = width / 2;
    if n <= rank {
        return;
    }
    let mut window = vec![0.0f32; width];
    let mut out = vec![0.0f32; n];
    for row in x.chunks_exact_mut(n) {
        for (j, o) in out.iter_mut().enumerate() {
            for (slot, k) in window.iter_mut().zip(-(rank as isize)..=rank as isize) {
                let mut read = (j as isize + k).unsigned_abs();
                if read >= n {
                    read = 2 * n - read - 2;
                }
                *slot = row[read];
            }
            window.select_nth_unstable_by(rank, f32::total_cmp);
            *o = window[rank];
        }
        row.copy_from_slice(&out);
    }
}

/// faster-whisper's `merge_punctuations`: an opening mark joins the word
/// after it, a closing mark the word before it (Python's `in` on strings:
/// substrings count).
fn merge_punctuations(a: &mut [Timing], prepended: &str, appended: &str) {
    if a.len() >= 2 {
        let mut j = a.len() - 1;
        for i in (0..a.len() - 1).rev() {
            if a[i].word.starts_with(' ') && prepended.contains(a[i].word.trim()) {
                let previous = std::mem::take(&mut a[i]);
                let following = &mut a[j];
                following.word = previous.word + &following.word;
                let mut tokens = previous.tokens;
                tokens.append(&mut following.tokens);
                following.tokens = tokens;
                a[i].start = previous.start;
                a[i].end = previous.end;
                a[i].probability = previous.probability;
            } else {
                j = i;
            }
        }
    }
    let mut i = 0;
    for j in 1..a.len() {
        if !a[i].word.ends_with(' ') && appended.contains(a[j].word.as_str()) {
            let word = std::mem::take(&mut a[j].word);
            let mut tokens = std::mem::take(&mut a[j].tokens);
            a[i].word.push_str(&word);
            a[i].tokens.append(&mut tokens);
        } else {
            i = j;
        }
    }
}

impl Aligner<'_> {
    /// faster-whisper's `split_tokens_on_unicode`: a piece ends wherever the
    /// tokens so far decode to whole characters.
    fn split_tokens_on_unicode(&self, tokens: &[u32]) -> (Vec<String>, Vec<Vec<u32>>) {
        const REPLACEMENT: char = '\u{fffd}';
        let full: Vec<char> = self.tokenizer.decode(tokens).chars().collect();
        let (mut words, mut word_tokens) = (Vec::new(), Vec::new());
        let mut current = Vec::new();
        let mut offset = 0;
        for &t in tokens {
            current.push(t);
            let decoded = self.tokenizer.decode(&current);
            let replacement = decoded
                .chars()
                .position(|c| c == REPLACEMENT)
                .map(|i| i + offset);
            let whole = match replacement {
                None => true,
                Some(i) => full.get(i) == Some(&REPLACEMENT),
            };
            if whole {
                offset += decoded.chars().count();
                words.push(decoded);
                word_tokens.push(std::mem::take(&mut current));
            }
        }
        (words, word_tokens)
    }

    /// faster-whisper's `split_to_word_tokens`.
    fn split_to_word_tokens(&self, tokens: &[u32]) -> (Vec<String>, Vec<Vec<u32>>) {
        let (subwords, subword_tokens) = self.split_tokens_on_unicode(tokens);
        if self.split_on_unicode {
            return (subwords, subword_tokens);
        }
        let eot = self.tokenizer.specials.eot;
        let mut words: Vec<String> = Vec::new();
        let mut word_tokens: Vec<Vec<u32>> = Vec::new();
        for (subword, toks) in subwords.into_iter().zip(subword_tokens) {
            let special = toks[0] >= eot;
            let with_space = subword.starts_with(' ');
            let punctuation = PUNCTUATION.contains(subword.trim());
            match (words.last_mut(), word_tokens.last_mut()) {
                (Some(w), Some(t)) if !(special || with_space || punctuation) => {
                    w.push_str(&subword);
                    t.extend(toks);
                }
                _ => {
                    words.push(subword);
                    word_tokens.push(toks);
                }
            }
        }
        (words, word_tokens)
    }

    /// CTranslate2's `align` and faster-whisper's `find_alignment` for the
    /// text tokens of one window whose audio fills `num_frames` mel frames.
    fn find_alignment(&self, cross: &CrossKv, text: &[u32], num_frames: usize) -> Vec<Timing> {
        let m = self.model;
        let c = &m.config;
        let dec = &m.decoder;
        let s = &self.tokenizer.specials;
        let frames = (num_frames / 2).min(c.n_audio_ctx);
        if text.is_empty() || frames == 0 || self.heads.is_empty() {
            return Vec::new();
        }
        let mut tokens = self.sot_sequence.clone();
        tokens.push(s.no_timestamps);
        tokens.extend_from_slice(text);
        tokens.push(s.eot);
        if tokens.len() > c.n_text_ctx {
            return Vec::new();
        }
        let mut heads: Vec<CrossScores> = self
            .heads
            .iter()
            .map(|&(layer, head)| CrossScores {
                layer,
                head,
                scores: Vec::new(),
            })
            .collect();
        let mut cache = dec.new_cache();
        let hidden = dec.forward_capturing(
            c,
            &tokens,
            std::slice::from_mut(&mut cache),
            cross,
            &mut heads,
        );
        let d = c.d_model;
        let offset = self.sot_sequence.len();
        let n = text.len();

        // The probability of each text token among the text tokens, from
        // the position before it.
        let logits = dec.logits(c, &hidden[offset * d..(offset + n) * d]);
        let eot = s.eot as usize;
        let probs: Vec<f32> = text
            .iter()
            .enumerate()
            .map(|(t, &tok)| {
                let row = &logits[t * c.n_vocab..t * c.n_vocab + eot];
                let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let sum: f32 = row.iter().map(|v| (v - max).exp()).sum();
                (row[tok as usize] - max).exp() / sum
            })
            .collect();

        // Attention of the alignment heads over the frames that hold audio.
        let rows = tokens.len();
        let mut matrix = vec![0.0f32; rows * frames];
        for h in &heads {
            let full = c.n_audio_ctx;
            let mut w: Vec<f32> = h
                .scores
                .chunks_exact(full)
                .flat_map(|r| r[..frames].iter().copied())
                .collect();
            crate::cpu::softmax_rows(&mut w, frames);
            // Normalised along the tokens (mean 0, variance 1 per frame).
            for f in 0..frames {
                let mean = (0..rows).map(|r| w[r * frames + f]).sum::<f32>() / rows as f32;
                let var = (0..rows)
                    .map(|r| (w[r * frames + f] - mean).powi(2))
                    .sum::<f32>()
                    / rows as f32;
                let inv = 1.0 / var.sqrt();
                for r in 0..rows {
                    w[r * frames + f] = (w[r * frames + f] - mean) * inv;
                }
            }
            median_filter(&mut w, frames, MEDIAN_FILTER_WIDTH);
            for (acc, v) in matrix.iter_mut().zip(&w) {
                *acc += v;
            }
        }
        // From `<|notimestamps|>` to the last text token; the path minimises
        // the negated mean attention.
        let cost: Vec<f32> = matrix[offset * frames..(offset + n + 1) * frames]
            .iter()
            .map(|v| {
                let mean = v / heads.len() as f32;
                if mean.is_finite() {
                    -mean
                } else {
                    0.0
                }
            })
            .collect();
        let path = dtw(&cost, n + 1, frames);
        let mut jump_times = Vec::with_capacity(n + 1);
        for (k, &(row, col)) in path.iter().enumerate() {
            if k == 0 || path[k - 1].0 != row {
                jump_times.push(col as f64 / TOKENS_PER_SECOND);
            }
        }

        let mut with_eot = text.to_vec();
        with_eot.push(s.eot);
        let (words, word_tokens) = self.split_to_word_tokens(&with_eot);
        if word_tokens.len() <= 1 {
            return Vec::new();
        }
        let mut boundaries = vec![0usize];
        for t in &word_tokens[..word_tokens.len() - 1] {
            boundaries.push(boundaries.last().copied().unwrap_or(0) + t.len());
        }
        words
            .into_iter()
            .zip(word_tokens)
            .zip(boundaries.windows(2))
            .map(|((word, tokens), b)| {
                let at = |i: usize| jump_times.get(i).copied().unwrap_or(0.0);
                let p = &probs[b[0]..b[1].min(probs.len())];
                Timing {
                    word,
                    tokens,
                    start: at(b[0]),
                    end: at(b[1]),
                    probability: p.iter().map(|&v| v as f64).sum::<f64>() / p.len().max(1) as f64,
                }
            })
            .collect()
    }

    /// faster-whisper's `add_word_timestamps` for the segments of one window
    /// that starts `time_offset` seconds into the audio and holds
    /// `num_frames` mel frames of it; fills `words` and moves the segments'
    /// times to their words. `last_speech` is where speech last ended;
    /// returns where it ends after these segments (the end of the last one
    /// with words), as faster-whisper's does.
    pub fn add_word_timestamps(
        &self,
        cross: &CrossKv,
        segments: &mut [WindowSegment],
        time_offset: f64,
        num_frames: usize,
        mut last_speech: f64,
    ) -> f64 {
        if segments.is_empty() {
            return last_speech;
        }
        let eot = self.tokenizer.specials.eot;
        let per_segment: Vec<Vec<u32>> = segments
            .iter()
            .map(|s| s.tokens.iter().copied().filter(|&t| t < eot).collect())
            .collect();
        let text = per_segment.concat();
        let mut alignment = self.find_alignment(cross, &text, num_frames);

        let mut durations: Vec<f64> = alignment
            .iter()
            .map(|w| w.end - w.start)
            .filter(|&d| d != 0.0)
            .collect();
        let median_duration = if durations.is_empty() {
            0.0
        } else {
            median(&mut durations).min(0.7)
        };
        let max_duration = median_duration * 2.0;
        // Words at sentence boundaries are at most twice the median long.
        if !durations.is_empty() {
            for i in 1..alignment.len() {
                if alignment[i].end - alignment[i].start > max_duration {
                    if SENTENCE_END.contains(alignment[i].word.as_str()) {
                        alignment[i].end = alignment[i].start + max_duration;
                    } else if SENTENCE_END.contains(alignment[i - 1].word.as_str()) {
                        alignment[i].start = alignment[i].end - max_duration;
                    }
                }
            }
        }
        merge_punctuations(
            &mut alignment,
            &self.prepend_punctuations,
            &self.append_punctuations,
        );

        let mut word_index = 0;
        for (seg, seg_text) in segments.iter_mut().zip(&per_segment) {
            let mut saved_tokens = 0;
            let mut words: Vec<Word> = Vec::new();
            while word_index < alignment.len() && saved_tokens < seg_text.len() {
                let timing = &alignment[word_index];
                if !timing.word.is_empty() {
                    words.push(Word {
                        word: timing.word.clone(),
                        start: round2(time_offset + timing.start),
                        end: round2(time_offset + timing.end),
                        probability: timing.probability,
                    });
                }
                saved_tokens += timing.tokens.len();
                word_index += 1;
            }
            if !words.is_empty() {
                // The first and second word after a pause are at most twice
                // the median long.
                let long_second =
                    words.len() > 1 && words[1].end - words[0].start > max_duration * 2.0;
                if words[0].end - last_speech > median_duration * 4.0
                    && (words[0].end - words[0].start > max_duration || long_second)
                {
                    if words.len() > 1 && words[1].end - words[1].start > max_duration {
                        let boundary = (words[1].end / 2.0).max(words[1].end - max_duration);
                        words[0].end = boundary;
                        words[1].start = boundary;
                    }
                    words[0].start = (words[0].end - max_duration).max(0.0);
                }
                // The segment's own start and end win over a first or last
                // word that overruns them.
                if seg.start < words[0].end && seg.start - 0.5 > words[0].start {
                    words[0].start = (words[0].end - median_duration).min(seg.start).max(0.0);
                } else {
                    seg.start = words[0].start;
                }
                let last = words.len() - 1;
                if seg.end > words[last].start && seg.end + 0.5 < words[last].end {
                    words[last].end = (words[last].start + median_duration).max(seg.end);
                } else {
                    seg.end = words[last].end;
                }
                last_speech = seg.end;
            }
            seg.words = words;
        }
        last_speech
    }
}

/// Where the last word of `segments` ends, else the last segment
/// (faster-whisper's `get_end`).
pub fn get_end(segments: &[WindowSegment]) -> Option<f64> {
    segments
        .iter()
        .rev()
        .find_map(|s| s.words.last().map(|w| w.end))
        .or_else(|| segments.last().map(|s| s.end))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dtw_follows_the_cheap_diagonal() {
        // Cheap cells on a staircase: rows 0,0,1,1,2 over five columns.
        let mut x = vec![1.0f32; 3 * 5];
        for (j, i) in [0, 0, 1, 1, 2].iter().enumerate() {
            x[i * 5 + j] = -1.0;
        }
        let path = dtw(&x, 3, 5);
        assert_eq!(path, vec![(0, 0), (0, 1), (1, 2), (1, 3), (2, 4)]);
    }

    #[test]
    fn median_filter_reflects_at_the_ends() {
        let mut x = vec![5.0, 1.0, 9.0, 2.0, 7.0];
        median_filter(&mut x, 5, 3);
        // Padded by reflection: [1, 5, 1, 9, 2, 7, 2].
        assert_eq!(x, vec![1.0, 5.0, 2.0, 7.0, 2.0]);
        let mut short = vec![3.0, 1.0];
        median_filter(&mut short, 2, 7);
        assert_eq!(short, vec![3.0, 1.0]);
    }

    fn timing(word: &str) -> Timing {
        Timing {
            word: word.into(),
            tokens: vec![0],
            ..Timing::default()
        }
    }

    #[test]
    fn punctuation_joins_its_neighbours() {
        let mut a: Vec<Timing> = [" (", "Hello", ",", " world", ".", "\""]
            .iter()
            .map(|w| timing(w))
            .collect();
        merge_punctuations(&mut a, PREPEND_PUNCTUATIONS, APPEND_PUNCTUATIONS);
        let words: Vec<&str> = a.iter().map(|t| t.word.as_str()).collect();
        assert_eq!(words, ["", " (Hello,", "", " world.\"", "", ""]);
        assert_eq!(a[1].tokens.len(), 3);
        assert_eq!(a[3].tokens.len(), 3);
    }

    #[test]
    fn rounding_is_pythons() {
        assert_eq!(round2(1.005), 1.0); // 1.00499999999999989...
        assert_eq!(round2(2.675), 2.67);
        assert_eq!(round2(0.125), 0.12);
        assert_eq!(round2(7.38), 7.38);
    }
}
