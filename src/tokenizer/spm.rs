//! The SentencePiece tokenizer of GGUF files (`tokenizer.ggml.model =
//! "llama"`: Llama-2, Mistral, Gemma), encoding and decoding as llama.cpp's
//! `llama_tokenize` / `llama_detokenize` do.
//!
//! Encoding `text`:
//! 1. Special tokens are cut out first: every control, user-defined and
//!    unknown token, longest text first, each one cutting its leftmost
//!    non-overlapping occurrences out of the pieces of text the longer ones
//!    left. User-defined tokens include whitespace runs and newlines in
//!    Gemma's vocabulary, so those never reach step 3.
//! 2. Each remaining piece of text gets a leading space when
//!    `add_space_prefix` is set and the piece starts the text or follows a
//!    special token; then every space becomes `▁` (U+2581).
//! 3. The piece is split into characters, and neighbouring symbols whose
//!    concatenation is a token are merged, the pair with the highest token
//!    score first (equal scores: the leftmost pair), until no neighbours
//!    form a token.
//! 4. A symbol that is no token (a single character missing from the
//!    vocabulary) is written as its UTF-8 bytes, each as the byte token
//!    `<0xXX>`.
//!
//! Decoding: `▁` becomes a space, byte tokens their byte, user-defined tokens
//! their text, control, unknown and unused tokens nothing. A leading BOS (and
//! a trailing EOS, where the tokenizer adds one) is dropped; when
//! `add_space_prefix` is set, one leading space of the first token is removed,
//! except after a BOS (llama.cpp keeps it there).

use crate::error::{Error, Result};
use std::borrow::Cow;
use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap};
use std::ops::Range;
use std::path::{Path, PathBuf};

/// How SentencePiece vocabularies write a space inside a token.
const SPACE: &str = "\u{2581}";

/// Texts llama.cpp treats as end of generation in any vocabulary
/// (`special_eog_ids`, chosen by token text); such a token also counts as a
/// control token. llama.cpp's two exceptions to the list concern BPE
/// vocabularies (gpt-oss's `<|end|>`, Gemma-4's `</s>`).
const END_OF_GENERATION: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<|flush|>",
    "<|calls|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "</s>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "[EOS]",
    "<|end_of_text|>",
    "<end_of_utterance>",
    "<eos>",
    "<turn|>",
    "<|tool_response>",
    "<｜end▁of▁sentence｜>",
    "[e~[",
];

/// A token's `tokenizer.ggml.token_type` (llama.cpp's `LLAMA_TOKEN_TYPE_*`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TokenKind {
    /// 0, or a value llama.cpp does not know.
    Undefined,
    Normal,
    Unknown,
    Control,
    UserDefined,
    Unused,
    /// `<0xXX>`: one byte of a character the vocabulary lacks.
    Byte,
}

impl TokenKind {
    pub fn from_gguf(token_type: i32) -> TokenKind {
        match token_type {
            1 => TokenKind::Normal,
            2 => TokenKind::Unknown,
            3 => TokenKind::Control,
            4 => TokenKind::UserDefined,
            5 => TokenKind::Unused,
            6 => TokenKind::Byte,
            _ => TokenKind::Undefined,
        }
    }

    /// Matched in the text before the SentencePiece merges run.
    fn is_special(self) -> bool {
        matches!(
            self,
            TokenKind::Control | TokenKind::UserDefined | TokenKind::Unknown
        )
    }
}

/// What a vocabulary says about the tokens around the text.
#[derive(Clone, Copy, Debug)]
pub struct SpmOptions {
    pub bos_id: Option<u32>,
    pub eos_id: Option<u32>,
    /// Put BOS before the text when asked for special tokens.
    pub add_bos: bool,
    /// Put EOS after the text when asked for special tokens.
    pub add_eos: bool,
    /// Prefix a space to text at the start and after each special token.
    pub add_space_prefix: bool,
}

pub struct Spm {
    /// Where the vocabulary came from, for error messages.
    source: PathBuf,
    /// Token texts; an empty one reads `[EMPTY_<id>]`, as in llama.cpp.
    texts: Vec<String>,
    scores: Vec<f32>,
    kinds: Vec<TokenKind>,
    ids: HashMap<String, u32>,
    /// The token for each byte value, for characters the vocabulary lacks.
    byte_tokens: [Option<u32>; 256],
    /// Special tokens in the order they are cut out of the text.
    specials: Vec<u32>,
    /// Tokens llama.cpp recognises by their text as ending generation.
    end_of_generation: Vec<u32>,
    options: SpmOptions,
}

/// A piece of the input between special tokens, or a special token.
enum Fragment {
    Text(Range<usize>),
    Token(u32),
}

