//! `--compute-type int8` on the CPU against faster-whisper's int8 CPU path
//! (`compute_type="int8"`) on the five LibriVox clips of Debian's
//! pocketsphinx-testdata, beam sizes 1 and 5, with the decoding options of
//! samples/fixtures/whisper/gold.json (samples/fixtures/whisper/int8.json,
//! from scripts/fixtures/whisper_int8_gold.py).
//!
//! Both round weights and inputs alike (one scale a row, CTranslate2's
//! levels; `quant::fast::gemm8`), so every transcript has faster-whisper
//! int8's words, including the one where its int8 path departs from its own
//! float32 transcript (samples/fixtures/whisper/gold.json), and all but one
//! its exact text. The float parts around the products (convolutions, layer
//! norms, attention) sum in other orders, and a level flips where a value
//! lies on a rounding edge: a beam-5 search may then pick a comma the other
//! way.

mod common;

use lfm::models::whisper::{ComputeType, WhisperFiles};
use lfm::run::transcribe::{transcribe, CpuBackend, Options};
use std::path::PathBuf;

const CLIPS: &str = "/usr/share/pocketsphinx/test/data/librivox";

/// The (beam size, clip) where faster-whisper's int8 transcript is not its
/// float32 one ("... selfish is to be old-exposed.").
const INT8_NOT_F32: (u64, &str) = (1, "sense_and_sensibility_01_austen_64kb-0890");

fn json(name: &str) -> serde_json::Value {
    let path = common::repo().join("samples/fixtures/whisper").join(name);
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
    assert_eq!(v["format_version"], 1);
    v
}

/// Lower-case words, punctuation dropped.
fn words(text: &str) -> Vec<String> {
    text.to_lowercase()
        .split(|c: char| !c.is_alphanumeric() && c != '\'')
        .filter(|w| !w.is_empty())
        .map(str::to_string)
        .collect()
}

#[test]
fn int8_transcripts_match_faster_whisper_int8() {
    let int8 = json("int8.json");
    let f32_gold = json("gold.json");
    let mut files = WhisperFiles::load(&common::model("whisper-tiny.en"), None).unwrap();
    files.model.set_compute_type(ComputeType::Int8).unwrap();
    let (mut departs, mut same) = (0, 0);
    for beam in [1u64, 5] {
        let key = format!("beam_size_{beam}");
        let fw = int8["faster_whisper_int8"][&key]["clips"]
            .as_array()
            .unwrap();
        let fw_f32 = f32_gold["faster_whisper"][&key]["clips"]
            .as_array()
            .unwrap();
        assert_eq!(fw.len(), 5);
        for (clip, clip_f32) in fw.iter().zip(fw_f32) {
            let name = clip["clip"].as_str().unwrap();
            assert_eq!(clip_f32["clip"].as_str(), Some(name));
            let path = PathBuf::from(CLIPS).join(format!("{name}.wav"));
            assert!(
                path.is_file(),
                "{} is missing: run scripts/setup",
                path.display()
            );
            let audio = lfm::run::audio::load(&path, 16_000).unwrap();
            let opts = Options {
                language: Some("en".into()),
                beam_size: beam as usize,
                ..Options::default()
            };
            let mut backend = CpuBackend::new(&files.model);
            let t = transcribe(&files, &mut backend, &audio.samples, &opts, &mut |_, _| {
                Ok(())
            })
            .unwrap();
            let text = t.text.trim();
            eprintln!("beam {beam} {name}: {text}");
            let fw_text = clip["text"].as_str().unwrap();
            assert_eq!(words(text), words(fw_text), "beam {beam} {name}");
            if text == fw_text {
                same += 1;
            }
            if (beam, name) == INT8_NOT_F32 {
                assert_eq!(text, fw_text, "beam {beam} {name}");
                assert_ne!(clip["text"], clip_f32["text"], "the fixtures changed");
                departs += 1;
            }
        }
    }
    assert_eq!(departs, 1);
    assert!(
        same >= 9,
        "{same} of 10 transcripts are faster-whisper int8's text"
    );
}
