//! Text to phoneme ids for Piper voices, the way Piper does it.
//!
//! 1. espeak-ng turns the text into IPA phonemes one clause at a time
//!    (`espeak_TextToPhonemes` with `espeakPHONEMES_IPA`, the function and
//!    flags piper-phonemize calls). The library is loaded at run time, so a
//!    machine without espeak-ng gets a message saying how to install it rather
//!    than a binary that does not start.
//! 2. Each clause keeps its terminating punctuation (`.`, `?`, `!`, or `,`
//!    `:` `;` followed by a space), language-switch marks such as `(fr)` are
//!    dropped, and the text is split into sentences where a clause ends one.
//! 3. Phonemes are Unicode code points after NFD decomposition (so accents
//!    become their own phonemes), and ids follow the voice's
//!    `phoneme_id_map`: `^`, then every phoneme followed by the pad `_`, then
//!    `$`. Phonemes missing from the map are skipped and reported.
//!
//! Piper calls a patched `espeak_TextToPhonemesWithTerminator` that also
//! returns the clause's terminator; Debian's espeak-ng 1.51 does not have it,
//! so [`clause_terminator`] reads the terminator back from the text espeak-ng
//! consumed for the clause, following espeak-ng's `ReadClause` rules.

use crate::error::{Error, Result};
use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::path::Path;
use std::sync::{Mutex, MutexGuard, OnceLock};
use unicode_normalization::UnicodeNormalization;

/// Piper's special symbols.
pub const PAD: &str = "_";
pub const BOS: &str = "^";
pub const EOS: &str = "$";

/// One sentence's phonemes, each one Unicode code point (as Piper splits them).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sentence {
    pub phonemes: Vec<String>,
}

impl Sentence {
    pub fn text(&self) -> String {
        self.phonemes.concat()
    }
}

// espeak-ng's C API (speak_lib.h).
const AUDIO_OUTPUT_SYNCHRONOUS: c_int = 2;
const ESPEAK_CHARS_AUTO: c_int = 0;
const ESPEAK_PHONEMES_IPA: c_int = 0x02;
type InitializeFn = unsafe extern "C" fn(c_int, c_int, *const c_char, c_int) -> c_int;
type SetVoiceByNameFn = unsafe extern "C" fn(*const c_char) -> c_int;
type TextToPhonemesFn = unsafe extern "C" fn(*mut *const c_void, c_int, c_int) -> *const c_char;

/// The shared libespeak-ng names tried in order, per platform.
const LIBRARY_NAMES: &[&str] = &[
    "libespeak-ng.so.1",
    "libespeak-ng.so",
    "libespeak-ng.1.dylib",
    "libespeak-ng.dylib",
    "libespeak-ng.dll",
    "espeak-ng.dll",
];

/// How to install espeak-ng, for the error message.
pub const INSTALL_HINT: &str = "install espeak-ng (Debian/Ubuntu: apt-get install espeak-ng; \
     Fedora: dnf install espeak-ng; macOS: brew install espeak-ng)";

struct Espeak {
    // Kept alive for the function pointers below.
    _lib: libloading::Library,
    set_voice: SetVoiceByNameFn,
    text_to_phonemes: TextToPhonemesFn,
    voice: Option<String>,
}

// espeak-ng keeps global state: one caller at a time, behind the mutex.
static ESPEAK: OnceLock<std::result::Result<Mutex<Espeak>, String>> = OnceLock::new();

fn espeak() -> Result<&'static Mutex<Espeak>> {
    ESPEAK
        .get_or_init(|| load_espeak(LIBRARY_NAMES))
        .as_ref()
        .map_err(|e| Error::invalid(e.clone()))
}

