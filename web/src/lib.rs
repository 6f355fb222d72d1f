//! The engine in a browser tab: `lfm` built for `wasm32-unknown-unknown`,
//! its GPU paths on the browser's WebGPU, exported to the page (`web/`).
//!
//! The engine's code is synchronous; in a tab its waits for the GPU suspend
//! the wasm stack (JavaScript Promise Integration, see `lfm::gpu::wait`).
//! So every export that may wait is a plain function of numbers, which the
//! page's loader (`web/lfm.js`) calls through `WebAssembly.promising`; its
//! inputs are set, and its results read, by ordinary wasm-bindgen exports
//! around it. The state lives in one per-tab [`Session`]. Every export
//! returns an error as a status (`Status::Error`, text in [`last_error`]),
//! never a panic: a page must not freeze on a bad file.

use lfm::formats::gguf::GgufFile;
use lfm::gpu::{Gpu, GpuOptions};
use lfm::models::llm::CausalLm;
use lfm::models::llm_gpu::{GpuLlm, GpuLlmOptions};
use lfm::run::chat::{ChatTemplate, Message};
use lfm::run::embed::{EmbedOptions, Embedder};
use lfm::sampling::{Sampler, SamplingOptions};
use lfm::tokenizer::Tokenizer;
use serde_json::{json, Value};
use std::cell::RefCell;
use std::sync::Arc;
use wasm_bindgen::prelude::*;

/// What a waiting export returns.
#[repr(i32)]
#[derive(Clone, Copy)]
pub enum Status {
    Ok = 0,
    Error = -1,
    /// Generation ended (an end-of-sequence token, or the token budget).
    Done = -2,
}

#[derive(Default)]
struct Session {
    gpu: Option<Arc<Gpu>>,
    gpu_options: GpuOptions,
    /// The model file the page handed over, until `load_model` takes it.
    model_bytes: Option<(String, Vec<u8>)>,
    /// The name of the HF directory whose files are under [`MODEL_DIR`].
    model_dir: Option<String>,
    model: Option<Model>,
    request: Request,
    generation: Option<Generation>,
    encoder: Option<Embedder>,
    sentences: Vec<String>,
    embeddings: Vec<f32>,
    last_error: String,
}

struct Model {
    name: String,
    llm: GpuLlm,
    tokenizer: Option<Tokenizer>,
    description: String,
    /// generation_config.json's sampling settings (an HF directory), else
    /// llama.cpp's defaults, as the native `generate` takes them.
    sampling_defaults: SamplingOptions,
}

/// What the next [`start_generation`] runs, from [`set_generation`].
#[derive(Default)]
struct Request {
    prompt: String,
    max_tokens: usize,
    /// Through the model's chat template (when it has one); `None`: as
    /// `generate` does, the template when there is one.
    chat: Option<bool>,
    system: Option<String>,
    /// Set fields replace the model's defaults.
    temperature: Option<f32>,
    top_k: Option<usize>,
    top_p: Option<f32>,
    min_p: Option<f32>,
    repeat_penalty: Option<f32>,
    seed: u64,
}

struct Generation {
    prompt_ids: Vec<u32>,
    /// The prompt as the model saw it (after the chat template).
    prompt_text: String,
    sampler: Sampler,
    /// The prompt and every produced token (the repetition penalty's view).
    history: Vec<u32>,
    /// Tokens produced so far; the last one is not consumed yet.
    produced: Vec<u32>,
    eos: Vec<u32>,
    text: String,
    /// The part of `text` the page has not read yet.
    new_text: String,
}

thread_local! {
    static SESSION: RefCell<Session> = RefCell::new(Session::default());
}

/// Runs `f` on the session; an error (or a second call while one waits)
/// becomes `Status::Error` with its text kept for [`last_error`].
fn with_session(f: impl FnOnce(&mut Session) -> lfm::Result<Status>) -> i32 {
    SESSION.with(|s| {
        let Ok(mut s) = s.try_borrow_mut() else {
            // The session is held by a suspended call: it cannot record
            // this error, so report it to the console.
            console_error("lfm: busy (another call is still running)");
            return Status::Error as i32;
        };
        match f(&mut s) {
            Ok(st) => st as i32,
            Err(e) => {
                s.last_error = e.to_string();
                Status::Error as i32
            }
        }
    })
}

fn read<T>(f: impl FnOnce(&Session) -> T) -> T {
    SESSION.with(|s| f(&s.borrow()))
}

#[wasm_bindgen]
extern "C" {
    #[wasm_bindgen(js_namespace = console, js_name = error)]
    fn console_error(s: &str);
}

