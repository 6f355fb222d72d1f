//! `kld` on the tiny LFM2 fixture over the Alice corpus (its own 384-token
//! tokenizer): an arm equal to the reference diverges by exactly nothing,
//! coarser formats diverge more, a quantised file equals the on-the-fly arm
//! of its type, saved references give the same numbers as the run that
//! saved them, and every bad input fails cleanly.

mod common;
use common::*;

use serde_json::Value;
use std::path::PathBuf;

const BIN: &str = env!("CARGO_BIN_EXE_kld");
const QUANTIZE: &str = env!("CARGO_BIN_EXE_quantize");

fn model() -> PathBuf {
    repo().join("samples/fixtures/llm/tiny-lfm2")
}

fn corpus() -> PathBuf {
    repo().join("samples/corpus/alice-ch1-4.txt")
}

/// Runs kld on the tiny model over 4 chunks of 64 tokens with `extra`
/// arguments and returns the JSON report.
fn kld(extra: &[&str]) -> Value {
    kld_on(&model(), "64", "4", extra)
}

/// Runs kld on the CPU on `model` over `chunks` chunks of `ctx` tokens of
/// the corpus with `extra` arguments and returns the JSON report.
fn kld_on(model: &std::path::Path, ctx: &str, chunks: &str, extra: &[&str]) -> Value {
    let c = corpus();
    let mut args = vec![
        "--cpu",
        "--model",
        model.to_str().unwrap(),
        "--corpus",
        c.to_str().unwrap(),
        "--ctx",
        ctx,
        "--chunks",
        chunks,
        "--json",
    ];
    args.extend_from_slice(extra);
    let o = run(BIN, &args);
    assert!(o.status.success(), "{}: {}", model.display(), stderr(&o));
    serde_json::from_str(stdout(&o).trim()).expect("one JSON object on stdout")
}

fn arm<'a>(r: &'a Value, label: &str) -> &'a Value {
    r["arms"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["arm"] == label)
        .unwrap_or_else(|| panic!("no arm {label} in {r}"))
}

#[test]
fn identical_arm_has_zero_divergence_and_coarser_formats_more() {
    let r = kld(&["--ref", "f32", "--arm", "f32,f16,q8_0,q4_0,q1_0"]);
    assert_eq!(
        (r["ctx"].as_u64(), r["chunks"].as_u64()),
        (Some(64), Some(4))
    );
    // 64/2 = 32 is the first scored position; 31 per chunk.
    assert_eq!(r["positions"], 4 * 31);
    assert_eq!(r["reference"]["arm"], "f32@cpu");
    let same = arm(&r, "f32@cpu");
    assert_eq!(same["kld_mean"], 0.0);
    assert_eq!(same["kld_percentiles"]["max"], 0.0);
    assert_eq!(same["same_top"], 1.0);
    assert_eq!(same["delta_p_rms"], 0.0);
    assert_eq!(same["ppl"], r["reference"]["ppl"]);
    let ppl = r["reference"]["ppl"].as_f64().unwrap();
    assert!(ppl > 1.0 && ppl.is_finite(), "{ppl}");
    let k = |a: &str| arm(&r, a)["kld_mean"].as_f64().unwrap();
    let (f16, q8, q4, q1) = (k("f16@cpu"), k("q8_0@cpu"), k("q4_0@cpu"), k("q1_0@cpu"));
    eprintln!("mean KLD: f16 {f16:.2e}, q8_0 {q8:.2e}, q4_0 {q4:.2e}, q1_0 {q1:.2e}");
    assert!(
        0.0 < f16 && f16 < q8 && q8 < q4 && q4 < q1,
        "{f16} {q8} {q4} {q1}"
    );
    for a in r["arms"].as_array().unwrap() {
        let p = &a["kld_percentiles"];
        let order = [
            "min", "p0_1", "p1", "p5", "p10", "median", "p90", "p95", "p99", "p99_9", "max",
        ];
        let v: Vec<f64> = order.iter().map(|k| p[k].as_f64().unwrap()).collect();
        assert!(v.windows(2).all(|w| w[0] <= w[1]), "{}: {v:?}", a["arm"]);
        let same_top = a["same_top"].as_f64().unwrap();
        assert!((0.0..=1.0).contains(&same_top));
    }
}