fn load_espeak(names: &[&str]) -> std::result::Result<Mutex<Espeak>, String> {
    let mut last_err = String::new();
    for name in names {
        // SAFETY: loading libespeak-ng runs no initialisers with preconditions.
        let lib = match unsafe { libloading::Library::new(name) } {
            Ok(l) => l,
            Err(e) => {
                last_err = e.to_string();
                continue;
            }
        };
        // SAFETY: the signatures are those of speak_lib.h (espeak-ng >= 1.49).
        let symbols = unsafe {
            (
                lib.get::<InitializeFn>(b"espeak_Initialize\0").map(|s| *s),
                lib.get::<SetVoiceByNameFn>(b"espeak_SetVoiceByName\0")
                    .map(|s| *s),
                lib.get::<TextToPhonemesFn>(b"espeak_TextToPhonemes\0")
                    .map(|s| *s),
            )
        };
        let (Ok(init), Ok(set_voice), Ok(text_to_phonemes)) = symbols else {
            return Err(format!(
                "{name} lacks espeak_TextToPhonemes (espeak-ng 1.49 or newer is needed); {INSTALL_HINT}"
            ));
        };
        // SAFETY: synchronous mode, default buffer, default data path, no options.
        let rate = unsafe { init(AUDIO_OUTPUT_SYNCHRONOUS, 0, std::ptr::null(), 0) };
        if rate < 0 {
            return Err(format!(
                "espeak-ng ({name}) failed to initialise: is espeak-ng-data installed? {INSTALL_HINT}"
            ));
        }
        return Ok(Mutex::new(Espeak {
            _lib: lib,
            set_voice,
            text_to_phonemes,
            voice: None,
        }));
    }
    Err(format!(
        "espeak-ng is needed to turn text into phonemes but its library was not found ({last_err}); {INSTALL_HINT}"
    ))
}

/// A clause's terminator as Piper keeps it, and whether it ends a sentence.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Terminator {
    pub punctuation: Option<char>,
    pub ends_sentence: bool,
}

/// The terminator of a clause, read from the text espeak-ng consumed for it.
///
/// `consumed` runs from the clause start to espeak-ng's read position, which
/// is one character past the clause (the first character of the next clause,
/// read ahead and held back) unless `last` (the text ended). espeak-ng ends a
/// clause at `.`, `?`, `!`, `,`, `:` or `;` followed by white space (a `.`
/// before a lower-case word does not end one); two or more dots are an
/// ellipsis, which ends a clause with no terminator Piper keeps; a run of
/// `?`/`!` counts as its first mark; a blank line ends a paragraph (a
/// sentence, no terminator).
pub fn clause_terminator(consumed: &str, last: bool) -> Terminator {
    let mut body = consumed;
    if !last {
        if let Some((i, _)) = body.char_indices().next_back() {
            body = &body[..i];
        }
    }
    let trimmed = body.trim_end();
    let trailing_newlines = body[trimmed.len()..].matches('\n').count();
    let paragraph = trailing_newlines >= 2;
    let chars: Vec<char> = trimmed.chars().collect();
    let Some(&c) = chars.last() else {
        return Terminator {
            punctuation: None,
            ends_sentence: last || paragraph,
        };
    };
    let run_start = |set: &[char]| {
        let mut i = chars.len() - 1;
        while i > 0 && set.contains(&chars[i - 1]) {
            i -= 1;
        }
        i
    };
    let punctuation = match c {
        '.' if chars.len() >= 2 && chars[chars.len() - 2] == '.' => None,
        '.' | ',' | ':' | ';' => Some(c),
        '?' | '!' => Some(chars[run_start(&['?', '!'])]),
        _ => None,
    };
    let ellipsis = c == '…' || (c == '.' && punctuation.is_none());
    if paragraph && punctuation.is_some() {
        // espeak-ng reports a paragraph end instead of the punctuation.
        return Terminator {
            punctuation: None,
            ends_sentence: true,
        };
    }
    Terminator {
        punctuation,
        ends_sentence: match punctuation {
            Some('.' | '?' | '!') => true,
            Some(_) => false,
            None => last || (paragraph && !ellipsis),
        },
    }
}

