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
use crate::sampling::{Draw, Sampler, SamplingOptions};
use crate::tokenizer::{TextStream, Tokenizer};
use std::collections::VecDeque;
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::mpsc::UnboundedSender;

/// A generation request as the scheduler takes it.
pub struct GenRequest {
    pub prompt: Vec<u32>,
    pub max_tokens: usize,
    pub sampling: SamplingOptions,
    pub grammar: Option<Grammar>,
    pub stop: Vec<String>,
    /// The end-of-sequence token is taken as any other (`ignore_eos`).
    pub ignore_eos: bool,
    /// Where its events go; a closed receiver cancels it.
    pub events: UnboundedSender<GenEvent>,
    pub arrived: Instant,
}

#[derive(Debug)]
pub enum GenEvent {
    /// Text produced since the last event (possibly empty when a token
    /// completes no character yet), with the token's log probability, and
    /// the token (none for the text held back until the end).
    Text {
        text: String,
        logprob: Option<Logprob>,
        token: Option<u32>,
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
    /// What must be in the cache before the next decode step: the prompt,
    /// or after a preemption the prompt and the tokens generated so far.
    feed: Vec<u32>,
    /// Tokens of `feed` in the cache so far.
    fed: usize,
    /// How many leading tokens of `feed` are prompt (the rest were
    /// generated and are recomputed as decode steps computed them).
    prompt_len: usize,
    /// Prompt tokens the prefix cache supplied at first admission.
    cached: usize,
    sampler: Sampler,
    /// Prompt and generated tokens, for the penalties.
    history: Vec<u32>,
    generated: usize,
    /// The last token produced, which the next step consumes.
    last: Option<u32>,
    /// After a preemption: the produced token to consume once `feed` is
    /// back in the cache.
    resume: Option<u32>,
    stream: Option<TextStream<'t>>,
    filter: StopFilter,
    last_token_at: Option<Instant>,
}

impl Running<'_> {
    fn events_closed(&self) -> bool {
        self.req.events.is_closed()
    }
}

/// A request waiting for a place in the batch: new, or preempted when the
/// cache ran out (it resumes where it stopped, recomputing its cache).
enum Waiting<'t> {
    New(Box<GenRequest>),
    Preempted(Box<Running<'t>>),
}

impl Waiting<'_> {
    fn request(&self) -> &GenRequest {
        match self {
            Waiting::New(r) => r,
            Waiting::Preempted(r) => &r.req,
        }
    }

    fn feed(&self) -> &[u32] {
        match self {
            Waiting::New(r) => &r.prompt,
            Waiting::Preempted(r) => &r.feed,
        }
    }
}

