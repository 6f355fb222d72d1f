//! Text <-> token ids. An HF `tokenizer.json` loads into the `tokenizers`
//! crate directly; a GGUF-embedded gpt2-style BPE vocabulary is turned into an
//! equivalent `tokenizer.json` (vocab, merges, special tokens, the
//! pre-tokenizer llama.cpp uses for `tokenizer.ggml.pre`) so both encode the
//! same way as the original tokenizer. A GGUF-embedded SentencePiece
//! vocabulary (`tokenizer.ggml.model = "llama"`) runs in [`spm`], which
//! follows llama.cpp.

pub mod spm;

use crate::error::{Error, Result};
use crate::util::fs;
use serde_json::{json, Value};
use spm::{Spm, SpmOptions, TokenKind};
use std::path::{Path, PathBuf};

pub struct Tokenizer {
    inner: Inner,
    /// Where the vocabulary came from, for error messages.
    source: PathBuf,
    pub bos_id: Option<u32>,
    /// Tokens that end generation (eos, end-of-turn).
    pub eos_ids: Vec<u32>,
    pub bos_token: Option<String>,
    pub eos_token: Option<String>,
    pub chat_template: Option<String>,
}

/// The engine behind a [`Tokenizer`] (boxed: both are large, and made once).
enum Inner {
    Hf(Box<tokenizers::Tokenizer>),
    Spm(Box<Spm>),
}

/// A vocabulary as stored in GGUF metadata (`tokenizer.ggml.*`).
#[derive(Clone, Debug)]
pub struct GgufVocab {
    /// `tokenizer.ggml.model`: "gpt2" (byte-level BPE) or "llama"
    /// (SentencePiece).
    pub model: String,
    /// `tokenizer.ggml.pre`: the pre-tokenizer name llama.cpp uses (BPE).
    pub pre: String,
    pub tokens: Vec<String>,
    /// BPE merges, "a b" (gpt2).
    pub merges: Vec<String>,
    /// SentencePiece token scores (llama); empty when the file has none.
    pub scores: Vec<f32>,
    /// llama.cpp token types: 1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte.
    pub token_types: Vec<i32>,
    pub bos_id: Option<u32>,
    pub eos_id: Option<u32>,
    /// `tokenizer.ggml.eot_token_id` and friends: extra end-of-generation ids.
    pub extra_eos_ids: Vec<u32>,
    /// `tokenizer.ggml.add_bos_token`, `add_eos_token`, `add_space_prefix`;
    /// `None` when absent (the defaults depend on the model).
    pub add_bos: Option<bool>,
    pub add_eos: Option<bool>,
    pub add_space_prefix: Option<bool>,
    pub chat_template: Option<String>,
}

const TOKEN_TYPE_CONTROL: i32 = 3;
const TOKEN_TYPE_USER_DEFINED: i32 = 4;

/// The pre-tokenizer llama.cpp applies for a `tokenizer.ggml.pre` name,
/// written as the equivalent HF `pre_tokenizer`.
fn pre_tokenizer_for(pre: &str) -> Option<Value> {
    let byte_level = |use_regex: bool| json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": use_regex});
    let split = |pattern: &str| json!({"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated", "invert": false});
    // llama3 / lfm2 style: numbers in groups of up to three digits.
    const LLAMA3: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
    // qwen2: like llama3 but every digit on its own.
    const QWEN2: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
    Some(match pre {
        // The plain gpt2 regex inside ByteLevel.
        "default" | "gpt2" | "gpt-2" => byte_level(true),
        // Every digit split off first, then the gpt2 regex.
        "smollm" | "starcoder" | "refact" | "codeshell" => {
            json!({"type": "Sequence", "pretokenizers": [
                {"type": "Digits", "individual_digits": true},
                byte_level(true),
            ]})
        }
        "llama3" | "llama-v3" | "llama-bpe" | "lfm2" => {
            json!({"type": "Sequence", "pretokenizers": [split(LLAMA3), byte_level(false)]})
        }
        "qwen2" => json!({"type": "Sequence", "pretokenizers": [split(QWEN2), byte_level(false)]}),
        _ => return None,
    })
}

