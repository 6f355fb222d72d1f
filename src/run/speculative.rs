//! Speculative decoding: a cheap drafter proposes the next few tokens, the
//! model checks them all in one forward ([`CausalLm::forward_verify`], or
//! for a plain argmax [`CausalLm::verify_greedy`]) and
//! keeps the longest prefix it agrees with, plus one token of its own.
//!
//! The drafters are prompt lookup (the tokens that followed the latest
//! earlier occurrence of the last n-gram, n = 3 down to 1: HF's
//! `prompt_lookup_num_tokens`, and the idea of llama.cpp's `llama-lookup`)
//! and a small draft model with the same vocabulary (llama.cpp's
//! `llama-speculative`). With a deterministic sampler (temperature 0, with
//! or without bias, penalties and grammar) each position's choice is the
//! sampler's own over the model's logits, as in plain decoding, so the
//! output is the same token for token where the verifying forward's logits
//! equal decode's (bit for bit on the CPU). With sampling, a draft token d
//! is kept with probability min(1, p(d) / q(d)) (p: the sampler's
//! distribution over the model's logits, q: the drafter's, 1 at d for
//! lookup) and on rejection the token is drawn from max(0, p - q)
//! normalised (Leviathan et al. 2023; Chen et al. 2023): the output follows
//! the sampler's distribution exactly.

use crate::error::{Error, Result};
use crate::models::llm::CausalLm;
use crate::sampling::Sampler;
use serde::Serialize;

/// Longest n-gram prompt lookup matches.
pub const LOOKUP_NGRAM_MAX: usize = 3;
/// Most tokens one verification checks (`--draft` is capped at this; the
/// conv state of LFM2 models can be rewound by more, see
/// [`crate::models::llm::REWIND_DEPTH`]).
pub const MAX_DRAFT: usize = 16;

/// Where the drafts come from.
// One per generation: the model variant's sampler costs nothing worth a box.
#[allow(clippy::large_enum_variant)]
pub enum Drafter<'a> {
    /// Prompt lookup over the prompt and the output so far.
    Lookup,
    /// A model of the same vocabulary; its sequence is kept in step with
    /// the output (it may start at any position: the common prefix is kept).
    Model {
        model: &'a mut dyn CausalLm,
        /// Draws the draft tokens when the main sampler samples (its
        /// options without grammar or logprobs); unused when greedy.
        sampler: Sampler,
        /// The tokens the draft model has consumed.
        consumed: Vec<u32>,
    },
}

pub struct Speculation<'a> {
    pub drafter: Drafter<'a>,
    /// Most tokens drafted per verification (1..=[`MAX_DRAFT`]).
    pub max_draft: usize,
}

/// Draft tokens, and for sampled drafts the drafter's distribution at each.
type Drafts = (Vec<u32>, Vec<Vec<(u32, f32)>>);

/// What speculation did in one generation (in `--json` and the timings
/// line).
#[derive(Clone, Debug, Default, Serialize)]
pub struct SpecStats {
    /// "lookup" or "draft-model".
    pub drafter: &'static str,
    pub max_draft: usize,
    pub drafted: usize,
    pub accepted: usize,
    /// accepted / drafted.
    pub acceptance_rate: f64,
    /// Forwards of the model after the prefill (each checks a draft or,
    /// with none, decodes one token).
    pub target_forwards: usize,
    /// Forwards of the draft model.
    pub draft_forwards: usize,
    /// Tokens produced per forward of the model after the prefill.
    pub tokens_per_forward: f64,
}

