//! Subtitles built from words, byte for byte as openai-whisper's writers
//! build them from the same words (samples/fixtures/whisper/subtitles.json,
//! from scripts/fixtures/whisper_subtitles_gold.py): segment cues, lines
//! of at most `--max-line-width`, cues of at most `--max-line-count` lines,
//! and karaoke cues (`--highlight-words`).

mod common;

use lfm::run::transcribe::output::{Format, SubtitleOptions, Writer};
use lfm::run::transcribe::words::Word;
use lfm::run::transcribe::{Segment, Transcript};

fn fixture(name: &str) -> serde_json::Value {
    let path = common::repo().join("samples/fixtures/whisper").join(name);
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
    assert_eq!(v["format_version"], 1);
    v
}

fn segments(words: &serde_json::Value, clip: &str) -> Vec<Segment> {
    let clip = words["clips"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["clip"] == clip)
        .unwrap();
    let f = |v: &serde_json::Value| v.as_f64().unwrap();
    clip["segments"]
        .as_array()
        .unwrap()
        .iter()
        .enumerate()
        .map(|(id, s)| Segment {
            id,
            seek: s["seek"].as_u64().unwrap() as usize,
            start: f(&s["start"]),
            end: f(&s["end"]),
            text: s["text"].as_str().unwrap().into(),
            tokens: Vec::new(),
            temperature: 0.0,
            avg_logprob: -0.1,
            compression_ratio: 1.0,
            no_speech_prob: 0.0,
            words: Some(
                s["words"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|w| Word {
                        word: w["word"].as_str().unwrap().into(),
                        start: f(&w["start"]),
                        end: f(&w["end"]),
                        probability: f(&w["probability"]),
                    })
                    .collect(),
            ),
        })
        .collect()
}

#[test]
fn subtitles_from_words_match_openai_whisper() {
    let gold = fixture("subtitles.json");
    let segs = segments(&fixture("words.json"), gold["clip"].as_str().unwrap());
    let transcript = Transcript {
        text: segs.iter().map(|s| s.text.as_str()).collect(),
        language: "en".into(),
        language_probability: None,
        duration: 49.0,
        segments: segs.clone(),
    };
    for case in gold["cases"].as_array().unwrap() {
        let l = &case["layout"];
        let layout = SubtitleOptions {
            max_line_width: l["max_line_width"].as_u64().map(|n| n as usize),
            max_line_count: l["max_line_count"].as_u64().map(|n| n as usize),
            highlight_words: l["highlight_words"].as_bool().unwrap_or(false),
        };
        for (format, key) in [(Format::Srt, "srt"), (Format::Vtt, "vtt")] {
            let mut w = Writer::with_subtitles(format, Vec::new(), layout);
            for s in &segs {
                w.segment(s).unwrap();
            }
            let got = String::from_utf8(w.finish(&transcript).unwrap()).unwrap();
            assert_eq!(got, case[key].as_str().unwrap(), "{key} with {l}");
        }
    }
}
