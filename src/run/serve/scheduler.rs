//! Continuous batching: one thread owns the model and, step after step,
//! admits waiting requests while the cache has room, feeds each running
//! sequence either its next prompt chunk or its last token, samples what the
//! step produced, streams the text back and retires finished or abandoned
//! sequences at once.

use super::metrics::Metrics;
use crate::error::Error;
use crate::grammar::{Constraint, Grammar, TokenTable};
use crate::models::batch::{BatchedLm, SeqId, SeqWork};
use crate::run::generate::{token_out, FinishReason, Logprob, StopFilter};
use crate::sampling::{Sampler, SamplingOptions};
use crate::tokenizer::{TextStream, Tokenizer};
use std::collections::VecDeque;
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::mpsc::UnboundedSender;

/// Tokens one step processes at most: decode tokens first, then prompt
/// chunks, so a long prompt does not stall the running streams.
pub const STEP_TOKENS: usize = 256;

/// A generation request as the scheduler takes it.
pub struct GenRequest {
    pub prompt: Vec<u32>,
    pub max_tokens: usize,
    pub sampling: SamplingOptions,
    pub grammar: Option<Grammar>,
    pub stop: Vec<String>,
    /// Where its events go; a closed receiver cancels it.
    pub events: UnboundedSender<GenEvent>,
    pub arrived: Instant,
}

#[derive(Debug)]
pub enum GenEvent {
    /// Text produced since the last event (possibly empty when a token
    /// completes no character yet), with the token's log probability.
    Text {
        text: String,
        logprob: Option<Logprob>,
    },
    Done(Usage),
    /// The request failed; nothing more follows.
    Failed(String),
}

#[derive(Clone, Copy, Debug)]
pub struct Usage {
    pub finish: FinishReason,
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    /// Prompt tokens taken from the prefix cache.
    pub cached_tokens: usize,
}

/// What the model thread is told.
pub enum Command {
    Generate(Box<GenRequest>),
    /// Stop taking work: finish what runs, then return.
    Shutdown,
}

struct Running<'t> {
    req: Box<GenRequest>,
    id: SeqId,
    /// Prompt tokens in the cache so far.
    fed: usize,
    cached: usize,
    sampler: Sampler,
    /// Prompt and generated tokens, for the penalties.
    history: Vec<u32>,
    generated: usize,
    /// The last token produced, which the next step consumes.
    last: Option<u32>,
    stream: Option<TextStream<'t>>,
    filter: StopFilter,
    first_token_at: Option<Instant>,
    last_token_at: Option<Instant>,
}

