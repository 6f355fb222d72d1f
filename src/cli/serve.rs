//! `serve`: an OpenAI-compatible HTTP server.

use crate::models::llm_gpu::BatchProducts;
use crate::models::{self, LoadOptions};
use crate::run::embed::Embedder;
use crate::run::serve::audio::{Asr, AudioServices, Voice};
use crate::run::serve::http::{router, AppState};
use crate::run::serve::metrics::Metrics;
use crate::run::serve::{LlmParts, LlmService, Worker};
use crate::tensor::Activations;
use anyhow::Context;
use clap::Parser;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

/// Serve models over OpenAI's HTTP API: chat and text completions with
/// continuous batching, embeddings, transcriptions and speech.
#[derive(Parser, Debug)]
#[command(
    name = "serve",
    version,
    about = "Serve models over OpenAI's HTTP API (chat and text completions, embeddings, transcriptions, speech)",
    after_help = "Examples:\n  serve -m model.gguf --port 8080\n  \
serve --cpu -m model.gguf --embed-model samples/models/all-minilm-l6-v2 --api-key \"$KEY\"\n  \
curl -s localhost:8080/v1/chat/completions -d '{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}]}'\n\n\
Endpoints: POST /v1/chat/completions, /v1/completions, /v1/embeddings,\n\
/v1/audio/transcriptions, /v1/audio/speech; GET /v1/models, /health, /metrics.\n\n\
Exit status: 0 after SIGINT/SIGTERM (running requests finish first), 1 when a model\n\
fails to load or the address is taken, 2 on a bad command line."
)]
pub struct Args {
    /// Language model: a .gguf file or a Hugging Face directory (as
    /// `generate` takes). Default: SmolLM2-135M-Instruct as fetched by
    /// scripts/setup, unless only other models are given.
    #[arg(short, long)]
    pub model: Option<PathBuf>,

    /// A sentence-transformers directory for /v1/embeddings.
    #[arg(long, value_name = "DIR")]
    pub embed_model: Option<PathBuf>,

    /// A Whisper (CTranslate2) directory for /v1/audio/transcriptions.
    #[arg(long, value_name = "DIR")]
    pub asr_model: Option<PathBuf>,

    /// A Piper voice (.onnx with its .onnx.json) for /v1/audio/speech.
    #[arg(long, value_name = "FILE")]
    pub voice: Option<PathBuf>,

    /// Address to listen on; anything but loopback exposes the server to
    /// the network.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,

    /// Port to listen on (0 picks a free one, printed on stderr).
    #[arg(long, default_value_t = 8080)]
    pub port: u16,

    /// Refuse requests without `Authorization: Bearer KEY` (401); /health
    /// stays open. Also read from LFM_API_KEY.
    #[arg(long, env = "LFM_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,

    /// Generation requests that may wait for a place in the batch; more are
    /// answered 429 with Retry-After.
    #[arg(long, default_value_t = 256, value_parser = super::values::positive)]
    pub max_queue: usize,

    /// Most sequences decoded together (llama-server's -np); more wait in
    /// the queue. Default: as many as the KV cache holds (on the GPU at most
    /// 64; 256 is the GPU's limit).
    #[arg(long, value_name = "N", default_value_t = usize::MAX, hide_default_value = true, value_parser = super::values::positive)]
    pub parallel: usize,

    /// Tokens one step processes at most: every running sequence's next
    /// token, then chunks of waiting prompts (vLLM's
    /// --max-num-batched-tokens). Fewer keep running streams steadier while
    /// prompts arrive; more start new ones sooner. Also caps the sequences
    /// running at once. Default: 8192 on the GPU (vLLM's on large GPUs), 256
    /// on the CPU.
    #[arg(long, value_name = "N", value_parser = super::values::positive)]
    pub step_tokens: Option<usize>,

    /// How a GPU decode step of many sequences computes its products:
    /// `invariant` keeps each sequence's sums exactly as it gets them alone
    /// (at temperature 0 its tokens are `generate`'s); `gemm` runs them
    /// through the prompt's matrix kernels (tensor cores where the GPU has
    /// them), faster from a few dozen sequences, but a sequence's tokens may
    /// then part from its run alone where two logits nearly tie. The CPU
    /// ignores it.
    #[arg(long, value_enum, value_name = "HOW", default_value_t = BatchProducts::Invariant)]
    pub batch_products: BatchProducts,

    /// Largest request body in MiB (uploads included); more is answered 413.
    #[arg(long, default_value_t = 32, value_parser = super::values::positive)]
    pub max_body_mib: usize,

    /// KV cache for all running sequences together, in MiB, paged in blocks
    /// of 16 positions (default: on the CPU room for four full contexts, on
    /// the GPU 65,536 positions).
    #[arg(long, value_name = "MIB", value_parser = super::values::positive)]
    pub kv_memory: Option<usize>,

    /// KV cache size as a number of 16-position blocks, in place of
    /// --kv-memory (vLLM's --num-gpu-blocks-override: for tests of a full
    /// cache).
    #[arg(long, value_name = "N", conflicts_with = "kv_memory", value_parser = super::values::positive)]
    pub kv_blocks: Option<usize>,

