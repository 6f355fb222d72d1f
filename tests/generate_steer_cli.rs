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
