//! Choosing the next token from logits. The chain follows llama.cpp's default
//! order: logit bias, penalties (repetition, frequency, presence), the
//! grammar's mask, top-k, top-p, min-p, temperature, then a draw from the
//! seeded generator. Temperature 0 is greedy (argmax after bias, penalties
//! and mask).

use crate::error::{Error, Result};
use crate::grammar::Constraint;
use crate::util::rng::Rng;
use serde::Serialize;
use std::rc::Rc;

#[derive(Clone, Debug)]
pub struct SamplingOptions {
    /// 0 = greedy.
    pub temperature: f32,
    /// 0 = off.
    pub top_k: usize,
    /// 1.0 = off.
    pub top_p: f32,
    /// 0.0 = off.
    pub min_p: f32,
    /// 1.0 = off. Applied to tokens among the last `repeat_last_n`.
    pub repeat_penalty: f32,
    /// 0.0 = off. Subtracted once from the logit of every token among the
    /// last `repeat_last_n` (llama.cpp's `penalty_present`).
    pub presence_penalty: f32,
    /// 0.0 = off. Subtracted from a token's logit once per occurrence among
    /// the last `repeat_last_n` (llama.cpp's `penalty_freq`).
    pub frequency_penalty: f32,
    /// How many of the latest tokens the penalties look at (0 = none).
    pub repeat_last_n: usize,
    /// Added to the logits of the given token ids before anything else.
    pub logit_bias: Vec<(u32, f32)>,
    /// Record each chosen token's log probability and the `n` most likely
    /// tokens' (None = off).
    pub logprobs: Option<usize>,
    pub seed: u64,
}

/// A chosen token's log probability under the model (log-softmax of the raw
/// logits, before bias, penalties, grammar and temperature, as llama.cpp's
/// server reports by default), and the most likely tokens'.
#[derive(Clone, Debug, Serialize)]
pub struct TokenLogprob {
    pub id: u32,
    pub logprob: f32,
    /// (id, log probability), most likely first.
    pub top: Vec<(u32, f32)>,
}

impl Default for SamplingOptions {
    fn default() -> Self {
        SamplingOptions {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            repeat_penalty: 1.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            repeat_last_n: 64,
            logit_bias: Vec::new(),
            logprobs: None,
            seed: 0,
        }
    }
}

pub struct Sampler {
    opts: SamplingOptions,
    rng: Rng,
    constraint: Option<Constraint>,
    /// Always mask the whole vocabulary ([`Sampler::set_full_mask`]).
    full_mask: bool,
    /// What went wrong in the constraint, for the generation loop to report.
    error: Option<Error>,
    logprobs: Vec<TokenLogprob>,
    /// The unsorted draw's weights, kept between draws (a fresh
    /// vocabulary-sized buffer a token cost page faults).
    weights: Vec<f32>,
}

use crate::cpu::activation::exp_poly;
pub use crate::cpu::argmax;

impl Sampler {
    pub fn new(opts: SamplingOptions) -> Sampler {
        let rng = Rng::new(opts.seed);
        Sampler {
            opts,
            rng,
            constraint: None,
            full_mask: false,
            error: None,
            logprobs: Vec::new(),
            weights: Vec::new(),
        }
    }

    /// Masks every token `constraint` does not allow from now on.
    pub fn set_constraint(&mut self, constraint: Constraint) {
        self.constraint = Some(constraint);
    }

    /// `true` computes the grammar's mask over the whole vocabulary at
    /// every step, even where checking the most likely tokens alone settles
    /// the draw: the reference the faster path is tested and measured
    /// against (the draw is the same either way).
    pub fn set_full_mask(&mut self, on: bool) {
        self.full_mask = on;
    }

    /// The constraint has matched a whole output and nothing can follow.
    pub fn is_finished(&self) -> bool {
        self.constraint
            .as_ref()
            .is_some_and(Constraint::is_finished)
    }

    /// An error of the constraint (a dead end), taken once.
    pub fn take_error(&mut self) -> Option<Error> {
        self.error.take()
    }

    /// The log probabilities recorded so far, one per token chosen.
    pub fn take_logprobs(&mut self) -> Vec<TokenLogprob> {
        std::mem::take(&mut self.logprobs)
    }

    /// Whether the logits pass to the draw unchanged (no bias, penalty or
    /// constraint) and nothing needs all of them (log probabilities).
    fn plain(&self) -> bool {
        self.unbiased() && self.constraint.is_none()
    }

    /// [`Sampler::plain`] but for a grammar: no bias or penalty moves a
    /// logit, nothing needs all of them.
    fn unbiased(&self) -> bool {
        self.moves_no_logit() && self.opts.logprobs.is_none()
    }

