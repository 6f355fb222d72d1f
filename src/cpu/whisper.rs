//! Whisper's choice of the next token, the CPU twin of the
//! `whisper_select_part` and `whisper_select` kernels
//! (`shaders/whisper_select*.wgsl`): openai-whisper's logit filters
//! (suppressed tokens, blank suppression at the start, the timestamp rules)
//! applied to each row of logits, then the row's log-sum-exp, its k
//! likeliest tokens and their log probabilities; and of `whisper_sample`:
//! a token drawn at a temperature from the filtered row. The search
//! (`run::transcribe::decode`) reads only these, so a GPU step reads back
//! a few words a row instead of the 51,864 logits.

/// No token (an unused [`RowRule::probe`]).
pub const NO_TOKEN: u32 = u32::MAX;
/// [`RowRule::flags`]: the row's first sampled token (blank suppression).
pub const ROW_FIRST: u32 = 1;
/// [`RowRule::flags`]: no rules at all (the raw distribution, for the
/// no-speech probability and language detection).
pub const ROW_RAW: u32 = 2;

/// The rules of one row, from the tokens its sequence sampled so far (the
/// search derives them). Bans are ranges of token ids; the token sets of
/// [`SelectRules`] come on top.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct RowRule {
    /// Tokens `0..text_end` are banned.
    pub text_end: u32,
    /// Timestamps `timestamp_begin..ts_from` are banned (they never go back).
    pub ts_from: u32,
    /// Tokens `ts_end..` are banned.
    pub ts_end: u32,
    /// [`ROW_FIRST`], [`ROW_RAW`].
    pub flags: u32,
    /// A token whose log probability is reported ([`NO_TOKEN`]: none).
    pub probe: u32,
    pub _pad: [u32; 3],
}
const _: () = assert!(std::mem::size_of::<RowRule>() == 32);

impl RowRule {
    /// No rules: the model's own distribution.
    pub fn raw(vocab: usize, probe: u32) -> RowRule {
        RowRule {
            text_end: 0,
            ts_from: 0,
            ts_end: vocab as u32,
            flags: ROW_RAW,
            probe,
            _pad: [0; 3],
        }
    }
}

/// What a row's rule depends on in the tokens its sequence sampled: how
/// many (2 stands for more), whether the last two were timestamps, and the
/// last timestamp ([`NO_TOKEN`]: none). [`RuleState::push`] takes one token
/// more, so the device can follow a greedy sequence without the host
/// (`whisper_next`).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct RuleState {
    pub len: u32,
    pub last_is_ts: u32,
    pub penultimate_is_ts: u32,
    pub last_ts: u32,
}
const _: () = assert!(std::mem::size_of::<RuleState>() == 16);

/// The constants of openai-whisper's timestamp rules for one run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TimestampRules {
    pub vocab: u32,
    pub timestamp_begin: u32,
    pub eot: u32,
    /// Timestamps are sampled (false: no rule applies).
    pub timestamps: bool,
    /// The first timestamp is at most this many steps of 0.02 s.
    pub max_initial_timestamp: Option<u32>,
}

impl RuleState {
    /// No token sampled yet.
    pub const EMPTY: RuleState = RuleState {
        len: 0,
        last_is_ts: 0,
        penultimate_is_ts: 0,
        last_ts: NO_TOKEN,
    };

    /// The state after `sampled`.
    pub fn of(sampled: &[u32], timestamp_begin: u32) -> RuleState {
        let mut s = RuleState::EMPTY;
        // Only the last two tokens and the last timestamp count.
        if let Some(&t) = sampled.iter().rev().find(|&&t| t >= timestamp_begin) {
            s.last_ts = t;
        }
        let n = sampled.len();
        s.len = n.min(2) as u32;
        s.last_is_ts = u32::from(n >= 1 && sampled[n - 1] >= timestamp_begin);
        s.penultimate_is_ts = u32::from(n >= 2 && sampled[n - 2] >= timestamp_begin);
        s
    }

    /// The state after one more token.
    pub fn push(&mut self, token: u32, timestamp_begin: u32) {
        self.penultimate_is_ts = self.last_is_ts;
        self.last_is_ts = u32::from(token >= timestamp_begin);
        if token >= timestamp_begin {
            self.last_ts = token;
        }
        self.len = (self.len + 1).min(2);
    }

