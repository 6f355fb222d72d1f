//! `generate`'s steering flags end to end on the default model (CPU):
//! --messages, --grammar, --logprobs, --logit-bias and their bad inputs.

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
fn messages_file_is_a_conversation() {
    let dir = scratch("messages");
    let f = dir.join("m.json");
    std::fs::write(
        &f,
        r#"[{"role":"system","content":"You answer in one word."},{"role":"user","content":"What is the capital of France?"}]"#,
    )
    .unwrap();
    let o = generate(&[
        "--messages",
        f.to_str().unwrap(),
        "-n",
        "12",
        "--temperature",
        "0",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).contains("Paris"), "{}", stdout(&o));
    std::fs::write(&f, r#"{"role":"user","content":"hi"}"#).unwrap();
    let o = generate(&["--messages", f.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("m.json: not a JSON array"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn grammar_constrains_the_output_and_bad_grammars_say_where() {
    let dir = scratch("grammar");
    let f = dir.join("yn.gbnf");
    std::fs::write(
        &f,
        "root ::= (\"yes\" | \"no\") \", because \" [a-z ]{1,20} \".\"\n",
    )
    .unwrap();
    let o = generate(&[
        "-p",
        "Is the sky blue?",
        "--grammar",
        f.to_str().unwrap(),
        "--temperature",
        "1",
        "--seed",
        "5",
        "-n",
        "60",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = stdout(&o);
    let text = text.trim_end();
    assert!(
        text.starts_with("yes, because ") || text.starts_with("no, because "),
        "{text}"
    );
    assert!(text.ends_with('.'), "{text}");
    std::fs::write(&f, "root ::= \"a\" | undefined-rule\n").unwrap();
    let o = generate(&["-p", "x", "--grammar", f.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("yn.gbnf:1:16: undefined rule undefined-rule"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn logprobs_in_json_and_logit_bias_errors() {
    let o = generate(&[
        "-p",
        "Hi",
        "-n",
        "3",
        "--temperature",
        "0",
        "--json",
        "--logprobs",
        "2",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(stdout(&o).trim()).unwrap();
    let lp = v["logprobs"].as_array().unwrap();
    assert_eq!(lp.len(), v["generated_ids"].as_array().unwrap().len());
    for l in lp {
        assert!(l["logprob"].as_f64().unwrap() <= 0.0);
        let top = l["top_logprobs"].as_array().unwrap();
        assert_eq!(top.len(), 2);
        // Greedy: the chosen token is the most likely one.
        assert_eq!(top[0]["id"], l["id"]);
    }
    let o = generate(&["-p", "Hi", "--logit-bias", "99999999=1"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("--logit-bias: token id 99999999 is outside the vocabulary"),
        "{}",
        stderr(&o)
    );
    let o = generate(&["-p", "Hi", "--logit-bias", "five=1"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let o = generate(&["-p", "Hi", "--presence-penalty", "nan"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
}

fn json_of(o: &std::process::Output) -> serde_json::Value {
    assert!(o.status.success(), "{}", stderr(o));
    serde_json::from_str(stdout(o).trim()).unwrap()
}

#[test]
fn lookup_reports_its_drafts_and_draft_flags_are_checked() {
    let p = "Copy this sentence: The old lighthouse keeper climbed the stairs every night.";
    let base = ["-p", p, "-n", "16", "--temperature", "0", "--json"];
    let plain = json_of(&generate(&base));
    let mut args = base.to_vec();
    args.extend(["--lookup", "--draft", "4"]);
    let look = json_of(&generate(&args));
    assert_eq!(look["generated_ids"], plain["generated_ids"]);
    let s = &look["speculative"];
    assert_eq!(s["drafter"], "lookup");
    assert_eq!(s["max_draft"], 4);
    assert!(s["accepted"].as_u64().unwrap() > 0, "{s}");
    assert!(plain.get("speculative").is_none());
    // Without --json the timings line says how the drafts fared.
    let o = generate(&["-p", p, "-n", "8", "--temperature", "0", "--lookup"]);
    assert!(stderr(&o).contains("lookup: "), "{}", stderr(&o));

    assert_usage_failure(&generate(&["-p", "hi", "--draft", "4"]), &["--lookup"]);
    assert_usage_failure(
        &generate(&["-p", "hi", "--lookup", "--draft", "17"]),
        &["--draft"],
    );
    let tiny = repo().join("samples/fixtures/llm/tiny-llama");
    let o = generate(&["-p", "hi", "--draft-model", tiny.to_str().unwrap()]);
    assert_clean_failure(&o, &["tiny-llama", "vocabulary"]);
}

#[test]
fn prompt_cache_is_reused_and_bad_caches_are_refused() {
    let dir = scratch("prompt-cache");
    let cache = dir.join("c.bin");
    let c = cache.to_str().unwrap();
    let p = "Here is a fixed preamble that stays the same between runs. What is 2+2?";
    let run_with = |prompt: &str| {
        json_of(&generate(&[
            "-p",
            prompt,
            "-n",
            "6",
            "--temperature",
            "0",
            "--json",
            "--prompt-cache",
            c,
        ]))
    };
    let first = run_with(p);
    let n = first["prompt_ids"].as_array().unwrap().len() as u64;
    assert_eq!(first["prompt_cache"]["reused_tokens"], 0);
    assert_eq!(first["prompt_cache"]["saved_tokens"], n - 1);
    // The same prompt: all but its last token from the file, the same text.
    let second = run_with(p);
    assert_eq!(second["prompt_cache"]["reused_tokens"], n - 1);
    assert!(second["prompt_cache"]["saved_tokens"].is_null());
    assert_eq!(second["generated_ids"], first["generated_ids"]);
    // A longer prompt with the same start reuses the shared part.
    let third = run_with(&format!("{p} And 3+3?"));
    let reused = third["prompt_cache"]["reused_tokens"].as_u64().unwrap();
    assert!(reused > n / 2 && reused < n, "{reused} of {n}");

    // Another model's cache, a damaged one, a directory.
    let tiny = repo().join("samples/fixtures/llm/tiny-llama");
    let o = run(
        BIN,
        &[
            "--cpu",
            "-m",
            tiny.to_str().unwrap(),
            "-p",
            "hi",
            "-n",
            "2",
            "--prompt-cache",
            c,
        ],
    );
    assert_clean_failure(&o, &["c.bin", "another model"]);
    let bytes = std::fs::read(&cache).unwrap();
    std::fs::write(&cache, &bytes[..bytes.len() / 2]).unwrap();
    assert_clean_failure(
        &generate(&["-p", p, "--prompt-cache", c]),
        &["c.bin", "damaged"],
    );
    let o = generate(&["-p", p, "--prompt-cache", dir.to_str().unwrap()]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("prompt-cache"), "{}", stderr(&o));
}

#[test]
fn interactive_reads_turns_from_stdin_and_keeps_the_cache() {
    use std::io::Write;
    use std::process::{Command, Stdio};
    let model = smollm2();
    let mut child = Command::new(BIN)
        .args([
            "--cpu",
            "-m",
            model.to_str().unwrap(),
            "-i",
            "--temperature",
            "0",
        ])
        .args(["-n", "10", "--json", "--system", "Answer briefly."])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Two turns and a blank line (skipped); end of input ends the chat.
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"My name is Ada.\n\nWhat is my name?\n")
        .unwrap();
    let o = child.wait_with_output().unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let turns: Vec<serde_json::Value> = stdout(&o)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(turns.len(), 2, "{}", stdout(&o));
    let (a, b) = (&turns[0]["timings"], &turns[1]["timings"]);
    assert_eq!(a["cached_tokens"], 0);
    // The second turn's prompt is the whole conversation, of which the
    // model held at least the first turn's prompt.
    assert!(b["prompt_tokens"].as_u64() > a["prompt_tokens"].as_u64());
    assert!(
        b["cached_tokens"].as_u64() >= a["prompt_tokens"].as_u64(),
        "{b}"
    );
    assert!(!turns[1]["text"].as_str().unwrap().is_empty());

    assert_usage_failure(&generate(&["-i", "-p", "-"]), &["--interactive"]);
    assert_usage_failure(&generate(&["-i", "--prompt-ids", "1,2"]), &["--prompt-ids"]);
}