    /// No bias or penalty moves a logit.
    fn moves_no_logit(&self) -> bool {
        let penalised = self.opts.repeat_last_n > 0
            && (self.opts.repeat_penalty != 1.0
                || self.opts.presence_penalty != 0.0
                || self.opts.frequency_penalty != 0.0);
        !penalised && self.opts.logit_bias.is_empty()
    }

    pub fn options(&self) -> &SamplingOptions {
        &self.opts
    }

    /// True when the choice depends only on the logits' argmax, so a GPU
    /// path may compute it on the device and read back one id.
    pub fn is_greedy(&self) -> bool {
        self.opts.temperature <= 0.0 && self.plain()
    }

    /// The next draw as the GPU can make it where the logits are
    /// (`sample_rows`), when it is the one [`Sampler::sample`] makes there
    /// ([`draw_unsorted`]): a plain sampler (no bias, penalty, grammar or
    /// log probabilities), greedy ([`Draw::GREEDY`]) or without top-k and
    /// top-p; its uniform is taken from the seeded generator as `sample`
    /// takes it. None otherwise, and nothing is taken. The token drawn is
    /// then taken with [`Sampler::accept`].
    pub fn device_draw(&mut self) -> Option<Draw> {
        if !self.draws_on_device() {
            return None;
        }
        Some(if self.opts.temperature <= 0.0 {
            Draw::GREEDY
        } else {
            Draw::sampled(self.rng.next_f32(), &self.opts)
        })
    }

    /// Whether [`Sampler::device_draw`] gives a draw (nothing is taken).
    pub fn draws_on_device(&self) -> bool {
        self.plain()
            && (self.opts.temperature <= 0.0 || (self.opts.top_k == 0 && self.opts.top_p >= 1.0))
    }

    /// True when the choice is the argmax among the tokens a grammar allows
    /// and nothing else moves it: a backend may then apply the grammar's
    /// mask ([`Sampler::token_mask`]) to the logits where they are (the
    /// GPU) and take the argmax there. Not with [`Sampler::set_full_mask`],
    /// the reference that path is tested against.
    pub fn is_guided_greedy(&self) -> bool {
        self.opts.temperature <= 0.0 && self.masks_alone()
    }

    /// With a grammar, the draw depends on the masked logits' `k` most
    /// likely tokens alone (top-k sampling, no bias or penalty): a backend
    /// may select them under the grammar's mask ([`Sampler::token_mask`])
    /// and draw with [`Sampler::sample_top_masked`]. Returns that k.
    pub fn masked_candidates_needed(&self) -> Option<usize> {
        (self.opts.temperature > 0.0 && self.opts.top_k > 0 && self.masks_alone())
            .then_some(self.opts.top_k)
    }

    /// A grammar decides, nothing else moves a logit, and the full mask is
    /// not asked for.
    fn masks_alone(&self) -> bool {
        self.unbiased() && self.constraint.is_some() && !self.full_mask
    }

    /// The tokens the grammar allows next as a bitmap (bit `id % 32` of word
    /// `id / 32`, [`Constraint::mask_bits`]); None without a grammar, an
    /// error when it allows no token.
    pub fn token_mask(&mut self) -> Result<Option<Rc<Vec<u32>>>> {
        let Some(c) = self.constraint.as_mut() else {
            return Ok(None);
        };
        let bits = c.mask_bits();
        if bits.iter().all(|&w| w == 0) {
            return Err(no_token_allowed());
        }
        Ok(Some(bits))
    }

    /// The draw [`Sampler::sample`] makes when
    /// [`Sampler::masked_candidates_needed`] holds, given the most likely
    /// tokens the grammar allows (at least that many, or all allowed), in
    /// `cpu::top_k`'s order; committed.
    pub fn sample_top_masked(&mut self, candidates: Vec<(u32, f32)>) -> Result<u32> {
        assert!(
            self.masked_candidates_needed().is_some(),
            "sample_top_masked: this draw needs every logit"
        );
        if candidates.is_empty() {
            return Err(no_token_allowed());
        }
        let token = self.sample_sorted(candidates);
        self.commit(&[], token);
        Ok(token)
    }

    /// Takes `token` as chosen without logits at hand (the guided greedy
    /// path, [`Sampler::is_guided_greedy`], records no log probabilities):
    /// the grammar moves past it.
    pub fn accept(&mut self, token: u32) {
        debug_assert!(
            self.opts.logprobs.is_none(),
            "accept: logprobs need the logits"
        );
        self.commit(&[], token);
    }

