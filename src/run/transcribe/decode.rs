//! Decoding one 30 s window, as openai-whisper's `DecodingTask`: the prompt
//! runs once, then tokens are chosen one at a time under Whisper's logit
//! rules (blank suppression at the start, suppressed tokens, timestamp
//! rules), greedily, by sampling `best_of` candidates at a temperature, or by
//! beam search; the candidates are ranked by length-normalised log
//! probability.

use super::{Backend, Pick, Picks};
use crate::cpu::whisper::{
    self as select, Draw, Picked, RowRule, RuleState, SampleRules, SelectRules, TimestampRules,
};
use crate::error::Result;
use crate::models::whisper::model::Whisper;
use crate::models::whisper::tokens::Tokenizer;
use crate::util::rng::Rng;
use std::collections::VecDeque;

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
#[derive(Clone, Debug, Default)]
struct Candidate {
    tokens: Vec<u32>,
    logprobs: Vec<f32>,
    sum: f32,
}

/// A window's candidates during decoding.
#[derive(Clone, Debug)]
struct Window {
    live: Vec<Candidate>,
    /// Beam search: the sequences that ended.
    finished: Vec<Candidate>,
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

pub struct WindowDecoder<'a> {
    pub model: &'a Whisper,
    pub tokenizer: &'a Tokenizer,
    pub rules: &'a Rules,
    /// The rules as the token choice ([`select::whisper_select`]) takes them.
    select: SelectRules,
    /// The constants of the rules that follow the sampled tokens.
    ts_rules: TimestampRules,
}