/// One symbol of a piece of text: a byte range that grows as its right
/// neighbours are merged into it (length 0 once merged away), in a linked
/// list of the symbols still standing.
struct Symbol {
    start: usize,
    len: usize,
    prev: Option<usize>,
    next: Option<usize>,
}

/// Two neighbouring symbols whose concatenation is a token.
struct Pair {
    score: f32,
    left: usize,
    right: usize,
    /// Bytes of the concatenation; a pair whose symbols changed since it was
    /// queued no longer adds up to it (symbols only grow or vanish).
    len: usize,
}

/// Ordered for a max-heap: highest score first, then the leftmost pair.
/// Equal scores (and -0.0 against 0.0) tie as in llama.cpp's comparator.
impl Ord for Pair {
    fn cmp(&self, other: &Self) -> Ordering {
        self.score
            .partial_cmp(&other.score)
            .unwrap_or(Ordering::Equal)
            .then_with(|| other.left.cmp(&self.left))
    }
}

impl PartialOrd for Pair {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl PartialEq for Pair {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Pair {}

/// The byte of a `<0xXX>` token text.
fn byte_value(text: &str) -> Option<u8> {
    let hex = text.strip_prefix("<0x")?.strip_suffix('>')?;
    if hex.len() != 2 {
        return None;
    }
    u8::from_str_radix(hex, 16).ok()
}

impl Spm {
    /// `scores` and `kinds` may be empty (all scores 0, all tokens normal, as
    /// llama.cpp reads a vocabulary without them); otherwise they hold one
    /// entry per token.
    pub fn new(
        source: &Path,
        tokens: Vec<String>,
        scores: Vec<f32>,
        kinds: Vec<TokenKind>,
        options: SpmOptions,
    ) -> Result<Spm> {
        let n = tokens.len();
        let bad = |what: String| Error::format(source, what);
        if n == 0 {
            return Err(bad("tokenizer.ggml.tokens is empty".into()));
        }
        for (name, len) in [
            ("tokenizer.ggml.scores", scores.len()),
            ("tokenizer.ggml.token_type", kinds.len()),
        ] {
            if len != 0 && len != n {
                return Err(bad(format!("{name} has {len} entries for {n} tokens")));
            }
        }
        let scores = if scores.is_empty() {
            vec![0.0; n]
        } else {
            scores
        };
        let mut kinds = if kinds.is_empty() {
            vec![TokenKind::Normal; n]
        } else {
            kinds
        };
        for (what, id, wanted) in [
            ("bos", options.bos_id, options.add_bos),
            ("eos", options.eos_id, options.add_eos),
        ] {
            match id {
                Some(id) if id as usize >= n => {
                    return Err(bad(format!(
                        "{what} token id {id} is outside the {n}-token vocabulary"
                    )))
                }
                None if wanted => {
                    return Err(bad(format!(
                        "tokenizer.ggml.add_{what}_token is set but there is no {what} token"
                    )))
                }
                _ => {}
            }
        }

        let texts: Vec<String> = tokens
            .into_iter()
            .enumerate()
            .map(|(id, t)| {
                if t.is_empty() {
                    format!("[EMPTY_{id}]")
                } else {
                    t
                }
            })
            .collect();
        let mut ids = HashMap::with_capacity(n);
        for (id, text) in texts.iter().enumerate() {
            if let Some(first) = ids.insert(text.clone(), id as u32) {
                return Err(bad(format!(
                    "tokens {first} and {id} are both {text:?} in tokenizer.ggml.tokens"
                )));
            }
        }
        for (id, text) in texts.iter().enumerate() {
            if kinds[id] == TokenKind::Byte && byte_value(text).is_none() {
                return Err(bad(format!(
                    "byte token {id} is {text:?}, not of the form <0xXX>"
                )));
            }
        }
        let byte_tokens = std::array::from_fn(|b| {
            let b = b as u8;
            ids.get(&format!("<0x{b:02X}>"))
                .or_else(|| match b.is_ascii() {
                    // llama.cpp's fallback: the byte as a one-character token.
                    true => ids.get(&char::from(b).to_string()),
                    false => None,
                })
                .copied()
        });

        let mut end_of_generation: Vec<u32> = END_OF_GENERATION
            .iter()
            .filter_map(|t| ids.get(*t).copied())
            .collect();
        end_of_generation.sort_unstable();
        for &id in &end_of_generation {
            kinds[id as usize] = TokenKind::Control;
        }

        // llama.cpp sorts by length with an unstable sort; ties (which only
        // matter for equal-length special tokens overlapping in the text)
        // keep id order here.
        let mut specials: Vec<u32> = (0..n as u32)
            .filter(|&id| kinds[id as usize].is_special())
            .collect();
        specials.sort_by_key(|&id| std::cmp::Reverse(texts[id as usize].len()));

        Ok(Spm {
            source: source.to_path_buf(),
            texts,
            scores,
            kinds,
            ids,
            byte_tokens,
            specials,
            end_of_generation,
            options,
        })
    }