    /// Picks the next token given the logits and the tokens so far.
    pub fn sample(&mut self, logits: &[f32], history: &[u32]) -> u32 {
        if let Some(token) = self.sample_unmasked(logits, history) {
            self.commit(logits, token);
            return token;
        }
        let adjusted = if self.moves_no_logit() && self.constraint.is_none() {
            std::borrow::Cow::Borrowed(logits)
        } else {
            std::borrow::Cow::Owned(self.adjust(logits, history))
        };
        let token = if self.opts.temperature <= 0.0 {
            argmax(&adjusted) as u32
        } else if self.opts.top_k == 0 {
            self.sample_unsorted(&adjusted)
        } else {
            let cand = finite_sorted(&adjusted, self.opts.top_k);
            self.sample_sorted(cand)
        };
        self.commit(logits, token);
        token
    }

    /// The draw without top-k, without sorting the vocabulary (a sort of
    /// every logit per token was most of a sampled step's host time): top-p
    /// sorts only as many of the most likely tokens as its nucleus needs;
    /// otherwise [`draw_unsorted`], the draw the GPU makes too. Same
    /// distribution as [`Sampler::sample_sorted`] over every token, other
    /// draws.
    fn sample_unsorted(&mut self, logits: &[f32]) -> u32 {
        let max = finite_max(logits);
        if max == f32::NEG_INFINITY {
            // Nothing finite: what the sorted draw falls back to.
            return finite_sorted(logits, 1)[0].0;
        }
        if self.opts.top_p < 1.0 {
            let nucleus = self.nucleus(logits, max);
            let (cand, p) = self.finish_sorted(nucleus);
            return self.draw_in_order(&cand, &p);
        }
        let draw = Draw::sampled(self.rng.next_f32(), &self.opts);
        draw_unsorted(logits, max, draw, &mut self.weights)
    }

    /// The most likely tokens whose probability (over every finite logit,
    /// `max` the largest) first reaches top-p, most likely first: the m
    /// most likely are selected and sorted, m growing until they do.
    fn nucleus(&self, logits: &[f32], max: f32) -> Vec<(u32, f32)> {
        let total: f64 = logits
            .iter()
            .filter(|l| l.is_finite())
            .map(|&l| ((l - max) as f64).exp())
            .sum();
        let mut m = 256.min(logits.len());
        loop {
            let cand = finite_sorted(logits, m);
            let mut cum = 0.0;
            for (i, c) in cand.iter().enumerate() {
                cum += ((c.1 - max) as f64).exp() / total;
                if cum >= self.opts.top_p as f64 {
                    return cand[..=i].to_vec();
                }
            }
            if cand.len() < m || m == logits.len() {
                return cand;
            }
            m = (m * 16).min(logits.len());
        }
    }

    /// With a grammar, the draw [`Sampler::sample`] makes, found without
    /// the grammar's mask over the whole vocabulary where the draw depends
    /// only on the most likely tokens: greedy, the argmax if the grammar
    /// allows it; with top-k, the first k allowed tokens among the 4k most
    /// likely, each checked alone ([`Constraint::allows`]), else the k most
    /// likely of the tokens the mask allows. None when that does not settle
    /// it (then the full mask is applied to the logits).
    fn sample_unmasked(&mut self, logits: &[f32], history: &[u32]) -> Option<u32> {
        self.constraint.as_ref()?;
        if self.full_mask {
            return None;
        }
        let greedy = self.opts.temperature <= 0.0;
        if !greedy && self.opts.top_k == 0 {
            return None;
        }
        let mut adjusted = logits.to_vec();
        for &(id, bias) in &self.opts.logit_bias {
            if let Some(l) = adjusted.get_mut(id as usize) {
                *l += bias;
            }
        }
        self.penalise(&mut adjusted, history);
        let c = self.constraint.as_mut().expect("checked above");
        if greedy {
            let t = argmax(&adjusted) as u32;
            return (adjusted[t as usize] > f32::NEG_INFINITY && c.allows(t)).then_some(t);
        }
        let k = self.opts.top_k;
        let wide = crate::cpu::top_k(&adjusted, (4 * k).min(adjusted.len()));
        let mut allowed = Vec::with_capacity(k);
        for &(id, l) in &wide {
            if l == f32::NEG_INFINITY || allowed.len() == k {
                break;
            }
            if c.allows(id) {
                allowed.push((id, l));
            }
        }
        // Fewer than k allowed among them (a restrictive state: right after
        // `{` or `,`, inside a key): the k come from the grammar's mask
        // (kept per state), taken from the allowed tokens alone rather than
        // from a masked copy of the whole vocabulary.
        if allowed.len() < k {
            let mask = c.mask();
            allowed = mask
                .iter()
                .enumerate()
                .filter(|&(id, &ok)| ok && id < adjusted.len())
                .map(|(id, _)| (id as u32, adjusted[id]))
                .filter(|&(_, l)| l > f32::NEG_INFINITY)
                .collect();
            if allowed.is_empty() {
                // The full path reports the dead end.
                return None;
            }
            allowed.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
            allowed.truncate(k);
        }
        Some(self.sample_sorted(allowed))
    }