/// Runs the scheduler until the command channel closes or says shut down
/// and nothing is left running.
pub fn run(
    model: &mut dyn BatchedLm,
    tokenizer: Option<&Tokenizer>,
    commands: mpsc::Receiver<Command>,
    metrics: Arc<Metrics>,
    parallel: usize,
    step_tokens: usize,
) {
    // No more running than a step's tokens (as vLLM's max_num_seqs <=
    // max_num_batched_tokens): a sequence admitted beyond them would hold
    // its blocks with no step left to feed its prompt.
    let max_running = model
        .max_sequences()
        .min(parallel.max(1))
        .min(step_tokens.max(1));
    let eos: Vec<u32> = tokenizer.map(|t| t.eos_ids.clone()).unwrap_or_default();
    let vocab = model.config().vocab;
    let table = tokenizer.map(|t| {
        let mut bytes = t.token_bytes();
        bytes.resize(vocab, None);
        Rc::new(TokenTable::new(bytes))
    });
    let mut waiting: VecDeque<Waiting> = VecDeque::new();
    let mut running: Vec<Running> = Vec::new();
    let mut accepting = true;
    // Commands taken while the backend ran ahead, handled first.
    let mut arrived: Vec<Command> = Vec::new();
    loop {
        for c in arrived.drain(..) {
            match c {
                Command::Generate(r) => waiting.push_back(Waiting::New(r)),
                Command::Shutdown => accepting = false,
            }
        }
        // Take what has arrived; sleep only when idle.
        if running.is_empty() && waiting.is_empty() {
            if !accepting {
                return;
            }
            match commands.recv() {
                Ok(Command::Generate(r)) => waiting.push_back(Waiting::New(r)),
                Ok(Command::Shutdown) | Err(_) => return,
            }
        }
        while let Ok(c) = commands.try_recv() {
            match c {
                Command::Generate(r) => waiting.push_back(Waiting::New(r)),
                Command::Shutdown => accepting = false,
            }
        }
        // Abandoned requests leave at once and free their blocks.
        waiting.retain(|w| {
            let gone = w.request().events.is_closed();
            if gone {
                metrics.waiting.fetch_sub(1, Ordering::Relaxed);
                metrics.cancelled.fetch_add(1, Ordering::Relaxed);
            }
            !gone
        });
        running.retain(|r| {
            let gone = r.events_closed();
            if gone {
                model.close(r.id);
                metrics.cancelled.fetch_add(1, Ordering::Relaxed);
            }
            !gone
        });
        // Admission, first come first served.
        while running.len() < max_running {
            let Some(w) = waiting.front() else { break };
            match model.open(w.feed()) {
                Ok(Some((id, cached))) => {
                    metrics.waiting.fetch_sub(1, Ordering::Relaxed);
                    let r = match waiting.pop_front().expect("front") {
                        Waiting::New(req) => {
                            let mut sampler = Sampler::new(req.sampling.clone());
                            if let (Some(g), Some(t)) = (&req.grammar, &table) {
                                sampler.set_constraint(Constraint::new(
                                    g.clone(),
                                    t.clone(),
                                    eos.clone(),
                                ));
                            }
                            Running {
                                id,
                                feed: req.prompt.clone(),
                                fed: cached,
                                prompt_len: req.prompt.len(),
                                cached,
                                sampler,
                                history: req.prompt.clone(),
                                generated: 0,
                                last: None,
                                resume: None,
                                stream: tokenizer.map(TextStream::new),
                                filter: StopFilter::new(&req.stop),
                                last_token_at: None,
                                req,
                            }
                        }
                        Waiting::Preempted(r) => Running {
                            id,
                            fed: cached,
                            ..*r
                        },
                    };
                    running.push(r);
                }
                Ok(None) => break,
                Err(e) => {
                    metrics.waiting.fetch_sub(1, Ordering::Relaxed);
                    let w = waiting.pop_front().expect("front");
                    let _ = w.request().events.send(GenEvent::Failed(e.to_string()));
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
            metrics.waiting.fetch_sub(1, Ordering::Relaxed);
            let w = waiting.pop_front().expect("non-empty");
            let _ = w.request().events.send(GenEvent::Failed(format!(
                "the request needs {} positions of KV cache, more than the server has (--kv-memory)",
                w.feed().len() + 1
            )));
            continue;
        }

        // This step's work; while the cache cannot take it, the newest
        // sequence steps back into the queue (vLLM's recompute preemption).
        let plan = loop {
            let plan = plan_step(&running, step_tokens);
            let need: usize = plan
                .iter()
                .map(|(i, range)| model.blocks_needed(running[*i].id, range.len().max(1)))
                .sum();
            if need <= model.free_blocks() || running.len() == 1 {
                break plan;
            }
            let mut r = running.pop().expect("more than one");
            model.close(r.id);
            if let Some(t) = r.last.take() {
                r.feed = r.history[..r.history.len() - 1].to_vec();
                r.resume = Some(t);
            }
            r.fed = 0;
            metrics.preempted.fetch_add(1, Ordering::Relaxed);
            metrics.waiting.fetch_add(1, Ordering::Relaxed);
            waiting.push_front(Waiting::Preempted(Box::new(r)));
        };
        // One sequence decoding alone takes the backend's fast path, if it
        // has one (no logits read back).
        if let [(i, range)] = plan.as_slice() {
            if range.is_empty() {
                let i = *i;
                let r = &mut running[i];
                let token = r.last.expect("decoding");
                let t0 = Instant::now();
                let fast = if r.sampler.is_greedy() {
                    // Greedy: the backend runs ahead until the sequence ends,
                    // its client goes, or another request arrives.
                    let mut failed = None;
                    let remaining = r.req.max_tokens.saturating_sub(r.generated).max(1);
                    let ran = unwinding(|| {
                        model.greedy_run(r.id, token, remaining, &mut |t| {
                            if let Err(e) = accept(r, t, &eos, tokenizer, &metrics) {
                                failed = Some(e);
                                return false;
                            }
                            if let Ok(c) = commands.try_recv() {
                                arrived.push(c);
                            }
                            r.last.is_some() && arrived.is_empty() && !r.req.events.is_closed()
                        })
                    })
                    .unwrap_or_else(|| Some(Err(internal_error())));
                    ran.map(|res| match (res, failed) {
                        (Err(e), _) | (Ok(_), Some(e)) => Err(e),
                        (Ok(_), None) => Ok(()),
                    })
                } else {
                    unwinding(|| model.step_sampled(r.id, token, &mut r.sampler, &r.history))
                        .unwrap_or_else(|| Some(Err(internal_error())))
                        .map(|next| next.and_then(|t| accept(r, t, &eos, tokenizer, &metrics)))
                };
                if let Some(outcome) = fast {
                    metrics.observe_step(t0.elapsed(), 1);
                    let done = match outcome {
                        Ok(()) => r.last.is_none(),
                        Err(e) => {
                            let _ = r.req.events.send(GenEvent::Failed(e.to_string()));
                            true
                        }
                    };
                    if done {
                        model.close(r.id);
                        running.remove(i);
                    }
                    publish(model, running.len(), &metrics);
                    continue;
                }
            }
        }
        // Decode steps only, all greedy: the backend may pick the tokens
        // itself (reading back ids, not every row's logits).
        let all_greedy = plan
            .iter()
            .all(|(i, range)| range.is_empty() && running[*i].sampler.is_greedy());
        // Several sequences, every running one among them: the backend may
        // run ahead of the host, step after step, until one of them ends,
        // a client goes or another request arrives.
        if all_greedy && plan.len() > 1 && plan.len() == running.len() {
            let order: Vec<usize> = plan.iter().map(|p| p.0).collect();
            let rows: Vec<(SeqId, u32)> = order
                .iter()
                .map(|&i| (running[i].id, running[i].last.expect("decoding")))
                .collect();
            let mut failed: Vec<(usize, Error)> = Vec::new();
            let mut t0 = Instant::now();
            let ran = unwinding(|| {
                model.greedy_run_many(&rows, usize::MAX, &mut |tokens| {
                    metrics.observe_step(t0.elapsed(), tokens.len());
                    t0 = Instant::now();
                    let mut go = true;
                    for (&i, &t) in order.iter().zip(tokens) {
                        let r = &mut running[i];
                        if let Err(e) = accept(r, t, &eos, tokenizer, &metrics) {
                            failed.push((i, e));
                            go = false;
                        } else if r.last.is_none() || r.req.events.is_closed() {
                            go = false;
                        }
                    }
                    while let Ok(c) = commands.try_recv() {
                        arrived.push(c);
                    }
                    go && arrived.is_empty()
                })
            })
            .unwrap_or_else(|| Some(Err(internal_error())));
            // No step run (no room for one): the single step below says why.
            if !matches!(ran, None | Some(Ok(0))) {
                let mut finished = vec![false; running.len()];
                for (i, e) in failed {
                    let _ = running[i].req.events.send(GenEvent::Failed(e.to_string()));
                    finished[i] = true;
                }
                for &i in &order {
                    let r = &running[i];
                    if let Some(Err(e)) = &ran {
                        // A failed run fails the sequences still going (their
                        // states are unknown); the server goes on.
                        if !finished[i] && r.last.is_some() {
                            let _ = r.req.events.send(GenEvent::Failed(e.to_string()));
                        }
                        finished[i] = true;
                    }
                    finished[i] |= r.last.is_none();
                }
                retire(model, &mut running, &finished);
                publish(model, running.len(), &metrics);
                continue;
            }
        }
        // Decode steps only, each drawn as the backend can draw it where
        // the logits are (greedy, or sampling without top-k and top-p):
        // the tokens come back, not every row's logits.
        let draws: Option<Vec<Draw>> = (!all_greedy
            && model.draws_on_device()
            && plan
                .iter()
                .all(|(i, range)| range.is_empty() && running[*i].sampler.draws_on_device()))
        .then(|| {
            plan.iter()
                .map(|(i, _)| running[*i].sampler.device_draw().expect("checked"))
                .collect()
        });
        let singles: Vec<[u32; 1]> = plan
            .iter()
            .map(|(i, _)| [running[*i].last.unwrap_or(0)])
            .collect();
        let work: Vec<SeqWork> = plan
            .iter()
            .zip(&singles)
            .map(|((i, range), single)| {
                let r = &running[*i];
                let tokens: &[u32] = if range.is_empty() {
                    single
                } else {
                    &r.feed[range.clone()]
                };
                // `generate` alone computes a one-token prompt as decode.
                let as_decode =
                    range.is_empty() || range.start >= r.prompt_len || r.prompt_len == 1;
                SeqWork {
                    id: r.id,
                    tokens,
                    as_decode,
                }
            })
            .collect();
        let t0 = Instant::now();
        let greedy_rows: Vec<(SeqId, u32)> = if all_greedy {
            work.iter().map(|w| (w.id, w.tokens[0])).collect()
        } else {
            Vec::new()
        };
        // A panic fails this step's requests, not the server.
        let picked = if all_greedy {
            unwinding(|| model.step_greedy_many(&greedy_rows))
                .unwrap_or_else(|| Some(Err(internal_error())))
        } else if let Some(draws) = &draws {
            let rows: Vec<(SeqId, u32, Draw)> = work
                .iter()
                .zip(draws)
                .map(|(w, &d)| (w.id, w.tokens[0], d))
                .collect();
            unwinding(|| model.step_drawn_many(&rows))
                .unwrap_or_else(|| Some(Err(internal_error())))
        } else {
            None
        };
        // Decode steps only, each greedy or sampling from its top-k: the
        // backend may select the candidates, and only those come back.
        let room = model.candidates_on_device();
        let from_candidates = picked.is_none()
            && room > 0
            && plan.iter().all(|(i, range)| {
                let s = &running[*i].sampler;
                range.is_empty()
                    && (s.is_greedy() || s.candidates_needed().is_some_and(|k| k <= room))
            });
        let result = match picked {
            Some(tokens) => tokens.map(|t| t.into_iter().map(Next::Token).collect::<Vec<_>>()),
            None if from_candidates => {
                // Each row's draw reads its top-k alone (greedy: the first).
                let rows: Vec<(SeqId, u32, usize)> = work
                    .iter()
                    .zip(&plan)
                    .map(|(w, (i, _))| {
                        let keep = running[*i].sampler.candidates_needed().unwrap_or(1);
                        (w.id, w.tokens[0], keep)
                    })
                    .collect();
                unwinding(|| model.step_candidates_many(&rows))
                    .unwrap_or_else(|| Some(Err(internal_error())))
                    .unwrap_or_else(|| Err(internal_error()))
                    .map(|c| c.into_iter().map(Next::Candidates).collect())
            }
            None => unwinding(|| model.step(&work))
                .unwrap_or_else(|| Err(internal_error()))
                .map(|l| l.into_iter().map(Next::Logits).collect()),
        };
        metrics.observe_step(t0.elapsed(), work.len());
        let mut finished = vec![false; running.len()];
        match result {
            Ok(next) => {
                for ((i, range), next) in plan.iter().zip(next) {
                    let r = &mut running[*i];
                    if !range.is_empty() {
                        r.fed = range.end;
                        if r.fed < r.feed.len() {
                            continue;
                        }
                        if let Some(t) = r.resume.take() {
                            r.last = Some(t);
                            continue;
                        }
                        metrics
                            .prompt_tokens
                            .fetch_add(r.req.prompt.len() as u64, Ordering::Relaxed);
                    }
                    let produced = unwinding(|| match &next {
                        Next::Logits(logits) => produce(r, logits, &eos, tokenizer, &metrics),
                        Next::Token(t) => accept(r, *t, &eos, tokenizer, &metrics),
                        Next::Candidates(c) => {
                            let t = if r.sampler.is_greedy() {
                                c[0].0
                            } else {
                                r.sampler.sample_top(c.clone())
                            };
                            accept(r, t, &eos, tokenizer, &metrics)
                        }
                    })
                    .unwrap_or_else(|| Err(internal_error()));
                    if let Err(e) = produced {
                        let _ = r.req.events.send(GenEvent::Failed(e.to_string()));
                        finished[*i] = true;
                        continue;
                    }
                    if r.last.is_none() {
                        finished[*i] = true;
                    }
                }
            }
            Err(e) => {
                // A failed step fails the sequences in it; the server goes on.
                for (i, _) in &plan {
                    let _ = running[*i].req.events.send(GenEvent::Failed(e.to_string()));
                    finished[*i] = true;
                }
            }
        }
        retire(model, &mut running, &finished);
        publish(model, running.len(), &metrics);
    }
}

/// Closes the sequences marked `finished` and takes them out of `running`.
fn retire(model: &mut dyn BatchedLm, running: &mut Vec<Running>, finished: &[bool]) {
    let mut k = 0;
    running.retain(|r| {
        k += 1;
        if finished[k - 1] {
            model.close(r.id);
        }
        !finished[k - 1]
    });
}

/// What a step gave a sequence: its next-token logits, or the token the
/// backend picked.
enum Next {
    Logits(Vec<f32>),
    Token(u32),
    /// The most likely tokens, most likely first.
    Candidates(Vec<(u32, f32)>),
}

/// Runs `f`, None when it panics: a panic in the model or the sampler fails
/// the requests of that step, not the server.
fn unwinding<T>(f: impl FnOnce() -> T) -> Option<T> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).ok()
}

