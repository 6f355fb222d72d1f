//! Whisper's vocabulary: the BPE text tokens from `tokenizer.json`, the
//! special tokens found there by name (their ids differ between English-only
//! and multilingual models), and the timestamp tokens that follow them.

use crate::error::{Error, Result};
use std::path::Path;

/// Ids of the special tokens the decoding rules use.
#[derive(Clone, Debug)]
pub struct Specials {
    pub eot: u32,
    pub sot: u32,
    pub translate: u32,
    pub transcribe: u32,
    pub sot_lm: u32,
    pub sot_prev: u32,
    pub no_speech: Option<u32>,
    pub no_timestamps: u32,
    /// `<|0.00|>`; timestamp i is `timestamp_begin + i`, 0.02 s apart.
    pub timestamp_begin: u32,
    /// Language codes and their tokens (`en` -> `<|en|>`), in id order.
    pub languages: Vec<(String, u32)>,
}

pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    pub specials: Specials,
}

impl Tokenizer {
    pub fn load(path: &Path) -> Result<Tokenizer> {
        let inner = crate::formats::hf::read_tokenizer_json(path)?;
        let id = |name: &str| inner.token_to_id(name);
        let need = |name: &str| {
            id(name).ok_or_else(|| {
                Error::format(
                    path,
                    format!("no special token {name} (not a Whisper tokenizer?)"),
                )
            })
        };
        let sot = need("<|startoftranscript|>")?;
        let translate = need("<|translate|>")?;
        // Language tokens sit between <|startoftranscript|> and <|translate|>.
        let languages = (sot + 1..translate)
            .filter_map(|t| {
                let s = inner.id_to_token(t)?;
                let code = s.strip_prefix("<|")?.strip_suffix("|>")?;
                Some((code.to_string(), t))
            })
            .collect();
        let no_timestamps = need("<|notimestamps|>")?;
        let specials = Specials {
            eot: need("<|endoftext|>")?,
            sot,
            translate,
            transcribe: need("<|transcribe|>")?,
            sot_lm: need("<|startoflm|>")?,
            sot_prev: need("<|startofprev|>")?,
            no_speech: id("<|nospeech|>").or_else(|| id("<|nocaptions|>")),
            no_timestamps,
            timestamp_begin: no_timestamps + 1,
            languages,
        };
        Ok(Tokenizer { inner, specials })
    }

    /// Text tokens of `text` (no special tokens added).
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        let enc = self
            .inner
            .encode(text, false)
            .map_err(|e| Error::invalid(format!("cannot tokenize {text:?}: {e}")))?;
        Ok(enc.get_ids().to_vec())
    }

    /// The text of the text tokens among `ids` (specials and timestamps
    /// are left out, as openai-whisper's `decode` does).
    pub fn decode(&self, ids: &[u32]) -> String {
        let text: Vec<u32> = ids
            .iter()
            .copied()
            .filter(|&t| t < self.specials.eot)
            .collect();
        self.inner.decode(&text, false).unwrap_or_default()
    }

    /// How one token reads on its own: its text, `<|1.24|>` for a timestamp,
    /// the special's name otherwise.
    pub fn token_text(&self, id: u32) -> String {
        let s = &self.specials;
        if id >= s.timestamp_begin {
            format!("<|{:.2}|>", (id - s.timestamp_begin) as f64 * 0.02)
        } else if id >= s.eot {
            self.inner.id_to_token(id).unwrap_or_default()
        } else {
            self.inner.decode(&[id], false).unwrap_or_default()
        }
    }

    /// The token of language `code` (`en`, `fr`, ...).
    pub fn language_token(&self, code: &str) -> Option<u32> {
        self.specials
            .languages
            .iter()
            .find(|(c, _)| c == code)
            .map(|&(_, t)| t)
    }

    pub fn language_code(&self, token: u32) -> Option<&str> {
        self.specials
            .languages
            .iter()
            .find(|&&(_, t)| t == token)
            .map(|(c, _)| c.as_str())
    }
}