    /// The logits after bias, penalties and the grammar's mask.
    fn adjust(&mut self, logits: &[f32], history: &[u32]) -> Vec<f32> {
        let mut logits = logits.to_vec();
        for &(id, bias) in &self.opts.logit_bias {
            if let Some(l) = logits.get_mut(id as usize) {
                *l += bias;
            }
        }
        self.penalise(&mut logits, history);
        if let Some(c) = self.constraint.as_mut() {
            let mask = c.mask();
            for (l, &ok) in logits.iter_mut().zip(mask.iter()) {
                if !ok {
                    *l = f32::NEG_INFINITY;
                }
            }
            if mask.len() < logits.len() {
                logits[mask.len()..].fill(f32::NEG_INFINITY);
            }
            if !mask.iter().any(|&ok| ok) {
                self.error = Some(no_token_allowed());
            }
        }
        logits
    }

    /// Takes `token` as the one chosen after the model's `raw` logits: the
    /// grammar moves past it and its log probability is recorded. What
    /// [`Sampler::sample`] does after its draw; for callers that choose by
    /// other means ([`Sampler::distribution`], speculative decoding).
    pub fn commit(&mut self, raw: &[f32], token: u32) {
        if let Some(c) = self.constraint.as_mut() {
            if self.error.is_none() {
                if let Err(e) = c.accept(token) {
                    self.error = Some(e);
                }
            }
        }
        if let Some(n) = self.opts.logprobs {
            self.logprobs.push(logprob(raw, token, n));
        }
    }

    /// The distribution [`Sampler::sample`] draws from: (id, probability)
    /// of every token it can pick, most likely first, summing to 1 (the
    /// argmax alone when greedy). Nothing is committed.
    pub fn distribution(&mut self, logits: &[f32], history: &[u32]) -> Vec<(u32, f32)> {
        let adjusted = self.adjust(logits, history);
        if self.opts.temperature <= 0.0 {
            return vec![(argmax(&adjusted) as u32, 1.0)];
        }
        let (cand, p) = self.filter_sorted(finite_sorted(&adjusted, self.opts.top_k));
        cand.into_iter()
            .zip(p)
            .map(|((id, _), p)| (id, p))
            .collect()
    }

    /// A uniform draw from [0, 1) of the seeded generator.
    pub fn uniform(&mut self) -> f32 {
        self.rng.next_f32()
    }

    /// A draw from `dist` ((id, weight) pairs; weights need not sum to 1).
    pub fn draw(&mut self, dist: &[(u32, f32)]) -> u32 {
        let total: f32 = dist.iter().map(|d| d.1).sum();
        let r = self.rng.next_f32() * total;
        let mut cum = 0.0;
        for &(id, p) in dist {
            cum += p;
            if r < cum {
                return id;
            }
        }
        dist.last().expect("a non-empty distribution").0
    }

    /// Repetition, frequency and presence penalties over the last
    /// `repeat_last_n` tokens, as llama.cpp's `llama_sampler_init_penalties`:
    /// the repetition penalty divides a positive logit (multiplies a
    /// negative one), then `count * frequency + presence` is subtracted.
    fn penalise(&self, logits: &mut [f32], history: &[u32]) {
        let o = &self.opts;
        if o.repeat_last_n == 0
            || (o.repeat_penalty == 1.0 && o.presence_penalty == 0.0 && o.frequency_penalty == 0.0)
        {
            return;
        }
        let start = history.len().saturating_sub(o.repeat_last_n);
        let mut counts: std::collections::HashMap<usize, u32> = std::collections::HashMap::new();
        for &t in &history[start..] {
            *counts.entry(t as usize).or_default() += 1;
        }
        for (t, n) in counts {
            let Some(l) = logits.get_mut(t) else { continue };
            *l = if *l <= 0.0 {
                *l * o.repeat_penalty
            } else {
                *l / o.repeat_penalty
            };
            *l -= n as f32 * o.frequency_penalty + o.presence_penalty;
        }
    }

    /// When the draw depends only on the `k` most likely tokens (sampling
    /// with top-k on and no repetition penalty), returns that k: a backend
    /// can then read back only the top candidates (see [`Sampler::sample_top`]).
    pub fn candidates_needed(&self) -> Option<usize> {
        (self.opts.temperature > 0.0 && self.plain() && self.opts.top_k > 0)
            .then_some(self.opts.top_k)
    }

    /// The draw [`Sampler::sample`] makes from the full logits, given only
    /// the most likely tokens as `cpu::top_k` orders them (by logit,
    /// descending, ties to the lower id), at least
    /// [`Sampler::candidates_needed`] of them.
    pub fn sample_top(&mut self, candidates: Vec<(u32, f32)>) -> u32 {
        assert!(
            self.candidates_needed().is_some(),
            "sample_top: this draw needs every logit"
        );
        self.sample_sorted(candidates)
    }