#[test]
fn a_quantised_file_is_the_same_arm_as_its_type() {
    let dir = scratch("kld-file");
    let q4 = dir.join("q4_0.gguf");
    let m = model();
    let o = run(
        QUANTIZE,
        &[
            m.to_str().unwrap(),
            "--to",
            "q4_0",
            "-o",
            q4.to_str().unwrap(),
        ],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let spec = format!("{}@cpu", q4.display());
    let r = kld(&["--arm", &format!("q4_0,{spec}")]);
    let (a, b) = (arm(&r, "q4_0@cpu"), arm(&r, &spec));
    for key in [
        "kld_mean",
        "ppl",
        "same_top",
        "delta_p_rms",
        "kld_percentiles",
    ] {
        assert_eq!(a[key], b[key], "{key}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn saved_reference_gives_the_numbers_of_the_run_that_saved_it() {
    let dir = scratch("kld-ref");
    let file = dir.join("ref.kld");
    let f = file.to_str().unwrap();
    let saved = kld(&["--arm", "q8_0,q4_k", "--save-ref", f]);
    let reused = kld(&["--arm", "q8_0,q4_k", "--ref-file", f]);
    assert_eq!(saved["arms"], reused["arms"]);
    assert_eq!(saved["reference"]["ppl"], reused["reference"]["ppl"]);
    // The exact reference differs from the saved one only by its 16-bit
    // quantisation of log-probabilities (steps of 2.4e-4 nats).
    let exact = kld(&["--arm", "q8_0,q4_k"]);
    for a in ["q8_0@cpu", "q4_k@cpu"] {
        let (x, s) = (arm(&exact, a), arm(&saved, a));
        let (xk, sk) = (
            x["kld_mean"].as_f64().unwrap(),
            s["kld_mean"].as_f64().unwrap(),
        );
        assert!((xk - sk).abs() <= 0.02 * xk + 1e-5, "{a}: {xk} vs {sk}");
        assert_eq!(x["same_top"], s["same_top"]);
        assert_eq!(x["ppl"], s["ppl"]);
    }
    assert_eq!(exact["reference"]["ppl"], saved["reference"]["ppl"]);

    // Without the corpus the file's tokens are used; --chunks takes fewer.
    let m = model();
    let o = run(
        BIN,
        &[
            "--cpu",
            "--model",
            m.to_str().unwrap(),
            "--ref-file",
            f,
            "--arm",
            "q8_0",
            "--chunks",
            "2",
            "--json",
        ],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let two: Value = serde_json::from_str(stdout(&o).trim()).unwrap();
    assert_eq!(two["positions"], 2 * 31);

    // Another corpus does not match the file.
    let other = dir.join("other.txt");
    std::fs::write(&other, "Down the rabbit hole. ".repeat(200)).unwrap();
    let o = run(
        BIN,
        &[
            "--cpu",
            "--model",
            m.to_str().unwrap(),
            "--ref-file",
            f,
            "--arm",
            "q8_0",
            "--corpus",
            other.to_str().unwrap(),
        ],
    );
    assert_clean_failure(&o, &["other.txt", "ref.kld"]);

    // An existing reference file is kept without --force.
    let before = std::fs::read(&file).unwrap();
    let c = corpus();
    let o = run(
        BIN,
        &[
            "--cpu",
            "--model",
            m.to_str().unwrap(),
            "--corpus",
            c.to_str().unwrap(),
            "--ctx",
            "64",
            "--chunks",
            "1",
            "--arm",
            "q8_0",
            "--save-ref",
            f,
        ],
    );
    assert_clean_failure(&o, &["ref.kld", "already exists"]);
    assert!(std::fs::read(&file).unwrap() == before);

    // A truncated or foreign reference file is refused.
    let cut = dir.join("cut.kld");
    std::fs::write(&cut, &before[..before.len() - 7]).unwrap();
    let o = run(
        BIN,
        &[
            "--cpu",
            "--model",
            m.to_str().unwrap(),
            "--ref-file",
            cut.to_str().unwrap(),
            "--arm",
            "q8_0",
        ],
    );
    assert_clean_failure(&o, &["cut.kld", "bytes"]);
    let o = run(
        BIN,
        &[
            "--cpu",
            "--model",
            m.to_str().unwrap(),
            "--ref-file",
            c.to_str().unwrap(),
            "--arm",
            "q8_0",
        ],
    );
    assert_clean_failure(&o, &["alice-ch1-4.txt", "magic"]);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn text_output_has_both_tables() {
    let (m, c) = (model(), corpus());
    let o = run(
        BIN,
        &[
            "--cpu",
            "-m",
            m.to_str().unwrap(),
            "--corpus",
            c.to_str().unwrap(),
            "-c",
            "32",
            "--chunks",
            "2",
            "--arm",
            "q4_0",
        ],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(out.contains("reference f32@cpu: PPL"), "{out}");
    assert!(out.contains("| q4_0@cpu |"), "{out}");
    assert!(
        out.contains("| arm | max | 99.9 | 99 | 95 | 90 | median | 10 | 5 | 1 | 0.1 | min |"),
        "{out}"
    );
}

/// The last `error:` line of a failed run (the graphics stack may print its
/// own "error:" lines first), after checking the exit code and that nothing
/// panicked.
fn last_error(o: &std::process::Output) -> String {
    let err = stderr(o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    err.lines()
        .rfind(|l| l.starts_with("error: "))
        .unwrap_or_default()
        .to_string()
}

/// A GPU arm runs on the GPU (lavapipe in CI) with the CPU's distributions,
/// or, without a GPU, fails saying so; it never runs on the CPU under a GPU
/// label, nor in a format other than the one asked for.
#[test]
fn gpu_arms_run_on_the_gpu_or_fail_clearly() {
    let (m, c) = (model(), corpus());
    let gpu = |arm: &str| {
        run(
            BIN,
            &[
                "-m",
                m.to_str().unwrap(),
                "--corpus",
                c.to_str().unwrap(),
                "-c",
                "32",
                "--chunks",
                "2",
                "--ref",
                "q8_0@cpu",
                "--arm",
                arm,
                "--json",
            ],
        )
    };
    let o = gpu("q8_0@gpu");
    if !o.status.success() {
        let line = last_error(&o);
        assert!(
            line.contains("arm 'q8_0@gpu'") && line.contains("GPU"),
            "{line}"
        );
        return;
    }
    let r: Value = serde_json::from_str(stdout(&o).trim()).unwrap();
    let a = &r["arms"][0];
    assert_eq!(a["arm"], "q8_0@gpu");
    // Same weights on both devices: only the order of float operations
    // differs, so the distributions agree far below any format's error
    // (q8_0 against f32 is ~7e-3 on this model).
    assert!(a["kld_mean"].as_f64().unwrap() < 1e-4, "{a}");
    assert!(a["same_top"].as_f64().unwrap() > 0.95, "{a}");
    // A format no GPU kernel reads would silently become f16: refused.
    let line = last_error(&gpu("q1_0@gpu"));
    assert!(
        line.contains("arm 'q1_0@gpu'") && line.contains("no GPU kernel reads"),
        "{line}"
    );
}

#[test]
fn bad_inputs_fail_cleanly() {
    let (m, c) = (model(), corpus());
    let (m, c) = (m.to_str().unwrap(), c.to_str().unwrap());
    let base = ["--cpu", "--corpus", c, "--chunks", "1"];
    let with = |extra: &[&str]| run(BIN, &[&base[..], extra].concat());

    // An arm that is neither a type nor a file is a bad command line.
    assert_usage_failure(
        &with(&["-m", m, "--arm", "q9_9"]),
        &["arm 'q9_9'", "q4_0", "model file"],
    );
    assert_clean_failure(&with(&["--arm", "q4_0"]), &["arm 'f32'", "--model"]);
    assert_usage_failure(
        &with(&["-m", m, "--arm", "q4_0", "--ref", "nonsense"]),
        &["arm 'nonsense'"],
    );
    assert_clean_failure(
        &with(&["-m", "/no/such/model", "--arm", "q4_0"]),
        &["/no/such/model"],
    );
    assert_clean_failure(
        &with(&["-m", m, "--arm", "q4_0", "-c", "100000"]),
        &["fewer than one chunk"],
    );
    assert_clean_failure(&with(&["-m", m, "--arm", "q4_0", "-c", "2"]), &["--ctx 2"]);
    assert_clean_failure(
        &with(&["-m", m, "--arm", "q4_0", "--tokenizer", "/no/tok"]),
        &["/no/tok"],
    );

    let dir = scratch("kld-bad");
    let short = dir.join("short.txt");
    std::fs::write(&short, "Alice.").unwrap();
    let o = run(
        BIN,
        &[
            "--cpu",
            "-m",
            m,
            "--corpus",
            short.to_str().unwrap(),
            "--arm",
            "q4_0",
        ],
    );
    assert_clean_failure(&o, &["short.txt", "fewer than one chunk of --ctx 512"]);
    let binary = dir.join("binary.txt");
    std::fs::write(&binary, [0xff, 0xfe, 0x00, 0x80]).unwrap();
    let o = run(
        BIN,
        &[
            "--cpu",
            "-m",
            m,
            "--corpus",
            binary.to_str().unwrap(),
            "--arm",
            "q4_0",
        ],
    );
    assert_clean_failure(&o, &["binary.txt", "UTF-8"]);
    std::fs::remove_dir_all(&dir).unwrap();

    // No arm at all is a command-line error.
    let o = run(BIN, &["--cpu", "-m", m, "--corpus", c]);
    assert_eq!(o.status.code(), Some(2));
}

/// Every decoder architecture runs through kld and quantize: for the tiny
/// fixtures of each new family, q8_0 diverges less than q4_0 from f32, and
/// a q8_0 file written by quantize (from the HF directory, or from
/// llama.cpp's GGUF of it) loads.
#[test]
fn every_architecture_runs_through_kld_and_quantize() {
    let dir = scratch("kld-archs");
    for (name, from) in [
        ("tiny-qwen2", "tiny-qwen2"),
        ("tiny-qwen3", "tiny-qwen3"),
        ("tiny-mistral", "tiny-mistral"),
        ("tiny-llama3", "tiny-llama3"),
        ("tiny-gemma3", "tiny-gemma3-spm"),
        ("tiny-phi3", "tiny-phi3.f32.gguf"),
    ] {
        let m = repo().join("samples/fixtures/llm").join(name);
        let r = kld_on(&m, "32", "2", &["--arm", "q8_0,q4_0"]);
        let mean = |a: &str| arm(&r, &format!("{a}@cpu"))["kld_mean"].as_f64().unwrap();
        assert!(
            0.0 < mean("q8_0") && mean("q8_0") < mean("q4_0"),
            "{name}: {r}"
        );
        let src = repo().join("samples/fixtures/llm").join(from);
        let out = dir.join(format!("{name}-q8_0.gguf"));
        let o = run(
            QUANTIZE,
            &[
                src.to_str().unwrap(),
                "--to",
                "q8_0",
                "-o",
                out.to_str().unwrap(),
            ],
        );
        assert!(o.status.success(), "{name}: {}", stderr(&o));
        let (cfg, _) = lfm::models::open_llm(&out).unwrap();
        let (want, _) = lfm::models::open_llm(&m).unwrap();
        assert_eq!(cfg.layers.len(), want.layers.len(), "{name}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