impl Speculation<'_> {
    /// Checks the draft model against the model it drafts for.
    pub fn check_vocab(&self, vocab: usize) -> Result<()> {
        if let Drafter::Model { model, .. } = &self.drafter {
            let dv = model.config().vocab;
            if dv != vocab {
                return Err(Error::invalid(format!(
                    "the draft model has a vocabulary of {dv} tokens, the model {vocab}"
                )));
            }
        }
        Ok(())
    }

    pub fn stats(&self) -> SpecStats {
        SpecStats {
            drafter: match self.drafter {
                Drafter::Lookup => "lookup",
                Drafter::Model { .. } => "draft-model",
            },
            max_draft: self.max_draft,
            ..Default::default()
        }
    }

    /// Up to `k` draft tokens to follow `history`, and for sampled drafts
    /// the drafter's distribution at each.
    fn draft(
        &mut self,
        history: &[u32],
        k: usize,
        greedy: bool,
        stats: &mut SpecStats,
    ) -> Result<Drafts> {
        if k == 0 {
            return Ok((Vec::new(), Vec::new()));
        }
        match &mut self.drafter {
            Drafter::Lookup => Ok((lookup(history, k, LOOKUP_NGRAM_MAX), Vec::new())),
            Drafter::Model {
                model,
                sampler,
                consumed,
            } => {
                let ctx = model.config().context;
                // Keep what the draft model shares with the history.
                let common = consumed
                    .iter()
                    .zip(history)
                    .take_while(|(a, b)| a == b)
                    .count()
                    .min(history.len() - 1);
                // It consumes the history and all drafts but the last.
                let k = k.min(ctx.saturating_sub(history.len()));
                if k == 0 {
                    return Ok((Vec::new(), Vec::new()));
                }
                if common < consumed.len() {
                    if common >= model.min_truncate_pos() {
                        model.truncate(common)?;
                        consumed.truncate(common);
                    } else {
                        model.reset();
                        consumed.clear();
                    }
                }
                let mut drafts = Vec::with_capacity(k);
                let mut dists = Vec::new();
                let mut seq = history.to_vec();
                let mut feed = history[consumed.len()..].to_vec();
                if greedy {
                    // The backend's greedy run (a GPU reads back token ids
                    // only, a step ahead): it leaves the last draft
                    // unconsumed, as below.
                    let (&last, before) = feed.split_last().expect("a token to feed");
                    if !before.is_empty() {
                        model.forward(before, false)?;
                        stats.draft_forwards += 1;
                    }
                    let n = model.greedy_run(last, k, &mut |t| {
                        drafts.push(t);
                        true
                    })?;
                    stats.draft_forwards += n;
                    consumed.extend_from_slice(&feed);
                    consumed.extend_from_slice(&drafts[..n.saturating_sub(1)]);
                    return Ok((drafts, dists));
                }
                for _ in 0..k {
                    let logits = model.forward(&feed, false)?;
                    stats.draft_forwards += 1;
                    consumed.extend_from_slice(&feed);
                    let q = sampler.distribution(&logits, &seq);
                    let d = sampler.draw(&q);
                    dists.push(q);
                    drafts.push(d);
                    seq.push(d);
                    feed = vec![d];
                }
                Ok((drafts, dists))
            }
        }
    }
}

/// Prompt lookup: the tokens (at most `k`) that followed the latest earlier
/// occurrence of the last n tokens of `history`, for the longest n from
/// `ngram_max` down to 1 that occurs earlier.
pub fn lookup(history: &[u32], k: usize, ngram_max: usize) -> Vec<u32> {
    let len = history.len();
    for n in (1..=ngram_max.min(len.saturating_sub(1))).rev() {
        let tail = &history[len - n..];
        // Starts of earlier occurrences, latest first; the match must be
        // followed by at least one token.
        for start in (0..len - n).rev() {
            if &history[start..start + n] == tail {
                let from = start + n;
                let to = (from + k).min(len);
                return history[from..to].to_vec();
            }
        }
    }
    Vec::new()
}

/// The result of checking one draft token.
enum Verdict {
    Accept,
    /// Rejected; the model's own token instead.
    Replace(u32),
}

/// Checks draft token `d` against the model's `logits` at its position.
/// `q`: the drafter's distribution there (None: a deterministic draft).
fn check(
    sampler: &mut Sampler,
    logits: &[f32],
    history: &[u32],
    d: u32,
    q: Option<&[(u32, f32)]>,
) -> Verdict {
    if sampler.options().temperature <= 0.0 {
        // Deterministic: the sampler's own choice, committed.
        let t = sampler.sample(logits, history);
        return if t == d {
            Verdict::Accept
        } else {
            Verdict::Replace(t)
        };
    }
    let p = sampler.distribution(logits, history);
    let prob = |dist: &[(u32, f32)], id: u32| dist.iter().find(|c| c.0 == id).map_or(0.0, |c| c.1);
    let pd = prob(&p, d);
    let qd = q.map_or(1.0, |q| prob(q, d));
    if qd > 0.0 && sampler.uniform() < (pd / qd).min(1.0) {
        sampler.commit(logits, d);
        return Verdict::Accept;
    }
    // The residual max(0, p - q), over p's support (q is 0 elsewhere that
    // matters: where p is 0 the residual is too).
    let residual: Vec<(u32, f32)> = p
        .iter()
        .map(|&(id, pi)| {
            let qi = match q {
                Some(q) => prob(q, id),
                None if id == d => 1.0,
                None => 0.0,
            };
            (id, (pi - qi).max(0.0))
        })
        .filter(|c| c.1 > 0.0)
        .collect();
    let t = if residual.is_empty() {
        sampler.draw(&p)
    } else {
        sampler.draw(&residual)
    };
    sampler.commit(logits, t);
    Verdict::Replace(t)
}