/// Removes espeak-ng's language-switch marks such as `(en)` or `(fr)`.
fn strip_language_flags(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(open) = rest.find('(') {
        match rest[open + 1..].find(')') {
            Some(len) if len > 0 => {
                out.push_str(&rest[..open]);
                rest = &rest[open + 1 + len + 1..];
            }
            _ => {
                out.push_str(&rest[..=open]);
                rest = &rest[open + 1..];
            }
        }
    }
    out.push_str(rest);
    out
}

/// espeak-ng's clauses of one text, read one library call at a time. The
/// library is held for the whole text: its clause reader keeps state from
/// one call to the next, so another text must not come between.
struct EspeakClauses {
    espeak: MutexGuard<'static, Espeak>,
    c_text: CString,
    /// Byte offset of the next clause; `None` once the text is read.
    pos: Option<usize>,
}

impl EspeakClauses {
    fn new(voice: &str, text: &str) -> Result<EspeakClauses> {
        let mut e = espeak()?.lock().unwrap_or_else(|p| p.into_inner());
        if e.voice.as_deref() != Some(voice) {
            let name = CString::new(voice)
                .map_err(|_| Error::invalid(format!("espeak voice name {voice:?} contains NUL")))?;
            // SAFETY: a NUL-terminated string that outlives the call.
            if unsafe { (e.set_voice)(name.as_ptr()) } != 0 {
                return Err(Error::invalid(format!(
                    "espeak-ng has no voice '{voice}' (is espeak-ng-data complete?)"
                )));
            }
            e.voice = Some(voice.to_string());
        }
        // NUL would end the C string early; espeak-ng reads it as a space anyway.
        let c_text = CString::new(text.replace('\0', " ")).expect("NULs replaced");
        Ok(EspeakClauses {
            espeak: e,
            c_text,
            pos: Some(0),
        })
    }
}

impl Iterator for EspeakClauses {
    /// (IPA phonemes, terminator)
    type Item = (String, Terminator);

    fn next(&mut self) -> Option<(String, Terminator)> {
        let before = self.pos?;
        let bytes = self.c_text.as_bytes();
        let len = bytes.len();
        let start = self.c_text.as_ptr();
        // SAFETY: `before` <= len, so the pointer stays inside `c_text` (at
        // worst on its NUL), which outlives the call; espeak-ng advances it
        // within the string or sets it to NULL at the end.
        let mut pos: *const c_void = unsafe { start.add(before) }.cast();
        let out = unsafe {
            (self.espeak.text_to_phonemes)(&mut pos, ESPEAK_CHARS_AUTO, ESPEAK_PHONEMES_IPA)
        };
        let last = pos.is_null();
        let after = if last {
            len
        } else {
            (pos as usize - start as usize).min(len)
        };
        let phonemes = if out.is_null() {
            String::new()
        } else {
            // SAFETY: espeak-ng returns a NUL-terminated static buffer, copied at once.
            unsafe { CStr::from_ptr(out) }
                .to_string_lossy()
                .into_owned()
        };
        let consumed = String::from_utf8_lossy(&bytes[before.min(after)..after]);
        let term = clause_terminator(&consumed, last);
        // No progress: stop rather than loop forever.
        self.pos = (!last && after > before).then_some(after);
        Some((phonemes, term))
    }
}

/// A clause as Piper keeps it: the phonemes without language-switch marks,
/// then the terminating punctuation (and a space after `,` `:` `;`).
fn clause_phonemes(phonemes: &str, term: Terminator) -> String {
    let mut s = strip_language_flags(phonemes);
    if let Some(p) = term.punctuation {
        s.push(p);
        if matches!(p, ',' | ':' | ';') {
            s.push(' ');
        }
    }
    s
}

