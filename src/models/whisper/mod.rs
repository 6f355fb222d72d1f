//! Whisper speech recognition: the log-mel front end ([`mel`]), the network
//! ([`model`], CPU reference; [`gpu`], the encoder on wgpu), the vocabulary
//! ([`tokens`]) and the files a model directory holds ([`WhisperFiles`]).
//! The decoding rules (timestamps, fallback, seeking) live in
//! `crate::run::transcribe`.

pub mod gpu;
pub mod gpu_decoder;
pub mod mel;
pub mod model;
pub mod tokens;

use crate::error::{Error, Result};
use crate::formats::ct2::Ct2File;
use std::path::{Path, PathBuf};

pub use model::{ComputeType, Config, Whisper};

/// What `config.json` beside a CTranslate2 Whisper model says about decoding.
#[derive(Clone, Debug, Default, serde::Deserialize)]
pub struct GenerationConfig {
    /// Tokens never sampled (openai-whisper's `suppress_tokens="-1"` set:
    /// symbols that are not speech, plus the task and start tokens).
    #[serde(default)]
    pub suppress_ids: Vec<u32>,
    /// Tokens not sampled first (a blank and end of text).
    #[serde(default)]
    pub suppress_ids_begin: Vec<u32>,
    /// (decoder layer, head) pairs whose cross-attention follows the timing
    /// of the words (word timestamps). Empty: openai-whisper's default, every
    /// head of the second half of the decoder layers.
    #[serde(default)]
    pub alignment_heads: Vec<(usize, usize)>,
}

/// A loaded model directory: weights, tokenizer, decoding config, mel bank.
pub struct WhisperFiles {
    pub dir: PathBuf,
    pub model: Whisper,
    pub tokenizer: tokens::Tokenizer,
    pub generation: GenerationConfig,
    pub mel: mel::MelFilters,
}

impl WhisperFiles {
    /// Loads `dir` (`model.bin`, `config.json`, `tokenizer.json`). The mel
    /// filter bank `mel_<n>.npy` is looked for in `mel_dir`, then in `dir`,
    /// then in a `whisper-mel` folder beside `dir` (the layout
    /// `scripts/fetch_models.py` makes).
    pub fn load(dir: &Path, mel_dir: Option<&Path>) -> Result<WhisperFiles> {
        if !dir.is_dir() {
            return Err(Error::invalid(format!(
                "{}: not a model directory (expected model.bin, config.json, tokenizer.json)",
                dir.display()
            )));
        }
        let ct2 = Ct2File::open(dir.join("model.bin"))?;
        if ct2.spec_name != "WhisperSpec" {
            return Err(Error::unsupported(
                ct2.path(),
                format!("a {} model (transcribe runs WhisperSpec)", ct2.spec_name),
            ));
        }
        let model = Whisper::from_ct2(&ct2)?;
        drop(ct2);
        let tokenizer = tokens::Tokenizer::load(&dir.join("tokenizer.json"))?;
        let config_path = dir.join("config.json");
        let generation: GenerationConfig = match std::fs::read(&config_path) {
            Ok(bytes) => serde_json::from_slice(&bytes)
                .map_err(|e| Error::format(&config_path, e.to_string()))?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => GenerationConfig::default(),
            Err(e) => return Err(Error::io(&config_path, e)),
        };
        let n = model.config.n_mels;
        // An explicit --mel-filters DIR must hold the bank; otherwise the
        // model directory or a whisper-mel directory beside it may, and
        // without one the bank is computed, as faster-whisper does.
        let mel = match mel_dir {
            Some(d) if !d.is_dir() => {
                return Err(Error::invalid(format!(
                    "{}: no such directory (--mel-filters)",
                    d.display()
                )))
            }
            Some(d) => mel::MelFilters::load(d, n)?,
            None => match [dir.to_path_buf(), dir.with_file_name("whisper-mel")]
                .iter()
                .find(|d| d.join(format!("mel_{n}.npy")).is_file())
            {
                Some(d) => mel::MelFilters::load(d, n)?,
                None => mel::MelFilters::slaney(n),
            },
        };
        let vocab_ok = tokenizer.specials.timestamp_begin as usize + 1501 <= model.config.n_vocab;
        if !vocab_ok {
            return Err(Error::format(
                dir.join("tokenizer.json"),
                format!(
                    "special tokens do not fit the model's {} logits",
                    model.config.n_vocab
                ),
            ));
        }
        Ok(WhisperFiles {
            dir: dir.to_path_buf(),
            model,
            tokenizer,
            generation,
            mel,
        })
    }
}