/// Runs the scheduler until the command channel closes or says shut down
/// and nothing is left running.
pub fn run(
    model: &mut dyn BatchedLm,
    tokenizer: Option<&Tokenizer>,
    commands: mpsc::Receiver<Command>,
    metrics: Arc<Metrics>,
    parallel: usize,
) {
    let max_running = model.max_sequences().min(parallel.max(1));
    let eos: Vec<u32> = tokenizer.map(|t| t.eos_ids.clone()).unwrap_or_default();
    let vocab = model.config().vocab;
    let table = tokenizer.map(|t| {
        let mut bytes = t.token_bytes();
        bytes.resize(vocab, None);
        Rc::new(TokenTable::new(bytes))
    });
    let mut waiting: VecDeque<Box<GenRequest>> = VecDeque::new();
    let mut running: Vec<Running> = Vec::new();
    let mut accepting = true;
    loop {
        // Take what has arrived; sleep only when idle.
        if running.is_empty() && waiting.is_empty() {
            if !accepting {
                return;
            }
            match commands.recv() {
                Ok(Command::Generate(r)) => waiting.push_back(r),
                Ok(Command::Shutdown) | Err(_) => return,
            }
        }
        while let Ok(c) = commands.try_recv() {
            match c {
                Command::Generate(r) => waiting.push_back(r),
                Command::Shutdown => accepting = false,
            }
        }
        // Abandoned requests leave at once and free their blocks.
        waiting.retain(|r| {
            let gone = r.events.is_closed();
            if gone {
                metrics.waiting.fetch_sub(1, Ordering::Relaxed);
                metrics.cancelled.fetch_add(1, Ordering::Relaxed);
            }
            !gone
        });
        running.retain(|r| {
            let gone = r.req.events.is_closed();
            if gone {
                model.close(r.id);
                metrics.cancelled.fetch_add(1, Ordering::Relaxed);
            }
            !gone
        });
        // Admission, first come first served.
        while running.len() < max_running {
            let Some(req) = waiting.front() else { break };
            let max_len = req.prompt.len() + req.max_tokens;
            match model.open(&req.prompt, max_len) {
                Ok(Some((id, cached))) => {
                    let req = waiting.pop_front().expect("front");
                    metrics.waiting.fetch_sub(1, Ordering::Relaxed);
                    let mut sampler = Sampler::new(req.sampling.clone());
                    if let (Some(g), Some(t)) = (&req.grammar, &table) {
                        sampler.set_constraint(Constraint::new(g.clone(), t.clone(), eos.clone()));
                    }
                    running.push(Running {
                        id,
                        fed: cached,
                        cached,
                        sampler,
                        history: req.prompt.clone(),
                        generated: 0,
                        last: None,
                        stream: tokenizer.map(TextStream::new),
                        filter: StopFilter::new(&req.stop),
                        first_token_at: None,
                        last_token_at: None,
                        req,
                    });
                }
                Ok(None) => break,
                Err(e) => {
                    let req = waiting.pop_front().expect("front");
                    metrics.waiting.fetch_sub(1, Ordering::Relaxed);
                    let _ = req.events.send(GenEvent::Failed(e.to_string()));
                }
            }
        }
        publish(model, running.len(), &metrics);
        if running.is_empty() {
            if waiting.is_empty() {
                continue;
            }
            // Nothing runs, yet the first waiting request does not fit: it
            // never will.
            let req = waiting.pop_front().expect("non-empty");
            metrics.waiting.fetch_sub(1, Ordering::Relaxed);
            let _ = req.events.send(GenEvent::Failed(format!(
                "the request needs {} positions of KV cache, more than the server has (--kv-memory)",
                req.prompt.len() + req.max_tokens
            )));
            continue;
        }

        // This step's work: every decode token, then prompt chunks.
        let mut budget = STEP_TOKENS;
        let mut plan: Vec<(usize, std::ops::Range<usize>)> = Vec::new();
        let mut decode_tokens: Vec<u32> = Vec::new();
        for (i, r) in running.iter().enumerate() {
            if let Some(t) = r.last {
                plan.push((i, 0..0));
                decode_tokens.push(t);
                budget = budget.saturating_sub(1);
            }
        }
        for (i, r) in running.iter().enumerate() {
            if r.last.is_none() && budget > 0 {
                let end = (r.fed + budget).min(r.req.prompt.len());
                plan.push((i, r.fed..end));
                budget -= end - r.fed;
            }
        }
        let mut next_decode = 0;
        let singles: Vec<[u32; 1]> = decode_tokens.iter().map(|&t| [t]).collect();
        let work: Vec<SeqWork> = plan
            .iter()
            .map(|(i, range)| {
                let r = &running[*i];
                let tokens: &[u32] = if range.is_empty() {
                    next_decode += 1;
                    &singles[next_decode - 1]
                } else {
                    &r.req.prompt[range.clone()]
                };
                SeqWork { id: r.id, tokens }
            })
            .collect();
        let t0 = Instant::now();
        let result = model.step(&work);
        metrics.observe_step(t0.elapsed(), work.len());
        let logits = match result {
            Ok(l) => l,
            Err(e) => {
                // A failed step fails the sequences in it; the server goes on.
                for (i, _) in &plan {
                    let r = &running[*i];
                    let _ = r.req.events.send(GenEvent::Failed(e.to_string()));
                    model.close(r.id);
                }
                let failed: Vec<usize> = plan.iter().map(|(i, _)| *i).collect();
                let mut k = 0;
                running.retain(|_| {
                    k += 1;
                    !failed.contains(&(k - 1))
                });
                publish(model, running.len(), &metrics);
                continue;
            }
        };
        let mut finished = vec![false; running.len()];
        for ((i, range), logits) in plan.iter().zip(logits) {
            let r = &mut running[*i];
            if !range.is_empty() {
                r.fed = range.end;
                if r.fed < r.req.prompt.len() {
                    continue;
                }
                metrics
                    .prompt_tokens
                    .fetch_add(r.req.prompt.len() as u64, Ordering::Relaxed);
            }
            if let Err(e) = produce(r, &logits, &eos, tokenizer, &metrics) {
                let _ = r.req.events.send(GenEvent::Failed(e.to_string()));
                finished[*i] = true;
                continue;
            }
            if r.last.is_none() {
                finished[*i] = true;
            }
        }
        let mut k = 0;
        running.retain(|r| {
            k += 1;
            if finished[k - 1] {
                model.close(r.id);
            }
            !finished[k - 1]
        });
        publish(model, running.len(), &metrics);
    }
}

