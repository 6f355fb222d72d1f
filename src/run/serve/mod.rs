//! `serve`: an OpenAI-compatible HTTP server over the engine.
//!
//! The HTTP side (axum on tokio, [`http`]) parses and checks requests and
//! streams answers; each model lives on a thread of its own: the language
//! model behind the continuous-batching [`scheduler`], the auxiliary models
//! (embeddings, speech recognition, speech) behind a [`Worker`] that answers
//! one job at a time. Models are built on their threads, so they need not be
//! `Send`.

pub mod api;
pub mod audio;
pub mod http;
pub mod metrics;
pub mod scheduler;

use crate::error::{Error, Result};
use crate::models::batch::BatchedLm;
use crate::run::chat::ChatTemplate;
use crate::sampling::SamplingOptions;
use crate::tokenizer::Tokenizer;
use std::sync::mpsc;
use std::sync::Arc;
use tokio::sync::oneshot;

/// A job for a model thread, and where its answer goes.
type Job<M> = Box<dyn FnOnce(&mut M) + Send>;

/// A model on a thread of its own, answering one job at a time.
pub struct Worker<M> {
    jobs: mpsc::Sender<Job<M>>,
}

impl<M> Clone for Worker<M> {
    fn clone(&self) -> Self {
        Worker {
            jobs: self.jobs.clone(),
        }
    }
}

impl<M: 'static> Worker<M> {
    /// Builds the model with `load` on a new thread; returns once it is
    /// loaded (or failed to).
    pub fn spawn(
        name: &str,
        load: impl FnOnce() -> Result<M> + Send + 'static,
    ) -> Result<Worker<M>> {
        let (jobs, rx) = mpsc::channel::<Job<M>>();
        let (ready_tx, ready_rx) = mpsc::channel();
        std::thread::Builder::new()
            .name(name.to_string())
            .spawn(move || {
                let mut model = match load() {
                    Ok(m) => {
                        let _ = ready_tx.send(Ok(()));
                        m
                    }
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                        return;
                    }
                };
                while let Ok(job) = rx.recv() {
                    job(&mut model);
                }
            })
            .map_err(|e| Error::invalid(format!("starting the {name} thread: {e}")))?;
        ready_rx
            .recv()
            .map_err(|_| Error::invalid(format!("the {name} thread died while loading")))??;
        Ok(Worker { jobs })
    }

    /// Runs `f` on the model; errors when the thread is gone.
    pub async fn run<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut M) -> T + Send + 'static,
    ) -> Result<T> {
        let (tx, rx) = oneshot::channel();
        self.jobs
            .send(Box::new(move |m: &mut M| {
                let out = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(m)));
                let _ = tx.send(out);
            }))
            .map_err(|_| Error::invalid("the model thread has stopped"))?;
        match rx.await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(_)) => Err(Error::invalid("the model panicked on this request")),
            Err(_) => Err(Error::invalid("the model thread has stopped")),
        }
    }
}

/// The language model as the HTTP side sees it.
pub struct LlmService {
    pub commands: mpsc::Sender<scheduler::Command>,
    /// The name `/v1/models` lists.
    pub id: String,
    pub tokenizer: Option<Arc<Tokenizer>>,
    pub template: Option<ChatTemplate>,
    pub defaults: SamplingOptions,
    pub context: usize,
    pub vocab: usize,
    pub thread: Option<std::thread::JoinHandle<()>>,
}

/// What [`LlmService::start`] needs from a loaded model.
pub struct LlmParts {
    pub model: Box<dyn BatchedLm>,
    pub tokenizer: Option<Tokenizer>,
    pub defaults: SamplingOptions,
}

impl LlmService {
    /// Loads the model with `load` on the scheduler's thread and starts it.
    pub fn start(
        id: String,
        metrics: Arc<metrics::Metrics>,
        parallel: usize,
        step_tokens: Option<usize>,
        load: impl FnOnce() -> Result<LlmParts> + Send + 'static,
    ) -> Result<LlmService> {
        let (commands, rx) = mpsc::channel();
        let (ready_tx, ready_rx) = mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("llm".to_string())
            .spawn(move || {
                let mut parts = match load() {
                    Ok(p) => p,
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                        return;
                    }
                };
                let tok = parts.tokenizer.take().map(Arc::new);
                let step_tokens = step_tokens.unwrap_or_else(|| parts.model.default_step_tokens());
                let c = parts.model.config();
                let _ = ready_tx.send(Ok((
                    tok.clone(),
                    parts.defaults.clone(),
                    c.context,
                    c.vocab,
                )));
                scheduler::run(
                    parts.model.as_mut(),
                    tok.as_deref(),
                    rx,
                    metrics,
                    parallel,
                    step_tokens,
                );
            })
            .map_err(|e| Error::invalid(format!("starting the model thread: {e}")))?;
        let (tokenizer, defaults, context, vocab) = ready_rx
            .recv()
            .map_err(|_| Error::invalid("the model thread died while loading"))??;
        let template = tokenizer.as_ref().and_then(|t| {
            t.chat_template
                .as_ref()
                .map(|c| ChatTemplate::new(c, t.bos_token.as_deref(), t.eos_token.as_deref()))
        });
        Ok(LlmService {
            commands,
            id,
            tokenizer,
            template,
            defaults,
            context,
            vocab,
            thread: Some(thread),
        })
    }

    /// Lets running sequences finish, then stops the thread.
    pub fn shutdown(&mut self) {
        let _ = self.commands.send(scheduler::Command::Shutdown);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
