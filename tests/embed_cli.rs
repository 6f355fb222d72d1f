//! The `embed` binary end to end: inputs (arguments, stdin, --input),
//! formats, search, the GPU against --cpu, bad input, and the man page.

use safetensors::SafeTensors;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn model_dir() -> PathBuf {
    root().join("samples/models/all-minilm-l6-v2")
}

/// Runs embed with `args` (after --model) and `stdin`.
fn embed(args: &[&str], stdin: &[u8]) -> Output {
    embed_with_model(&model_dir(), args, stdin)
}

fn embed_with_model(model: &Path, args: &[&str], stdin: &[u8]) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_embed"))
        .arg("--model")
        .arg(model)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("embed runs");
    // A run that fails before reading stdin closes the pipe: not an error here.
    let _ = child.stdin.take().unwrap().write_all(stdin);
    child.wait_with_output().unwrap()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[track_caller]
fn assert_ok(o: &Output) {
    assert!(o.status.success(), "embed failed: {}", stderr(o));
}

/// A failure with exit status `code`, one `error:` line that mentions every
/// part of `says`, and no panic.
#[track_caller]
fn assert_fails(o: &Output, code: i32, says: &[&str]) {
    let err = stderr(o);
    assert_eq!(o.status.code(), Some(code), "exit status; stderr: {err}");
    assert!(!err.contains("panicked"), "panic: {err}");
    let line = err
        .lines()
        .find(|l| l.starts_with("error:"))
        .unwrap_or_else(|| panic!("no error line in: {err}"));
    for s in says {
        assert!(line.contains(s), "error line {line:?} does not say {s:?}");
    }
}