    /// Top-k, top-p, min-p, temperature and the draw over candidates sorted
    /// by logit, descending.
    fn sample_sorted(&mut self, cand: Vec<(u32, f32)>) -> u32 {
        let (cand, p) = self.filter_sorted(cand);
        self.draw_in_order(&cand, &p)
    }

    /// A draw from candidates with probabilities `p`, in their order.
    fn draw_in_order(&mut self, cand: &[(u32, f32)], p: &[f32]) -> u32 {
        let r = self.rng.next_f32();
        let mut cum = 0.0;
        for (c, pi) in cand.iter().zip(p) {
            cum += pi;
            if r < cum {
                return c.0;
            }
        }
        cand.last().expect("at least one candidate").0
    }

    /// Top-k, top-p, min-p and temperature over candidates sorted by logit,
    /// descending: the candidates left and their probabilities.
    fn filter_sorted(&self, mut cand: Vec<(u32, f32)>) -> (Vec<(u32, f32)>, Vec<f32>) {
        if self.opts.top_k > 0 {
            cand.truncate(self.opts.top_k.max(1));
        }
        if self.opts.top_p < 1.0 {
            let p = probs(&cand);
            let mut cum = 0.0;
            let mut keep = cand.len();
            for (i, pi) in p.iter().enumerate() {
                cum += pi;
                if cum >= self.opts.top_p {
                    keep = i + 1;
                    break;
                }
            }
            cand.truncate(keep);
        }
        self.finish_sorted(cand)
    }

    /// Min-p and temperature over candidates sorted by logit, descending,
    /// after top-k and top-p: the candidates left and their probabilities.
    fn finish_sorted(&self, mut cand: Vec<(u32, f32)>) -> (Vec<(u32, f32)>, Vec<f32>) {
        if self.opts.min_p > 0.0 {
            let p = probs(&cand);
            let floor = p[0] * self.opts.min_p;
            let keep = p.iter().take_while(|&&pi| pi >= floor).count().max(1);
            cand.truncate(keep);
        }
        for c in cand.iter_mut() {
            c.1 /= self.opts.temperature;
        }
        let p = probs(&cand);
        (cand, p)
    }
}

/// How a draw without sorting picks a token from one row of logits, the
/// same on the CPU ([`draw_unsorted`]) and the GPU (`sample_rows`): `u`
/// uniform in [0, 1), `inv_t` 1 / temperature, `cut` min-p's threshold
/// below the largest logit (ln min_p; -inf for none); `sampled` false for
/// the argmax instead.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Draw {
    pub u: f32,
    pub inv_t: f32,
    pub cut: f32,
    pub sampled: bool,
}

impl Draw {
    /// The argmax (the first on ties).
    pub const GREEDY: Draw = Draw {
        u: 0.0,
        inv_t: 1.0,
        cut: f32::NEG_INFINITY,
        sampled: false,
    };

    fn sampled(u: f32, o: &SamplingOptions) -> Draw {
        Draw {
            u,
            inv_t: 1.0 / o.temperature,
            // Min-p keeps p >= min_p * p_max, that is l >= max + ln(min_p).
            cut: if o.min_p > 0.0 {
                o.min_p.ln()
            } else {
                f32::NEG_INFINITY
            },
            sampled: true,
        }
    }

    /// As the GPU kernel reads it: (u, inv_t, cut, 1 sampled / 0 argmax).
    pub fn to_gpu(self) -> [f32; 4] {
        [
            self.u,
            self.inv_t,
            self.cut,
            if self.sampled { 1.0 } else { 0.0 },
        ]
    }
}

/// Interleaved blocks of the unsorted draw: block b holds the tokens
/// b, b + 256, b + 512, ... (one GPU thread's, read coalesced).
pub const DRAW_BLOCKS: usize = 256;