impl<'a> WindowDecoder<'a> {
    pub fn new(
        model: &'a Whisper,
        tokenizer: &'a Tokenizer,
        rules: &'a Rules,
    ) -> WindowDecoder<'a> {
        let s = &tokenizer.specials;
        let vocab = model.config.n_vocab;
        let mut always = rules.suppress.clone();
        if rules.timestamps {
            always.push(s.no_timestamps);
        }
        WindowDecoder {
            model,
            tokenizer,
            rules,
            select: SelectRules {
                vocab,
                timestamp_begin: s.timestamp_begin,
                timestamps: rules.timestamps,
                masks: select::token_masks(vocab, &always, &rules.suppress_begin),
            },
            ts_rules: TimestampRules {
                vocab: vocab as u32,
                timestamp_begin: s.timestamp_begin,
                eot: s.eot,
                timestamps: rules.timestamps,
                max_initial_timestamp: rules.max_initial_timestamp,
            },
        }
    }

    /// openai-whisper's logit filters for a sequence whose sampled tokens
    /// so far are `sampled`, as ranges (the token sets are in `select`).
    fn row_rule(&self, sampled: &[u32]) -> RowRule {
        RuleState::of(sampled, self.ts_rules.timestamp_begin).rule(&self.ts_rules)
    }

    /// Decodes the windows `backend` encoded last, window w after
    /// `prompts[w]` (previous text, start of transcript, language, task;
    /// all of one length), together: their sequences are the rows of each
    /// pass, and a window leaves the pass when it is done. `sot_index` is
    /// where `<|startoftranscript|>` sits in the prompts.
    pub fn decode(
        &self,
        backend: &mut dyn Backend,
        prompts: &[&[u32]],
        sot_index: usize,
        st: &Strategy,
        rng: &mut Rng,
    ) -> Result<Vec<Decoded>> {
        let c = &self.model.config;
        let s = &self.tokenizer.specials;
        let eot = s.eot;
        let n_windows = prompts.len();

        let beam = st.temperature == 0.0 && st.beam_size > 1;
        let sampling = st.temperature > 0.0;
        let n_group = if beam {
            st.beam_size
        } else if sampling {
            st.best_of.max(1)
        } else {
            1
        };
        // A beam extends by its beam_size + 1 best tokens.
        let k = if beam { n_group + 1 } else { 1 };
        let first = vec![self.row_rule(&[]); n_windows];
        let probe = s.no_speech.map(|ns| (sot_index, ns));
        // Sampling: each candidate's first token drawn from its window's
        // prompt row, in candidate order.
        let draws: Vec<Draw> = if sampling {
            (0..n_windows * n_group)
                .map(|i| Draw {
                    row: (i / n_group) as u32,
                    u: rng.next_f32(),
                })
                .collect()
        } else {
            Vec::new()
        };
        let (no_speech, picks) = backend.prompt(
            prompts,
            probe,
            &self.pick(st.temperature, k, &first, &draws),
        )?;
        let forks: Vec<usize> = (0..n_windows)
            .flat_map(|w| std::iter::repeat_n(w, n_group))
            .collect();
        backend.select(&forks)?;
        // What each row's pass gave: the prompt's picks once per candidate,
        // or a draw of each.
        let mut picks = match picks {
            Picks::Top(p) => Picks::Top(forks.iter().map(|&w| p[w].clone()).collect()),
            other => other,
        };
        let mut windows = vec![
            Window {
                live: vec![Candidate::default(); n_group],
                finished: Vec::new(),
            };
            n_windows
        ];
        let max_candidates = ((st.beam_size as f32 * st.patience).round() as usize).max(1);
        // The windows whose rows the passes hold, in row order.
        let mut active: Vec<usize> = (0..n_windows).collect();
        // Greedy search can run several passes a submission: the picks of
        // the passes made ahead, in order.
        let greedy = !beam && !sampling;
        let mut ahead: VecDeque<Vec<Picked>> = VecDeque::new();
        for step in 0..st.sample_len {
            let mut sources = Vec::with_capacity(active.len() * n_group);
            let mut still = Vec::with_capacity(active.len());
            // Sampling: the pass's draws, one for each row not ended, in order.
            let mut drawn = match &picks {
                Picks::Sampled(d) => d.iter(),
                _ => [].iter(),
            };
            for (i, &w) in active.iter().enumerate() {
                let base = i * n_group;
                let win = &mut windows[w];
                let (completed, kept) = if beam {
                    let top = match &picks {
                        Picks::Top(p) => &p[base..base + n_group],
                        _ => unreachable!("beam search reads picks"),
                    };
                    beam_step(win, top, max_candidates, eot)
                } else {
                    for (j, cand) in win.live.iter_mut().enumerate() {
                        if cand.tokens.last() == Some(&eot) {
                            continue;
                        }
                        let (next, logprob) = match &picks {
                            Picks::Top(p) => (p[base + j].tokens[0], p[base + j].logprobs[0]),
                            Picks::Sampled(_) => {
                                let d = drawn.next().expect("a draw for each row not ended");
                                (d.token, d.logprob)
                            }
                            Picks::Logits(_) => unreachable!("the search reads picks or draws"),
                        };
                        cand.sum += logprob;
                        cand.tokens.push(next);
                        cand.logprobs.push(logprob);
                    }
                    let done = win.live.iter().all(|c| c.tokens.last() == Some(&eot));
                    (done, (0..n_group).collect())
                };
                // As openai-whisper: stop once the sequence outgrows the context.
                let full = prompts[w].len() + win.live[0].tokens.len() > c.n_text_ctx;
                if !(completed || full) {
                    sources.extend(kept.iter().map(|&j| base + j));
                    still.push(w);
                }
            }
            // The last step's tokens would never be read.
            if still.is_empty() || step + 1 == st.sample_len {
                break;
            }
            let rows = active.len() * n_group;
            if sources.len() != rows || sources.iter().enumerate().any(|(i, &s)| i != s) {
                backend.select(&sources)?;
                // Picks made ahead follow their rows.
                for p in ahead.iter_mut() {
                    *p = sources.iter().map(|&s| p[s].clone()).collect();
                }
            }
            active = still;
            if let Some(p) = ahead.pop_front() {
                picks = Picks::Top(p);
                continue;
            }
            let live = active.iter().flat_map(|&w| &windows[w].live);
            let next: Vec<u32> = live
                .clone()
                .map(|c| *c.tokens.last().expect("one token per step"))
                .collect();
            let rules: Vec<RowRule> = live.clone().map(|c| self.row_rule(&c.tokens)).collect();
            // Drawn in the order they are used: row after row, skipping
            // the candidates that have ended.
            let draws: Vec<Draw> = if sampling {
                live.enumerate()
                    .filter(|(_, c)| c.tokens.last() != Some(&eot))
                    .map(|(r, _)| Draw {
                        row: r as u32,
                        u: rng.next_f32(),
                    })
                    .collect()
            } else {
                Vec::new()
            };
            if greedy {
                let states: Vec<RuleState> = active
                    .iter()
                    .flat_map(|&w| &windows[w].live)
                    .map(|c| RuleState::of(&c.tokens, self.ts_rules.timestamp_begin))
                    .collect();
                // Passes whose picks can still be read.
                let n = st.sample_len - step - 1;
                let run = backend.greedy_ahead(
                    &next,
                    &self.select,
                    &rules,
                    &states,
                    &self.ts_rules,
                    n,
                )?;
                if let Some(mut run) = run.filter(|r| !r.is_empty()) {
                    picks = Picks::Top(run.remove(0));
                    ahead.extend(run);
                    continue;
                }
            }
            picks = backend.step(&next, &self.pick(st.temperature, k, &rules, &draws))?;
        }
        Ok(windows
            .into_iter()
            .zip(no_speech)
            .map(|(win, no_speech_prob)| self.finish(win, beam, st, no_speech_prob))
            .collect())
    }

    /// What a pass reads back: the k best tokens of each row under its
    /// rule, or at a temperature above 0 the draws' tokens.
    fn pick<'p>(
        &'p self,
        temperature: f32,
        k: usize,
        rows: &'p [RowRule],
        draws: &'p [Draw],
    ) -> Pick<'p> {
        if temperature > 0.0 {
            Pick::Sample {
                rules: SampleRules {
                    select: &self.select,
                    rows,
                    temperature,
                },
                draws,
            }
        } else {
            Pick::Top {
                k,
                rules: &self.select,
                rows,
            }
        }
    }

    /// The best of a window's candidates, cut at its end of text.
    fn finish(&self, win: Window, beam: bool, st: &Strategy, no_speech_prob: f32) -> Decoded {
        let eot = self.tokenizer.specials.eot;
        let Window { live, mut finished } = win;
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
        Decoded {
            avg_logprob: chosen.sum / (chosen.tokens.len() + 1) as f32,
            compression_ratio: compression_ratio(text.trim()),
            text,
            sum_logprob: chosen.sum,
            tokens: chosen.tokens,
            token_logprobs: chosen.logprobs,
            no_speech_prob,
            temperature: st.temperature,
        }
    }
}