/// Phonemises `text` with espeak-ng voice `voice` (e.g. "en-us"), grouped
/// into sentences. Text that yields no phonemes gives no sentences.
pub fn phonemize(voice: &str, text: &str) -> Result<Vec<Sentence>> {
    let mut sentences = Vec::new();
    let mut current: Vec<String> = Vec::new();
    for (phonemes, term) in EspeakClauses::new(voice, text)? {
        current.extend(clause_phonemes(&phonemes, term).nfd().map(String::from));
        if term.ends_sentence {
            sentences.push(Sentence {
                phonemes: std::mem::take(&mut current),
            });
        }
    }
    if !current.is_empty() {
        sentences.push(Sentence { phonemes: current });
    }
    sentences.retain(|s| !s.phonemes.is_empty());
    Ok(sentences)
}

/// A voice's phoneme -> ids table (`phoneme_id_map` in the .onnx.json), with
/// its optional `phoneme_map` (phoneme -> replacement phonemes).
#[derive(Clone, Debug)]
pub struct PhonemeIdMap {
    ids: HashMap<String, Vec<i64>>,
    replace: HashMap<String, Vec<String>>,
}

/// The ids of one sentence and the phonemes the map lacked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ids {
    pub ids: Vec<i64>,
    pub missing: Vec<String>,
}

impl PhonemeIdMap {
    /// Reads the maps from a parsed voice config; `path` names it in errors.
    pub fn from_config(path: &Path, config: &serde_json::Value) -> Result<PhonemeIdMap> {
        let bad = |what: &str| Error::format(path, what.to_string());
        let map = config
            .get("phoneme_id_map")
            .and_then(|m| m.as_object())
            .ok_or_else(|| bad("no phoneme_id_map object"))?;
        let mut ids = HashMap::new();
        for (k, v) in map {
            let list = v
                .as_array()
                .and_then(|a| a.iter().map(|x| x.as_i64()).collect::<Option<Vec<_>>>())
                .ok_or_else(|| bad(&format!("phoneme_id_map[{k:?}] is not a list of integers")))?;
            ids.insert(k.clone(), list);
        }
        for special in [PAD, BOS, EOS] {
            if !ids.contains_key(special) {
                return Err(bad(&format!("phoneme_id_map has no '{special}'")));
            }
        }
        let mut replace = HashMap::new();
        if let Some(m) = config.get("phoneme_map").and_then(|m| m.as_object()) {
            for (k, v) in m {
                let list = v
                    .as_array()
                    .and_then(|a| {
                        a.iter()
                            .map(|x| x.as_str().map(String::from))
                            .collect::<Option<Vec<_>>>()
                    })
                    .ok_or_else(|| bad(&format!("phoneme_map[{k:?}] is not a list of strings")))?;
                replace.insert(k.clone(), list);
            }
        }
        Ok(PhonemeIdMap { ids, replace })
    }

    /// Piper's ids for one sentence: `^ _ p1 _ p2 _ ... pn _ $`.
    pub fn sentence_ids(&self, sentence: &Sentence) -> Ids {
        let pad = &self.ids[PAD];
        let mut ids = self.ids[BOS].clone();
        ids.extend(pad);
        let mut missing = Vec::new();
        for p in &sentence.phonemes {
            let replaced;
            let phonemes: &[String] = match self.replace.get(p) {
                Some(r) => r,
                None => {
                    replaced = [p.clone()];
                    &replaced
                }
            };
            for p in phonemes {
                match self.ids.get(p) {
                    Some(v) => {
                        ids.extend(v);
                        ids.extend(pad);
                    }
                    None => missing.push(p.clone()),
                }
            }
        }
        ids.extend(&self.ids[EOS]);
        Ids { ids, missing }
    }
}

/// One sentence to synthesise: its phonemes (when they came from text) and
/// ids, and whether it continues the sentence before it (a piece of a long
/// one: no pause between them).
pub struct SentenceIds {
    pub phonemes: Option<String>,
    pub ids: Vec<i64>,
    pub continues: bool,
}

impl AsRef<[i64]> for SentenceIds {
    fn as_ref(&self) -> &[i64] {
        &self.ids
    }
}