/// The unsorted draw of one row (`max` its largest finite logit): weights
/// w = e^((l - max) inv_t) ([`exp_poly`], with FMA) for the finite logits at
/// or above max + cut, summed per block in token order, the blocks' sums in
/// block order; r = u x total; the token where the running sum (blocks,
/// then the block's tokens) first passes r. All in f32 and in that order,
/// as the GPU computes it, so both draw the same token but where their
/// logits or a rounding of the exponential differ at a boundary.
pub fn draw_unsorted(logits: &[f32], max: f32, draw: Draw, weights: &mut Vec<f32>) -> u32 {
    if !draw.sampled {
        return argmax(logits) as u32;
    }
    let cut = max + draw.cut;
    weights.clear();
    weights.resize(logits.len(), 0.0);
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
        // SAFETY: the CPU has AVX2 and FMA (checked above).
        unsafe { draw_weights_fma(logits, max, cut, draw.inv_t, weights) };
    } else {
        draw_weights::<false>(logits, max, cut, draw.inv_t, weights);
    }
    #[cfg(not(target_arch = "x86_64"))]
    draw_weights::<false>(logits, max, cut, draw.inv_t, weights);
    let mut sums = [0.0f32; DRAW_BLOCKS];
    for c in weights.chunks(DRAW_BLOCKS) {
        for (s, &w) in sums.iter_mut().zip(c) {
            *s += w;
        }
    }
    let total: f32 = sums.iter().fold(0.0, |a, &s| a + s);
    let r = draw.u * total;
    let mut cum = 0.0f32;
    let mut last = None;
    for (b, &s) in sums.iter().enumerate() {
        if s > 0.0 {
            last = Some(b);
            if r < cum + s {
                break;
            }
            cum += s;
        }
    }
    let Some(b) = last else {
        return argmax(logits) as u32;
    };
    let mut pick = b;
    for j in (b..logits.len()).step_by(DRAW_BLOCKS) {
        if weights[j] > 0.0 {
            pick = j;
            cum += weights[j];
            if r < cum {
                break;
            }
        }
    }
    pick as u32
}