/// A scratch directory for one test, emptied first.
fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("lfm-embed-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The gold vector sentence-transformers gives fixture sentence `i`.
fn gold(name: &str, i: usize) -> Vec<f32> {
    let bytes = std::fs::read(root().join("samples/fixtures/embed/gold.safetensors")).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let all: Vec<f32> = bytemuck::pod_collect_to_vec(st.tensor(name).unwrap().data());
    all[i * 384..(i + 1) * 384].to_vec()
}

fn cosine(a: &[f32], b: &[f32]) -> f32 {
    lfm::run::embed::cosine(a, b)
}

fn json_lines(o: &Output) -> Vec<serde_json::Value> {
    String::from_utf8(o.stdout.clone())
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn vector(v: &serde_json::Value) -> Vec<f32> {
    serde_json::from_value(v["embedding"].clone()).unwrap()
}

/// The float32 [rows, cols] array of a .npy file.
fn read_npy(bytes: &[u8]) -> (Vec<usize>, Vec<f32>) {
    assert_eq!(&bytes[..8], b"\x93NUMPY\x01\x00");
    let len = u16::from_le_bytes([bytes[8], bytes[9]]) as usize;
    let header = std::str::from_utf8(&bytes[10..10 + len]).unwrap();
    assert!(header.contains("'descr': '<f4'"), "{header}");
    let shape = header
        .split("'shape': (")
        .nth(1)
        .unwrap()
        .split(')')
        .next()
        .unwrap();
    let shape = shape
        .split(',')
        .filter(|s| !s.trim().is_empty())
        .map(|s| s.trim().parse().unwrap())
        .collect();
    (shape, bytemuck::pod_collect_to_vec(&bytes[10 + len..]))
}

#[test]
fn texts_as_arguments_give_json_lines_matching_sentence_transformers() {
    let o = embed(&["--cpu", "A man is eating food.", ""], b"");
    assert_ok(&o);
    let text = String::from_utf8(o.stdout.clone()).unwrap();
    assert!(text.starts_with("{\"index\":0,\"text\":\"A man is eating food.\",\"embedding\":["));
    let lines = json_lines(&o);
    assert_eq!(lines.len(), 2);
    assert_eq!(lines[1]["index"], 1);
    assert_eq!(lines[1]["text"], "");
    // Fixture sentences 0 and 5 are these two texts.
    for (line, g) in lines.iter().zip([0, 5]) {
        let v = vector(line);
        assert_eq!(v.len(), 384);
        let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt();
        assert!((norm - 1.0).abs() < 1e-5, "norm {norm}");
        assert!(cosine(&v, &gold("default", g)) >= 0.99999);
    }
    assert!(stderr(&o).contains("embed: 2 texts"), "{}", stderr(&o));
}

#[test]
fn stdin_input_file_tsv_and_npy_agree() {
    let dir = scratch("formats");
    let texts = "A man is eating food.\r\nThe quick brown fox jumps over the lazy dog.\n";
    let input = dir.join("texts.txt");
    std::fs::write(&input, texts).unwrap();

    let from_stdin = embed(&["--cpu", "-"], texts.as_bytes());
    assert_ok(&from_stdin);
    let lines = json_lines(&from_stdin);
    assert_eq!(lines.len(), 2, "a final newline does not add a text");
    assert_eq!(
        lines[1]["text"],
        "The quick brown fox jumps over the lazy dog."
    );

    let tsv = embed(
        &[
            "--cpu",
            "--input",
            input.to_str().unwrap(),
            "--format",
            "tsv",
        ],
        b"",
    );
    assert_ok(&tsv);
    let rows: Vec<Vec<f32>> = String::from_utf8(tsv.stdout.clone())
        .unwrap()
        .lines()
        .map(|l| l.split('\t').map(|v| v.parse().unwrap()).collect())
        .collect();
    assert_eq!(rows.len(), 2);

    let npy_path = dir.join("out.npy");
    let npy = embed(
        &[
            "--cpu",
            "--input",
            input.to_str().unwrap(),
            "--format",
            "npy",
            "-o",
            npy_path.to_str().unwrap(),
        ],
        b"",
    );
    assert_ok(&npy);
    assert!(npy.stdout.is_empty());
    let (shape, data) = read_npy(&std::fs::read(&npy_path).unwrap());
    assert_eq!(shape, [2, 384]);
    for i in 0..2 {
        let j = vector(&lines[i]);
        assert_eq!(rows[i], j, "tsv row {i} differs from jsonl");
        assert_eq!(
            &data[i * 384..(i + 1) * 384],
            &j[..],
            "npy row {i} differs from jsonl"
        );
    }
    assert!(cosine(&rows[1], &gold("default", 1)) >= 0.99999);

    // An existing output is refused without --force and left as it was.
    std::fs::write(&npy_path, b"keep me").unwrap();
    let again = embed(
        &[
            "--cpu",
            "x",
            "--format",
            "npy",
            "-o",
            npy_path.to_str().unwrap(),
        ],
        b"",
    );
    assert_fails(&again, 1, &["already exists"]);
    assert_eq!(std::fs::read(&npy_path).unwrap(), b"keep me");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn pooling_and_normalisation_overrides() {
    let o = embed(
        &[
            "--cpu",
            "--pooling",
            "cls",
            "--no-normalize",
            "A man is eating food.",
        ],
        b"",
    );
    assert_ok(&o);
    let v = vector(&json_lines(&o)[0]);
    assert!(cosine(&v, &gold("cls", 0)) >= 0.99999);
    let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt();
    let gold_norm = gold("cls", 0).iter().map(|x| x * x).sum::<f32>().sqrt();
    assert!(
        (norm - gold_norm).abs() < 1e-3 * gold_norm,
        "not normalised: {norm} vs {gold_norm}"
    );

    let both = embed(
        &[
            "--cpu",
            "--pooling",
            "mean,max",
            "--no-normalize",
            "A man is eating food.",
        ],
        b"",
    );
    assert_ok(&both);
    let v = vector(&json_lines(&both)[0]);
    assert_eq!(v.len(), 768, "two poolings concatenate");
    assert!(cosine(&v[..384], &gold("mean", 0)) >= 0.99999);
    assert!(cosine(&v[384..], &gold("max", 0)) >= 0.99999);
}

#[test]
fn search_prints_the_best_lines_with_scores() {
    let dir = scratch("search");
    let docs = dir.join("docs.txt");
    std::fs::write(
        &docs,
        "The stock market fell sharply today.\n\nA man is eating a piece of bread.\n\
         A cat sleeps on the sofa.\nSomeone plays the guitar.\n",
    )
    .unwrap();
    let d = docs.to_str().unwrap();
    let o = embed(
        &[
            "--cpu",
            "--query",
            "A man is eating food.",
            "--docs",
            d,
            "--top-k",
            "2",
        ],
        b"",
    );
    assert_ok(&o);
    let out = String::from_utf8(o.stdout.clone()).unwrap();
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 2, "{out}");
    let first: Vec<&str> = lines[0].split('\t').collect();
    assert_eq!(
        first[1..],
        ["3", "A man is eating a piece of bread."],
        "{out}"
    );
    let s1: f32 = first[0].parse().unwrap();
    let s2: f32 = lines[1].split('\t').next().unwrap().parse().unwrap();
    assert!(s1 > s2 && s1 > 0.5 && s1 <= 1.0, "{out}");

    let j = embed(
        &[
            "--cpu",
            "--query",
            "A man is eating food.",
            "--docs",
            d,
            "-f",
            "jsonl",
        ],
        b"",
    );
    assert_ok(&j);
    let hits = json_lines(&j);
    assert_eq!(hits.len(), 4, "blank lines are not documents");
    assert_eq!(hits[0]["rank"], 1);
    assert_eq!(hits[0]["line"], 3);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn gpu_agrees_with_cpu() {
    let texts = [
        "A man is eating food.",
        "Größenwahn in München — 東京タワー!",
    ];
    // --gpu: use the adapter even when it is a software one (lavapipe in CI);
    // --profile: its report must not change the vectors.
    let gpu = embed(&[&["--gpu", "--profile"][..], &texts].concat(), b"");
    if !gpu.status.success() && std::env::var_os("LFM_SKIP_GPU_TESTS").is_some() {
        eprintln!("SKIPPING the GPU CLI run (LFM_SKIP_GPU_TESTS set)");
        return;
    }
    assert_ok(&gpu);
    let err = stderr(&gpu);
    assert!(
        err.contains(" on gpu: ") || std::env::var_os("LFM_SKIP_GPU_TESTS").is_some(),
        "embed did not use a GPU: {err}"
    );
    // One batch of both texts, its pass timed per kernel, pooled on the device.
    assert!(err.contains("embed profile: 1 batches, 2 texts"), "{err}");
    assert!(err.contains("| seq_pool | 1 |"), "{err}");
    let cpu = embed(&[&["--cpu"][..], &texts].concat(), b"");
    assert_ok(&cpu);
    for (g, c) in json_lines(&gpu).iter().zip(json_lines(&cpu)) {
        assert!(cosine(&vector(g), &vector(&c)) >= 0.99999);
    }
}

#[test]
fn truncation_is_reported_once() {
    let long = "word ".repeat(400);
    let input = format!("{long}\nshort text\n{long}\n");
    let o = embed(&["--cpu", "-"], input.as_bytes());
    assert_ok(&o);
    let err = stderr(&o);
    let notes: Vec<&str> = err.lines().filter(|l| l.contains("truncated")).collect();
    assert_eq!(notes.len(), 1, "{err}");
    assert!(
        notes[0].contains("2 of 3 texts") && notes[0].contains("256 tokens"),
        "{err}"
    );
}

#[test]
fn bad_input_is_a_clear_error() {
    let bad_utf8 = embed(&["--cpu", "-"], b"fine\nnot \xff fine\n");
    assert_fails(&bad_utf8, 1, &["stdin", "line 2", "UTF-8"]);

    assert_fails(
        &embed(&["--cpu", "-"], b""),
        1,
        &["no input texts", "stdin"],
    );
    let dir = scratch("bad-input");
    let empty = dir.join("empty.txt");
    std::fs::write(&empty, b"").unwrap();
    assert_fails(
        &embed(&["--cpu", "--input", empty.to_str().unwrap()], b""),
        1,
        &["no input texts", "empty.txt"],
    );
    assert_fails(
        &embed(
            &[
                "--cpu",
                "--input",
                dir.join("missing.txt").to_str().unwrap(),
            ],
            b"",
        ),
        1,
        &["missing.txt"],
    );
    std::fs::remove_dir_all(&dir).unwrap();

    // Bad command lines exit with 2.
    assert_fails(&embed(&["--cpu"], b""), 2, &["no input"]);
    assert_fails(
        &embed(
            &["--cpu", "--query", "x", "--docs", "README.md", "-f", "npy"],
            b"",
        ),
        2,
        &["npy"],
    );
    assert_fails(
        &embed(&["--cpu", "--batch-size", "0", "x"], b""),
        2,
        &["batch-size"],
    );
}

/// A copy of the model directory (weights linked, not copied) with
/// `file` replaced by `contents`.
fn model_with(name: &str, file: &str, contents: &[u8]) -> PathBuf {
    let dir = scratch(name);
    for entry in std::fs::read_dir(model_dir()).unwrap() {
        let entry = entry.unwrap();
        std::os::unix::fs::symlink(entry.path(), dir.join(entry.file_name())).unwrap();
    }
    std::fs::remove_file(dir.join(file)).unwrap();
    std::fs::write(dir.join(file), contents).unwrap();
    dir
}

fn config_with(edit: impl FnOnce(&mut serde_json::Value)) -> Vec<u8> {
    let mut config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(model_dir().join("config.json")).unwrap()).unwrap();
    edit(&mut config);
    serde_json::to_vec(&config).unwrap()
}

#[test]
fn bad_models_are_clear_errors() {
    let missing = embed_with_model(Path::new("/nonexistent/model"), &["--cpu", "x"], b"");
    assert_fails(&missing, 1, &["/nonexistent/model", "not found"]);

    let cases: Vec<(&str, &str, Vec<u8>, Vec<&str>)> = vec![
        (
            "no-hidden-size",
            "config.json",
            config_with(|c| {
                c.as_object_mut().unwrap().remove("hidden_size");
            }),
            vec!["config.json", "missing field hidden_size"],
        ),
        (
            "bad-heads",
            "config.json",
            config_with(|c| c["num_attention_heads"] = 7.into()),
            vec!["config.json", "not a multiple of num_attention_heads 7"],
        ),
        (
            "bad-intermediate",
            "config.json",
            config_with(|c| c["intermediate_size"] = 1000.into()),
            vec![
                "model.safetensors",
                "intermediate.dense.weight",
                "[1000, 384]",
            ],
        ),
        (
            "extra-layer",
            "config.json",
            config_with(|c| c["num_hidden_layers"] = 7.into()),
            vec!["model.safetensors", "encoder.layer.6", "missing"],
        ),
        (
            "not-json",
            "config.json",
            b"{ not json".to_vec(),
            vec!["config.json", "not valid JSON"],
        ),
        (
            "long-max-seq",
            "sentence_bert_config.json",
            br#"{"max_seq_length": 1000}"#.to_vec(),
            vec![
                "sentence_bert_config.json",
                "max_seq_length 1000",
                "512 positions",
            ],
        ),
        (
            "bad-pooling",
            "1_Pooling/config.json",
            br#"{"word_embedding_dimension": 384, "pooling_mode": "median"}"#.to_vec(),
            vec!["1_Pooling/config.json", "median"],
        ),
        (
            "bad-weights",
            "model.safetensors",
            b"\x08\x00\x00\x00\x00\x00\x00\x00{}garbage".to_vec(),
            vec!["model.safetensors", "not a valid safetensors file"],
        ),
    ];
    for (name, file, contents, says) in cases {
        let dir = if file.contains('/') {
            // Replace a file inside a linked subdirectory: copy that directory.
            let dir = scratch(name);
            for entry in std::fs::read_dir(model_dir()).unwrap() {
                let entry = entry.unwrap();
                if entry.file_name() != "1_Pooling" {
                    std::os::unix::fs::symlink(entry.path(), dir.join(entry.file_name())).unwrap();
                }
            }
            std::fs::create_dir(dir.join("1_Pooling")).unwrap();
            std::fs::write(dir.join(file), &contents).unwrap();
            dir
        } else {
            model_with(name, file, &contents)
        };
        let o = embed_with_model(&dir, &["--cpu", "x"], b"");
        assert_fails(&o, 1, &says);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    // A tokenizer from another vocabulary: one token more than the model has rows.
    let mut tok: serde_json::Value =
        serde_json::from_slice(&std::fs::read(model_dir().join("tokenizer.json")).unwrap())
            .unwrap();
    tok["model"]["vocab"]
        .as_object_mut()
        .unwrap()
        .insert("[extra]".into(), 30522.into());
    let dir = model_with(
        "tokenizer",
        "tokenizer.json",
        &serde_json::to_vec(&tok).unwrap(),
    );
    let o = embed_with_model(&dir, &["--cpu", "x"], b"");
    assert_fails(
        &o,
        1,
        &["tokenizer.json", "30523 tokens", "vocab_size is 30522"],
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

fn fixture(name: &str) -> PathBuf {
    root().join("samples/fixtures/encoders").join(name)
}

#[test]
fn rerank_prints_documents_by_cross_encoder_score() {
    let gold: serde_json::Value = serde_json::from_slice(
        &std::fs::read(root().join("samples/fixtures/encoders/gold.json")).unwrap(),
    )
    .unwrap();
    let docs: Vec<String> = serde_json::from_value(gold["docs"].clone()).unwrap();
    let want: Vec<f32> =
        serde_json::from_value(gold["rerank"]["tiny-xlmr-rerank"]["scores"].clone()).unwrap();
    let dir = scratch("rerank");
    let path = dir.join("docs.txt");
    std::fs::write(&path, docs.join("\n\n")).unwrap();
    let o = embed_with_model(
        &fixture("tiny-xlmr-rerank"),
        &[
            "--cpu",
            "--rerank",
            "--query",
            gold["query"].as_str().unwrap(),
            "--docs",
            path.to_str().unwrap(),
            "--top-k",
            "3",
            "-f",
            "jsonl",
        ],
        b"",
    );
    assert_ok(&o);
    let hits = json_lines(&o);
    assert_eq!(hits.len(), 3);
    let mut best: Vec<(usize, f32)> = want.iter().copied().enumerate().collect();
    best.sort_by(|a, b| b.1.total_cmp(&a.1));
    for (hit, (i, score)) in hits.iter().zip(best) {
        assert_eq!(hit["text"], docs[i].as_str());
        assert_eq!(hit["line"], 2 * i + 1, "blank lines keep their numbers");
        let got = hit["score"].as_f64().unwrap() as f32;
        assert!((got - score).abs() < 1e-4, "{got} vs {score}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn prompts_truncation_and_precision() {
    let m = fixture("tiny-xlmr");
    let texts = ["A man is eating food.", "x", "Le petit chat dort."];
    let run = |extra: &[&str]| embed_with_model(&m, &[&["--cpu"][..], extra, &texts].concat(), b"");
    let plain = run(&[]);
    assert_ok(&plain);
    let named = run(&["--prompt-name", "query"]);
    let literal = run(&["--prompt", "query: "]);
    assert_ok(&named);
    assert_ok(&literal);
    assert_eq!(
        named.stdout, literal.stdout,
        "--prompt-name query is \"query: \""
    );
    assert_ne!(named.stdout, plain.stdout);

    let cut = run(&["--truncate-dim", "8"]);
    assert_ok(&cut);
    for line in json_lines(&cut) {
        let v = vector(&line);
        assert_eq!(v.len(), 8);
        let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt();
        assert!((norm - 1.0).abs() < 1e-5, "renormalised: {norm}");
    }

    let dir = scratch("precision");
    let npy = dir.join("bits.npy");
    let o = run(&["--precision", "ubinary", "-o", npy.to_str().unwrap()]);
    assert_ok(&o);
    let bytes = std::fs::read(&npy).unwrap();
    let len = u16::from_le_bytes([bytes[8], bytes[9]]) as usize;
    let header = std::str::from_utf8(&bytes[10..10 + len]).unwrap();
    assert!(
        header.contains("'descr': '|u1'") && header.contains("(3, 4)"),
        "{header}"
    );
    assert_eq!(bytes.len(), 10 + len + 12);
    let ints = run(&["--precision", "int8"]);
    assert_ok(&ints);
    for line in json_lines(&ints) {
        let v: Vec<i64> = serde_json::from_value(line["embedding"].clone()).unwrap();
        assert_eq!(v.len(), 32);
        assert!(v.iter().all(|x| (-128..=127).contains(x)));
    }
    std::fs::remove_dir_all(&dir).unwrap();

    let short = run(&["--max-seq-length", "4"]);
    assert_ok(&short);
    assert!(
        stderr(&short).contains("texts were longer than 4 tokens"),
        "{}",
        stderr(&short)
    );
}

#[test]
fn encoder_bad_input_is_a_clear_error() {
    let m = fixture("tiny-xlmr");
    let one = |args: &[&str]| embed_with_model(&m, args, b"");
    assert_fails(
        &one(&["--cpu", "--truncate-dim", "33", "x"]),
        1,
        &["--truncate-dim 33", "32 dimensions"],
    );
    assert_fails(
        &one(&["--cpu", "--prompt-name", "nope", "x"]),
        1,
        &["config_sentence_transformers.json", "\"nope\"", "query"],
    );
    assert_fails(
        &one(&["--cpu", "--precision", "int8", "x"]),
        1,
        &["int8", "two or more"],
    );
    assert_fails(
        &one(&["--cpu", "--max-seq-length", "100000", "x"]),
        1,
        &["--max-seq-length 100000", "tiny-xlmr"],
    );
    assert_fails(
        &one(&["--cpu", "--rerank", "--query", "q", "--docs", "README.md"]),
        1,
        &["tiny-xlmr", "not a cross-encoder"],
    );
    assert_fails(
        &embed_with_model(&fixture("tiny-bert-rerank"), &["--cpu", "x"], b""),
        1,
        &["tiny-bert-rerank", "a cross-encoder", "--rerank"],
    );
    assert_fails(
        &one(&[
            "--cpu",
            "--query",
            "q",
            "--docs",
            "README.md",
            "--precision",
            "int8",
        ]),
        2,
        &["--precision"],
    );
    // An architecture the encoder does not run: named, with the supported list.
    let dir = scratch("gpt2");
    for entry in std::fs::read_dir(&m).unwrap() {
        let entry = entry.unwrap();
        if entry.file_name() != "config.json" {
            std::os::unix::fs::symlink(entry.path(), dir.join(entry.file_name())).unwrap();
        }
    }
    let mut config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(m.join("config.json")).unwrap()).unwrap();
    config["model_type"] = "gpt2".into();
    std::fs::write(
        dir.join("config.json"),
        serde_json::to_vec(&config).unwrap(),
    )
    .unwrap();
    assert_fails(
        &embed_with_model(&dir, &["--cpu", "x"], b""),
        1,
        &[
            "config.json",
            "\"gpt2\"",
            "xlm-roberta",
            "nomic_bert",
            "gte",
            "modernbert",
        ],
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Search with a model that has prompts: the query gets its `query` prompt,
/// the documents its `document` one (empty on tiny-xlmr), as
/// encode_query / encode_document do.
#[test]
fn search_uses_the_models_query_prompt() {
    let m = fixture("tiny-xlmr");
    let dir = scratch("search-prompts");
    let docs = dir.join("docs.txt");
    std::fs::write(&docs, "Le petit chat dort.\nA man is eating food.\n").unwrap();
    let o = embed_with_model(
        &m,
        &[
            "--cpu",
            "--query",
            "a cat",
            "--docs",
            docs.to_str().unwrap(),
            "-f",
            "jsonl",
        ],
        b"",
    );
    assert_ok(&o);
    let hits = json_lines(&o);
    let q = embed_with_model(&m, &["--cpu", "--prompt", "query: ", "a cat"], b"");
    let d = embed_with_model(
        &m,
        &["--cpu", "Le petit chat dort.", "A man is eating food."],
        b"",
    );
    assert_ok(&q);
    assert_ok(&d);
    let qv = vector(&json_lines(&q)[0]);
    for hit in hits {
        let line = hit["line"].as_u64().unwrap() as usize;
        let want = cosine(&qv, &vector(&json_lines(&d)[line - 1]));
        let got = hit["score"].as_f64().unwrap() as f32;
        assert!((got - want).abs() < 1e-5, "line {line}: {got} vs {want}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
