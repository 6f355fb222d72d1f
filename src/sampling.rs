//! Choosing the next token from logits. The chain follows llama.cpp's default
//! order: repetition penalty, top-k, top-p, min-p, temperature, then a draw
//! from the seeded generator. Temperature 0 is greedy (argmax after the
//! penalty).

use crate::util::rng::Rng;

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
    pub repeat_last_n: usize,
    pub seed: u64,
}

impl Default for SamplingOptions {
    fn default() -> Self {
        SamplingOptions {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            repeat_penalty: 1.0,
            repeat_last_n: 64,
            seed: 0,
        }
    }
}

pub struct Sampler {
    opts: SamplingOptions,
    rng: Rng,
}

pub use crate::cpu::argmax;

impl Sampler {
    pub fn new(opts: SamplingOptions) -> Sampler {
        let rng = Rng::new(opts.seed);
        Sampler { opts, rng }
    }

    pub fn options(&self) -> &SamplingOptions {
        &self.opts
    }

    /// True when the choice depends only on the logits' argmax, so a GPU
    /// path may compute it on the device and read back one id.
    pub fn is_greedy(&self) -> bool {
        self.opts.temperature <= 0.0 && self.opts.repeat_penalty == 1.0
    }

    /// Picks the next token given the logits and the tokens so far.
    pub fn sample(&mut self, logits: &[f32], history: &[u32]) -> u32 {
        let mut logits = logits.to_vec();
        if self.opts.repeat_penalty != 1.0 {
            let start = history.len().saturating_sub(self.opts.repeat_last_n);
            let mut seen = std::collections::HashSet::new();
            for &t in &history[start..] {
                let t = t as usize;
                if t < logits.len() && seen.insert(t) {
                    // As llama.cpp and transformers: shrink positive logits,
                    // push negative ones further down.
                    let l = &mut logits[t];
                    *l = if *l > 0.0 {
                        *l / self.opts.repeat_penalty
                    } else {
                        *l * self.opts.repeat_penalty
                    };
                }
            }
        }
        if self.opts.temperature <= 0.0 {
            return argmax(&logits) as u32;
        }
        self.sample_sorted(crate::cpu::top_k(&logits, logits.len()))
    }

    /// When the draw depends only on the `k` most likely tokens (sampling
    /// with top-k on and no repetition penalty), returns that k: a backend
    /// can then read back only the top candidates (see [`Sampler::sample_top`]).
    pub fn candidates_needed(&self) -> Option<usize> {
        (self.opts.temperature > 0.0 && self.opts.repeat_penalty == 1.0 && self.opts.top_k > 0)
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
    fn sample_sorted(&mut self, mut cand: Vec<(u32, f32)>) -> u32 {
        if self.opts.top_k > 0 {
            cand.truncate(self.opts.top_k.max(1));
        }
        let probs = |c: &[(u32, f32)]| -> Vec<f32> {
            let max = c[0].1;
            let e: Vec<f32> = c.iter().map(|(_, l)| (l - max).exp()).collect();
            let s: f32 = e.iter().sum();
            e.into_iter().map(|v| v / s).collect()
        };
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
        let r = self.rng.next_f32();
        let mut cum = 0.0;
        for (c, pi) in cand.iter().zip(&p) {
            cum += pi;
            if r < cum {
                return c.0;
            }
        }
        cand.last().expect("at least one candidate").0
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
}
