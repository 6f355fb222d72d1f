//! The generation loop: prefill the prompt, then decode token by token until
//! an end-of-sequence token, a stop string, or the token budget.

use super::sampling::Sampler;
use super::speculative::{self, SpecStats, Speculation};
use crate::error::{Error, Result};
use crate::models::llm::{CausalLm, GreedyGuide};
use crate::tokenizer::{TextStream, Tokenizer};
use serde::Serialize;
use std::time::Instant;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    /// The model produced an end-of-sequence token.
    Eos,
    /// A `--stop` string appeared, or the grammar matched a whole output
    /// that nothing can continue.
    Stop,
    /// `max_tokens` were generated.
    Length,
}

#[derive(Clone, Debug, Serialize)]
pub struct Timings {
    pub prompt_tokens: usize,
    /// Tokens of the prompt the model held already (not prefilled).
    pub cached_tokens: usize,
    pub prefill_ms: f64,
    pub prefill_tok_per_s: f64,
    pub generated_tokens: usize,
    pub decode_ms: f64,
    pub decode_tok_per_s: f64,
}

#[derive(Clone, Debug, Serialize)]
pub struct Generation {
    pub prompt_ids: Vec<u32>,
    pub generated_ids: Vec<u32>,
    pub text: String,
    pub finish_reason: FinishReason,
    pub timings: Timings,
    /// Per generated token, when the sampler records them (`--logprobs`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub logprobs: Option<Vec<Logprob>>,
    /// What speculative decoding did, when it ran.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub speculative: Option<SpecStats>,
}

/// A token and its log probability, as OpenAI's `logprobs.content` entries.
#[derive(Clone, Debug, Serialize)]
pub struct TokenLogprobOut {
    pub id: u32,
    pub token: String,
    pub bytes: Vec<u8>,
    pub logprob: f32,
}

#[derive(Clone, Debug, Serialize)]
pub struct Logprob {
    #[serde(flatten)]
    pub token: TokenLogprobOut,
    pub top_logprobs: Vec<TokenLogprobOut>,
}

pub struct Request<'a> {
    pub prompt_ids: Vec<u32>,
    pub max_tokens: usize,
    pub eos_ids: &'a [u32],
    pub stop: &'a [String],
}

/// Holds back streamed text that could still turn into a stop string.
pub(crate) struct StopFilter {
    stop: Vec<String>,
    pending: String,
}

impl StopFilter {
    pub(crate) fn new(stop: &[String]) -> StopFilter {
        StopFilter {
            stop: stop.to_vec(),
            pending: String::new(),
        }
    }

    /// Adds text; returns (text safe to emit, whether a stop string matched).
    pub(crate) fn push(&mut self, piece: &str) -> (String, bool) {
        self.pending.push_str(piece);
        if let Some(at) = self
            .stop
            .iter()
            .filter_map(|s| self.pending.find(s.as_str()))
            .min()
        {
            let out = self.pending[..at].to_string();
            self.pending.clear();
            return (out, true);
        }
        // Keep the longest suffix that is a prefix of some stop string.
        let mut keep = 0;
        for s in &self.stop {
            for (i, _) in self.pending.char_indices() {
                let tail = &self.pending[i..];
                if s.starts_with(tail) {
                    keep = keep.max(tail.len());
                    break;
                }
            }
        }
        let cut = self.pending.len() - keep;
        let out = self.pending[..cut].to_string();
        self.pending.drain(..cut);
        (out, false)
    }

    pub(crate) fn finish(&mut self) -> String {
        std::mem::take(&mut self.pending)
    }
}

/// The produced tokens on their way to text: detokenised, held back while a
/// stop string could still match, and the reason the run ends.
struct Output<'a> {
    stream: Option<TextStream<'a>>,
    filter: StopFilter,
    text: String,
    history: Vec<u32>,
    generated: Vec<u32>,
    finish: FinishReason,
    eos_ids: &'a [u32],
    max_tokens: usize,
}

fn stdout_error(e: std::io::Error) -> Error {
    Error::Io {
        path: "<stdout>".into(),
        source: e,
    }
}