/// Panics (engine bugs, not bad input) go to the console before the wasm
/// traps, so the page can show the message it gets from the trap.
#[wasm_bindgen(start)]
fn start() {
    std::panic::set_hook(Box::new(|info| {
        console_error(&format!("lfm panicked: {info}"))
    }));
}

/// The text of the last error.
#[wasm_bindgen]
pub fn last_error() -> String {
    read(|s| s.last_error.clone())
}

/// Ignore subgroups and f16 when opening the GPU (the portable kernels).
#[wasm_bindgen]
pub fn set_portable(portable: bool) {
    SESSION.with(|s| s.borrow_mut().gpu_options.portable = portable);
}

/// Opens the browser's WebGPU adapter (waits: call through promising).
#[wasm_bindgen]
pub fn open_gpu() -> i32 {
    with_session(|s| {
        let mut opts = s.gpu_options.clone();
        opts.required = true;
        s.gpu = Some(Arc::new(Gpu::new(&opts)?));
        Ok(Status::Ok)
    })
}

/// The adapter and the features the kernels use, one line.
#[wasm_bindgen]
pub fn gpu_description() -> String {
    read(|s| s.gpu.as_ref().map(|g| g.describe()).unwrap_or_default())
}

/// Hands over a model file (GGUF) for [`load_model`]; `name` names it in errors.
#[wasm_bindgen]
pub fn set_model_bytes(name: String, bytes: Vec<u8>) {
    SESSION.with(|s| {
        let mut s = s.borrow_mut();
        s.model = None;
        s.generation = None;
        s.model_dir = None;
        s.model_bytes = Some((name, bytes));
    });
    lfm::util::fs::remove_dir(MODEL_DIR);
}

/// The directory an HF model directory's files are handed over into.
const MODEL_DIR: &str = "/model";

/// Hands over one file of an HF model directory (`config.json`,
/// `tokenizer.json`, `model.safetensors` or the shards of its index,
/// `generation_config.json`, `tokenizer_config.json`, ...) by its name
/// inside the directory, for [`load_model`]; `first` forgets the files of
/// a previous model; `dir_name` names the directory in messages.
#[wasm_bindgen]
pub fn add_model_file(dir_name: String, relative_path: String, bytes: Vec<u8>, first: bool) {
    if first {
        lfm::util::fs::remove_dir(MODEL_DIR);
    }
    SESSION.with(|s| {
        let mut s = s.borrow_mut();
        s.model = None;
        s.generation = None;
        s.model_bytes = None;
        s.model_dir = Some(dir_name);
    });
    lfm::util::fs::add_file(std::path::Path::new(MODEL_DIR).join(relative_path), bytes);
}

/// Treat buffers over `bytes` as over the adapter's limits (0: the
/// adapter's own); for the next [`open_gpu`].
#[wasm_bindgen]
pub fn set_max_buffer(bytes: f64) {
    SESSION.with(|s| {
        s.borrow_mut().gpu_options.max_buffer_bytes = (bytes >= 1.0).then_some(bytes as u64)
    });
}

/// Parses the model handed over (a GGUF file or an HF directory's files)
/// through the recipe the native `generate` uses and uploads it (waits).
#[wasm_bindgen]
pub fn load_model() -> i32 {
    with_session(|s| {
        let gpu = s
            .gpu
            .clone()
            .ok_or_else(|| lfm::Error::gpu("no GPU opened (open_gpu first)"))?;
        s.model = None;
        let (name, cfg, weights, tokenizer, sampling_defaults) =
            match (s.model_bytes.take(), s.model_dir.clone()) {
                (Some((name, bytes)), _) => {
                    let g = GgufFile::from_bytes(&name, bytes)?;
                    let (cfg, weights, tokenizer) = lfm::models::llm_from_gguf(&g)?;
                    (
                        name,
                        cfg,
                        weights,
                        tokenizer,
                        lfm::models::llama_cpp_defaults(),
                    )
                }
                (None, Some(dir)) => {
                    let (cfg, weights, tokenizer, defaults) =
                        lfm::models::llm_from_hf_dir(std::path::Path::new(MODEL_DIR))
                            .map_err(|e| in_dir(e, &dir))?;
                    (dir, cfg, weights, tokenizer, defaults)
                }
                (None, None) => return Err(lfm::Error::invalid("no model file handed over")),
            };
        let description = format!(
            "{name}: {:?}, {} layers, d{}, {} weights, vocabulary {}{}",
            cfg.arch,
            cfg.layers.len(),
            cfg.hidden,
            weights
                .layers
                .first()
                .map(|l| l.gate.dtype.name())
                .unwrap_or("none"),
            cfg.vocab,
            if tokenizer
                .as_ref()
                .is_some_and(|t| t.chat_template.is_some())
            {
                ", chat template"
            } else {
                ""
            }
        );
        let llm = GpuLlm::new(gpu.clone(), &cfg, &weights, &GpuLlmOptions::default()).map_err(
            |e| match e {
                // Limits, memory, a kernel the adapter refuses: the model
                // cannot run here, whatever the page does.
                lfm::Error::Gpu(what) => lfm::Error::gpu(format!(
                    "{name} does not fit this WebGPU adapter (buffers up to {}, storage bindings up to {}): {what}",
                    mib(gpu.caps.max_buffer),
                    mib(gpu.caps.max_binding)
                )),
                e => e,
            },
        )?;
        s.model = Some(Model {
            name,
            llm,
            tokenizer,
            description,
            sampling_defaults,
        });
        Ok(Status::Ok)
    })
}