    /// openai-whisper's logit filters for the next token, as ranges (the
    /// token sets are [`SelectRules`]'): after a closed pair of timestamps
    /// text, after an opened one a timestamp or the end, timestamps never
    /// going back, and at the start a timestamp within the initial limit.
    pub fn rule(&self, t: &TimestampRules) -> RowRule {
        let tb = t.timestamp_begin;
        let mut r = RowRule {
            text_end: 0,
            ts_from: 0,
            ts_end: t.vocab,
            flags: if self.len == 0 { ROW_FIRST } else { 0 },
            probe: NO_TOKEN,
            _pad: [0; 3],
        };
        if !t.timestamps {
            return r;
        }
        let last_was_ts = self.len >= 1 && self.last_is_ts != 0;
        let penultimate_was_ts = self.len < 2 || self.penultimate_is_ts != 0;
        if last_was_ts {
            if penultimate_was_ts {
                // A pair just closed: the next token is text.
                r.ts_end = tb;
            } else {
                // An opened segment ends here or at end of text: no text.
                r.text_end = t.eot;
            }
        }
        if self.last_ts != NO_TOKEN {
            // Timestamps never decrease, and a segment is never empty.
            r.ts_from = if last_was_ts && !penultimate_was_ts {
                self.last_ts
            } else {
                self.last_ts + 1
            };
        }
        if self.len == 0 {
            r.text_end = tb;
            if let Some(max) = t.max_initial_timestamp {
                r.ts_end = r.ts_end.min(tb.saturating_add(max + 1));
            }
        }
        r
    }
}

/// The CPU twin of `whisper_next`: each row's token picked by
/// [`whisper_select`] (`picks`, [`select_words`]`(1)` words a row) goes
/// into its state, and the rule of its next step comes out. The kernel
/// also writes the token's embedding row; here the caller looks it up.
pub fn whisper_next(picks: &[u32], states: &mut [RuleState], t: &TimestampRules) -> Vec<RowRule> {
    states
        .iter_mut()
        .zip(picks.chunks_exact(select_words(1)))
        .map(|(s, w)| {
            s.push(w[4].min(t.vocab - 1), t.timestamp_begin);
            s.rule(t)
        })
        .collect()
}

/// What the rows of a run share.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SelectRules {
    pub vocab: usize,
    pub timestamp_begin: u32,
    /// Take a timestamp when the timestamps together are likelier than
    /// any text token (openai-whisper's rule, with timestamps on).
    pub timestamps: bool,
    /// Two bitmaps of `mask_words(vocab)` words each: tokens never
    /// sampled, then tokens not sampled first (bit t % 32 of word t / 32).
    pub masks: Vec<u32>,
}

/// Words of one token bitmap.
pub fn mask_words(vocab: usize) -> usize {
    vocab.div_ceil(32)
}

/// The two bitmaps of [`SelectRules::masks`] from token lists (ids past
/// the vocabulary are ignored, as openai-whisper's indexing would fail on
/// them only for a broken config).
pub fn token_masks(vocab: usize, always: &[u32], first: &[u32]) -> Vec<u32> {
    let words = mask_words(vocab);
    let mut m = vec![0u32; 2 * words];
    for (set, list) in [always, first].iter().enumerate() {
        for &t in list.iter().filter(|&&t| (t as usize) < vocab) {
            m[set * words + t as usize / 32] |= 1 << (t % 32);
        }
    }
    m
}

/// u32 words [`whisper_select`] writes per row: the probe's log
/// probability (f32 bits), flags ([`ROW_DAMAGED`], [`ROW_TEXT_BANNED`]),
/// the log-sum-exp and the maximum of the filtered row (f32 bits), then k
/// pairs (token, log probability bits).
pub fn select_words(k: usize) -> usize {
    4 + 2 * k
}

/// [`whisper_select`]'s flags: the row's logits hold a NaN or an infinity.
pub const ROW_DAMAGED: u32 = 1;
/// [`whisper_select`]'s flags: the timestamp rule banned every text token.
pub const ROW_TEXT_BANNED: u32 = 2;

fn banned(rules: &SelectRules, rule: &RowRule, t: usize) -> bool {
    if rule.flags & ROW_RAW != 0 {
        return false;
    }
    let words = mask_words(rules.vocab);
    let bit = |set: usize| rules.masks[set * words + t / 32] >> (t % 32) & 1 == 1;
    let t32 = t as u32;
    bit(0)
        || (rule.flags & ROW_FIRST != 0 && bit(1))
        || t32 < rule.text_end
        || (t32 >= rules.timestamp_begin && t32 < rule.ts_from)
        || t32 >= rule.ts_end
}

