//! `generate` end to end on the real default model (CPU reference), and
//! every bad input from the foundation issue getting a clean error.

mod common;
use common::*;

const BIN: &str = env!("CARGO_BIN_EXE_generate");

fn generate(args: &[&str]) -> std::process::Output {
    let model = smollm2();
    let mut all = vec!["--cpu", "--model", model.to_str().unwrap()];
    all.extend_from_slice(args);
    run(BIN, &all)
}

#[test]
fn answers_the_capital_of_france() {
    let o = generate(&[
        "--prompt",
        "What is the capital of France?",
        "-n",
        "24",
        "--temperature",
        "0",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).contains("Paris"), "answer: {}", stdout(&o));
    assert!(
        stderr(&o).contains("tok/s"),
        "timings on stderr: {}",
        stderr(&o)
    );
}

#[test]
fn json_output_has_ids_text_reason_and_timings() {
    let o = generate(&[
        "--prompt",
        "Name a colour.",
        "-n",
        "5",
        "--temperature",
        "0",
        "--json",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value =
        serde_json::from_str(stdout(&o).trim()).expect("one JSON object on stdout");
    assert!(!v["prompt_ids"].as_array().unwrap().is_empty());
    let gen = v["generated_ids"].as_array().unwrap();
    assert!(!gen.is_empty() && gen.len() <= 5);
    assert!(v["text"].is_string());
    assert!(["eos", "length", "stop"].contains(&v["finish_reason"].as_str().unwrap()));
    assert!(v["timings"]["decode_tok_per_s"].is_number());
}

#[test]
fn same_seed_same_text() {
    let args = [
        "--prompt",
        "Tell me a story.",
        "-n",
        "12",
        "--temperature",
        "1.0",
        "--seed",
        "7",
        "--json",
    ];
    let text = |o: std::process::Output| {
        let v: serde_json::Value = serde_json::from_str(stdout(&o).trim()).unwrap();
        v["generated_ids"].clone()
    };
    assert_eq!(text(generate(&args)), text(generate(&args)));
}

#[test]
fn prompt_ids_skip_the_tokenizer_and_stop_strings_stop() {
    let o = generate(&[
        "--prompt-ids",
        "1,504,3575,282,4649,314",
        "-n",
        "8",
        "--temperature",
        "0",
        "--json",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(stdout(&o).trim()).unwrap();
    assert_eq!(
        v["prompt_ids"],
        serde_json::json!([1, 504, 3575, 282, 4649, 314])
    );
    let first_word = v["text"]
        .as_str()
        .unwrap()
        .split_whitespace()
        .next()
        .unwrap()
        .to_string();
    let o = generate(&[
        "--prompt-ids",
        "1,504,3575,282,4649,314",
        "-n",
        "8",
        "--temperature",
        "0",
        "--stop",
        &first_word,
        "--json",
    ]);
    let v: serde_json::Value = serde_json::from_str(stdout(&o).trim()).unwrap();
    assert_eq!(v["finish_reason"], "stop");
    assert!(!v["text"].as_str().unwrap().contains(&first_word));
}

#[test]
fn prompt_from_stdin() {
    use std::io::Write;
    let model = smollm2();
    let mut child = std::process::Command::new(BIN)
        .args([
            "--cpu",
            "--model",
            model.to_str().unwrap(),
            "--prompt",
            "-",
            "-n",
            "4",
            "--temperature",
            "0",
            "--json",
        ])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"What is the capital of France?")
        .unwrap();
    let o = child.wait_with_output().unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
}

#[test]
fn missing_model_path() {
    let o = run(
        BIN,
        &[
            "--cpu",
            "--model",
            "/nonexistent/model.gguf",
            "--prompt",
            "hi",
        ],
    );
    assert_clean_failure(&o, &["/nonexistent/model.gguf"]);
}

#[test]
fn directory_without_config() {
    let dir = scratch("noconfig");
    let o = run(
        BIN,
        &["--cpu", "--model", dir.to_str().unwrap(), "--prompt", "hi"],
    );
    assert_clean_failure(&o, &["config.json"]);
}

#[test]
fn unsupported_architecture() {
    let dir = scratch("bert");
    std::fs::write(
        dir.join("config.json"),
        r#"{"model_type": "bert", "hidden_size": 8}"#,
    )
    .unwrap();
    std::fs::write(
        dir.join("model.safetensors"),
        b"\x08\x00\x00\x00\x00\x00\x00\x00{}      ",
    )
    .unwrap();
    let o = run(
        BIN,
        &["--cpu", "--model", dir.to_str().unwrap(), "--prompt", "hi"],
    );
    assert_clean_failure(&o, &["config.json", "bert"]);
}

#[test]
fn garbage_and_truncated_gguf() {
    let dir = scratch("gguf");
    let garbage = dir.join("garbage.gguf");
    std::fs::write(
        &garbage,
        b"GGUF\x03\x00\x00\x00\xff\xff\xff\xff\xff\xff\xff\x7f",
    )
    .unwrap();
    assert_clean_failure(
        &run(
            BIN,
            &[
                "--cpu",
                "--model",
                garbage.to_str().unwrap(),
                "--prompt",
                "hi",
            ],
        ),
        &["garbage.gguf"],
    );
    let bad_magic = dir.join("magic.gguf");
    std::fs::write(&bad_magic, b"GGML0000000000000000000000").unwrap();
    assert_clean_failure(
        &run(
            BIN,
            &[
                "--cpu",
                "--model",
                bad_magic.to_str().unwrap(),
                "--prompt",
                "hi",
            ],
        ),
        &["magic.gguf"],
    );
    let truncated = dir.join("truncated.gguf");
    let real = std::fs::read(smollm2()).unwrap();
    std::fs::write(&truncated, &real[..real.len() / 2]).unwrap();
    assert_clean_failure(
        &run(
            BIN,
            &[
                "--cpu",
                "--model",
                truncated.to_str().unwrap(),
                "--prompt",
                "hi",
            ],
        ),
        &["truncated.gguf"],
    );
}

#[test]
fn prompt_plus_tokens_past_the_context() {
    let o = generate(&["--prompt", "hi", "-n", "9000"]);
    assert_clean_failure(&o, &["context", "8192"]);
}

#[test]
fn token_ids_outside_the_vocabulary() {
    let o = generate(&["--prompt-ids", "1,99999999", "-n", "2"]);
    assert_clean_failure(&o, &["99999999"]);
}

#[test]
fn bad_command_line_exits_2() {
    let o = run(BIN, &["--temperature", "hot"]);
    assert_eq!(o.status.code(), Some(2));
    // Flag values are checked by the parser, before the model loads.
    let o = generate(&["--prompt", "x", "--top-p", "1.5"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("--top-p"), "{}", stderr(&o));
}

#[test]
fn umbrella_runs_generate() {
    let model = smollm2();
    let o = run(
        env!("CARGO_BIN_EXE_lfm"),
        &[
            "generate",
            "--cpu",
            "--model",
            model.to_str().unwrap(),
            "--prompt-ids",
            "1,504",
            "-n",
            "2",
            "--temperature",
            "0",
        ],
    );
    assert!(o.status.success(), "{}", stderr(&o));
}
