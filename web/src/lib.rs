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
use lfm::run::embed::{EmbedOptions, Embedder};
use lfm::tokenizer::Tokenizer;
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
    model: Option<Model>,
    prompt: String,
    max_tokens: usize,
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
}

struct Generation {
    prompt_ids: Vec<u32>,
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
        s.model_bytes = Some((name, bytes));
    });
}

/// Parses the file handed over and uploads it to the GPU (waits).
#[wasm_bindgen]
pub fn load_model() -> i32 {
    with_session(|s| {
        let gpu = s
            .gpu
            .clone()
            .ok_or_else(|| lfm::Error::gpu("no GPU opened (open_gpu first)"))?;
        let (name, bytes) = s
            .model_bytes
            .take()
            .ok_or_else(|| lfm::Error::invalid("no model file handed over"))?;
        s.model = None;
        let g = GgufFile::from_bytes(&name, bytes)?;
        let (cfg, weights, tokenizer) = lfm::models::llm_from_gguf(&g)?;
        let description = format!(
            "{name}: {:?}, {} layers, d{}, {} weights, vocabulary {}",
            cfg.arch,
            cfg.layers.len(),
            cfg.hidden,
            weights
                .layers
                .first()
                .map(|l| l.gate.dtype.name())
                .unwrap_or("none"),
            cfg.vocab
        );
        let llm = GpuLlm::new(gpu, &cfg, &weights, &GpuLlmOptions::default())?;
        s.model = Some(Model {
            name,
            llm,
            tokenizer,
            description,
        });
        Ok(Status::Ok)
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

/// The prompt and token budget for the next [`start_generation`].
#[wasm_bindgen]
pub fn set_prompt(prompt: String, max_tokens: u32) {
    SESSION.with(|s| {
        let mut s = s.borrow_mut();
        s.prompt = prompt;
        s.max_tokens = max_tokens as usize;
    });
}

/// Tokenises the prompt, prefills it and produces the first token (waits;
/// read it with [`produced_ids`] / [`take_new_text`]).
#[wasm_bindgen]
pub fn start_generation() -> i32 {
    with_session(|s| {
        s.generation = None;
        let prompt = s.prompt.clone();
        let m = s
            .model
            .as_mut()
            .ok_or_else(|| lfm::Error::invalid("no model loaded"))?;
        let tok = m.tokenizer.as_ref().ok_or_else(|| {
            lfm::Error::invalid(format!("{} has no tokenizer in its metadata", m.name))
        })?;
        let prompt_ids = tok.encode(&prompt, true)?;
        if prompt_ids.is_empty() {
            return Err(lfm::Error::invalid("the prompt is empty"));
        }
        let eos = tok.eos_ids.clone();
        m.llm.reset();
        let logits = m.llm.forward(&prompt_ids, false)?;
        lfm::models::llm::check_logits(&logits)?;
        let first = lfm::sampling::argmax(&logits) as u32;
        let mut g = Generation {
            prompt_ids,
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
        let max_tokens = s.max_tokens;
        let (Some(m), Some(g)) = (s.model.as_mut(), s.generation.as_mut()) else {
            return Err(lfm::Error::invalid("no generation started"));
        };
        let last = *g.produced.last().expect("start_generation pushed one");
        if g.eos.contains(&last) || g.produced.len() >= max_tokens {
            return Ok(Status::Done);
        }
        let next = m.llm.step_greedy(last)?;
        let tok = m.tokenizer.as_ref().expect("checked at the start");
        push_token(g, tok, next)?;
        Ok(Status::Ok)
    })
}

/// Records `id` as produced, decodes the text so far and keeps the new part.
fn push_token(g: &mut Generation, tok: &Tokenizer, id: u32) -> lfm::Result<()> {
    g.produced.push(id);
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
