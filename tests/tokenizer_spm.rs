//! The SentencePiece tokenizer of GGUF files (`tokenizer.ggml.model =
//! "llama"`): Gemma-3's real vocabulary against llama.cpp's ids and text
//! (samples/fixtures/llm/gemma3-270m.tokens.json, made by
//! scripts/fixtures/gemma3_tokens.py), and tiny hand-made vocabularies for
//! each rule on its own.

mod common;

use lfm::formats::gguf::{GgufFile, GgufWriter};
use lfm::models::gguf_tokenizer;
use lfm::tokenizer::{GgufVocab, TextStream, Tokenizer};
use serde_json::Value as Json;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

fn gemma_path() -> PathBuf {
    common::model("gemma3-270m/gemma-3-270m-q4_k_m.gguf")
}

/// Gemma-3's tokenizer as shipped (add_space_prefix false), loaded once.
fn gemma() -> &'static Tokenizer {
    static TOK: OnceLock<Tokenizer> = OnceLock::new();
    TOK.get_or_init(|| gguf_tokenizer(&GgufFile::open(gemma_path()).unwrap()).unwrap())
}

/// The same vocabulary with `tokenizer.ggml.add_space_prefix` true, as the
/// fixture script patched it for llama.cpp: a metadata-only copy.
fn gemma_space_prefix() -> &'static Tokenizer {
    static TOK: OnceLock<Tokenizer> = OnceLock::new();
    TOK.get_or_init(|| {
        let g = GgufFile::open(gemma_path()).unwrap();
        let mut w = GgufWriter::new();
        for (k, v) in g.metadata() {
            w.set(k.clone(), v.clone()).unwrap();
        }
        w.set("tokenizer.ggml.add_space_prefix", true).unwrap();
        let path = common::scratch("spm-space-prefix").join("vocab.gguf");
        w.write(&path, false).unwrap();
        gguf_tokenizer(&GgufFile::open(&path).unwrap()).unwrap()
    })
}

fn fixture() -> &'static Json {
    static FIXTURE: OnceLock<Json> = OnceLock::new();
    FIXTURE.get_or_init(|| {
        let path = common::repo().join("samples/fixtures/llm/gemma3-270m.tokens.json");
        let f: Json = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        assert_eq!(f["format_version"], 1);
        f
    })
}

fn ids(v: &Json) -> Vec<u32> {
    v.as_array()
        .expect("id list")
        .iter()
        .map(|i| i.as_u64().unwrap() as u32)
        .collect()
}

/// Every case of `key` encodes, with and without BOS, to llama.cpp's ids.
fn check_encode(tok: &Tokenizer, key: &str) {
    let cases = fixture()[key].as_array().unwrap();
    assert!(cases.len() >= 15, "{key}: only {} cases", cases.len());
    let mut wrong = Vec::new();
    for case in cases {
        let text = case["text"].as_str().unwrap();
        for (add_special, want) in [(true, "with_bos"), (false, "without_bos")] {
            let got = tok.encode(text, add_special).unwrap();
            let want = ids(&case[want]);
            if got != want {
                wrong.push(format!(
                    "{text:?} (add_special {add_special}):\n  lfm       {got:?}\n  llama.cpp {want:?}"
                ));
            }
        }
    }
    assert!(wrong.is_empty(), "{key}: {}", wrong.join("\n"));
}

#[test]
fn gemma_encodes_like_llama_cpp() {
    check_encode(gemma(), "encode");
}

#[test]
fn gemma_encodes_random_text_like_llama_cpp() {
    check_encode(gemma(), "encode_random");
}

#[test]
fn gemma_with_space_prefix_encodes_like_llama_cpp() {
    check_encode(gemma_space_prefix(), "encode_add_space_prefix");
}

