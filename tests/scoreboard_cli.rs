//! `scoreboard` on a tiny model: the report's shape, and bad arguments.

mod common;
use common::*;

const BIN: &str = env!("CARGO_BIN_EXE_scoreboard");

fn tiny() -> String {
    repo()
        .join("samples/fixtures/llm/tiny-lfm2.f32.gguf")
        .display()
        .to_string()
}

#[test]
fn json_report_has_one_row_per_arm_and_test() {
    let dir = scratch("scoreboard");
    let plot = dir.join("plot.svg");
    let append = dir.join("BENCH.md");
    let o = run(
        BIN,
        &[
            &tiny(),
            "-b",
            "cpu",
            "-t",
            "f32,q8_0",
            "-p",
            "8",
            "-n",
            "4",
            "-d",
            "0,3",
            "-r",
            "2",
            "-o",
            "json",
            "--plot",
            plot.to_str().unwrap(),
            "--append",
            append.to_str().unwrap(),
        ],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    let rows = v["rows"].as_array().unwrap();
    // 2 formats x 2 depths x (pp8, tg4)
    assert_eq!(rows.len(), 8);
    for r in rows {
        assert_eq!(r["samples"].as_array().unwrap().len(), 2);
        assert!(r["tok_per_s"].as_f64().unwrap() > 0.0);
        let roof = r["roofline"].as_f64().unwrap();
        assert!(roof > 0.0 && roof.is_finite());
    }
    assert!(rows
        .iter()
        .any(|r| r["test"] == "tg4 @ d3" && r["format"] == "q8_0"));
    assert!(v["host_copy_bandwidth_gb_s"].as_f64().unwrap() > 0.0);
    assert!(std::fs::read_to_string(&plot).unwrap().starts_with("<svg"));
    let md = std::fs::read_to_string(&append).unwrap();
    assert!(md.contains("| lfm | tiny-lfm2.f32.gguf | q8_0 |"), "{md}");
}

#[test]
fn gpu_arm_profiles_its_decode_steps_and_prefill() {
    let o = run(
        BIN,
        &[
            &tiny(),
            "-b",
            "gpu",
            "-p",
            "5",
            "-n",
            "2",
            "-r",
            "1",
            "--profile",
            "3",
            "-o",
            "json",
        ],
    );
    if !o.status.success() && std::env::var_os("LFM_SKIP_GPU_TESTS").is_some() {
        eprintln!("SKIPPING the GPU scoreboard run (LFM_SKIP_GPU_TESTS set)");
        return;
    }
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert!(v["gpu_copy_bandwidth_gb_s"].as_f64().unwrap() > 0.0);
    let profiles = v["profiles"].as_array().unwrap();
    assert_eq!(profiles.len(), 2);
    // (test, runs, the start of a kernel's name it must have run: the
    // prefill's GEMMs, split over k or not)
    for (p, (test, runs, kernel)) in profiles
        .iter()
        .zip([("decode", 3, "argmax"), ("pp5", 1, "gemm_add")])
    {
        assert_eq!(p["test"], test);
        let p = &p["profile"];
        assert_eq!(p["steps"], runs, "{test}");
        let kernels = p["kernels"].as_array().unwrap();
        // Every dispatch is attributed to a kernel, once per step.
        let calls: f64 = kernels.iter().map(|k| k["calls"].as_f64().unwrap()).sum();
        assert_eq!(calls, p["dispatches"].as_f64().unwrap(), "{test}");
        let ran = |k: &serde_json::Value| k["name"].as_str().unwrap().starts_with(kernel);
        assert!(kernels.iter().any(ran), "{test}");
        let kernel_us: f64 = kernels.iter().map(|k| k["us"].as_f64().unwrap()).sum();
        let gpu_us = p["gpu_us"].as_f64().unwrap();
        // The per-kernel times tile the step (more only if a clock stepped back).
        assert!(gpu_us > 0.0 && kernel_us >= gpu_us * (1.0 - 1e-6), "{test}");
        assert!(p["wall_us"].as_f64().unwrap() >= p["wait_us"].as_f64().unwrap());
    }
    let err = stderr(&o);
    assert!(err.contains("decode step, mean of 3 runs"), "{err}");
    assert!(err.contains("prefill of 5 tokens, mean of 1 runs"), "{err}");
    assert!(err.contains("| kernel | calls/step |"), "{err}");
}

#[test]
fn bad_arguments() {
    // Bad flag values are bad command lines (exit 2), found before any model loads.
    assert_usage_failure(&run(BIN, &[&tiny(), "-b", "cpu", "-t", "q9_9"]), &["q9_9"]);
    assert_usage_failure(
        &run(BIN, &[&tiny(), "-b", "cpu", "-r", "0"]),
        &["repetitions"],
    );
    assert_usage_failure(
        &run(BIN, &[&tiny(), "-b", "cpu", "-p", "0", "-n", "0"]),
        &["nothing to measure"],
    );
    assert_clean_failure(
        &run(BIN, &["/no/such.gguf", "-b", "cpu"]),
        &["/no/such.gguf"],
    );
}

#[test]
fn batch_mode_prints_a_row_per_batch_size() {
    batch_rows("cpu", &[]);
    let o = run(BIN, &[&tiny(), "-b", "cpu", "--batch", "0"]);
    assert_usage_failure(&o, &["--batch"]);
}

#[test]
fn batch_mode_runs_on_the_gpu() {
    let err = batch_rows("gpu", &["--profile", "2"]);
    // A profile of the batched steps, per kernel; a batch of one decodes on
    // the single-sequence path, which has none.
    let head = "gpu, B = 3: batched decode step, mean of 2 runs";
    assert!(err.contains(head), "{err}");
    assert!(err.contains("| gemv_cols"), "{err}");
    assert!(
        err.contains("gpu, B = 1: no batched steps to profile"),
        "{err}"
    );
}

/// Runs `--batch 1,3` on `backend` and checks its rows; returns stderr.
fn batch_rows(backend: &str, extra: &[&str]) -> String {
    let model = tiny();
    let mut args = vec![
        model.as_str(),
        "-b",
        backend,
        "--batch",
        "1,3",
        "-p",
        "5",
        "-n",
        "2",
        "-o",
        "json",
    ];
    args.extend_from_slice(extra);
    let o = run(BIN, &args);
    assert!(o.status.success(), "{}", stderr(&o));
    let rows: Vec<serde_json::Value> = stdout(&o)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(rows.len(), 2, "{}", stdout(&o));
    for (r, b) in rows.iter().zip([1, 3]) {
        let row = &r["row"];
        assert_eq!(
            (row["b"].as_u64(), row["pp"].as_u64(), row["tg"].as_u64()),
            (Some(b), Some(5), Some(2))
        );
        assert_eq!(row["n_kv"].as_u64(), Some(b * 7));
        assert!(row["s_tg"].as_f64().unwrap() > 0.0, "{row}");
    }
    stderr(&o)
}

/// `--batch` beside `--llama-batched-bench`: the peer gets the same prompt,
/// generation and batch sizes, its JSONL rows are reported, and each of
/// ours carries its ratio. A stand-in script plays llama-batched-bench.
#[cfg(unix)]
#[test]
fn batched_rows_sit_beside_llama_batched_bench() {
    use std::os::unix::fs::PermissionsExt;
    let dir = scratch("scoreboard-batched-peer");
    let args_file = dir.join("args.txt");
    let peer = dir.join("llama-batched-bench");
    std::fs::write(
        &peer,
        format!(
            "#!/bin/sh\necho \"$@\" > '{}'\n\
             echo 'llama_model_load: noise' >&2\n\
             echo '{{\"pp\": 4, \"tg\": 2, \"pl\": 1, \"n_kv\": 6, \"t_pp\": 0.5, \"speed_pp\": 8.0, \"t_tg\": 1.0, \"speed_tg\": 2.0}}'\n\
             echo '{{\"pp\": 4, \"tg\": 2, \"pl\": 2, \"n_kv\": 12, \"t_pp\": 0.5, \"speed_pp\": 16.0, \"t_tg\": 1.0, \"speed_tg\": 4.0}}'\n",
            args_file.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&peer, std::fs::Permissions::from_mode(0o755)).unwrap();
    let peer_arg = peer.display().to_string();
    let common_args = [
        tiny(),
        "-b".into(),
        "cpu".into(),
        "--batch".into(),
        "1,2".into(),
        "-p".into(),
        "4".into(),
        "-n".into(),
        "2".into(),
        "--llama-batched-bench".into(),
        peer_arg,
        "--llama-batched-bench-args".into(),
        "-ngl 99".into(),
    ];
    let mut json_args: Vec<&str> = common_args.iter().map(String::as_str).collect();
    json_args.extend(["-o", "json"]);
    let o = run(BIN, &json_args);
    assert!(o.status.success(), "{}", stderr(&o));
    let called = std::fs::read_to_string(&args_file).unwrap();
    assert!(
        called.contains(&format!("-m {} -npp 4 -ntg 2 -npl 1,2 -c 12", tiny())),
        "{called}"
    );
    assert!(
        called.trim_end().ends_with("--output-format jsonl -ngl 99"),
        "{called}"
    );
    let lines: Vec<serde_json::Value> = stdout(&o)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let peer_rows: Vec<_> = lines
        .iter()
        .filter(|v| v["backend"] == "llama.cpp")
        .collect();
    assert_eq!(peer_rows.len(), 2, "{lines:?}");
    assert_eq!(peer_rows[1]["row"]["s_tg"], 4.0);
    let ours: Vec<_> = lines.iter().filter(|v| v["backend"] == "cpu").collect();
    assert_eq!(ours.len(), 2, "{lines:?}");
    for v in ours {
        let b = v["row"]["b"].as_f64().unwrap();
        let want = v["row"]["s_tg"].as_f64().unwrap() / (2.0 * b);
        let got = v["s_tg_vs_peer"].as_f64().unwrap();
        assert!((got - want).abs() < 1e-9 * want.max(1.0), "{v}");
    }
    // Markdown: the peer's table, then ours with the ratio column.
    let md_args: Vec<&str> = common_args.iter().map(String::as_str).collect();
    let o = run(BIN, &md_args);
    assert!(o.status.success(), "{}", stderr(&o));
    let md = stdout(&o);
    assert!(md.contains("(llama.cpp: `"), "{md}");
    assert!(md.contains("| S_TG vs llama.cpp |"), "{md}");

    // Without --batch the peer has nothing to compare; with it, llama-bench.
    let o = run(BIN, &[&tiny(), "-b", "cpu", "--llama-batched-bench", "x"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("--batch"), "{}", stderr(&o));
    let o = run(
        BIN,
        &[&tiny(), "-b", "cpu", "--batch", "2", "--llama-bench", "x"],
    );
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("--llama-batched-bench"),
        "{}",
        stderr(&o)
    );
    // --plot and --append record single-sequence tests only.
    for flag in ["--plot", "--append"] {
        let o = run(BIN, &[&tiny(), "-b", "cpu", "--batch", "2", flag, "x.svg"]);
        assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
        assert!(stderr(&o).contains("not with --batch"), "{}", stderr(&o));
    }
    // A peer that prints no rows is an error naming it.
    std::fs::write(&peer, "#!/bin/sh\necho nothing\n").unwrap();
    let o = run(BIN, &md_args);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(stderr(&o).contains("printed no rows"), "{}", stderr(&o));
    let _ = std::fs::remove_dir_all(dir);
}