/// The largest finite logit (-inf where none is), in 8 lanes (the loop
/// vectorises).
pub fn finite_max(logits: &[f32]) -> f32 {
    let mut lanes = [f32::NEG_INFINITY; 8];
    for c in logits.chunks(8) {
        for (m, &v) in lanes.iter_mut().zip(c) {
            let v = if v.is_finite() { v } else { f32::NEG_INFINITY };
            *m = m.max(v);
        }
    }
    lanes.into_iter().fold(f32::NEG_INFINITY, f32::max)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn draw_weights_fma(logits: &[f32], max: f32, cut: f32, inv_t: f32, weights: &mut [f32]) {
    draw_weights::<true>(logits, max, cut, inv_t, weights)
}

/// [`draw_unsorted`]'s weights (the loop vectorises); FMA: whether
/// `mul_add` is one instruction.
#[inline(always)]
fn draw_weights<const FMA: bool>(
    logits: &[f32],
    max: f32,
    cut: f32,
    inv_t: f32,
    weights: &mut [f32],
) {
    for (w, &l) in weights.iter_mut().zip(logits) {
        let e = exp_poly::<FMA>((l - max) * inv_t);
        *w = if l.is_finite() && l >= cut { e } else { 0.0 };
    }
}

/// The probabilities of candidates sorted by logit, descending.
fn probs(c: &[(u32, f32)]) -> Vec<f32> {
    let max = c[0].1;
    let e: Vec<f32> = c.iter().map(|(_, l)| (l - max).exp()).collect();
    let s: f32 = e.iter().sum();
    e.into_iter().map(|v| v / s).collect()
}

fn no_token_allowed() -> Error {
    Error::invalid("the grammar allows no token of the vocabulary here")
}

/// The tokens with a finite logit, sorted by logit (descending, ties to
/// the lower id), the first `top_k` only (0: all); at least one.
fn finite_sorted(logits: &[f32], top_k: usize) -> Vec<(u32, f32)> {
    let k = if top_k == 0 {
        logits.len()
    } else {
        top_k.min(logits.len())
    };
    let mut cand = crate::cpu::top_k(logits, k);
    // Masked tokens (-inf) are never drawn.
    let finite = cand.iter().take_while(|c| c.1 > f32::NEG_INFINITY).count();
    cand.truncate(finite.max(1));
    cand
}

/// Log-softmax of `logits` at `token`, and the `n` most likely tokens'.
fn logprob(logits: &[f32], token: u32, n: usize) -> TokenLogprob {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f64 = logits.iter().map(|&l| ((l - max) as f64).exp()).sum();
    let log_z = max as f64 + sum.ln();
    let lp = |l: f32| (l as f64 - log_z) as f32;
    let top = if n == 0 {
        Vec::new()
    } else {
        crate::cpu::top_k(logits, n.min(logits.len()))
    };
    TokenLogprob {
        id: token,
        logprob: logits
            .get(token as usize)
            .map_or(f32::NEG_INFINITY, |&l| lp(l)),
        top: top.into_iter().map(|(id, l)| (id, lp(l))).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(temperature: f32) -> SamplingOptions {
        SamplingOptions {
            temperature,
            seed: 42,
            ..Default::default()
        }
    }

    #[test]
    fn greedy_is_argmax() {
        let mut s = Sampler::new(opts(0.0));
        assert_eq!(s.sample(&[0.1, 3.0, -1.0, 2.9], &[]), 1);
    }

    #[test]
    fn repeat_penalty_changes_greedy_choice() {
        let mut s = Sampler::new(SamplingOptions {
            repeat_penalty: 2.0,
            ..opts(0.0)
        });
        assert_eq!(s.sample(&[0.1, 3.0, -1.0, 2.9], &[1]), 3);
    }

    #[test]
    fn same_seed_same_draws() {
        let logits: Vec<f32> = (0..50).map(|i| ((i * 37) % 11) as f32 * 0.3).collect();
        let draw = || {
            let mut s = Sampler::new(opts(1.0));
            (0..20).map(|_| s.sample(&logits, &[])).collect::<Vec<_>>()
        };
        assert_eq!(draw(), draw());
    }

    #[test]
    fn top_k_one_is_greedy() {
        let mut s = Sampler::new(SamplingOptions {
            top_k: 1,
            ..opts(5.0)
        });
        for _ in 0..20 {
            assert_eq!(s.sample(&[0.0, 1.0, 0.5], &[]), 1);
        }
    }

    #[test]
    fn top_p_and_min_p_cut_the_tail() {
        // p = softmax([10, 9, 0, 0]): the last two are ~1e-4 each.
        let logits = [10.0, 9.0, 0.0, 0.0];
        let mut s = Sampler::new(SamplingOptions {
            top_p: 0.9,
            ..opts(1.0)
        });
        let mut t = Sampler::new(SamplingOptions {
            min_p: 0.05,
            ..opts(1.0)
        });
        for _ in 0..200 {
            assert!(s.sample(&logits, &[]) < 2);
            assert!(t.sample(&logits, &[]) < 2);
        }
    }

    /// The draw without top-k (no sort of the vocabulary) keeps the sorted
    /// draw's distribution: frequencies over many draws against the
    /// probabilities [`Sampler::distribution`] gives, with and without
    /// min-p; top-p's nucleus, found by growing selections, is the sorted
    /// candidates' (up to the token where the sums' rounding decides).
    #[test]
    fn unsorted_draw_follows_the_sorted_distribution() {
        // 5,000 tokens, a few likely ones among a long tail of distinct
        // logits, so that top-p's nucleus needs more than the first
        // selection of 256.
        let logits: Vec<f32> = (0..5000u32)
            .map(|i| match i % 997 {
                0 => 6.0 + i as f32 * 1e-4,
                1 => 4.5 + i as f32 * 1e-4,
                _ => ((i * 7919) % 4999) as f32 * 2e-4,
            })
            .collect();
        for (top_p, min_p) in [(1.0, 0.0), (1.0, 0.02), (0.5, 0.0), (0.9, 0.0)] {
            let o = SamplingOptions {
                top_p,
                min_p,
                ..opts(0.8)
            };
            let mut s = Sampler::new(o.clone());
            let dist = s.distribution(&logits, &[]);
            let mut allowed: Vec<u32> = dist.iter().map(|d| d.0).collect();
            if top_p < 1.0 {
                let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let nucleus: Vec<u32> = s.nucleus(&logits, max).iter().map(|c| c.0).collect();
                let common = nucleus.len().min(allowed.len());
                assert!(nucleus.len().abs_diff(allowed.len()) <= 2, "{top_p}");
                assert_eq!(nucleus[..common], allowed[..common], "{top_p}");
                assert!(nucleus.len() > 256, "{top_p}: the selection did not grow");
                allowed = nucleus;
            }
            let allowed: std::collections::HashSet<u32> = allowed.into_iter().collect();
            // Each draw with top-p selects and sorts thousands of tokens.
            let draws = if top_p < 1.0 { 3_000 } else { 20_000 };
            let mut seen = vec![0u32; logits.len()];
            for _ in 0..draws {
                seen[s.sample(&logits, &[]) as usize] += 1;
            }
            for (id, &n) in seen.iter().enumerate() {
                assert!(
                    n == 0 || allowed.contains(&(id as u32)),
                    "{top_p} {min_p}: drew {id}"
                );
            }
            // Each likely token's frequency within 5 standard deviations.
            for &(id, p) in dist.iter().filter(|d| d.1 > 0.01) {
                let want = p as f64 * draws as f64;
                let sd = (want * (1.0 - p as f64)).sqrt();
                let got = seen[id as usize] as f64;
                assert!(
                    (got - want).abs() < 5.0 * sd,
                    "{top_p} {min_p}: token {id} {got} vs {want:.0}"
                );
            }
        }
    }

    #[test]
    fn penalties_follow_llama_cpp() {
        // Token 1 twice and token 2 once in the window; token 0 outside it.
        let s = Sampler::new(SamplingOptions {
            repeat_penalty: 2.0,
            frequency_penalty: 0.5,
            presence_penalty: 0.25,
            repeat_last_n: 3,
            ..opts(0.0)
        });
        let mut logits = vec![1.0, 3.0, -1.0, 0.5];
        s.penalise(&mut logits, &[0, 1, 2, 1]);
        assert_eq!(
            logits,
            vec![1.0, 3.0 / 2.0 - 1.0 - 0.25, -2.0 - 0.5 - 0.25, 0.5]
        );
        // repeat_last_n 0 turns them off.
        let s = Sampler::new(SamplingOptions {
            presence_penalty: 5.0,
            repeat_last_n: 0,
            ..opts(0.0)
        });
        assert!(s.is_greedy() && s.candidates_needed().is_none());
    }

    #[test]
    fn logit_bias_moves_greedy_and_sampled_choices() {
        let mut s = Sampler::new(SamplingOptions {
            logit_bias: vec![(2, 10.0), (1, f32::NEG_INFINITY)],
            ..opts(0.0)
        });
        assert!(!s.is_greedy());
        assert_eq!(s.sample(&[0.1, 3.0, -1.0, 2.9], &[]), 2);
        let mut t = Sampler::new(SamplingOptions {
            logit_bias: vec![(1, f32::NEG_INFINITY)],
            top_k: 2,
            ..opts(1.0)
        });
        assert_eq!(t.candidates_needed(), None);
        for _ in 0..50 {
            assert_ne!(t.sample(&[0.1, 30.0, -1.0, 2.9], &[]), 1);
        }
    }

    /// What the GPU does under a grammar (the mask applied to the logits
    /// where they are, the masked top-k read back, the draw among the
    /// allowed candidates) draws what the full mask on the host draws,
    /// with top-p and min-p acting after it, over many seeds and steps.
    #[test]
    fn masked_candidates_draw_what_the_full_mask_draws() {
        use crate::grammar::{Grammar, TokenTable};
        use std::rc::Rc;
        // 300 tokens: digits, letters, pairs of them, commas; a grammar of
        // digit groups split by commas.
        let mut bytes: Vec<Option<Vec<u8>>> = Vec::new();
        for c in b'0'..=b'9' {
            bytes.push(Some(vec![c]));
            for d in b'a'..=b'z' {
                bytes.push(Some(vec![c, d]));
            }
        }
        bytes.push(Some(b",".to_vec()));
        bytes.resize(300, Some(b"x".to_vec()));
        let table = Rc::new(TokenTable::new(bytes));
        let grammar = Grammar::parse(r#"root ::= [0-9]+ ("," [0-9]+)*"#, "test").unwrap();
        let constrained = |o: &SamplingOptions, full: bool| {
            let mut s = Sampler::new(o.clone());
            s.set_constraint(Constraint::new(grammar.clone(), table.clone(), vec![299]));
            s.set_full_mask(full);
            s
        };
        let mut rng = Rng::new(3);
        for (top_k, top_p, min_p) in [(40, 1.0, 0.0), (5, 0.8, 0.0), (256, 0.95, 0.05)] {
            for seed in 0..8 {
                let o = SamplingOptions {
                    temperature: 0.9,
                    top_k,
                    top_p,
                    min_p,
                    seed,
                    ..Default::default()
                };
                let (mut full, mut masked) = (constrained(&o, true), constrained(&o, false));
                assert_eq!(masked.masked_candidates_needed(), Some(top_k));
                assert_eq!(full.masked_candidates_needed(), None);
                for step in 0..20 {
                    let logits = rng.vec(300, -4.0, 4.0);
                    let want = full.sample(&logits, &[]);
                    let mask = masked.token_mask().unwrap().unwrap();
                    let x = crate::cpu::masked_logits(&logits, &mask);
                    let cand = crate::cpu::top_k(&x, 256)
                        .into_iter()
                        .filter(|&(id, _)| crate::cpu::mask_allows(&mask, id as usize))
                        .collect();
                    let got = masked.sample_top_masked(cand).unwrap();
                    assert_eq!(got, want, "top-k {top_k}, seed {seed}, step {step}");
                }
            }
        }
    }

    #[test]
    fn logprobs_are_log_softmax_of_the_raw_logits() {
        let mut s = Sampler::new(SamplingOptions {
            logprobs: Some(2),
            ..opts(0.0)
        });
        let logits = [0.0f32, (2.0f32).ln(), (3.0f32).ln(), f32::NEG_INFINITY];
        assert_eq!(s.sample(&logits, &[]), 2);
        let lp = s.take_logprobs();
        assert_eq!(lp.len(), 1);
        assert!((lp[0].logprob - 0.5f32.ln()).abs() < 1e-6);
        assert_eq!(lp[0].top.len(), 2);
        assert_eq!(lp[0].top[1].0, 1);
        assert!((lp[0].top[1].1 - (1.0f32 / 3.0).ln()).abs() < 1e-6);
    }
}