    pub fn vocab_size(&self) -> usize {
        self.texts.len()
    }

    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.ids.get(token).copied()
    }

    pub fn token_text(&self, id: u32) -> Option<&str> {
        self.texts.get(id as usize).map(String::as_str)
    }

    /// The bytes a token stands for in generated text; None for control,
    /// unknown and unused tokens, which stand for no text.
    pub fn token_bytes(&self, id: u32) -> Option<Vec<u8>> {
        let text = self.texts.get(id as usize)?;
        match self.kinds[id as usize] {
            TokenKind::Byte => byte_value(text).map(|b| vec![b]),
            TokenKind::Control | TokenKind::Unknown | TokenKind::Unused => None,
            _ => Some(text.replace('\u{2581}', " ").into_bytes()),
        }
    }

    /// Tokens whose text marks the end of generation (`<end_of_turn>`, ...).
    pub fn end_of_generation(&self) -> &[u32] {
        &self.end_of_generation
    }

    /// Encodes `text`, special-token texts in it becoming their ids;
    /// `add_special` adds BOS / EOS as the vocabulary asks.
    pub fn encode(&self, text: &str, add_special: bool) -> Result<Vec<u32>> {
        let mut out = Vec::with_capacity(text.len() / 3 + 2);
        if add_special && self.options.add_bos {
            out.extend(self.options.bos_id);
        }
        let mut after_special = true;
        for fragment in self.split_specials(text) {
            match fragment {
                Fragment::Token(id) => {
                    out.push(id);
                    after_special = true;
                }
                Fragment::Text(range) => {
                    let space = if self.options.add_space_prefix && after_special {
                        " "
                    } else {
                        ""
                    };
                    let piece = format!("{space}{}", &text[range]).replace(' ', SPACE);
                    self.encode_piece(&piece, &mut out)?;
                    after_special = false;
                }
            }
        }
        if add_special && self.options.add_eos {
            out.extend(self.options.eos_id);
        }
        Ok(out)
    }

    /// Step 1: the text cut at every special token.
    fn split_specials(&self, text: &str) -> Vec<Fragment> {
        if text.is_empty() {
            return Vec::new();
        }
        // A token with a byte the text lacks cannot occur in it; this skips
        // most of the thousands of special tokens without a search.
        let mut present = [false; 256];
        for b in text.bytes() {
            present[b as usize] = true;
        }
        let mut fragments = vec![Fragment::Text(0..text.len())];
        for &id in &self.specials {
            let needle = self.texts[id as usize].as_str();
            if !needle.bytes().all(|b| present[b as usize]) {
                continue;
            }
            let mut split = Vec::with_capacity(fragments.len());
            for fragment in fragments {
                let Fragment::Text(range) = fragment else {
                    split.push(fragment);
                    continue;
                };
                let mut start = range.start;
                while let Some(at) = text[start..range.end].find(needle) {
                    let at = start + at;
                    if at > start {
                        split.push(Fragment::Text(start..at));
                    }
                    split.push(Fragment::Token(id));
                    start = at + needle.len();
                }
                if start < range.end {
                    split.push(Fragment::Text(start..range.end));
                }
            }
            fragments = split;
        }
        fragments
    }