fn mib(bytes: u64) -> String {
    if bytes >= 1 << 20 {
        format!("{:.0} MiB", bytes as f64 / (1u64 << 20) as f64)
    } else {
        format!("{bytes} bytes")
    }
}

/// An error about the files under [`MODEL_DIR`], told with the directory's
/// own name (`/model/config.json` -> `tiny-lfm2/config.json`).
fn in_dir(e: lfm::Error, dir: &str) -> lfm::Error {
    match e {
        lfm::Error::Gpu(what) => lfm::Error::gpu(what.replace(MODEL_DIR, dir)),
        e => lfm::Error::invalid(e.to_string().replace(MODEL_DIR, dir)),
    }
}

/// The loaded model: `{description, chat_template, defaults: {temperature,
/// top_k, top_p, min_p, repeat_penalty}}`, JSON (the page fills its form).
#[wasm_bindgen]
pub fn model_info() -> String {
    read(|s| {
        let Some(m) = s.model.as_ref() else {
            return "null".to_string();
        };
        let d = &m.sampling_defaults;
        json!({
            "description": m.description,
            "chat_template": m.tokenizer.as_ref().is_some_and(|t| t.chat_template.is_some()),
            "defaults": {
                "temperature": d.temperature,
                "top_k": d.top_k,
                "top_p": d.top_p,
                "min_p": d.min_p,
                "repeat_penalty": d.repeat_penalty,
            },
        })
        .to_string()
    })
}

#[wasm_bindgen]
pub fn model_description() -> String {
    read(|s| {
        s.model
            .as_ref()
            .map(|m| m.description.clone())
            .unwrap_or_default()
    })
}

/// What the next [`start_generation`] runs, JSON: `{prompt, max_tokens,
/// chat?, system?, temperature?, top_k?, top_p?, min_p?, repeat_penalty?,
/// seed?}` (a missing sampling field: the model's default; `chat`: through
/// the chat template, by default when the model has one). Returns the
/// error text, empty when the request is well formed.
#[wasm_bindgen]
pub fn set_generation(request: String) -> String {
    match parse_request(&request) {
        Ok(r) => {
            SESSION.with(|s| s.borrow_mut().request = r);
            String::new()
        }
        Err(e) => format!("the generation request: {e}"),
    }
}

fn parse_request(text: &str) -> Result<Request, String> {
    let v: Value = serde_json::from_str(text).map_err(|e| e.to_string())?;
    let f32_of = |k: &str| -> Result<Option<f32>, String> {
        match v.get(k) {
            None | Some(Value::Null) => Ok(None),
            Some(x) => x
                .as_f64()
                .filter(|x| x.is_finite())
                .map(|x| Some(x as f32))
                .ok_or_else(|| format!("{k} must be a number, not {x}")),
        }
    };
    let u64_of = |k: &str| -> Result<Option<u64>, String> {
        match v.get(k) {
            None | Some(Value::Null) => Ok(None),
            Some(x) => x
                .as_u64()
                .map(Some)
                .ok_or_else(|| format!("{k} must be a whole number >= 0, not {x}")),
        }
    };
    let r = Request {
        prompt: v["prompt"].as_str().unwrap_or_default().to_string(),
        max_tokens: u64_of("max_tokens")?.unwrap_or(64).max(1) as usize,
        chat: v.get("chat").and_then(Value::as_bool),
        system: v
            .get("system")
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
            .map(str::to_string),
        temperature: f32_of("temperature")?,
        top_k: u64_of("top_k")?.map(|k| k as usize),
        top_p: f32_of("top_p")?,
        min_p: f32_of("min_p")?,
        repeat_penalty: f32_of("repeat_penalty")?,
        seed: u64_of("seed")?.unwrap_or(0),
    };
    if r.temperature.is_some_and(|t| t < 0.0) {
        return Err("temperature must be >= 0".into());
    }
    if r.top_p.is_some_and(|p| !(0.0..=1.0).contains(&p)) {
        return Err("top_p must be between 0 and 1".into());
    }
    if r.min_p.is_some_and(|p| !(0.0..=1.0).contains(&p)) {
        return Err("min_p must be between 0 and 1".into());
    }
    if r.repeat_penalty.is_some_and(|p| p <= 0.0) {
        return Err("repeat_penalty must be > 0".into());
    }
    Ok(r)
}