/// Phonemes synthesised in one pass at most (about 70 words, 25 s of
/// speech). The model's memory and time grow faster than linearly with a
/// pass's length (a 400-word run-on sentence took 29 s and 1.24 GB in one
/// pass, 2000 words did not finish in 500 s), so longer sentences are cut.
pub const MAX_PHONEMES: usize = 400;

/// `s` cut into pieces of at most [`MAX_PHONEMES`] phonemes: after the last
/// clause mark (`,` `;` `:`) in the second half of a piece, else at the last
/// word boundary, else (one enormous word) at the limit.
fn split_long(s: Sentence) -> Vec<Sentence> {
    let mut pieces = Vec::new();
    let mut rest = s.phonemes;
    while rest.len() > MAX_PHONEMES {
        let window = &rest[..MAX_PHONEMES];
        let clause = (MAX_PHONEMES / 2..MAX_PHONEMES)
            .rev()
            .find(|&i| matches!(window[i].as_str(), "," | ";" | ":"));
        let space = (1..MAX_PHONEMES).rev().find(|&i| window[i] == " ");
        let cut = clause.map(|i| i + 1).or(space).unwrap_or(MAX_PHONEMES);
        let tail = rest.split_off(cut);
        pieces.push(Sentence { phonemes: rest });
        rest = tail;
        while rest.first().is_some_and(|p| p == " ") {
            rest.remove(0);
        }
    }
    if !rest.is_empty() {
        pieces.push(Sentence { phonemes: rest });
    }
    pieces
}

/// Where a text's phonemes come from (the voice's `phoneme_type`).
#[derive(Clone, Copy, Debug)]
pub enum Phonemes<'a> {
    /// espeak-ng with this voice (e.g. "en-us").
    Espeak(&'a str),
    /// The text's code points after NFD decomposition, each non-empty line
    /// (trimmed) a sentence, as Piper's command line reads `text` voices.
    Text,
}

/// A text's clauses: (phonemes, whether the clause ends a sentence).
enum Clauses<'t> {
    Espeak(EspeakClauses),
    Text(std::str::Lines<'t>),
}

impl Iterator for Clauses<'_> {
    type Item = (Vec<String>, bool);

    fn next(&mut self) -> Option<(Vec<String>, bool)> {
        match self {
            Clauses::Espeak(c) => {
                let (phonemes, term) = c.next()?;
                let p = clause_phonemes(&phonemes, term)
                    .nfd()
                    .map(String::from)
                    .collect();
                Some((p, term.ends_sentence))
            }
            Clauses::Text(lines) => loop {
                let line = lines.next()?.trim();
                if !line.is_empty() {
                    return Some((line.nfd().map(String::from).collect(), true));
                }
            },
        }
    }
}

/// Text -> sentences of ids, produced as they are read: the first
/// sentence's ids are ready after its own clauses, not after the whole text,
/// and what is held at once is one sentence's phonemes (a sentence longer
/// than [`MAX_PHONEMES`] is given out piece by piece as it is read).
/// Notices say what cannot be spoken; a text with nothing to say at all is
/// an error.
pub struct SentenceStream<'t, 'm> {
    clauses: Clauses<'t>,
    id_map: &'m PhonemeIdMap,
    source: String,
    /// The phonemes of the sentence being read that are not given out yet.
    current: Vec<String>,
    /// `current` is the rest of a sentence whose first pieces were given out.
    continues: bool,
    ready: std::collections::VecDeque<SentenceIds>,
    spoken: bool,
    done: bool,
}

impl<'t, 'm> SentenceStream<'t, 'm> {
    pub fn new(
        text: &'t str,
        phonemes: Phonemes<'_>,
        id_map: &'m PhonemeIdMap,
    ) -> Result<SentenceStream<'t, 'm>> {
        if text.trim().is_empty() {
            return Err(Error::invalid("no text to speak (the text is empty)"));
        }
        let (clauses, source) = match phonemes {
            Phonemes::Espeak(voice) => (
                Clauses::Espeak(EspeakClauses::new(voice, text)?),
                format!("espeak-ng found nothing to say in the text (voice {voice})"),
            ),
            Phonemes::Text => (
                Clauses::Text(text.lines()),
                "the text has nothing the voice can say".to_string(),
            ),
        };
        Ok(SentenceStream {
            clauses,
            id_map,
            source,
            current: Vec::new(),
            continues: false,
            ready: Default::default(),
            spoken: false,
            done: false,
        })
    }