    /// The model name `/v1/models` lists (default: the file's name).
    #[arg(long)]
    pub alias: Option<String>,

    #[command(flatten)]
    pub device: super::DeviceArgs,

    #[command(flatten)]
    pub quiet: super::QuietArgs,
}

/// The name a model is listed under.
fn model_id(path: &Path) -> String {
    path.file_name()
        .map(|n| n.to_string_lossy().to_string())
        .unwrap_or_else(|| path.display().to_string())
}

pub fn run(args: Args) -> anyhow::Result<()> {
    args.quiet.apply();
    let only_others =
        args.embed_model.is_some() || args.asr_model.is_some() || args.voice.is_some();
    let model_path = match (&args.model, only_others) {
        (Some(p), _) => Some(p.clone()),
        (None, false) => Some(models::default_llm_path()?),
        (None, true) => None,
    };
    for p in [&model_path, &args.embed_model, &args.asr_model, &args.voice]
        .into_iter()
        .flatten()
    {
        if !p.exists() {
            anyhow::bail!("{}: no such file or directory", p.display());
        }
    }
    let metrics = Arc::new(Metrics::default());
    let device = args.device.choice();

    let llm = match &model_path {
        None => None,
        Some(path) => {
            let path = path.clone();
            let opts = LoadOptions {
                device: device.clone(),
                weight_type: None,
                cpu_activations: Activations::Int8,
            };
            let kv = match (args.kv_memory, args.kv_blocks) {
                (Some(mib), _) => models::KvSize::Bytes(mib << 20),
                (None, Some(n)) => models::KvSize::Blocks(n),
                (None, None) => models::KvSize::Default,
            };
            let (parallel, products) = (args.parallel, args.batch_products);
            let id = args.alias.clone().unwrap_or_else(|| model_id(&path));
            let service = LlmService::start(
                id,
                metrics.clone(),
                args.parallel,
                args.step_tokens,
                move || {
                    let loaded = models::load_batched_llm(
                        &path,
                        &opts,
                        kv,
                        (parallel != usize::MAX).then_some(parallel),
                        products,
                    )?;
                    crate::util::log::notice(&format!(
                        "serve: language model {} on {} (up to {} sequences at once)",
                        path.display(),
                        loaded.model.backend_name(),
                        match loaded.model.max_sequences() {
                            usize::MAX => "any number of".to_string(),
                            n => n.to_string(),
                        }
                    ));
                    Ok(LlmParts {
                        model: loaded.model,
                        tokenizer: loaded.tokenizer,
                        defaults: loaded.sampling_defaults,
                    })
                },
            )
            .with_context(|| format!("loading {}", model_path.as_ref().unwrap().display()))?;
            Some(service)
        }
    };
    let embed = match &args.embed_model {
        None => None,
        Some(dir) => {
            let d = dir.clone();
            let dev = device.clone();
            let w = Worker::spawn("embed", move || {
                let (e, _) =
                    dev.build(|| Embedder::load(&d, None), |g| Embedder::load(&d, Some(g)))?;
                Ok(e)
            })
            .with_context(|| format!("loading {}", dir.display()))?;
            Some((model_id(dir), w))
        }
    };
    let mut audio = AudioServices::default();
    if let Some(dir) = &args.asr_model {
        let (d, dev) = (dir.clone(), device.clone());
        let w = Worker::spawn("asr", move || Asr::load(&d, &dev))
            .with_context(|| format!("loading {}", dir.display()))?;
        audio.asr = Some((model_id(dir), w));
    }
    if let Some(path) = &args.voice {
        let (p, dev) = (path.clone(), device.clone());
        let w = Worker::spawn("voice", move || Voice::load(&p, &dev))
            .with_context(|| format!("loading {}", path.display()))?;
        audio.voice = Some((model_id(path), w));
    }

    let state = Arc::new(AppState {
        llm,
        embed,
        audio,
        metrics,
        api_key: args.api_key.clone().filter(|k| !k.is_empty()),
        max_queue: args.max_queue,
        max_body: args.max_body_mib << 20,
        next_id: AtomicU64::new(1),
    });
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let addr = format!("{}:{}", args.host, args.port);
    runtime.block_on(async {
        let listener = tokio::net::TcpListener::bind(&addr)
            .await
            .with_context(|| format!("listening on {addr}"))?;
        let local = listener.local_addr()?;
        // Always printed: a script that asked for port 0 reads it here.
        eprintln!("serve: listening on http://{local}");
        axum::serve(listener, router(state.clone()))
            .with_graceful_shutdown(shutdown_signal())
            .await
            .context("serving")?;
        anyhow::Ok(())
    })?;
    crate::util::log::notice("serve: stopping; finishing running requests");
    // Connections are closed; what the scheduler still runs ends now.
    drop(runtime);
    if let Ok(mut s) = Arc::try_unwrap(state) {
        if let Some(l) = s.llm.as_mut() {
            l.shutdown();
        }
    }
    Ok(())
}

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
    }
}
