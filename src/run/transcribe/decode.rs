//! Decoding one 30 s window, as openai-whisper's `DecodingTask`: the prompt
//! runs once, then tokens are chosen one at a time under Whisper's logit
//! rules (blank suppression at the start, suppressed tokens, timestamp
//! rules), greedily, by sampling `best_of` candidates at a temperature, or by
//! beam search; the candidates are ranked by length-normalised log
//! probability.

use super::Backend;
use crate::cpu;
use crate::error::Result;
use crate::models::whisper::model::Whisper;
use crate::models::whisper::tokens::Tokenizer;
use crate::util::rng::Rng;

/// Time between two timestamp tokens, in seconds.
pub const TIME_PRECISION: f64 = 0.02;

/// The rules that do not change between windows.
#[derive(Clone, Debug)]
pub struct Rules {
    /// Never sampled.
    pub suppress: Vec<u32>,
    /// Not sampled as the first token (a blank, end of text).
    pub suppress_begin: Vec<u32>,
    /// Sample timestamp tokens (false: `<|notimestamps|>` is in the prompt).
    pub timestamps: bool,
    /// The first timestamp is at most this many steps of 0.02 s.
    pub max_initial_timestamp: Option<u32>,
}

/// How to choose tokens in one attempt at a window.
#[derive(Clone, Copy, Debug)]
pub struct Strategy {
    pub temperature: f32,
    /// Beam search with this many beams (used at temperature 0 when > 1).
    pub beam_size: usize,
    /// Candidates sampled at a temperature above 0.
    pub best_of: usize,
    /// Beam search stops after `round(beam_size * patience)` finished beams.
    pub patience: f32,
    /// None: rank by log probability / length; Some(a): by GNMT's
    /// ((5 + length) / 6)^a.
    pub length_penalty: Option<f32>,
    /// Tokens sampled at most.
    pub sample_len: usize,
}

/// The chosen sequence of one window.
#[derive(Clone, Debug, Default)]
pub struct Decoded {
    /// Sampled tokens, up to (not including) the end of text.
    pub tokens: Vec<u32>,
    /// Log probability of each sampled token under the filtered logits.
    pub token_logprobs: Vec<f32>,
    pub text: String,
    pub sum_logprob: f32,
    /// sum_logprob / (tokens + 1): the end of text counts.
    pub avg_logprob: f32,
    pub no_speech_prob: f32,
    pub temperature: f32,
    pub compression_ratio: f32,
}

/// One candidate sequence during decoding.
#[derive(Clone, Debug)]
struct Candidate {
    tokens: Vec<u32>,
    logprobs: Vec<f32>,
    sum: f32,
}

/// len(text) / len(zlib(text)): high for repetitive text.
pub fn compression_ratio(text: &str) -> f32 {
    use std::io::Write;
    let bytes = text.as_bytes();
    let mut z = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::new(6));
    z.write_all(bytes).expect("writing to a Vec cannot fail");
    let packed = z.finish().expect("writing to a Vec cannot fail");
    bytes.len() as f32 / packed.len() as f32
}

/// log_softmax of one row, in f32 as torch does (with -inf kept).
fn log_softmax(x: &[f32]) -> Vec<f32> {
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f32 = x.iter().map(|v| (v - max).exp()).sum();
    let lse = max + sum.ln();
    x.iter().map(|v| v - lse).collect()
}

fn argmax(x: &[f32]) -> usize {
    let mut best = 0;
    for (i, &v) in x.iter().enumerate() {
        if v > x[best] {
            best = i;
        }
    }
    best
}

pub struct WindowDecoder<'a> {
    pub model: &'a Whisper,
    pub tokenizer: &'a Tokenizer,
    pub rules: &'a Rules,
}