    /// Cuts what is read of the current sentence into passes; `end`: the
    /// sentence is complete, else the last piece is kept to grow.
    fn cut(&mut self, end: bool) {
        if self.current.is_empty() {
            return;
        }
        let mut pieces = split_long(Sentence {
            phonemes: std::mem::take(&mut self.current),
        });
        if !end {
            if let Some(rest) = pieces.pop() {
                self.current = rest.phonemes;
            }
        }
        for s in pieces {
            // A clause espeak-ng could not read leaves only its punctuation:
            // nothing to say (Piper would synthesise a short breath for it).
            let speakable = s
                .phonemes
                .iter()
                .any(|p| !p.chars().all(|c| c.is_whitespace() || ".,;:!?".contains(c)));
            if !speakable {
                crate::notice!("notice: nothing to say in \"{}\"; skipped", s.text());
                continue;
            }
            let r = self.id_map.sentence_ids(&s);
            if !r.missing.is_empty() {
                crate::notice!(
                    "notice: skipped phonemes the voice does not know: {} (in \"{}\")",
                    r.missing.join(" "),
                    s.text()
                );
            }
            self.ready.push_back(SentenceIds {
                phonemes: Some(s.text()),
                ids: r.ids,
                continues: self.continues,
            });
            self.continues = true;
        }
        if end {
            self.continues = false;
        }
    }
}

impl Iterator for SentenceStream<'_, '_> {
    type Item = Result<SentenceIds>;

    fn next(&mut self) -> Option<Result<SentenceIds>> {
        loop {
            if let Some(s) = self.ready.pop_front() {
                self.spoken = true;
                return Some(Ok(s));
            }
            if self.done {
                return None;
            }
            match self.clauses.next() {
                Some((phonemes, ends_sentence)) => {
                    self.current.extend(phonemes);
                    if ends_sentence {
                        self.cut(true);
                    } else if self.current.len() > 2 * MAX_PHONEMES {
                        self.cut(false);
                    }
                }
                None => {
                    self.done = true;
                    self.cut(true);
                    if self.ready.is_empty() && !self.spoken {
                        return Some(Err(Error::invalid(self.source.clone())));
                    }
                }
            }
        }
    }
}