impl Tokenizer {
    /// Loads `tokenizer.json` plus, when present, `tokenizer_config.json`
    /// (special tokens, chat template), `chat_template.jinja` and
    /// `generation_config.json` (eos ids) from an HF directory.
    pub fn from_hf_dir(dir: &Path) -> Result<Tokenizer> {
        let path = dir.join("tokenizer.json");
        if !fs::is_file(&path) {
            return Err(Error::format(
                dir,
                "no tokenizer.json in the model directory",
            ));
        }
        // Through serde_json first: tokenizers panics on some bad files.
        let inner = crate::formats::hf::read_tokenizer_json(&path)?;
        let config = read_json_if_exists(&dir.join("tokenizer_config.json"))?;
        let token_str = |key: &str| -> Option<String> {
            match config.as_ref()?.get(key)? {
                Value::String(s) => Some(s.clone()),
                Value::Object(o) => o.get("content")?.as_str().map(str::to_string),
                _ => None,
            }
        };
        let bos_token = token_str("bos_token");
        let eos_token = token_str("eos_token");
        let mut chat_template = config
            .as_ref()
            .and_then(|c| c.get("chat_template"))
            .and_then(|t| t.as_str())
            .map(str::to_string);
        let jinja = dir.join("chat_template.jinja");
        if fs::is_file(&jinja) {
            chat_template = Some(fs::read_to_string(&jinja).map_err(|e| Error::io(&jinja, e))?);
        }
        let bos_id = bos_token.as_deref().and_then(|t| inner.token_to_id(t));
        let mut eos_ids: Vec<u32> = eos_token
            .as_deref()
            .and_then(|t| inner.token_to_id(t))
            .into_iter()
            .collect();
        if let Some(gen) = read_json_if_exists(&dir.join("generation_config.json"))? {
            match gen.get("eos_token_id") {
                Some(Value::Number(n)) => eos_ids.extend(n.as_u64().map(|v| v as u32)),
                Some(Value::Array(a)) => {
                    eos_ids.extend(a.iter().filter_map(|v| v.as_u64()).map(|v| v as u32))
                }
                _ => {}
            }
        }
        eos_ids.sort_unstable();
        eos_ids.dedup();
        Ok(Tokenizer {
            inner: Inner::Hf(Box::new(inner)),
            source: path,
            bos_id,
            eos_ids,
            bos_token,
            eos_token,
            chat_template,
        })
    }

    /// The tokenizer of a GGUF-embedded vocabulary.
    pub fn from_gguf_vocab(path: &Path, v: GgufVocab) -> Result<Tokenizer> {
        match v.model.as_str() {
            "gpt2" => Self::from_gguf_bpe(path, v),
            "llama" => Self::from_gguf_spm(path, v),
            other => Err(Error::unsupported(
                path,
                format!(
                    "tokenizer model '{other}' (supported: gpt2 = byte-level BPE, llama = SentencePiece)"
                ),
            )),
        }
    }

    /// A SentencePiece vocabulary, with llama.cpp's defaults for what the
    /// file leaves out: BOS 1, EOS 2, BOS added, EOS not, space prefix on.
    fn from_gguf_spm(path: &Path, v: GgufVocab) -> Result<Tokenizer> {
        let n = v.tokens.len() as u32;
        let default_id = |id: u32| (id < n).then_some(id);
        let options = SpmOptions {
            bos_id: v.bos_id.or(default_id(1)),
            eos_id: v.eos_id.or(default_id(2)),
            add_bos: v.add_bos.unwrap_or(true),
            add_eos: v.add_eos.unwrap_or(false),
            add_space_prefix: v.add_space_prefix.unwrap_or(true),
        };
        let kinds = v
            .token_types
            .iter()
            .map(|&t| TokenKind::from_gguf(t))
            .collect();
        let spm = Spm::new(path, v.tokens, v.scores, kinds, options)?;
        let text = |id: Option<u32>| id.and_then(|id| spm.token_text(id)).map(str::to_string);
        let mut eos_ids: Vec<u32> = options
            .eos_id
            .into_iter()
            .chain(v.extra_eos_ids.into_iter().filter(|&id| id < n))
            .chain(spm.end_of_generation().iter().copied())
            .collect();
        eos_ids.sort_unstable();
        eos_ids.dedup();
        Ok(Tokenizer {
            source: path.to_path_buf(),
            bos_id: options.bos_id,
            bos_token: text(options.bos_id),
            eos_token: text(options.eos_id),
            eos_ids,
            chat_template: v.chat_template,
            inner: Inner::Spm(Box::new(spm)),
        })
    }