#[test]
fn gemma_decodes_like_llama_cpp() {
    let mut wrong = Vec::new();
    let decodes = fixture()["decode"].as_array().unwrap();
    for d in decodes {
        let tok = match d["variant"].as_str().unwrap() {
            "as shipped" => gemma(),
            "add_space_prefix" => gemma_space_prefix(),
            other => panic!("unknown variant {other}"),
        };
        let ids = ids(&d["ids"]);
        let got = tok.decode(&ids).unwrap();
        let want = d["text"].as_str().unwrap();
        if got != want {
            wrong.push(format!(
                "{} {ids:?}:\n  lfm       {got:?}\n  llama.cpp {want:?}",
                d["variant"]
            ));
        }
    }
    assert!(decodes.len() >= 20);
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[test]
fn gemma_text_round_trips() {
    for case in fixture()["encode"].as_array().unwrap() {
        let text = case["text"].as_str().unwrap();
        let ids = gemma().encode(text, true).unwrap();
        // Special-token texts decode to nothing, everything else to itself.
        let mut plain = text.to_string();
        for special in [
            "<start_of_turn>",
            "<end_of_turn>",
            "<unused5>",
            "<bos>",
            "</s>",
        ] {
            plain = plain.replace(special, "");
        }
        assert_eq!(gemma().decode(&ids).unwrap(), plain, "{ids:?}");
    }
}

#[test]
fn gemma_streams_whole_characters() {
    for (tok, key) in [
        (gemma(), "encode"),
        (gemma_space_prefix(), "encode_add_space_prefix"),
    ] {
        for case in fixture()[key].as_array().unwrap() {
            let text = case["text"].as_str().unwrap();
            if text.contains('<') {
                continue; // special tokens are left out of the stream
            }
            let mut stream = TextStream::new(tok);
            let mut out = String::new();
            for id in ids(&case["without_bos"]) {
                if let Some(piece) = stream.push(id).unwrap() {
                    assert!(!piece.contains('\u{FFFD}'), "{key} {text:?}: {piece:?}");
                    out.push_str(&piece);
                }
            }
            out.extend(stream.finish().unwrap());
            // A stream continues a text, so no leading space is removed: it
            // is every token's piece, as decoding after a BOS gives them.
            let after_bos = [&[2][..], &ids(&case["without_bos"])].concat();
            assert_eq!(out, tok.decode(&after_bos).unwrap(), "{key}");
            if key == "encode" {
                assert_eq!(out, text);
            }
        }
    }
}

#[test]
fn gemma_special_ids() {
    let tok = gemma();
    assert_eq!(tok.vocab_size(), 262144);
    assert_eq!(tok.bos_id, Some(2));
    assert_eq!(tok.bos_token.as_deref(), Some("<bos>"));
    assert_eq!(tok.eos_token.as_deref(), Some("<eos>"));
    // <eos>, and what llama.cpp knows by its text: <end_of_turn> and </s>
    // (which Gemma has as a user-defined token, an HTML-like tag; llama.cpp
    // makes it a control token, as its log says).
    assert_eq!(tok.eos_ids, [1, 106, 212]);
    assert_eq!(tok.token_to_id("<start_of_turn>"), Some(105));
    assert_eq!(tok.token_to_id("▁Hello"), Some(26352));
}

// ---- tiny hand-made vocabularies ----

const TINY: &str = "tiny.gguf";

/// `<unk>` 0, `<s>` 1, `</s>` 2, `<0x00>`..`<0xFF>` 3..258, then `pieces`
/// (text, score) as normal tokens from 259 and `extra` (text, token type).
fn vocab(pieces: &[(&str, f32)], extra: &[(&str, i32)]) -> GgufVocab {
    let mut tokens: Vec<String> = ["<unk>", "<s>", "</s>"].map(String::from).into();
    let mut types = vec![2, 3, 3];
    tokens.extend((0..=255).map(|b| format!("<0x{b:02X}>")));
    types.extend([6; 256]);
    let mut scores = vec![0.0; tokens.len()];
    for &(t, s) in pieces {
        tokens.push(t.into());
        scores.push(s);
        types.push(1);
    }
    for &(t, ty) in extra {
        tokens.push(t.into());
        scores.push(0.0);
        types.push(ty);
    }
    GgufVocab {
        model: "llama".into(),
        pre: "default".into(),
        tokens,
        merges: Vec::new(),
        scores,
        token_types: types,
        bos_id: Some(1),
        eos_id: Some(2),
        extra_eos_ids: Vec::new(),
        add_bos: Some(true),
        add_eos: Some(false),
        add_space_prefix: Some(false),
        chat_template: None,
    }
}

fn tiny(v: GgufVocab) -> Tokenizer {
    Tokenizer::from_gguf_vocab(Path::new(TINY), v).unwrap()
}

/// `text` encoded without special tokens, as token texts.
fn pieces(tok: &Tokenizer, v: &GgufVocab, text: &str) -> Vec<String> {
    tok.encode(text, false)
        .unwrap()
        .iter()
        .map(|&id| v.tokens[id as usize].clone())
        .collect()
}

const ABC: &[(&str, f32)] = &[
    ("a", -1.0),
    ("b", -1.0),
    ("c", -1.0),
    ("d", -1.0),
    ("▁", -1.0),
];

/// ABC and `extra`.
fn with(extra: &[(&'static str, f32)]) -> Vec<(&'static str, f32)> {
    [ABC, extra].concat()
}

#[test]
fn the_best_scoring_pair_merges_first() {
    let v = vocab(&with(&[("ab", -3.0), ("bc", -2.0)]), &[]);
    assert_eq!(pieces(&tiny(v.clone()), &v, "abc"), ["a", "bc"]);
    let v = vocab(&with(&[("ab", -2.0), ("bc", -3.0)]), &[]);
    assert_eq!(pieces(&tiny(v.clone()), &v, "abc"), ["ab", "c"]);
}

#[test]
fn equal_scores_merge_the_leftmost_pair() {
    let v = vocab(&with(&[("ab", -2.0), ("bc", -2.0)]), &[]);
    assert_eq!(pieces(&tiny(v.clone()), &v, "abc"), ["ab", "c"]);
    let v = vocab(&with(&[("aa", -2.0)]), &[]);
    assert_eq!(pieces(&tiny(v.clone()), &v, "aaaaa"), ["aa", "aa", "a"]);
}

#[test]
fn merges_build_on_merges() {
    // ab and cd first (best scores), then abcd from them; "bc" loses to both.
    let v = vocab(
        &with(&[("ab", -1.5), ("cd", -1.6), ("bc", -1.7), ("abcd", -5.0)]),
        &[],
    );
    assert_eq!(pieces(&tiny(v.clone()), &v, "abcd"), ["abcd"]);
    // No token joins "ab" and "c": the merge stops there.
    assert_eq!(pieces(&tiny(v.clone()), &v, "abc"), ["ab", "c"]);
}

#[test]
fn characters_outside_the_vocabulary_fall_back_to_bytes() {
    let v = vocab(ABC, &[]);
    let tok = tiny(v.clone());
    assert_eq!(pieces(&tok, &v, "aéb"), ["a", "<0xC3>", "<0xA9>", "b"]);
    assert_eq!(pieces(&tok, &v, "€"), ["<0xE2>", "<0x82>", "<0xAC>"]);
    assert_eq!(
        tok.decode(&tok.encode("aéb€", false).unwrap()).unwrap(),
        "aéb€"
    );

    // Without byte tokens the text cannot be spelled: an error naming the file.
    let mut v = vocab(ABC, &[]);
    v.tokens[3 + 0xC3] = "<0xC3-gone>".into();
    v.token_types[3 + 0xC3] = 1;
    let e = tiny(v).encode("é", false).unwrap_err().to_string();
    assert!(e.starts_with(TINY) && e.contains("<0xC3>"), "{e}");
}

#[test]
fn add_space_prefix_puts_a_space_before_the_text_and_after_special_tokens() {
    let pieces_list = with(&[("▁a", -0.5), ("▁b", -0.5)]);
    let mut v = vocab(&pieces_list, &[("<ctl>", 3), ("\n", 4)]);
    let off = tiny(v.clone());
    assert_eq!(pieces(&off, &v, "a b"), ["a", "▁b"]);
    assert_eq!(pieces(&off, &v, "<ctl>a\nb"), ["<ctl>", "a", "\n", "b"]);
    v.add_space_prefix = Some(true);
    let on = tiny(v.clone());
    assert_eq!(pieces(&on, &v, "a b"), ["▁a", "▁b"]);
    assert_eq!(pieces(&on, &v, "<ctl>a\nb"), ["<ctl>", "▁a", "\n", "▁b"]);
    assert_eq!(pieces(&on, &v, ""), Vec::<String>::new());
    assert_eq!(on.encode("", true).unwrap(), [1]);

    // Decoding removes that space from the first token, except after BOS.
    let ids = on.encode("a b", false).unwrap();
    assert_eq!(on.decode(&ids).unwrap(), "a b");
    assert_eq!(on.decode(&on.encode("a b", true).unwrap()).unwrap(), " a b");
    assert_eq!(off.decode(&ids).unwrap(), " a b");
}

#[test]
fn special_tokens_are_cut_out_longest_first() {
    let v = vocab(
        ABC,
        &[("<ctl>", 3), ("  ", 4), ("   ", 4), ("<ctl><ctl>", 4)],
    );
    let tok = tiny(v.clone());
    // 4 spaces: the 3-space token at the left, then one escaped space.
    assert_eq!(pieces(&tok, &v, "a    b"), ["a", "   ", "▁", "b"]);
    assert_eq!(
        pieces(&tok, &v, "<ctl><ctl><ctl>a"),
        ["<ctl><ctl>", "<ctl>", "a"]
    );
    // Control tokens are parsed from the text, BOS included.
    assert_eq!(
        tok.encode("<s>a</s>", true).unwrap(),
        [1, 1, tok.token_to_id("a").unwrap(), 2]
    );
    // They decode to nothing; user-defined ones to their text.
    let ids = tok.encode("a<ctl>b  c", false).unwrap();
    assert_eq!(tok.decode(&ids).unwrap(), "ab  c");
}

#[test]
fn eos_is_added_and_dropped_when_the_vocabulary_asks() {
    let mut v = vocab(ABC, &[]);
    v.add_eos = Some(true);
    let tok = tiny(v);
    let ids = tok.encode("ab", true).unwrap();
    assert_eq!(ids.first(), Some(&1));
    assert_eq!(ids.last(), Some(&2));
    assert_eq!(tok.decode(&ids).unwrap(), "ab");
}

#[test]
fn llama_cpp_defaults_apply_when_the_file_says_nothing() {
    let mut v = vocab(&with(&[("▁a", 0.0)]), &[]);
    v.bos_id = None;
    v.eos_id = None;
    v.add_bos = None;
    v.add_space_prefix = None;
    v.scores.clear();
    let tok = tiny(v);
    assert_eq!(tok.bos_id, Some(1));
    assert_eq!(tok.eos_ids, [2]);
    let a = tok.token_to_id("▁a").unwrap();
    assert_eq!(tok.encode("a", true).unwrap(), [1, a]);
}

#[test]
fn a_stream_waits_for_the_last_byte_of_a_character() {
    let v = vocab(ABC, &[]);
    let tok = tiny(v);
    let ids = tok.encode("aé", false).unwrap();
    assert_eq!(ids.len(), 3);
    let mut stream = TextStream::new(&tok);
    assert_eq!(stream.push(ids[0]).unwrap().as_deref(), Some("a"));
    assert_eq!(stream.push(ids[1]).unwrap(), None);
    assert_eq!(stream.push(ids[2]).unwrap().as_deref(), Some("é"));
    assert_eq!(stream.finish().unwrap(), None);
}

// ---- bad input: one line naming the file ----

/// A GGUF file holding only `vocab` as `tokenizer.ggml.*` metadata.
fn write_vocab(name: &str, v: &GgufVocab) -> PathBuf {
    let mut w = GgufWriter::new();
    w.set("general.architecture", "llama").unwrap();
    w.set("tokenizer.ggml.model", v.model.as_str()).unwrap();
    w.set("tokenizer.ggml.tokens", v.tokens.clone()).unwrap();
    w.set("tokenizer.ggml.scores", v.scores.clone()).unwrap();
    w.set("tokenizer.ggml.token_type", v.token_types.clone())
        .unwrap();
    w.set("tokenizer.ggml.bos_token_id", 1u32).unwrap();
    w.set("tokenizer.ggml.eos_token_id", 2u32).unwrap();
    if let Some(prefix) = v.add_space_prefix {
        w.set("tokenizer.ggml.add_space_prefix", prefix).unwrap();
    }
    let path = common::scratch(&format!("spm-{name}")).join(format!("{name}.gguf"));
    w.write(&path, false).unwrap();
    path
}

fn load_err(path: &Path) -> String {
    let e = match gguf_tokenizer(&GgufFile::open(path).unwrap()) {
        Ok(_) => panic!("{}: loaded without error", path.display()),
        Err(e) => e.to_string(),
    };
    assert!(
        e.starts_with(&path.display().to_string()),
        "error does not name the file: {e}"
    );
    assert!(!e.contains('\n'), "error is not one line: {e}");
    e
}

#[test]
fn a_tiny_vocabulary_file_loads() {
    let v = vocab(&with(&[("ab", -0.5)]), &[]);
    let tok = gguf_tokenizer(&GgufFile::open(write_vocab("good", &v)).unwrap()).unwrap();
    assert_eq!(pieces(&tok, &v, "abc"), ["ab", "c"]);
}

#[test]
fn unknown_tokenizer_models_are_refused() {
    let mut v = vocab(ABC, &[]);
    v.model = "bert".into();
    let e = load_err(&write_vocab("bert", &v));
    assert!(
        e.contains("'bert'") && e.contains("gpt2") && e.contains("llama"),
        "{e}"
    );
}

#[test]
fn scores_and_types_must_match_the_tokens() {
    let mut v = vocab(ABC, &[]);
    v.scores.pop();
    let e = load_err(&write_vocab("scores", &v));
    assert!(e.contains("tokenizer.ggml.scores"), "{e}");
    let mut v = vocab(ABC, &[]);
    v.token_types.push(1);
    let e = load_err(&write_vocab("types", &v));
    assert!(e.contains("tokenizer.ggml.token_type"), "{e}");
}

#[test]
fn duplicate_and_malformed_tokens_are_refused() {
    let mut v = vocab(&with(&[("a", -2.0)]), &[]);
    let e = load_err(&write_vocab("duplicate", &v));
    assert!(e.contains("\"a\""), "{e}");
    v = vocab(ABC, &[("<0xZZ>", 6)]);
    let e = load_err(&write_vocab("byte", &v));
    assert!(e.contains("<0xZZ>"), "{e}");
}
