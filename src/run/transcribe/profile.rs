//! Where a transcription's time goes: [`Profiled`] wraps a [`Backend`] and
//! times each of its calls, and counts the windows encoded, the decoder
//! passes and their rows, the device submissions and the bytes read back.
//! What the backend calls do not cover (features, the search on the host,
//! segments and output) is the rest of the run's time.

use super::{Backend, Features, Pick, Picks, Traffic};
use crate::cpu::whisper::{Picked, RowRule, RuleState, SelectRules, TimestampRules};
use crate::error::Result;
use crate::models::whisper::model::CrossKv;
use std::time::Duration;
use web_time::Instant;

/// Counts and times of one transcription.
#[derive(Clone, Debug, Default)]
pub struct Profile {
    /// Windows encoded.
    pub windows: usize,
    /// Prompt passes: one per attempt at a window or a batch of windows
    /// (fallbacks count), and one per language detection.
    pub prompts: usize,
    /// Decoder passes after the prompt, and their rows (a beam search of 5
    /// has 5 rows a pass; a batch of windows, theirs together).
    pub steps: usize,
    pub rows: usize,
    /// Time in the encoder (recording, device, waiting).
    pub encode: Duration,
    /// Time in the decoder's calls: recording, submitting, waiting, reading
    /// the results back (on the CPU backend: the whole forward pass).
    pub decode: Duration,
    /// Time computing features ([`ProfiledFeatures`], or the batched
    /// pipeline's chunks).
    pub features: Duration,
    pub traffic: Traffic,
}

impl Profile {
    /// One line for the timings on stderr; `total` is the run's time, of
    /// which the host's search and output take what the rest leaves.
    pub fn summary(&self, total: Duration) -> String {
        let rest = total.saturating_sub(self.encode + self.decode + self.features);
        let per_step = |d: Duration| {
            let n = (self.prompts + self.steps).max(1);
            d.as_secs_f64() * 1e6 / n as f64
        };
        let t = &self.traffic;
        let device = if t.submissions == 0 {
            String::new()
        } else {
            format!(
                ": recording {:.0} us, waiting for the device {:.0} us",
                per_step(t.record),
                per_step(t.wait)
            )
        };
        format!(
            "{} windows, {} attempts, {} steps ({} rows); encoder {:.2} s, decoder {:.2} s ({:.0} us a pass{device}), \
             features {:.2} s, search and output {:.2} s ({:.0} us a pass); {} submissions, {:.1} MB read back",
            self.windows,
            self.prompts,
            self.steps,
            self.rows,
            self.encode.as_secs_f64(),
            self.decode.as_secs_f64(),
            per_step(self.decode),
            self.features.as_secs_f64(),
            rest.as_secs_f64(),
            per_step(rest),
            t.submissions,
            t.bytes_read as f64 / 1e6,
        )
    }
}

/// A backend whose calls are counted and timed into `profile`.
pub struct Profiled<'a> {
    inner: &'a mut dyn Backend,
    /// Traffic the backend had reported before this wrapper.
    start: Traffic,
    pub profile: Profile,
}

impl<'a> Profiled<'a> {
    pub fn new(inner: &'a mut dyn Backend) -> Profiled<'a> {
        let start = inner.traffic();
        Profiled {
            inner,
            start,
            profile: Profile::default(),
        }
    }

    /// The profile, with the backend's traffic since [`Profiled::new`].
    pub fn finish(mut self) -> Profile {
        self.profile.traffic = self.inner.traffic() - self.start;
        self.profile
    }
}

fn timed<T>(into: &mut Duration, f: impl FnOnce() -> T) -> T {
    let t = Instant::now();
    let out = f();
    *into += t.elapsed();
    out
}

impl Backend for Profiled<'_> {
    fn encode(&mut self, mels: &[&[f32]]) -> Result<()> {
        self.profile.windows += mels.len();
        timed(&mut self.profile.encode, || self.inner.encode(mels))
    }

    fn cross_kv(&mut self, window: usize) -> Result<&CrossKv> {
        let t = Instant::now();
        let kv = self.inner.cross_kv(window);
        self.profile.decode += t.elapsed();
        kv
    }

    fn prompt(
        &mut self,
        prompts: &[&[u32]],
        probe: Option<(usize, u32)>,
        pick: &Pick,
    ) -> Result<(Vec<f32>, Picks)> {
        self.profile.prompts += 1;
        timed(&mut self.profile.decode, || {
            self.inner.prompt(prompts, probe, pick)
        })
    }

    fn select(&mut self, sources: &[usize]) -> Result<()> {
        timed(&mut self.profile.decode, || self.inner.select(sources))
    }

    fn step(&mut self, tokens: &[u32], pick: &Pick) -> Result<Picks> {
        self.profile.steps += 1;
        self.profile.rows += tokens.len();
        timed(&mut self.profile.decode, || self.inner.step(tokens, pick))
    }

    fn greedy_ahead(
        &mut self,
        tokens: &[u32],
        rules: &SelectRules,
        rows: &[RowRule],
        states: &[RuleState],
        timestamps: &TimestampRules,
        n: usize,
    ) -> Result<Option<Vec<Vec<Picked>>>> {
        let picks = timed(&mut self.profile.decode, || {
            self.inner
                .greedy_ahead(tokens, rules, rows, states, timestamps, n)
        })?;
        if let Some(p) = &picks {
            self.profile.steps += p.len();
            self.profile.rows += p.len() * tokens.len();
        }
        Ok(picks)
    }

    fn traffic(&self) -> Traffic {
        self.inner.traffic()
    }
}

/// Features whose computation is timed into a [`Profile`].
pub struct ProfiledFeatures<'a> {
    pub inner: &'a mut dyn Features,
    pub time: Duration,
}

impl Features for ProfiledFeatures<'_> {
    fn signal_len(&self) -> usize {
        self.inner.signal_len()
    }

    fn frames(&mut self, start: usize, count: usize) -> Result<Vec<f32>> {
        timed(&mut self.time, || self.inner.frames(start, count))
    }
}