/// Tokenises the prompt (through the chat template as `generate` does),
/// prefills it and draws the first token with the engine's sampler (waits;
/// read it with [`produced_ids`] / [`take_new_text`]).
#[wasm_bindgen]
pub fn start_generation() -> i32 {
    with_session(|s| {
        s.generation = None;
        let r = &s.request;
        let m = s
            .model
            .as_mut()
            .ok_or_else(|| lfm::Error::invalid("no model loaded"))?;
        let tok = m.tokenizer.as_ref().ok_or_else(|| {
            lfm::Error::invalid(format!("{} has no tokenizer in its metadata", m.name))
        })?;
        if r.prompt.is_empty() {
            return Err(lfm::Error::invalid("the prompt is empty"));
        }
        let template = match (r.chat, tok.chat_template.as_ref()) {
            (Some(false), _) => None,
            (_, Some(t)) => Some(t),
            (Some(true), None) => {
                return Err(lfm::Error::invalid(format!(
                    "{} has no chat template",
                    m.name
                )))
            }
            (None, None) => None,
        };
        let (prompt_text, prompt_ids) = match template {
            Some(t) => {
                let mut messages = Vec::new();
                if let Some(sys) = &r.system {
                    messages.push(Message::new("system", sys));
                }
                messages.push(Message::new("user", &r.prompt));
                let t = ChatTemplate::new(t, tok.bos_token.as_deref(), tok.eos_token.as_deref());
                let text = t.render(&messages, true)?;
                let ids = tok.encode(&text, false)?;
                (text, ids)
            }
            None => (r.prompt.clone(), tok.encode(&r.prompt, true)?),
        };
        if prompt_ids.is_empty() {
            return Err(lfm::Error::invalid("the prompt is empty"));
        }
        let context = m.llm.config().context;
        if prompt_ids.len() + r.max_tokens > context {
            return Err(lfm::Error::invalid(format!(
                "prompt ({} tokens) plus max tokens ({}) exceeds the model's context of {context} tokens",
                prompt_ids.len(),
                r.max_tokens
            )));
        }
        let d = &m.sampling_defaults;
        let mut sampler = Sampler::new(SamplingOptions {
            temperature: r.temperature.unwrap_or(d.temperature),
            top_k: r.top_k.unwrap_or(d.top_k),
            top_p: r.top_p.unwrap_or(d.top_p),
            min_p: r.min_p.unwrap_or(d.min_p),
            repeat_penalty: r.repeat_penalty.unwrap_or(d.repeat_penalty),
            seed: r.seed,
            ..SamplingOptions::default()
        });
        let eos = tok.eos_ids.clone();
        m.llm.reset();
        let logits = m.llm.forward(&prompt_ids, false)?;
        lfm::models::llm::check_logits(&logits)?;
        let first = sampler.sample(&logits, &prompt_ids);
        let mut g = Generation {
            history: prompt_ids.clone(),
            prompt_ids,
            prompt_text,
            sampler,
            produced: Vec::new(),
            eos,
            text: String::new(),
            new_text: String::new(),
        };
        push_token(&mut g, tok, first)?;
        s.generation = Some(g);
        Ok(Status::Ok)
    })
}

/// Consumes the last token and produces the next (waits); `Status::Done`
/// once the last produced token was an end of sequence or the budget is spent.
#[wasm_bindgen]
pub fn next_token() -> i32 {
    with_session(|s| {
        let max_tokens = s.request.max_tokens;
        let (Some(m), Some(g)) = (s.model.as_mut(), s.generation.as_mut()) else {
            return Err(lfm::Error::invalid("no generation started"));
        };
        let last = *g.produced.last().expect("start_generation pushed one");
        if g.eos.contains(&last) || g.produced.len() >= max_tokens {
            return Ok(Status::Done);
        }
        let next = if g.sampler.is_greedy() {
            m.llm.step_greedy(last)?
        } else {
            m.llm.step_sample(last, &mut g.sampler, &g.history)?
        };
        let tok = m.tokenizer.as_ref().expect("checked at the start");
        push_token(g, tok, next)?;
        Ok(Status::Ok)
    })
}