/// One step of CTranslate2's beam search (what faster-whisper runs) for
/// one window: of all extensions of the beams, ranked by their summed
/// log probabilities, those ending in end of text among the best
/// `beam_size` finish, and the best `beam_size` that do not end go on.
/// Each beam's `beam_size + 1` best tokens (`top`, one per beam) hold
/// every extension either rule can take. Returns whether enough have
/// finished, and the beam each kept sequence extends (the decoder state
/// to carry over).
///
/// openai-whisper differs in which finish: every end of text ranked
/// above the last kept beam, up to `max_candidates`. Finishing more,
/// sooner, it can stop before a longer, better scoring sequence ends.
fn beam_step(
    win: &mut Window,
    top: &[Picked],
    max_candidates: usize,
    eot: u32,
) -> (bool, Vec<usize>) {
    let n_beams = win.live.len();
    // Candidates in insertion order; identical beams (the first step's)
    // give each extension once.
    let mut scored: Vec<(Candidate, usize)> = Vec::new();
    for (j, (beam, picked)) in win.live.iter().zip(top).enumerate() {
        for (&t, &lp) in picked.tokens.iter().zip(&picked.logprobs).take(n_beams + 1) {
            let mut cand = beam.clone();
            cand.sum += lp;
            cand.tokens.push(t);
            cand.logprobs.push(lp);
            match scored.iter_mut().find(|(c, _)| c.tokens == cand.tokens) {
                Some(slot) => *slot = (cand, j),
                None => scored.push((cand, j)),
            }
        }
    }
    scored.sort_by(|a, b| b.0.sum.total_cmp(&a.0.sum));
    let mut next = Vec::with_capacity(n_beams);
    let mut sources = Vec::with_capacity(n_beams);
    for (rank, (cand, src)) in scored.into_iter().enumerate() {
        if cand.tokens.last() == Some(&eot) {
            if rank < n_beams {
                win.finished.push(cand);
            }
        } else {
            next.push(cand);
            sources.push(src);
            if next.len() == n_beams {
                break;
            }
        }
    }
    win.live = next;
    (win.finished.len() >= max_candidates, sources)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn beam(tokens: &[u32], sum: f32) -> Candidate {
        Candidate {
            tokens: tokens.to_vec(),
            logprobs: vec![0.0; tokens.len()],
            sum,
        }
    }

    fn picked(tokens: &[u32], logprobs: &[f32]) -> Picked {
        Picked {
            probe: f32::NEG_INFINITY,
            tokens: tokens.to_vec(),
            logprobs: logprobs.to_vec(),
        }
    }

    const EOT: u32 = 99;

    #[test]
    fn beams_finish_only_among_the_best_beam_size_extensions() {
        // Ranked: a.10 (-0.1), a.EOT (-0.2), b.EOT (-0.25), b.12 (-0.3).
        let mut win = Window {
            live: vec![beam(&[1], 0.0), beam(&[2], -0.1)],
            finished: Vec::new(),
        };
        let top = [
            picked(&[10, EOT, 11], &[-0.1, -0.2, -5.0]),
            picked(&[EOT, 12, 13], &[-0.15, -0.2, -6.0]),
        ];
        let (done, sources) = beam_step(&mut win, &top, 2, EOT);
        // b.EOT ranks third of two beams: it does not finish (openai-whisper's
        // rule would take it, being above the last kept beam).
        assert_eq!(win.finished.len(), 1);
        assert_eq!(win.finished[0].tokens, [1, EOT]);
        assert!(!done);
        let live: Vec<_> = win.live.iter().map(|c| c.tokens.clone()).collect();
        assert_eq!(live, [vec![1, 10], vec![2, 12]]);
        assert_eq!(sources, [0, 1]);
    }

    #[test]
    fn every_end_among_the_best_finishes_past_max_candidates() {
        let mut win = Window {
            live: vec![beam(&[1], 0.0), beam(&[2], -0.05)],
            finished: Vec::new(),
        };
        let top = [
            picked(&[EOT, 10, 11], &[-0.1, -0.5, -5.0]),
            picked(&[EOT, 12, 13], &[-0.1, -0.6, -6.0]),
        ];
        let (done, _) = beam_step(&mut win, &top, 1, EOT);
        assert!(done);
        assert_eq!(win.finished.len(), 2, "both ends rank within the beam size");
        let live: Vec<_> = win.live.iter().map(|c| c.tokens.clone()).collect();
        assert_eq!(live, [vec![1, 10], vec![2, 12]]);
    }

    #[test]
    fn compression_ratio_flags_repetition() {
        let plain = "He was not an ill disposed young man.";
        let looped = "I'm sorry. ".repeat(20);
        assert!(compression_ratio(plain) < 1.5);
        assert!(compression_ratio(&looped) > 2.4);
        assert_eq!(compression_ratio(""), 0.0);
    }
}