/// The gauges: running sequences and cache blocks.
fn publish(model: &dyn BatchedLm, running: usize, metrics: &Metrics) {
    metrics.running.store(running, Ordering::Relaxed);
    let usage = model.usage();
    metrics.kv_blocks_in_use.store(usage.in_use, Ordering::Relaxed);
    metrics.kv_blocks_total.store(usage.total, Ordering::Relaxed);
}

/// Samples the next token from `logits`, streams its text, and decides
/// whether the sequence goes on (`r.last` is the token to consume) or ends
/// (`r.last` is None and the final event is sent).
fn produce(
    r: &mut Running,
    logits: &[f32],
    eos: &[u32],
    tokenizer: Option<&Tokenizer>,
    metrics: &Metrics,
) -> crate::error::Result<()> {
    if logits.iter().any(|x| !x.is_finite()) {
        return Err(Error::invalid(
            "the model's logits are NaN or infinite (damaged weights?)",
        ));
    }
    let token = r.sampler.sample(logits, &r.history);
    if let Some(e) = r.sampler.take_error() {
        return Err(e);
    }
    let now = Instant::now();
    match r.last_token_at {
        None => metrics.observe_first_token(now - r.req.arrived),
        Some(t) => metrics.observe_inter_token(now - t),
    }
    r.first_token_at.get_or_insert(now);
    r.last_token_at = Some(now);
    let logprob = r.sampler.options().logprobs.and_then(|_| {
        r.sampler.take_logprobs().pop().map(|l| Logprob {
            token: token_out(tokenizer, l.id, l.logprob),
            top_logprobs: l
                .top
                .iter()
                .map(|&(id, p)| token_out(tokenizer, id, p))
                .collect(),
        })
    });
    let mut finish = None;
    if eos.contains(&token) {
        finish = Some(FinishReason::Eos);
    } else {
        r.generated += 1;
        metrics.completion_tokens.fetch_add(1, Ordering::Relaxed);
        r.history.push(token);
        let mut text = String::new();
        if let Some(s) = r.stream.as_mut() {
            if let Some(piece) = s.push(token)? {
                let (out, stopped) = r.filter.push(&piece);
                text = out;
                if stopped {
                    finish = Some(FinishReason::Stop);
                }
            }
        }
        if finish.is_none() && r.sampler.is_finished() {
            finish = Some(FinishReason::Stop);
        }
        if finish.is_none() && r.generated >= r.req.max_tokens {
            finish = Some(FinishReason::Length);
        }
        let _ = r.req.events.send(GenEvent::Text { text, logprob });
    }
    match finish {
        None => r.last = Some(token),
        Some(f) => {
            r.last = None;
            if f != FinishReason::Stop {
                let mut rest = String::new();
                if let Some(s) = r.stream.as_mut() {
                    if let Some(piece) = s.finish()? {
                        rest = r.filter.push(&piece).0;
                    }
                }
                rest.push_str(&r.filter.finish());
                if !rest.is_empty() {
                    let _ = r.req.events.send(GenEvent::Text {
                        text: rest,
                        logprob: None,
                    });
                }
            }
            let _ = r.req.events.send(GenEvent::Done(Usage {
                finish: f,
                prompt_tokens: r.req.prompt.len(),
                completion_tokens: r.generated,
                cached_tokens: r.cached,
            }));
            metrics.observe_request(r.req.arrived.elapsed());
        }
    }
    Ok(())
}