/// Records `id` as produced, decodes the text so far and keeps the new part.
fn push_token(g: &mut Generation, tok: &Tokenizer, id: u32) -> lfm::Result<()> {
    g.produced.push(id);
    g.history.push(id);
    let text = tok.decode(&g.produced)?;
    // A byte-level token may end inside a character: wait for the rest.
    if !text.ends_with('\u{fffd}') {
        match text.strip_prefix(g.text.as_str()) {
            Some(tail) => g.new_text.push_str(tail),
            None => g.new_text = text.clone(),
        }
        g.text = text;
    }
    Ok(())
}

/// Text produced since the last call.
#[wasm_bindgen]
pub fn take_new_text() -> String {
    SESSION.with(|s| {
        let mut s = s.borrow_mut();
        s.generation
            .as_mut()
            .map(|g| std::mem::take(&mut g.new_text))
            .unwrap_or_default()
    })
}

/// The prompt's token ids, JSON.
#[wasm_bindgen]
pub fn prompt_ids() -> String {
    read(|s| {
        serde_json::to_string(
            &s.generation
                .as_ref()
                .map(|g| g.prompt_ids.clone())
                .unwrap_or_default(),
        )
        .expect("ids serialise")
    })
}

/// The prompt as the model saw it (after the chat template).
#[wasm_bindgen]
pub fn prompt_text() -> String {
    read(|s| {
        s.generation
            .as_ref()
            .map(|g| g.prompt_text.clone())
            .unwrap_or_default()
    })
}

/// The tokens produced so far, JSON.
#[wasm_bindgen]
pub fn produced_ids() -> String {
    read(|s| {
        serde_json::to_string(
            &s.generation
                .as_ref()
                .map(|g| g.produced.clone())
                .unwrap_or_default(),
        )
        .expect("ids serialise")
    })
}

/// The directory an encoder's files are handed over into.
const ENCODER_DIR: &str = "/encoder";

/// Hands over one file of a sentence-transformers directory (`config.json`,
/// `model.safetensors`, `tokenizer.json`, `modules.json`, ...) by its path
/// inside the directory; `first` forgets the files of a previous encoder.
#[wasm_bindgen]
pub fn add_encoder_file(relative_path: String, bytes: Vec<u8>, first: bool) {
    if first {
        lfm::util::fs::remove_dir(ENCODER_DIR);
        SESSION.with(|s| s.borrow_mut().encoder = None);
    }
    lfm::util::fs::add_file(std::path::Path::new(ENCODER_DIR).join(relative_path), bytes);
}

/// Loads the encoder from the files handed over and uploads it (waits).
#[wasm_bindgen]
pub fn load_encoder() -> i32 {
    with_session(|s| {
        let gpu = s
            .gpu
            .clone()
            .ok_or_else(|| lfm::Error::gpu("no GPU opened (open_gpu first)"))?;
        s.encoder = None;
        let e = Embedder::load(std::path::Path::new(ENCODER_DIR), Some(gpu))?;
        s.encoder = Some(e);
        Ok(Status::Ok)
    })
}

/// The sentences for the next [`embed`], a JSON list of strings.
#[wasm_bindgen]
pub fn set_sentences(json: String) -> bool {
    let Ok(list) = serde_json::from_str::<Vec<String>>(&json) else {
        return false;
    };
    SESSION.with(|s| s.borrow_mut().sentences = list);
    true
}

/// Embeds the sentences on the GPU (waits); read them with [`embeddings`].
#[wasm_bindgen]
pub fn embed() -> i32 {
    with_session(|s| {
        let e = s
            .encoder
            .as_ref()
            .ok_or_else(|| lfm::Error::invalid("no encoder loaded"))?;
        if s.sentences.is_empty() {
            return Err(lfm::Error::invalid("no sentences to embed"));
        }
        s.embeddings = e.embed(&s.sentences, &EmbedOptions::default())?;
        Ok(Status::Ok)
    })
}

/// The last embeddings, `[sentences, dim]` row-major.
#[wasm_bindgen]
pub fn embeddings() -> Vec<f32> {
    read(|s| s.embeddings.clone())
}

#[wasm_bindgen]
pub fn encoder_description() -> String {
    read(|s| {
        s.encoder
            .as_ref()
            .map(|e| e.device_name())
            .unwrap_or_default()
    })
}