fn internal_error() -> Error {
    Error::invalid("the model failed on this step (an internal error)")
}

/// The gauges: running sequences and cache blocks.
fn publish(model: &dyn BatchedLm, running: usize, metrics: &Metrics) {
    metrics.running.store(running, Ordering::Relaxed);
    let usage = model.usage();
    metrics
        .kv_blocks_in_use
        .store(usage.in_use, Ordering::Relaxed);
    metrics
        .kv_blocks_total
        .store(usage.total, Ordering::Relaxed);
}

/// Which running sequences a step feeds and what: an empty range for a
/// decode token, else the next chunk of its feed. Decode tokens go first,
/// then prompt chunks up to `step_tokens` in all.
fn plan_step(running: &[Running], step_tokens: usize) -> Vec<(usize, std::ops::Range<usize>)> {
    let mut budget = step_tokens;
    let mut plan = Vec::new();
    for (i, r) in running.iter().enumerate() {
        if r.last.is_some() {
            plan.push((i, 0..0));
            budget = budget.saturating_sub(1);
        }
    }
    for (i, r) in running.iter().enumerate() {
        if r.last.is_none() && budget > 0 {
            // A chunk is all prompt or all recomputed decode tokens.
            let limit = if r.fed < r.prompt_len {
                r.prompt_len
            } else {
                r.feed.len()
            };
            let end = (r.fed + budget).min(limit);
            plan.push((i, r.fed..end));
            budget -= end - r.fed;
        }
    }
    plan
}

/// Samples the next token from `logits` and takes it ([`accept`]).
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
    accept(r, token, eos, tokenizer, metrics)
}

/// Takes the token the sampler drew: streams its text, and decides whether
/// the sequence goes on (`r.last` is the token to consume) or ends (`r.last`
/// is None and the final event is sent).
fn accept(
    r: &mut Running,
    token: u32,
    eos: &[u32],
    tokenizer: Option<&Tokenizer>,
    metrics: &Metrics,
) -> crate::error::Result<()> {
    if let Some(e) = r.sampler.take_error() {
        return Err(e);
    }
    let now = Instant::now();
    match r.last_token_at {
        None => metrics.observe_first_token(now - r.req.arrived),
        Some(t) => metrics.observe_inter_token(now - t),
    }
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
    if !r.req.ignore_eos && eos.contains(&token) {
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
        let _ = r.req.events.send(GenEvent::Text {
            text,
            logprob,
            token: Some(token),
        });
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
                        token: None,
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