/// One row's logits after the rules (banned tokens at -inf), and the
/// log-sum-exp of what is left. The timestamp rule compares the
/// timestamps' log-sum-exp with the best text logit, both before the
/// normalisation openai-whisper subtracts from each (the same comparison).
pub fn filter_row(row: &mut [f32], rules: &SelectRules, rule: &RowRule) -> f32 {
    filter(row, rules, rule).0
}

/// [`filter_row`], and whether the timestamp rule banned the text tokens.
fn filter(row: &mut [f32], rules: &SelectRules, rule: &RowRule) -> (f32, bool) {
    let tb = (rules.timestamp_begin as usize).min(row.len());
    let ninf = f32::NEG_INFINITY;
    for (t, v) in row.iter_mut().enumerate() {
        if banned(rules, rule, t) || v.is_nan() {
            *v = ninf;
        }
    }
    let lse = |x: &[f32]| {
        let max = x.iter().copied().fold(ninf, f32::max);
        if max == ninf {
            return ninf;
        }
        max + x.iter().map(|v| (v - max).exp()).sum::<f32>().ln()
    };
    if rules.timestamps && rule.flags & ROW_RAW == 0 {
        let ts_lse = lse(&row[tb..]);
        let text_max = row[..tb].iter().copied().fold(ninf, f32::max);
        if ts_lse > text_max {
            row[..tb].fill(ninf);
            return (ts_lse, true);
        }
    }
    (lse(row), false)
}

/// The log probability of `token` under the row's own distribution (no
/// rules): what [`whisper_select`] reports for a [`RowRule::raw`] probe.
pub fn raw_logprob(row: &[f32], token: u32) -> f32 {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let lse = max + row.iter().map(|v| (v - max).exp()).sum::<f32>().ln();
    row[token as usize] - lse
}

/// For each row of `logits` ([rows.len(), vocab]) under its rule: the
/// probe's log probability, whether the row held a NaN or an infinity and
/// whether text was banned, the filtered row's log-sum-exp and maximum,
/// and the k likeliest tokens (by filtered logit, the lower id first on ties;
/// banned tokens at -inf come last, in id order) with their log
/// probabilities, as [`select_words`] words a row.
pub fn whisper_select(logits: &[f32], rules: &SelectRules, rows: &[RowRule], k: usize) -> Vec<u32> {
    let vocab = rules.vocab;
    assert!(
        logits.len() == rows.len() * vocab && k <= vocab,
        "whisper_select: logits [{}] for {} rows of {vocab}, k {k}",
        logits.len(),
        rows.len()
    );
    assert_eq!(
        rules.masks.len(),
        2 * mask_words(vocab),
        "whisper_select: masks"
    );
    let mut out = Vec::with_capacity(rows.len() * select_words(k));
    for (r, rule) in rows.iter().enumerate() {
        let raw = &logits[r * vocab..(r + 1) * vocab];
        let nonfinite = raw.iter().any(|v| !v.is_finite());
        let mut row = raw.to_vec();
        let (lse, text_banned) = filter(&mut row, rules, rule);
        let probe = match rule.probe {
            NO_TOKEN => f32::NEG_INFINITY,
            t => row[t as usize] - lse,
        };
        let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        out.push(probe.to_bits());
        let damaged = if nonfinite { ROW_DAMAGED } else { 0 };
        let banned = if text_banned { ROW_TEXT_BANNED } else { 0 };
        out.push(damaged | banned);
        out.push(lse.to_bits());
        out.push(max.to_bits());
        let mut top: Vec<usize> = (0..vocab).collect();
        let order = |&a: &usize, &b: &usize| row[b].total_cmp(&row[a]).then(a.cmp(&b));
        if k < vocab {
            top.select_nth_unstable_by(k, order);
        }
        top.truncate(k);
        top.sort_by(order);
        for t in top {
            out.push(t as u32);
            out.push((row[t] - lse).to_bits());
        }
    }
    out
}

/// One row's result, read from [`whisper_select`]'s words (or the kernel's).
#[derive(Clone, Debug, PartialEq)]
pub struct Picked {
    /// The probe's log probability (-inf without a probe).
    pub probe: f32,
    /// The k likeliest tokens, best first, and their log probabilities
    /// (NaN when the row's logits were not all finite: damaged weights
    /// then show in every score).
    pub tokens: Vec<u32>,
    pub logprobs: Vec<f32>,
}