/// Text -> sentences of ids, all at once (see [`SentenceStream`]).
pub fn text_to_ids(text: &str, voice: &str, id_map: &PhonemeIdMap) -> Result<Vec<SentenceIds>> {
    SentenceStream::new(text, Phonemes::Espeak(voice), id_map)?.collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(p: Option<char>, end: bool) -> Terminator {
        Terminator {
            punctuation: p,
            ends_sentence: end,
        }
    }

    #[test]
    fn terminators_follow_espeak_clause_rules() {
        // (consumed text, last clause?) -> terminator
        assert_eq!(clause_terminator("Hello there.", true), t(Some('.'), true));
        assert_eq!(clause_terminator("Dr. S", false), t(Some('.'), true));
        assert_eq!(
            clause_terminator("paid $3.50, d", false),
            t(Some(','), false)
        );
        assert_eq!(clause_terminator("Yes: t", false), t(Some(':'), false));
        assert_eq!(clause_terminator("Hi!  B", false), t(Some('!'), true));
        assert_eq!(clause_terminator("What?! N", false), t(Some('?'), true));
        assert_eq!(clause_terminator("Wait... w", false), t(None, false));
        assert_eq!(clause_terminator("the lazy dog", true), t(None, true));
        assert_eq!(clause_terminator("one.\n\nT", false), t(None, true));
    }

    #[test]
    fn a_missing_library_says_how_to_install_it() {
        let Err(e) = load_espeak(&["libespeak-ng-not-here.so.9"]) else {
            panic!("loaded a library that does not exist");
        };
        assert!(
            e.contains("espeak-ng is needed") && e.contains("apt-get install espeak-ng"),
            "{e}"
        );
    }

    #[test]
    fn language_flags_are_removed() {
        assert_eq!(
            strip_language_flags("(en)hˈɛloʊ(fr) wˈɜːld"),
            "hˈɛloʊ wˈɜːld"
        );
        assert_eq!(strip_language_flags("a () b ("), "a () b (");
    }

    fn toy_map() -> PhonemeIdMap {
        let mut ids = serde_json::Map::new();
        for (i, p) in ["_", "^", "$", " ", ",", "a", "b"].iter().enumerate() {
            ids.insert(p.to_string(), serde_json::json!([i]));
        }
        let cfg = serde_json::json!({ "phoneme_id_map": ids });
        PhonemeIdMap::from_config(Path::new("v.json"), &cfg).unwrap()
    }

    #[test]
    fn text_voices_speak_each_line_as_its_code_points() {
        let map = toy_map();
        let got: Vec<SentenceIds> = SentenceStream::new("ab\n\n  ba , \n", Phonemes::Text, &map)
            .unwrap()
            .collect::<Result<_>>()
            .unwrap();
        let phonemes: Vec<_> = got.iter().map(|s| s.phonemes.clone().unwrap()).collect();
        assert_eq!(phonemes, ["ab", "ba ,"]);
        assert_eq!(got[0].ids, [1, 0, 5, 0, 6, 0, 2]);
        assert!(got.iter().all(|s| !s.continues));
        let mut none = SentenceStream::new(" .,\n", Phonemes::Text, &map).unwrap();
        assert!(none.next().unwrap().is_err());
        assert!(none.next().is_none());
    }

    /// A sentence too long for one pass is given out piece by piece as it
    /// is read, in the same pieces as cutting the whole sentence at once.
    #[test]
    fn a_long_sentence_streams_in_the_pieces_of_a_whole_cut() {
        let text = "and the keeper wound the clockwork, ".repeat(150);
        let whole = phonemize("en-us", &text).unwrap();
        assert_eq!(whole.len(), 1, "one sentence");
        assert!(whole[0].phonemes.len() > 8 * MAX_PHONEMES);
        let want: Vec<String> = split_long(whole[0].clone())
            .iter()
            .map(|s| s.text())
            .collect();
        let map = toy_map();
        let got: Vec<SentenceIds> = SentenceStream::new(&text, Phonemes::Espeak("en-us"), &map)
            .unwrap()
            .collect::<Result<_>>()
            .unwrap();
        let texts: Vec<String> = got.iter().map(|s| s.phonemes.clone().unwrap()).collect();
        assert_eq!(texts, want);
        assert!(!got[0].continues && got[1..].iter().all(|s| s.continues));
    }

    #[test]
    fn ids_are_padded_and_missing_phonemes_reported() {
        let cfg = serde_json::json!({
            "phoneme_id_map": {"_": [0], "^": [1], "$": [2], "a": [5], "b": [6, 7]},
            "phoneme_map": {"c": ["a", "b"]}
        });
        let map = PhonemeIdMap::from_config(Path::new("v.json"), &cfg).unwrap();
        let s = Sentence {
            phonemes: ["a", "x", "b", "c"].map(String::from).to_vec(),
        };
        let got = map.sentence_ids(&s);
        assert_eq!(got.ids, [1, 0, 5, 0, 6, 7, 0, 5, 0, 6, 7, 0, 2]);
        assert_eq!(got.missing, ["x"]);
        let e = PhonemeIdMap::from_config(Path::new("v.json"), &serde_json::json!({}))
            .unwrap_err()
            .to_string();
        assert!(e.contains("v.json") && e.contains("phoneme_id_map"), "{e}");
    }
}