    /// Builds the equivalent HF tokenizer for a GGUF-embedded BPE vocabulary.
    fn from_gguf_bpe(path: &Path, v: GgufVocab) -> Result<Tokenizer> {
        let pre = pre_tokenizer_for(&v.pre)
            .ok_or_else(|| Error::unsupported(path, format!("pre-tokenizer '{}'", v.pre)))?;
        if !v.token_types.is_empty() && v.token_types.len() != v.tokens.len() {
            return Err(Error::format(
                path,
                format!(
                    "{} token types for {} tokens",
                    v.token_types.len(),
                    v.tokens.len()
                ),
            ));
        }
        let n = v.tokens.len() as u32;
        for (what, id) in [("bos", v.bos_id), ("eos", v.eos_id)] {
            if let Some(id) = id.filter(|&id| id >= n) {
                return Err(Error::format(
                    path,
                    format!("{what} token id {id} is outside the {n}-token vocabulary"),
                ));
            }
        }
        let mut vocab = serde_json::Map::with_capacity(v.tokens.len());
        for (id, tok) in v.tokens.iter().enumerate() {
            vocab.insert(tok.clone(), json!(id));
        }
        let added: Vec<Value> = v
            .tokens
            .iter()
            .enumerate()
            .filter(|(i, _)| matches!(v.token_types.get(*i), Some(&TOKEN_TYPE_CONTROL) | Some(&TOKEN_TYPE_USER_DEFINED)))
            .map(|(i, tok)| {
                json!({"id": i, "content": tok, "single_word": false, "lstrip": false, "rstrip": false,
                       "normalized": false, "special": v.token_types[i] == TOKEN_TYPE_CONTROL})
            })
            .collect();
        let post = match (v.add_bos.unwrap_or(false), v.bos_id) {
            (true, Some(bos)) => {
                let tok = &v.tokens[bos as usize];
                json!({"type": "TemplateProcessing",
                    "single": [{"SpecialToken": {"id": tok, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
                    "pair": [{"SpecialToken": {"id": tok, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                             {"Sequence": {"id": "B", "type_id": 1}}],
                    "special_tokens": {tok.as_str(): {"id": tok, "ids": [bos], "tokens": [tok]}}})
            }
            _ => Value::Null,
        };
        let spec = json!({
            "version": "1.0",
            "truncation": null,
            "padding": null,
            "added_tokens": added,
            "normalizer": null,
            "pre_tokenizer": pre,
            "post_processor": post,
            "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
            "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
                      "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
                      "vocab": vocab, "merges": v.merges},
        });
        let inner: tokenizers::Tokenizer =
            spec.to_string().parse().map_err(|e: tokenizers::Error| {
                Error::format(path, format!("embedded tokenizer: {e}"))
            })?;
        let mut eos_ids: Vec<u32> = v
            .eos_id
            .into_iter()
            .chain(v.extra_eos_ids)
            .filter(|&id| id < n)
            .collect();
        eos_ids.sort_unstable();
        eos_ids.dedup();
        Ok(Tokenizer {
            inner: Inner::Hf(Box::new(inner)),
            source: path.to_path_buf(),
            bos_id: v.bos_id,
            eos_token: v.eos_id.map(|i| v.tokens[i as usize].clone()),
            bos_token: v.bos_id.map(|i| v.tokens[i as usize].clone()),
            eos_ids,
            chat_template: v.chat_template,
        })
    }

    pub fn vocab_size(&self) -> usize {
        match &self.inner {
            Inner::Hf(t) => t.get_vocab_size(true),
            Inner::Spm(t) => t.vocab_size(),
        }
    }

    /// Encodes `text`; special-token strings in it (`<|im_start|>`) become
    /// their ids. `add_special` adds what the tokenizer's post-processor adds
    /// (BOS for most models): true for raw prompts, false for rendered chat
    /// templates, which already contain them.
    pub fn encode(&self, text: &str, add_special: bool) -> Result<Vec<u32>> {
        match &self.inner {
            Inner::Hf(t) => {
                let enc = t
                    .encode(text, add_special)
                    .map_err(|e| Error::format(&self.source, format!("encoding failed: {e}")))?;
                Ok(enc.get_ids().to_vec())
            }
            Inner::Spm(t) => t.encode(text, add_special),
        }
    }

    /// Decodes ids to text, leaving out special tokens.
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        match &self.inner {
            Inner::Hf(t) => t
                .decode(ids, true)
                .map_err(|e| Error::format(&self.source, format!("decoding failed: {e}"))),
            Inner::Spm(t) => t.decode(ids),
        }
    }

    /// Decodes ids that continue a text: like [`Tokenizer::decode`], except
    /// that a SentencePiece tokenizer keeps the leading space of the first
    /// token (it belongs between the text so far and this).
    fn decode_continuation(&self, ids: &[u32]) -> Result<String> {
        match &self.inner {
            Inner::Hf(_) => self.decode(ids),
            Inner::Spm(t) => t.decode_continuation(ids),
        }
    }

    /// The bytes each token stands for in generated text (a byte-level BPE
    /// token may hold part of a character); None for special tokens, which
    /// stand for no text. For constrained generation, which matches text.
    pub fn token_bytes(&self) -> Vec<Option<Vec<u8>>> {
        let n = self.vocab_size() as u32;
        let map = ByteMap::new(self);
        (0..n).map(|id| self.bytes_with(&map, id)).collect()
    }

    /// [`Tokenizer::token_bytes`] of one token.
    pub fn token_bytes_of(&self, id: u32) -> Option<Vec<u8>> {
        self.bytes_with(&ByteMap::new(self), id)
    }

    fn bytes_with(&self, map: &ByteMap, id: u32) -> Option<Vec<u8>> {
        match &self.inner {
            Inner::Spm(t) => t.token_bytes(id),
            Inner::Hf(t) => {
                if map.specials.contains(&id) {
                    return None;
                }
                let piece = t.id_to_token(id)?;
                if map.byte_level {
                    piece
                        .chars()
                        .map(|c| map.unicode_to_byte.get(&c).copied())
                        .collect()
                } else {
                    t.decode(&[id], false).ok().map(String::into_bytes)
                }
            }
        }
    }

    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        match &self.inner {
            Inner::Hf(t) => t.token_to_id(token),
            Inner::Spm(t) => t.token_to_id(token),
        }
    }
}

/// How an HF tokenizer's token strings turn into bytes.
struct ByteMap {
    byte_level: bool,
    unicode_to_byte: std::collections::HashMap<char, u8>,
    specials: std::collections::HashSet<u32>,
}

impl ByteMap {
    fn new(tok: &Tokenizer) -> ByteMap {
        match &tok.inner {
            Inner::Spm(_) => ByteMap {
                byte_level: false,
                unicode_to_byte: Default::default(),
                specials: Default::default(),
            },
            Inner::Hf(t) => ByteMap {
                byte_level: matches!(
                    t.get_decoder(),
                    Some(tokenizers::DecoderWrapper::ByteLevel(_))
                ),
                unicode_to_byte: gpt2_bytes_to_unicode()
                    .into_iter()
                    .map(|(b, c)| (c, b))
                    .collect(),
                specials: t
                    .get_added_tokens_decoder()
                    .iter()
                    .filter(|(_, tok)| tok.special)
                    .map(|(&id, _)| id)
                    .collect(),
            },
        }
    }
}

/// GPT-2's map from bytes to the printable characters byte-level BPE
/// vocabularies write them as.
fn gpt2_bytes_to_unicode() -> Vec<(u8, char)> {
    let mut out = Vec::with_capacity(256);
    let mut extra = 0u32;
    for b in 0..=255u8 {
        let printable = matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
        let c = if printable {
            b as u32
        } else {
            extra += 1;
            255 + extra
        };
        out.push((b, char::from_u32(c).expect("a valid code point")));
    }
    out
}

fn read_json_if_exists(path: &Path) -> Result<Option<Value>> {
    if !fs::is_file(path) {
        return Ok(None);
    }
    let text = fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
    serde_json::from_str(&text)
        .map(Some)
        .map_err(|e| Error::format(path, format!("invalid JSON: {e}")))
}

/// Turns a stream of token ids into text pieces as soon as they form whole
/// characters (a multi-byte character may span several byte-level tokens).
pub struct TextStream<'a> {
    tok: &'a Tokenizer,
    ids: Vec<u32>,
    prefix: usize,
    read: usize,
}

impl<'a> TextStream<'a> {
    pub fn new(tok: &'a Tokenizer) -> Self {
        TextStream {
            tok,
            ids: Vec::new(),
            prefix: 0,
            read: 0,
        }
    }

    /// Adds one token; returns the new text it completes, if any.
    pub fn push(&mut self, id: u32) -> Result<Option<String>> {
        self.ids.push(id);
        let before = self
            .tok
            .decode_continuation(&self.ids[self.prefix..self.read])?;
        let now = self.tok.decode_continuation(&self.ids[self.prefix..])?;
        if now.len() > before.len() && !now.ends_with('\u{FFFD}') && now.starts_with(&before) {
            self.prefix = self.read;
            self.read = self.ids.len();
            return Ok(Some(now[before.len()..].to_string()));
        }
        Ok(None)
    }

    /// Whatever is left (e.g. an incomplete character at the end).
    pub fn finish(&mut self) -> Result<Option<String>> {
        let before = self
            .tok
            .decode_continuation(&self.ids[self.prefix..self.read])?;
        let now = self.tok.decode_continuation(&self.ids[self.prefix..])?;
        self.prefix = self.ids.len();
        self.read = self.ids.len();
        Ok(now
            .strip_prefix(&before)
            .filter(|rest| !rest.is_empty())
            .map(str::to_string))
    }
}