/// Splits the words of `rows` rows into their results.
pub fn read_picks(words: &[u32], k: usize) -> Vec<Picked> {
    words
        .chunks_exact(select_words(k))
        .map(|w| {
            let damaged = w[1] & ROW_DAMAGED != 0;
            let lp = |bits: u32| {
                if damaged {
                    f32::NAN
                } else {
                    f32::from_bits(bits)
                }
            };
            Picked {
                probe: lp(w[0]),
                tokens: w[4..].iter().step_by(2).copied().collect(),
                logprobs: w[5..].iter().step_by(2).map(|&b| lp(b)).collect(),
            }
        })
        .collect()
}

/// What the rows of one [`whisper_sample`] call are drawn under: the run's
/// rules, each row's rule and the temperature (above 0).
#[derive(Clone, Copy, Debug)]
pub struct SampleRules<'a> {
    pub select: &'a SelectRules,
    pub rows: &'a [RowRule],
    pub temperature: f32,
}

/// One draw of [`whisper_sample`]: row `row` of the logits, `u` uniform
/// in [0, 1) (the search's generator). As the GPU reads it: two words.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct Draw {
    pub row: u32,
    pub u: f32,
}

/// A drawn token and its log probability under the filtered row (NaN when
/// the row's logits were not all finite).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sampled {
    pub token: u32,
    pub logprob: f32,
}

/// u32 words the `whisper_sample` kernel writes per draw: the token, its
/// log probability (f32 bits), [`DRAW_ON_CPU`] or 0, and 0.
pub const SAMPLE_WORDS: usize = 4;
/// The kernel could not be sure of the CPU's choice: draw on the CPU.
pub const DRAW_ON_CPU: u32 = 1;

/// For each draw, a token drawn from softmax(row / temperature) of its
/// row's logits ([rules.rows.len(), vocab]) under the row's rule: the filtered
/// weights exp((x - max) / temperature) in f64, walked in token order
/// until u times their sum is spent. The GPU's `whisper_sample` makes the
/// same choice or hands the draw back to this function.
pub fn whisper_sample(logits: &[f32], rules: &SampleRules, draws: &[Draw]) -> Vec<Sampled> {
    let SampleRules {
        select: rules,
        rows,
        temperature,
    } = *rules;
    let vocab = rules.vocab;
    assert!(
        logits.len() == rows.len() * vocab && temperature > 0.0,
        "whisper_sample: logits [{}] for {} rows of {vocab}, temperature {temperature}",
        logits.len(),
        rows.len()
    );
    draws
        .iter()
        .map(|d| {
            let r = d.row as usize;
            let mut row = logits[r * vocab..(r + 1) * vocab].to_vec();
            let damaged = row.iter().any(|v| !v.is_finite());
            let lse = filter_row(&mut row, rules, &rows[r]);
            let token = sample(&row, temperature, d.u);
            Sampled {
                token: token as u32,
                logprob: if damaged { f32::NAN } else { row[token] - lse },
            }
        })
        .collect()
}