impl Output<'_> {
    /// Takes one produced token; returns whether generation goes on.
    fn push(
        &mut self,
        token: u32,
        on_text: &mut impl FnMut(&str) -> std::io::Result<()>,
    ) -> Result<bool> {
        if self.generated.len() >= self.max_tokens {
            return Ok(false);
        }
        if self.eos_ids.contains(&token) {
            self.finish = FinishReason::Eos;
            return Ok(false);
        }
        self.generated.push(token);
        self.history.push(token);
        if let Some(s) = self.stream.as_mut() {
            if let Some(piece) = s.push(token)? {
                let (out, stopped) = self.filter.push(&piece);
                self.text.push_str(&out);
                on_text(&out).map_err(stdout_error)?;
                if stopped {
                    self.finish = FinishReason::Stop;
                    return Ok(false);
                }
            }
        }
        Ok(self.generated.len() < self.max_tokens)
    }

    /// Emits what the stream and the stop filter still hold.
    fn flush(&mut self, on_text: &mut impl FnMut(&str) -> std::io::Result<()>) -> Result<()> {
        if self.finish == FinishReason::Stop {
            return Ok(());
        }
        if let Some(s) = self.stream.as_mut() {
            if let Some(piece) = s.finish()? {
                let (out, stopped) = self.filter.push(&piece);
                self.text.push_str(&out);
                on_text(&out).map_err(stdout_error)?;
                if stopped {
                    self.finish = FinishReason::Stop;
                    return Ok(());
                }
            }
        }
        let rest = self.filter.finish();
        self.text.push_str(&rest);
        on_text(&rest).map_err(stdout_error)
    }
}

/// Runs one generation. `on_text` receives the text as it is produced
/// (nothing when there is no tokenizer); its error aborts the run.
pub fn generate(
    model: &mut dyn CausalLm,
    tokenizer: Option<&Tokenizer>,
    sampler: &mut Sampler,
    req: &Request,
    on_text: impl FnMut(&str) -> std::io::Result<()>,
) -> Result<Generation> {
    generate_with(model, tokenizer, sampler, req, None, on_text)
}

/// [`generate`], decoding speculatively when `spec` is given. `model` may
/// hold the start of the prompt already: its first `model.position()`
/// tokens (a cached prefix, the earlier turns of a chat), which are not
/// prefilled again. Afterwards it has consumed the prompt and every
/// produced token but the last.
pub fn generate_with(
    model: &mut dyn CausalLm,
    tokenizer: Option<&Tokenizer>,
    sampler: &mut Sampler,
    req: &Request,
    spec: Option<&mut Speculation>,
    mut on_text: impl FnMut(&str) -> std::io::Result<()>,
) -> Result<Generation> {
    if req.prompt_ids.is_empty() {
        return Err(Error::invalid("the prompt is empty"));
    }
    let held = model.position();
    if held >= req.prompt_ids.len() {
        return Err(Error::invalid(format!(
            "the model holds {held} tokens of a {}-token prompt: at least its last token must be new",
            req.prompt_ids.len()
        )));
    }
    let context = model.config().context;
    let needed = req.prompt_ids.len() + req.max_tokens;
    if needed > context {
        return Err(Error::invalid(format!(
            "prompt ({} tokens) plus --max-tokens ({}) exceeds the model's context of {context} tokens",
            req.prompt_ids.len(),
            req.max_tokens
        )));
    }
    if let Some(spec) = spec.as_deref() {
        spec.check_vocab(model.config().vocab)?;
    }
    let mut out = Output {
        stream: tokenizer.map(TextStream::new),
        filter: StopFilter::new(req.stop),
        text: String::new(),
        history: req.prompt_ids.clone(),
        generated: Vec::new(),
        finish: FinishReason::Length,
        eos_ids: req.eos_ids,
        max_tokens: req.max_tokens,
    };

    let t0 = Instant::now();
    let logits = model.forward(&req.prompt_ids[held..], false)?;
    crate::models::llm::check_logits(&logits)?;
    let first = sampler.sample(&logits, &out.history);
    let prefill = t0.elapsed();

    let t1 = Instant::now();
    let mut decode_steps = 0usize;
    if let Some(e) = sampler.take_error() {
        return Err(e);
    }
    let mut stats = spec.as_deref().map(Speculation::stats);
    if out.push(first, &mut on_text)? && !grammar_done(sampler, &mut out) {
        if let (Some(spec), Some(stats)) = (spec, stats.as_mut()) {
            let mut last = first;
            loop {
                let budget = out.max_tokens - out.generated.len();
                let history = out.history.clone();
                let before = out.generated.len();
                let mut failed = None;
                let more = speculative::round(
                    model,
                    sampler,
                    spec,
                    &history,
                    last,
                    budget,
                    stats,
                    &mut |t, sampler| {
                        last = t;
                        Ok(match out.push(t, &mut on_text) {
                            Ok(more) => more && !grammar_done(sampler, &mut out),
                            Err(e) => {
                                failed = Some(e);
                                false
                            }
                        })
                    },
                )?;
                if let Some(e) = failed {
                    return Err(e);
                }
                decode_steps += out.generated.len() - before;
                if !more {
                    break;
                }
            }
        } else if sampler.is_greedy() {
            // The backend may keep the device a step ahead of this loop.
            let mut failed = None;
            decode_steps = model.greedy_run(first, req.max_tokens - 1, &mut |t| {
                out.push(t, &mut on_text).unwrap_or_else(|e| {
                    failed = Some(e);
                    false
                })
            })?;
            if let Some(e) = failed {
                return Err(e);
            }
        } else if sampler.is_guided_greedy() {
            // Greedy under a grammar: the backend applies the grammar's mask
            // where the logits are.
            let mut guide = Guided {
                sampler,
                out: &mut out,
                on_text: &mut on_text,
                failed: None,
            };
            decode_steps = model.greedy_run_guided(first, req.max_tokens - 1, &mut guide)?;
            if let Some(e) = guide.failed {
                return Err(e);
            }
        } else {
            let mut next = first;
            loop {
                decode_steps += 1;
                next = model.step_sample(next, sampler, &out.history)?;
                if let Some(e) = sampler.take_error() {
                    return Err(e);
                }
                if !out.push(next, &mut on_text)? || grammar_done(sampler, &mut out) {
                    break;
                }
            }
        }
    }
    out.flush(&mut on_text)?;
    let decode = t1.elapsed();
    let rate = |n: usize, d: std::time::Duration| {
        if d.as_secs_f64() > 0.0 {
            n as f64 / d.as_secs_f64()
        } else {
            0.0
        }
    };
    let logprobs = sampler.options().logprobs.map(|_| {
        let mut lp = sampler.take_logprobs();
        lp.truncate(out.generated.len());
        lp.into_iter()
            .map(|l| Logprob {
                token: token_out(tokenizer, l.id, l.logprob),
                top_logprobs: l
                    .top
                    .iter()
                    .map(|&(id, p)| token_out(tokenizer, id, p))
                    .collect(),
            })
            .collect()
    });
    let speculative = stats.map(|mut s| {
        s.acceptance_rate = if s.drafted > 0 {
            s.accepted as f64 / s.drafted as f64
        } else {
            0.0
        };
        s.tokens_per_forward = if s.target_forwards > 0 {
            decode_steps as f64 / s.target_forwards as f64
        } else {
            0.0
        };
        s
    });
    Ok(Generation {
        logprobs,
        speculative,
        timings: Timings {
            prompt_tokens: req.prompt_ids.len(),
            cached_tokens: held,
            prefill_ms: prefill.as_secs_f64() * 1e3,
            prefill_tok_per_s: rate(req.prompt_ids.len() - held, prefill),
            generated_tokens: out.generated.len(),
            decode_ms: decode.as_secs_f64() * 1e3,
            // Forward passes after the prefill, each of which yields a token.
            decode_tok_per_s: rate(decode_steps, decode),
        },
        prompt_ids: req.prompt_ids.clone(),
        generated_ids: out.generated,
        text: out.text,
        finish_reason: out.finish,
    })
}