    /// Steps 3 and 4 on one escaped piece of text.
    fn encode_piece(&self, text: &str, out: &mut Vec<u32>) -> Result<()> {
        let mut symbols: Vec<Symbol> = text
            .char_indices()
            .map(|(start, c)| Symbol {
                start,
                len: c.len_utf8(),
                prev: None,
                next: None,
            })
            .collect();
        let n = symbols.len();
        for (i, s) in symbols.iter_mut().enumerate() {
            s.prev = i.checked_sub(1);
            s.next = (i + 1 < n).then_some(i + 1);
        }
        let pair = |symbols: &[Symbol], left: usize, right: usize| -> Option<Pair> {
            let start = symbols[left].start;
            let len = symbols[left].len + symbols[right].len;
            let id = *self.ids.get(&text[start..start + len])?;
            Some(Pair {
                score: self.scores[id as usize],
                left,
                right,
                len,
            })
        };
        let mut queue: BinaryHeap<Pair> = (1..n).filter_map(|i| pair(&symbols, i - 1, i)).collect();
        while let Some(p) = queue.pop() {
            let (left, right) = (&symbols[p.left], &symbols[p.right]);
            if left.len == 0 || right.len == 0 || left.len + right.len != p.len {
                continue;
            }
            let next = right.next;
            symbols[p.left].len = p.len;
            symbols[p.left].next = next;
            symbols[p.right].len = 0;
            if let Some(next) = next {
                symbols[next].prev = Some(p.left);
            }
            if let Some(prev) = symbols[p.left].prev {
                queue.extend(pair(&symbols, prev, p.left));
            }
            if let Some(next) = next {
                queue.extend(pair(&symbols, p.left, next));
            }
        }
        // Every merged symbol is a token; a symbol that is not is a single
        // character missing from the vocabulary.
        let mut at = (n > 0).then_some(0);
        while let Some(i) = at {
            let s = &symbols[i];
            let piece = &text[s.start..s.start + s.len];
            match self.ids.get(piece) {
                Some(&id) => out.push(id),
                None => {
                    for b in piece.bytes() {
                        let id = self.byte_tokens[b as usize].ok_or_else(|| {
                            Error::format(
                                &self.source,
                                format!(
                                    "{piece:?} is not in the vocabulary and there is no byte token <0x{b:02X}> to spell it"
                                ),
                            )
                        })?;
                        out.push(id);
                    }
                }
            }
            at = s.next;
        }
        Ok(())
    }

    /// Decodes ids to text as `llama_detokenize` does with
    /// `remove_special` and without `unparse_special`.
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        let o = &self.options;
        let mut ids = ids;
        let mut strip_space = o.add_space_prefix;
        if let (true, Some((&first, rest))) = (o.add_bos, ids.split_first()) {
            if Some(first) == o.bos_id {
                strip_space = false;
                ids = rest;
            }
        }
        if let (true, Some((&last, rest))) = (o.add_eos, ids.split_last()) {
            if Some(last) == o.eos_id {
                ids = rest;
            }
        }
        self.join_pieces(ids, strip_space)
    }

    /// Decodes ids that continue a text (streamed output): every token's
    /// piece as it is, no BOS/EOS dropped, no leading space removed.
    pub fn decode_continuation(&self, ids: &[u32]) -> Result<String> {
        self.join_pieces(ids, false)
    }

    fn join_pieces(&self, ids: &[u32], strip_first_space: bool) -> Result<String> {
        let mut bytes = Vec::with_capacity(ids.len() * 4);
        for (i, &id) in ids.iter().enumerate() {
            let piece = self.piece(id)?;
            let piece = match (i, strip_first_space) {
                (0, true) => piece.strip_prefix(b" ").unwrap_or(&piece),
                _ => &piece,
            };
            bytes.extend_from_slice(piece);
        }
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    }

    /// The bytes a token stands for in decoded text (llama.cpp's
    /// `token_to_piece` without special tokens).
    fn piece(&self, id: u32) -> Result<Cow<'_, [u8]>> {
        let Some(text) = self.texts.get(id as usize) else {
            return Err(Error::format(
                &self.source,
                format!(
                    "token id {id} is outside the {}-token vocabulary",
                    self.texts.len()
                ),
            ));
        };
        Ok(match self.kinds[id as usize] {
            TokenKind::Normal => Cow::Owned(text.replace(SPACE, " ").into_bytes()),
            TokenKind::UserDefined => Cow::Borrowed(text.as_bytes()),
            TokenKind::Byte => Cow::Owned(vec![byte_value(text).expect("checked on load")]),
            TokenKind::Control | TokenKind::Unknown | TokenKind::Unused | TokenKind::Undefined => {
                Cow::Borrowed(&[])
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_tokens_are_two_hex_digits() {
        assert_eq!(byte_value("<0x0A>"), Some(10));
        assert_eq!(byte_value("<0xff>"), Some(255));
        assert_eq!(byte_value("<0x1>"), None);
        assert_eq!(byte_value("<0x100>"), None);
        assert_eq!(byte_value("0x41"), None);
    }

    #[test]
    fn higher_score_pops_first_then_leftmost() {
        let p = |score, left| Pair {
            score,
            left,
            right: left + 1,
            len: 2,
        };
        let mut q: BinaryHeap<Pair> = [p(1.0, 5), p(2.0, 9), p(2.0, 3), p(-0.0, 0), p(0.0, 1)]
            .into_iter()
            .collect();
        let order: Vec<usize> = std::iter::from_fn(|| q.pop().map(|p| p.left)).collect();
        assert_eq!(order, [3, 9, 5, 0, 1]);
    }
}