impl WindowDecoder<'_> {
    /// openai-whisper's logit filters, in its order, for a sequence whose
    /// sampled tokens so far are `sampled`.
    fn apply_rules(&self, logits: &mut [f32], sampled: &[u32]) {
        let s = &self.tokenizer.specials;
        let ninf = f32::NEG_INFINITY;
        if sampled.is_empty() {
            for &t in &self.rules.suppress_begin {
                logits[t as usize] = ninf;
            }
        }
        for &t in &self.rules.suppress {
            if let Some(l) = logits.get_mut(t as usize) {
                *l = ninf;
            }
        }
        if !self.rules.timestamps {
            return;
        }
        let tb = s.timestamp_begin as usize;
        logits[s.no_timestamps as usize] = ninf;
        let is_ts = |t: u32| t >= s.timestamp_begin;
        let last_was_ts = sampled.last().is_some_and(|&t| is_ts(t));
        let penultimate_was_ts = sampled.len() < 2 || is_ts(sampled[sampled.len() - 2]);
        if last_was_ts {
            if penultimate_was_ts {
                // A pair just closed: the next token is text.
                logits[tb..].fill(ninf);
            } else {
                // An opened segment ends here or at end of text: no text.
                logits[..s.eot as usize].fill(ninf);
            }
        }
        if let Some(&last_ts) = sampled.iter().rev().find(|&&t| is_ts(t)) {
            // Timestamps never decrease, and a segment is never empty.
            let from = if last_was_ts && !penultimate_was_ts {
                last_ts
            } else {
                last_ts + 1
            };
            logits[tb..from as usize].fill(ninf);
        }
        if sampled.is_empty() {
            logits[..tb].fill(ninf);
            if let Some(max) = self.rules.max_initial_timestamp {
                logits[tb + max as usize + 1..].fill(ninf);
            }
        }
        // If the timestamps together are likelier than any text token, take one.
        let lp = log_softmax(logits);
        let ts_max = lp[tb..].iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let ts_lse = if ts_max == f32::NEG_INFINITY {
            ts_max
        } else {
            ts_max
                + lp[tb..]
                    .iter()
                    .map(|v| (v - ts_max).exp())
                    .sum::<f32>()
                    .ln()
        };
        let text_max = lp[..tb].iter().copied().fold(f32::NEG_INFINITY, f32::max);
        if ts_lse > text_max {
            logits[..tb].fill(ninf);
        }
    }

    /// Decodes the window `backend` encoded last, after the `prompt` tokens
    /// (previous text, start of transcript, language, task); `sot_index` is
    /// where `<|startoftranscript|>` sits in `prompt`.
    pub fn decode(
        &self,
        backend: &mut dyn Backend,
        prompt: &[u32],
        sot_index: usize,
        st: &Strategy,
        rng: &mut Rng,
    ) -> Result<Decoded> {
        let c = &self.model.config;
        let s = &self.tokenizer.specials;
        let eot = s.eot;
        let vocab = c.n_vocab;

        let first = backend.prompt(prompt, &[sot_index, prompt.len() - 1])?;
        let no_speech_prob = match s.no_speech {
            Some(ns) => {
                let mut p = first[..vocab].to_vec();
                cpu::softmax_rows(&mut p, vocab);
                p[ns as usize]
            }
            None => 0.0,
        };
        let beam = st.temperature == 0.0 && st.beam_size > 1;
        let n_group = if beam {
            st.beam_size
        } else if st.temperature > 0.0 {
            st.best_of.max(1)
        } else {
            1
        };
        backend.select(&vec![0; n_group])?;
        let mut logits: Vec<f32> = first[vocab..].repeat(n_group);
        let mut live: Vec<Candidate> = vec![
            Candidate {
                tokens: Vec::new(),
                logprobs: Vec::new(),
                sum: 0.0,
            };
            n_group
        ];
        let max_candidates = ((st.beam_size as f32 * st.patience).round() as usize).max(1);
        let mut finished: Vec<Candidate> = Vec::new();
        for _ in 0..st.sample_len {
            let mut lps = Vec::with_capacity(n_group);
            for (k, cand) in live.iter().enumerate() {
                let row = &mut logits[k * vocab..(k + 1) * vocab];
                self.apply_rules(row, &cand.tokens);
                lps.push(log_softmax(row));
            }
            let completed = if beam {
                let (done, sources) =
                    self.beam_step(&mut live, &lps, &mut finished, max_candidates);
                if !done {
                    backend.select(&sources)?;
                }
                done
            } else {
                for (k, cand) in live.iter_mut().enumerate() {
                    if cand.tokens.last() == Some(&eot) {
                        continue;
                    }
                    let row = &logits[k * vocab..(k + 1) * vocab];
                    let next = if st.temperature == 0.0 {
                        argmax(row)
                    } else {
                        sample(row, st.temperature, rng)
                    };
                    cand.sum += lps[k][next];
                    cand.tokens.push(next as u32);
                    cand.logprobs.push(lps[k][next]);
                }
                live.iter().all(|c| c.tokens.last() == Some(&eot))
            };
            // As openai-whisper: stop once the sequence outgrows the context.
            if completed || prompt.len() + live[0].tokens.len() > c.n_text_ctx {
                break;
            }
            let next: Vec<u32> = live
                .iter()
                .map(|c| *c.tokens.last().expect("one token per step"))
                .collect();
            logits = backend.step(&next)?;
        }

        // Every candidate, cut at its end of text.
        let candidates: Vec<Candidate> = if beam {
            if finished.len() < st.beam_size {
                let mut order: Vec<usize> = (0..live.len()).collect();
                order.sort_by(|&a, &b| live[b].sum.total_cmp(&live[a].sum));
                for k in order {
                    if finished.len() >= st.beam_size {
                        break;
                    }
                    if !finished
                        .iter()
                        .any(|f| f.tokens[..f.tokens.len() - 1] == live[k].tokens[..])
                    {
                        let mut cand = live[k].clone();
                        cand.tokens.push(eot);
                        cand.logprobs.push(0.0);
                        finished.push(cand);
                    }
                }
            }
            finished
        } else {
            live
        };
        let candidates: Vec<Candidate> = candidates
            .into_iter()
            .map(|mut cand| {
                let end = cand
                    .tokens
                    .iter()
                    .position(|&t| t == eot)
                    .unwrap_or(cand.tokens.len());
                cand.tokens.truncate(end);
                cand.logprobs.truncate(end);
                cand
            })
            .collect();
        let score = |cand: &Candidate| {
            let len = cand.tokens.len() as f32;
            let penalty = match st.length_penalty {
                None => len,
                Some(a) => ((5.0 + len) / 6.0).powf(a),
            };
            cand.sum / penalty
        };
        let mut best = 0;
        for (i, cand) in candidates.iter().enumerate() {
            if score(cand) > score(&candidates[best]) {
                best = i;
            }
        }
        let chosen = candidates
            .into_iter()
            .nth(best)
            .expect("at least one candidate");
        let text = self.tokenizer.decode(&chosen.tokens);
        Ok(Decoded {
            avg_logprob: chosen.sum / (chosen.tokens.len() + 1) as f32,
            compression_ratio: compression_ratio(text.trim()),
            text,
            sum_logprob: chosen.sum,
            tokens: chosen.tokens,
            token_logprobs: chosen.logprobs,
            no_speech_prob,
            temperature: st.temperature,
        })
    }

    /// One step of openai-whisper's beam search for one audio: extends each
    /// beam by its `beam_size + 1` best tokens, keeps the best `beam_size`
    /// unfinished sequences, and collects finished ones. Returns whether
    /// enough have finished, and the beam each kept sequence extends (the
    /// decoder state to carry over).
    fn beam_step(
        &self,
        live: &mut Vec<Candidate>,
        lps: &[Vec<f32>],
        finished: &mut Vec<Candidate>,
        max_candidates: usize,
    ) -> (bool, Vec<usize>) {
        let eot = self.tokenizer.specials.eot;
        let n_beams = live.len();
        // Candidates in insertion order, deduplicated as a Python dict would.
        let mut scored: Vec<(Candidate, usize)> = Vec::new();
        for (j, beam) in live.iter().enumerate() {
            let lp = &lps[j];
            let mut top: Vec<usize> = (0..lp.len()).collect();
            let k = (n_beams + 1).min(top.len());
            top.select_nth_unstable_by(k - 1, |&a, &b| lp[b].total_cmp(&lp[a]));
            top.truncate(k);
            top.sort_by(|&a, &b| lp[b].total_cmp(&lp[a]));
            for t in top {
                let mut cand = beam.clone();
                cand.sum += lp[t];
                cand.tokens.push(t as u32);
                cand.logprobs.push(lp[t]);
                match scored.iter_mut().find(|(c, _)| c.tokens == cand.tokens) {
                    Some(slot) => *slot = (cand, j),
                    None => scored.push((cand, j)),
                }
            }
        }
        scored.sort_by(|a, b| b.0.sum.total_cmp(&a.0.sum));
        let mut next = Vec::with_capacity(n_beams);
        let mut sources = Vec::with_capacity(n_beams);
        let mut newly_finished = Vec::new();
        for (cand, src) in scored {
            if cand.tokens.last() == Some(&eot) {
                newly_finished.push(cand);
            } else {
                next.push(cand);
                sources.push(src);
                if next.len() == n_beams {
                    break;
                }
            }
        }
        for cand in newly_finished {
            if finished.len() >= max_candidates {
                break;
            }
            finished.push(cand);
        }
        *live = next;
        (finished.len() >= max_candidates, sources)
    }
}