/// Greedy decoding under a grammar ([`Sampler::is_guided_greedy`]) as the
/// backend's guided run sees it.
struct Guided<'s, 'o, 'a, F> {
    sampler: &'s mut Sampler,
    out: &'o mut Output<'a>,
    on_text: &'o mut F,
    failed: Option<Error>,
}

impl<F: FnMut(&str) -> std::io::Result<()>> GreedyGuide for Guided<'_, '_, '_, F> {
    fn mask(&mut self) -> Result<std::rc::Rc<Vec<u32>>> {
        self.sampler
            .token_mask()?
            .ok_or_else(|| Error::invalid("guided greedy decoding without a grammar"))
    }

    fn emit(&mut self, token: u32) -> bool {
        self.sampler.accept(token);
        if let Some(e) = self.sampler.take_error() {
            self.failed = Some(e);
            return false;
        }
        match self.out.push(token, self.on_text) {
            Ok(more) => more && !grammar_done(self.sampler, self.out),
            Err(e) => {
                self.failed = Some(e);
                false
            }
        }
    }
}

/// The sampler's grammar has matched a whole output that nothing can
/// continue: the run ends there.
fn grammar_done(sampler: &Sampler, out: &mut Output) -> bool {
    let done = sampler.is_finished();
    if done {
        out.finish = FinishReason::Stop;
    }
    done
}

pub(crate) fn token_out(tokenizer: Option<&Tokenizer>, id: u32, logprob: f32) -> TokenLogprobOut {
    let bytes = tokenizer
        .and_then(|t| t.token_bytes_of(id))
        .unwrap_or_default();
    TokenLogprobOut {
        id,
        token: String::from_utf8_lossy(&bytes).into_owned(),
        bytes,
        logprob,
    }
}

#[cfg(test)]
mod tests {
    use super::StopFilter;

    #[test]
    fn stop_filter_holds_back_partial_matches() {
        let stop = vec!["</end>".to_string()];
        let mut f = StopFilter::new(&stop);
        assert_eq!(f.push("hello <"), ("hello ".to_string(), false));
        assert_eq!(f.push("/en"), (String::new(), false));
        assert_eq!(f.push("d> tail"), (String::new(), true));
        let mut f = StopFilter::new(&stop);
        assert_eq!(f.push("a </x"), ("a </x".to_string(), false));
        assert_eq!(f.push("<"), (String::new(), false));
        assert_eq!(f.finish(), "<");
    }
}