/// One round: drafts after `last` (produced, not yet consumed by `model`),
/// checks them, and passes each token produced to `emit` until it returns
/// false. Returns whether generation goes on, and leaves `model` having
/// consumed every produced token but the last. `budget`: tokens that may
/// still be produced (at least 1).
#[allow(clippy::too_many_arguments)]
pub(crate) fn round(
    model: &mut dyn CausalLm,
    sampler: &mut Sampler,
    spec: &mut Speculation,
    history: &[u32],
    last: u32,
    budget: usize,
    stats: &mut SpecStats,
    emit: &mut dyn FnMut(u32, &mut Sampler) -> Result<bool>,
) -> Result<bool> {
    let greedy = sampler.options().temperature <= 0.0;
    let mut seq = history.to_vec();
    debug_assert_eq!(seq.last(), Some(&last));
    let k = spec.max_draft.min(budget - 1);
    let (drafts, dists) = spec.draft(&seq, k, greedy, stats)?;
    let base = model.position();
    let mut tokens = Vec::with_capacity(drafts.len() + 1);
    tokens.push(last);
    tokens.extend_from_slice(&drafts);
    // A plain argmax needs each row's argmax only (a GPU reads back the
    // ids); anything else the rows' logits.
    let (argmaxes, logits) = if sampler.is_greedy() {
        (model.verify_greedy(&tokens)?, Vec::new())
    } else {
        let logits = model.forward_verify(&tokens)?;
        if logits.iter().any(|x| !x.is_finite()) {
            return Err(Error::invalid(
                "the model's logits are NaN or infinite (damaged weights?)",
            ));
        }
        (Vec::new(), logits)
    };
    stats.target_forwards += 1;
    stats.drafted += drafts.len();
    let vocab = model.config().vocab;
    // Row i holds the model's choice (or logits) after tokens[..=i]: it
    // judges drafts[i].
    for i in 0..tokens.len() {
        let verdict = match (argmaxes.get(i), drafts.get(i)) {
            (Some(&t), Some(&d)) if t == d => Verdict::Accept,
            (Some(&t), _) => Verdict::Replace(t),
            (None, draft) => {
                let row = &logits[i * vocab..(i + 1) * vocab];
                match draft {
                    Some(&d) => check(sampler, row, &seq, d, dists.get(i).map(|q| q.as_slice())),
                    None => Verdict::Replace(sampler.sample(row, &seq)),
                }
            }
        };
        if let Some(e) = sampler.take_error() {
            return Err(e);
        }
        let (token, accepted) = match verdict {
            Verdict::Accept => (drafts[i], true),
            Verdict::Replace(t) => (t, false),
        };
        if accepted {
            stats.accepted += 1;
        }
        // The model has consumed tokens[..=i]; `token` follows them.
        let consumed = base + i + 1;
        let more = emit(token, sampler)?;
        if !more || !accepted {
            model.truncate(consumed)?;
            return Ok(more);
        }
        seq.push(token);
    }
    unreachable!("the last row always replaces")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampling::SamplingOptions;

    #[test]
    fn lookup_continues_the_latest_earlier_match() {
        // "1 2 3" occurs twice before the tail; the latest one is followed
        // by 7 8.
        let h = [1, 2, 3, 4, 5, 1, 2, 3, 7, 8, 9, 1, 2, 3];
        assert_eq!(lookup(&h, 2, 3), vec![7, 8]);
        assert_eq!(lookup(&h, 9, 3), vec![7, 8, 9, 1, 2, 3]);
        // Only a 1-gram matches.
        assert_eq!(lookup(&[5, 6, 9, 5], 3, 3), vec![6, 9, 5]);
        assert!(lookup(&[1, 2, 3], 3, 3).is_empty());
    }

    /// How often each token comes out of `check` with draft `d` (drawn
    /// from `q` when given), over many trials.
    fn frequencies(logits: &[f32], q: Option<&[(u32, f32)]>, trials: usize) -> Vec<f64> {
        let mut s = Sampler::new(SamplingOptions {
            temperature: 1.0,
            seed: 3,
            ..Default::default()
        });
        let mut drafter = Sampler::new(SamplingOptions {
            temperature: 1.0,
            seed: 4,
            ..Default::default()
        });
        let mut counts = vec![0usize; logits.len()];
        for _ in 0..trials {
            let d = match q {
                Some(q) => drafter.draw(q),
                None => 1,
            };
            let t = match check(&mut s, logits, &[], d, q) {
                Verdict::Accept => d,
                Verdict::Replace(t) => t,
            };
            counts[t as usize] += 1;
        }
        counts.iter().map(|&c| c as f64 / trials as f64).collect()
    }

    #[test]
    fn rejection_sampling_keeps_the_samplers_distribution() {
        let logits = [0.5f32, 1.5, -0.5, 1.0];
        let z: f64 = logits.iter().map(|&l| (l as f64).exp()).sum();
        let p: Vec<f64> = logits.iter().map(|&l| (l as f64).exp() / z).collect();
        let trials = 40_000;
        // Three standard deviations of a frequency over `trials` draws.
        let tol = 3.0 * (0.25f64 / trials as f64).sqrt();
        // A deterministic draft (lookup) and a draft distribution far from p.
        let q = [(0u32, 0.1f32), (1, 0.2), (2, 0.6), (3, 0.1)];
        for (what, q) in [("lookup", None), ("draft model", Some(&q[..]))] {
            let f = frequencies(&logits, q, trials);
            for (i, (fi, pi)) in f.iter().zip(&p).enumerate() {
                assert!((fi - pi).abs() < tol, "{what}: token {i}: {fi} vs {pi}");
            }
        }
    }
}