/// The token drawn from softmax(logits / temperature) by `u` in [0, 1).
pub fn sample(logits: &[f32], temperature: f32, u: f32) -> usize {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let weights: Vec<f64> = logits
        .iter()
        .map(|&l| (((l - max) / temperature) as f64).exp())
        .collect();
    let total: f64 = weights.iter().sum();
    let mut u = u as f64 * total;
    for (i, w) in weights.iter().enumerate() {
        if u < *w {
            return i;
        }
        u -= w;
    }
    argmax(logits)
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A state pushed token by token is the state of the whole sequence,
    /// and its rules are openai-whisper's: after a closed pair text, after
    /// an opened one a timestamp or the end, never an earlier timestamp, at
    /// the start a timestamp within the initial limit.
    #[test]
    fn rule_states_follow_the_sampled_tokens() {
        let t = TimestampRules {
            vocab: 1100,
            timestamp_begin: 1000,
            eot: 900,
            timestamps: true,
            max_initial_timestamp: Some(50),
        };
        let seq = [1000, 5, 7, 1010, 1010, 8, 1020, 9];
        let mut s = RuleState::EMPTY;
        for n in 0..=seq.len() {
            assert_eq!(s, RuleState::of(&seq[..n], 1000), "after {n} tokens");
            if n < seq.len() {
                s.push(seq[n], 1000);
            }
        }
        let rule = |sampled: &[u32]| RuleState::of(sampled, 1000).rule(&t);
        let first = rule(&[]);
        assert_eq!(
            (first.text_end, first.ts_end, first.flags),
            (1000, 1051, ROW_FIRST)
        );
        // Text after an opened segment: a later timestamp may close it.
        let r = rule(&[1000, 5]);
        assert_eq!((r.text_end, r.ts_from, r.ts_end), (0, 1001, 1100));
        // A segment opened at 1010 closes at 1010 or later, or ends: no text.
        let r = rule(&[1000, 5, 1010]);
        assert_eq!((r.text_end, r.ts_from, r.ts_end), (900, 1010, 1100));
        // A pair just closed: text next.
        let r = rule(&[1000, 5, 1010, 1010]);
        assert_eq!((r.text_end, r.ts_from, r.ts_end), (0, 1011, 1000));
        let off = TimestampRules {
            timestamps: false,
            ..t
        };
        let r = RuleState::of(&[1000, 5, 1010], 1000).rule(&off);
        assert_eq!((r.text_end, r.ts_from, r.ts_end), (0, 0, 1100));
    }

    fn rules(vocab: usize, tb: u32, always: &[u32], first: &[u32]) -> SelectRules {
        SelectRules {
            vocab,
            timestamp_begin: tb,
            timestamps: true,
            masks: token_masks(vocab, always, first),
        }
    }

    fn open(vocab: usize) -> RowRule {
        RowRule {
            text_end: 0,
            ts_from: 0,
            ts_end: vocab as u32,
            flags: 0,
            probe: NO_TOKEN,
            _pad: [0; 3],
        }
    }

    #[test]
    fn bans_and_order() {
        // Text 0..6, timestamps 6..10.
        let r = rules(10, 6, &[2], &[0]);
        let logits = [5.0, 1.0, 9.0, 3.0, 3.0, 0.0, -1.0, -2.0, -3.0, -4.0];
        let first = RowRule {
            flags: ROW_FIRST,
            ..open(10)
        };
        let got = read_picks(&whisper_select(&logits, &r, &[first], 3), 3);
        // 2 is always banned, 0 at the first token; 3 and 4 tie: 3 first.
        assert_eq!(got[0].tokens, vec![3, 4, 1]);
        let lse = filter_row(&mut logits.to_vec(), &r, &first);
        assert_eq!(got[0].logprobs[0], 3.0 - lse);
        // Timestamps likelier than any text token: text is banned and the
        // log probabilities are over the timestamps alone.
        let ts = [0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.5, 0.5, 0.0, 0.0];
        let got = read_picks(&whisper_select(&ts, &r, &[open(10)], 2), 2);
        assert_eq!(got[0].tokens, vec![6, 7]);
        let sum: f32 = [0.5f32, 0.5, 0.0, 0.0].iter().map(|v| v.exp()).sum();
        assert!((got[0].logprobs[0] - (0.5 - sum.ln())).abs() < 1e-6);
        // Ranges: text below 5 and timestamps below 8 banned.
        let ranged = RowRule {
            text_end: 5,
            ts_from: 8,
            ..open(10)
        };
        let got = read_picks(&whisper_select(&logits, &r, &[ranged], 3), 3);
        assert_eq!(got[0].tokens, vec![5, 8, 9]);
        // Raw: no rules, and the probe's probability.
        let got = read_picks(&whisper_select(&logits, &r, &[RowRule::raw(10, 2)], 1), 1);
        assert_eq!(got[0].tokens, vec![2]);
        let z: f32 = logits.iter().map(|v| (v - 9.0).exp()).sum();
        assert!((got[0].probe - (-z.ln())).abs() < 1e-6);
    }

    #[test]
    fn sampling_follows_the_distribution() {
        let mut rng = crate::util::rng::Rng::new(3);
        let logits = [0.0f32, 2.0_f32.ln(), f32::NEG_INFINITY];
        let mut counts = [0; 3];
        for _ in 0..3000 {
            counts[sample(&logits, 1.0, rng.next_f32())] += 1;
        }
        assert_eq!(counts[2], 0, "a suppressed token was sampled");
        let ratio = counts[1] as f32 / counts[0] as f32;
        assert!((1.7..2.3).contains(&ratio), "{counts:?}");
    }

    #[test]
    fn damaged_logits_poison_the_scores() {
        let r = rules(4, 4, &[], &[]);
        let got = read_picks(
            &whisper_select(&[1.0, f32::NAN, 0.0, 2.0], &r, &[open(4)], 1),
            1,
        );
        assert_eq!(got[0].tokens, vec![3]);
        assert!(got[0].logprobs[0].is_nan());
    }
}
