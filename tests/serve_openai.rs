//! The official `openai` Python client (installed into .venv by
//! scripts/setup) against `serve` with all four kinds of model loaded:
//! chat and text completions streamed and not, logprobs, seeds, JSON-schema
//! output, stop strings, errors, embeddings, transcription and speech.

mod common;
mod serve_support;

use serve_support::Server;
use std::process::Command;

#[test]
fn the_official_openai_client_works_against_serve() {
    let python = common::repo().join(".venv/bin/python");
    assert!(
        python.is_file(),
        "{} is missing: run scripts/setup (it installs the openai client)",
        python.display()
    );
    let clip =
        "/usr/share/pocketsphinx/test/data/librivox/sense_and_sensibility_01_austen_64kb-0930.wav";
    assert!(
        std::path::Path::new(clip).is_file(),
        "{clip} is missing: run scripts/setup"
    );
    let s = Server::start(&[
        "--cpu",
        "-m",
        common::smollm2().to_str().unwrap(),
        "--embed-model",
        common::model("all-minilm-l6-v2").to_str().unwrap(),
        "--asr-model",
        common::model("whisper-tiny.en").to_str().unwrap(),
        "--voice",
        common::model("piper-joe/en_US-joe-medium.onnx")
            .to_str()
            .unwrap(),
        "--api-key",
        "test-key",
    ]);
    let o = Command::new(&python)
        .arg(common::repo().join("tests/serve/openai_client.py"))
        .args([&format!("http://127.0.0.1:{}/v1", s.port), "test-key", clip])
        .output()
        .expect("python runs");
    assert!(
        o.status.success(),
        "the openai client failed:\n{}\n{}\nserver log:\n{}",
        common::stdout(&o),
        common::stderr(&o),
        s.log.lock().unwrap()
    );
    assert!(common::stdout(&o).contains("all checks passed"));
}