/// A token drawn from softmax(logits / temperature).
fn sample(logits: &[f32], temperature: f32, rng: &mut Rng) -> usize {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let weights: Vec<f64> = logits
        .iter()
        .map(|&l| (((l - max) / temperature) as f64).exp())
        .collect();
    let total: f64 = weights.iter().sum();
    let mut u = rng.next_f32() as f64 * total;
    for (i, w) in weights.iter().enumerate() {
        if u < *w {
            return i;
        }
        u -= w;
    }
    argmax(logits)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compression_ratio_flags_repetition() {
        let plain = "He was not an ill disposed young man.";
        let looped = "I'm sorry. ".repeat(20);
        assert!(compression_ratio(plain) < 1.5);
        assert!(compression_ratio(&looped) > 2.4);
        assert_eq!(compression_ratio(""), 0.0);
    }

    #[test]
    fn sampling_follows_the_distribution() {
        let mut rng = Rng::new(3);
        let logits = [0.0f32, 2.0_f32.ln(), f32::NEG_INFINITY];
        let mut counts = [0; 3];
        for _ in 0..3000 {
            counts[sample(&logits, 1.0, &mut rng)] += 1;
        }
        assert_eq!(counts[2], 0, "a suppressed token was sampled");
        let ratio = counts[1] as f32 / counts[0] as f32;
        assert!((1.7..2.3).contains(&ratio), "{counts:?}");
    }
}
