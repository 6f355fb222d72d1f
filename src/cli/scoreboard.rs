//! `scoreboard`: the benchmark harness. Every arm (model file x weight format
//! x backend x context depth) measured the way llama-bench measures, side by
//! side with a peer run in the same process invocation, with the share of the
//! memory-bandwidth roofline each number reaches.

use crate::cli::DeviceChoice;
use crate::gpu::profile::StepProfile;
use crate::gpu::{Backend, GpuOptions};
use crate::models::llm_gpu::BatchProducts;
use crate::models::{self, LoadOptions};
use crate::quant::GgmlType;
use crate::run::bench::{self, Measurement, Test};
use crate::tensor::Activations;
use anyhow::{bail, Context};
use clap::Parser;
use serde::Serialize;
use std::io::Write;
use std::path::{Path, PathBuf};

/// Benchmark prompt processing (pp) and generation (tg) speed across models,
/// weight formats, backends and context depths, optionally beside llama-bench.
#[derive(Parser, Debug)]
#[command(
    name = "scoreboard",
    version,
    about = "Benchmark prompt processing (pp) and generation (tg) speed of language models, \
optionally beside llama-bench",
    long_about = None
)]
pub struct Args {
    /// Model files or HF directories (default: the default generate model).
    pub models: Vec<PathBuf>,

    /// A model file or HF directory, as llama-bench's -m (repeatable; added
    /// to the positional ones).
    #[arg(short = 'm', long = "model", value_name = "PATH")]
    pub model: Vec<PathBuf>,

    /// Prompt lengths to measure (pp); 0 skips the test.
    #[arg(short = 'p', long, value_delimiter = ',', default_value = "512")]
    pub n_prompt: Vec<usize>,

    /// Generation lengths to measure (tg); 0 skips the test.
    #[arg(short = 'n', long, value_delimiter = ',', default_value = "128")]
    pub n_gen: Vec<usize>,

    /// Context depths: tokens already in the context before each test.
    #[arg(short = 'd', long, value_delimiter = ',', default_value = "0")]
    pub depth: Vec<usize>,

    /// Measured repetitions per test (after one warm-up run).
    #[arg(short = 'r', long, default_value_t = 5, value_parser = super::values::positive)]
    pub repetitions: usize,

    /// Weight formats to convert the models to before measuring (f32, f16,
    /// q8_0, q4_0, ...); default: as stored.
    #[arg(short = 't', long = "type", value_delimiter = ',')]
    pub types: Vec<String>,

    /// Backends to measure [default: gpu; the cpu instead when the only GPU
    /// is a software one (lavapipe), unless -b gpu, --wgpu-backend or
    /// --adapter asks for it].
    #[arg(short = 'b', long = "backends", value_delimiter = ',')]
    pub backends: Vec<Arm>,

    /// Graphics API for the gpu arms.
    #[arg(long, value_enum)]
    pub wgpu_backend: Option<Backend>,

    /// GPU adapter name substring for the gpu arms.
    #[arg(long)]
    pub adapter: Option<String>,

    /// Output format.
    #[arg(short = 'o', long, value_enum, default_value = "md")]
    pub output: Output,

    /// Run this llama-bench on the same model files and tests and show its
    /// rows beside ours with the ratio.
    #[arg(long)]
    pub llama_bench: Option<PathBuf>,

    /// Extra arguments for llama-bench (e.g. "-ngl 99").
    #[arg(long, allow_hyphen_values = true)]
    pub llama_bench_args: Option<String>,

    /// With --batch: run this llama-batched-bench on the same model files
    /// (-npp, -ntg and -npl from -p, -n and --batch) and show its rows
    /// beside ours with the ratio.
    #[arg(long, value_name = "PATH")]
    pub llama_batched_bench: Option<PathBuf>,

    /// Extra arguments for llama-batched-bench (e.g. "-ngl 99"), after ours.
    #[arg(long, allow_hyphen_values = true)]
    pub llama_batched_bench_args: Option<String>,

    /// Draw tokens/s per arm into an SVG file.
    #[arg(long, value_name = "FILE")]
    pub plot: Option<PathBuf>,

    /// Replace the --plot file if it exists.
    #[arg(long)]
    pub force: bool,

    /// Append the results as a dated markdown section to this file (e.g. BENCHMARKS.md).
    #[arg(long)]
    pub append: Option<PathBuf>,

    /// Seed for the random token ids.
    #[arg(long, default_value_t = 1234)]
    pub seed: u64,

    /// Batched decode instead, as llama-batched-bench measures it (`serve`'s
    /// engine without HTTP): for each B, prefill B sequences of the first -p
    /// tokens, then the first -n steps of all B together.
    #[arg(long, value_delimiter = ',', value_name = "B,...", value_parser = super::values::positive)]
    pub batch: Option<Vec<usize>>,

    /// With --batch: how a GPU decode step computes its products (`serve
    /// --batch-products`): `invariant`, each sequence's sums as alone, or
    /// `gemm`, through the prompt's matrix kernels.
    #[arg(long, value_enum, value_name = "HOW", default_value_t = BatchProducts::Invariant, requires = "batch")]
    pub batch_products: BatchProducts,

    /// Also profile this many decode steps of each gpu arm at each depth,
    /// and one run of each prompt test: device time per kernel (timestamp
    /// queries) and host time per step. With --batch: this many batched
    /// steps at each B above 1, in a run apart from the timed one (GPU; a
    /// batch of one decodes on the single-sequence path).
    #[arg(long, value_name = "STEPS", value_parser = super::values::positive)]
    pub profile: Option<usize>,

    #[command(flatten)]
    pub quiet: super::QuietArgs,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Arm {
    Gpu,
    Cpu,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Output {
    Md,
    Json,
    Csv,
}

/// One row of the scoreboard.
#[derive(Clone, Debug, Serialize)]
pub struct Row {
    pub engine: String,
    pub model: String,
    pub format: String,
    pub backend: String,
    pub params: usize,
    pub size_bytes: usize,
    pub test: String,
    pub tok_per_s: f64,
    pub sd: f64,
    /// Share of the memory-bandwidth roofline reached (0..1), when known.
    pub roofline: Option<f64>,
    /// Ours over the peer's tok/s for the same model and test.
    pub ratio_vs_peer: Option<f64>,
    pub samples: Vec<f64>,
}

#[derive(Serialize)]
struct Report {
    date: String,
    commit: String,
    machine: String,
    adapter: Option<String>,
    gpu_copy_bandwidth_gb_s: Option<f64>,
    host_copy_bandwidth_gb_s: f64,
    command: String,
    rows: Vec<Row>,
    profiles: Vec<Profile>,
}

/// Where a gpu arm's decode step or prefill spends its time.
#[derive(Serialize)]
struct Profile {
    model: String,
    format: String,
    depth: usize,
    /// "decode" or the prompt test ("pp512").
    test: String,
    profile: StepProfile,
}

/// Checks the --append file before the benchmark runs, creating nothing.
fn check_append(path: &Path) -> anyhow::Result<()> {
    match std::fs::metadata(path) {
        Ok(m) if m.is_dir() => bail!("{}: is a directory (--append needs a file)", path.display()),
        Ok(_) => {
            std::fs::OpenOptions::new()
                .append(true)
                .open(path)
                .with_context(|| format!("{}: cannot open for appending", path.display()))?;
        }
        Err(_) => {
            let parent = match path.parent() {
                Some(p) if !p.as_os_str().is_empty() => p,
                _ => Path::new("."),
            };
            if !parent.is_dir() {
                bail!(
                    "{}: cannot create: the directory {} does not exist",
                    path.display(),
                    parent.display()
                );
            }
        }
    }
    Ok(())
}

pub fn run(mut args: Args) -> anyhow::Result<()> {
    args.quiet.apply();
    if args.batch.is_some() && (args.plot.is_some() || args.append.is_some()) {
        return Err(super::usage(
            "--plot and --append draw and record the single-sequence tests; not with --batch",
        ));
    }
    // Output paths first: a bad one must not cost a benchmark.
    if let Some(path) = &args.plot {
        crate::util::atomic_write::check_extension(path, &["svg"], "SVG")
            .map_err(|e| super::usage(e.to_string()))?;
        crate::util::atomic_write::check(path, args.force)?;
    }
    if let Some(path) = &args.append {
        check_append(path)?;
    }
    match (&args.batch, &args.llama_bench, &args.llama_batched_bench) {
        (Some(_), Some(_), _) => return Err(super::usage(
            "--llama-bench measures single-sequence tests; with --batch pass --llama-batched-bench",
        )),
        (None, _, Some(_)) => {
            return Err(super::usage(
                "--llama-batched-bench compares --batch runs; pass --batch",
            ))
        }
        _ => {}
    }
    let mut models = args.models.clone();
    models.extend(args.model.iter().cloned());
    if models.is_empty() {
        models.push(models::default_llm_path()?);
    }
    let types: Vec<Option<GgmlType>> = if args.types.is_empty() {
        vec![None]
    } else {
        args.types
            .iter()
            .map(|t| {
                GgmlType::from_name(t)
                    .map(Some)
                    .ok_or_else(|| super::usage(format!("-t: unknown weight format '{t}'")))
            })
            .collect::<anyhow::Result<_>>()?
    };
    let mut tests: Vec<Test> = args
        .n_prompt
        .iter()
        .filter(|&&n| n > 0)
        .map(|&n| Test::Pp(n))
        .collect();
    tests.extend(args.n_gen.iter().filter(|&&n| n > 0).map(|&n| Test::Tg(n)));
    if tests.is_empty() {
        return Err(super::usage("nothing to measure: every -p and -n is 0"));
    }

    let gpu_opts = GpuOptions {
        backend: args.wgpu_backend,
        adapter: args.adapter.clone(),
        portable: false,
        // The gpu arm measures whatever adapter there is, lavapipe included.
        required: true,
        ..Default::default()
    };
    // Without -b, a software adapter is skipped as the other tools skip it.
    let default_arms = args.backends.is_empty();
    if default_arms {
        args.backends.push(Arm::Gpu);
    }
    let mut adapter = None;
    let mut gpu_bw = None;
    if args.backends.contains(&Arm::Gpu) {
        let gpu = crate::gpu::Gpu::new(&gpu_opts)
            .context("the gpu arm needs an adapter (or pass -b cpu)")?;
        let named = gpu_opts.backend.is_some() || gpu_opts.adapter.is_some();
        if default_arms && !named && gpu.is_software() {
            crate::util::log::notice(&format!(
                "only a software GPU ({}) found; measuring the CPU (-b gpu measures it anyway)",
                gpu.info.name
            ));
            args.backends = vec![Arm::Cpu];
        } else {
            crate::util::log::notice(&gpu.describe());
            adapter = Some(format!(
                "{} ({:?}, {} {})",
                gpu.info.name, gpu.info.backend, gpu.info.driver, gpu.info.driver_info
            ));
            gpu_bw = Some(bench::gpu_copy_bandwidth(&gpu)?);
        }
    }
    let host_bw = bench::host_copy_bandwidth();
    if let Some(batches) = &args.batch {
        return batched(&args, &models, &types, &gpu_opts, batches);
    }

    let mut rows = Vec::new();
    let mut profiles = Vec::new();
    for model in &models {
        for &ty in &types {
            for &arm in &args.backends {
                let device = match arm {
                    Arm::Cpu => DeviceChoice::Cpu,
                    Arm::Gpu => DeviceChoice::Gpu(gpu_opts.clone()),
                };
                let mut loaded = models::load_llm(
                    model,
                    &LoadOptions {
                        device,
                        weight_type: ty,
                        // What generate runs, and what llama.cpp's CPU
                        // backend does.
                        cpu_activations: Activations::Int8,
                    },
                )?;
                if arm == Arm::Gpu && loaded.backend_name() == "cpu" {
                    bail!("{}: the gpu arm fell back to the CPU", model.display());
                }
                let cfg = loaded.model.config().clone();
                let bw = if arm == Arm::Gpu {
                    gpu_bw.unwrap_or(host_bw)
                } else {
                    host_bw
                };
                for &depth in &args.depth {
                    for &test in &tests {
                        if depth + test.tokens() > cfg.context {
                            bail!(
                                "{}: depth {depth} + {} tokens exceeds the context of {}",
                                model.display(),
                                test.tokens(),
                                cfg.context
                            );
                        }
                        crate::notice!(
                            "{}: {} {} {} ...",
                            display_name(model),
                            loaded.weight_format(),
                            arm_name(arm),
                            test.name(depth)
                        );
                        let m = bench::measure(
                            loaded.model.as_mut(),
                            test,
                            depth,
                            args.repetitions,
                            args.seed,
                        )?;
                        let roofline = roofline(&cfg, loaded.bytes_per_token, test, depth, &m, bw);
                        rows.push(Row {
                            engine: "lfm".into(),
                            model: display_name(model),
                            format: loaded.weight_format().to_string(),
                            backend: arm_name(arm).into(),
                            params: loaded.params,
                            size_bytes: loaded.weight_bytes,
                            test: m.test.clone(),
                            tok_per_s: m.mean,
                            sd: m.sd,
                            roofline: Some(roofline),
                            ratio_vs_peer: None,
                            samples: m.samples,
                        });
                    }
                    if let (Some(steps), Arm::Gpu) = (args.profile, arm) {
                        let format = loaded.weight_format().to_string();
                        let model_ref = loaded.model.as_mut();
                        let mut rng = crate::util::rng::Rng::new(args.seed);
                        let mut ids = |n: usize| -> Vec<u32> {
                            (0..n)
                                .map(|_| (rng.next_u64() % cfg.vocab as u64) as u32)
                                .collect()
                        };
                        let prompts = tests.iter().filter_map(|t| match t {
                            Test::Pp(n) => Some(*n),
                            Test::Tg(_) => None,
                        });
                        let runs: Vec<Option<usize>> =
                            std::iter::once(None).chain(prompts.map(Some)).collect();
                        for run in runs {
                            model_ref.reset();
                            if depth > 0 {
                                model_ref.forward(&ids(depth), false)?;
                            }
                            let (test, profile) = match run {
                                None => (
                                    "decode".to_string(),
                                    model_ref.profile_decode(ids(1)[0], steps)?,
                                ),
                                Some(n) => {
                                    (Test::Pp(n).name(0), model_ref.profile_prefill(&ids(n))?)
                                }
                            };
                            eprintln!("{}", profile.table());
                            profiles.push(Profile {
                                model: display_name(model),
                                format: format.clone(),
                                depth,
                                test,
                                profile,
                            });
                        }
                    }
                }
            }
        }
    }

    if let Some(peer) = &args.llama_bench {
        let peer_rows = llama_bench(peer, args.llama_bench_args.as_deref(), &models, &args)?;
        for r in rows.iter_mut() {
            if let Some(p) = peer_rows
                .iter()
                .find(|p| p.model == r.model && p.test == r.test)
            {
                r.ratio_vs_peer = Some(r.tok_per_s / p.tok_per_s);
            }
        }
        rows.extend(peer_rows);
    }

    let report = Report {
        date: crate::util::date::today_utc(),
        commit: commit(),
        machine: machine(),
        adapter,
        gpu_copy_bandwidth_gb_s: gpu_bw.map(|b| b / 1e9),
        host_copy_bandwidth_gb_s: host_bw / 1e9,
        command: std::env::args().collect::<Vec<_>>().join(" "),
        rows,
        profiles,
    };
    let text = match args.output {
        Output::Md => markdown(&report),
        Output::Json => serde_json::to_string_pretty(&report)? + "\n",
        Output::Csv => csv(&report),
    };
    std::io::stdout().write_all(text.as_bytes())?;
    if let Some(path) = &args.plot {
        crate::util::atomic_write::write_atomic(path, svg(&report).as_bytes(), args.force)?;
    }
    if let Some(path) = &args.append {
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .with_context(|| format!("{}: cannot open for appending", path.display()))?;
        write!(f, "\n{}", markdown(&report))
            .with_context(|| format!("{}: write failed", path.display()))?;
    }
    Ok(())
}

fn arm_name(a: Arm) -> &'static str {
    match a {
        Arm::Gpu => "gpu",
        Arm::Cpu => "cpu",
    }
}

fn display_name(p: &Path) -> String {
    p.file_name()
        .map(|n| n.to_string_lossy().to_string())
        .unwrap_or_else(|| p.display().to_string())
}

/// Share of the bandwidth roofline: bytes the test must move (weights once per
/// forward pass, plus the KV cache it reads) over the measured copy bandwidth,
/// against the measured time.
fn roofline(
    cfg: &crate::models::llm::LlmConfig,
    weight_bytes: usize,
    test: Test,
    depth: usize,
    m: &Measurement,
    bw: f64,
) -> f64 {
    let kv_row = cfg.kv_bytes_per_position();
    let n = test.tokens();
    let (passes, kv_positions) = match test {
        // One forward pass over n tokens; attention reads up to depth + n positions.
        Test::Pp(_) => (1.0, (depth + n) as f64),
        // n passes, each reading the cache as it grows.
        Test::Tg(_) => (n as f64, n as f64 * (depth as f64 + n as f64 / 2.0)),
    };
    let bytes = passes * weight_bytes as f64 + kv_positions * kv_row as f64;
    let seconds = n as f64 / m.mean.max(1e-12);
    bytes / seconds / bw
}

/// The commit this binary was built from (build.rs), not the checkout it
/// runs in.
fn commit() -> String {
    env!("LFM_BUILD_COMMIT").to_string()
}

fn machine() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_string())
        })
        .unwrap_or_else(|| std::env::consts::ARCH.to_string());
    let threads = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    format!("{cpu}, {threads} threads, {}", std::env::consts::OS)
}

fn fmt_rate(r: &Row) -> String {
    format!("{:.2} ± {:.2}", r.tok_per_s, r.sd)
}

fn markdown(rep: &Report) -> String {
    let mut s = format!(
        "### scoreboard {} (commit {})\n\n- machine: {}\n- adapter: {}\n- copy bandwidth: {}host {:.1} GB/s\n- command: `{}`\n\n",
        rep.date,
        rep.commit,
        rep.machine,
        rep.adapter.as_deref().unwrap_or("none"),
        rep.gpu_copy_bandwidth_gb_s.map(|b| format!("gpu {b:.1} GB/s, ")).unwrap_or_default(),
        rep.host_copy_bandwidth_gb_s,
        rep.command
    );
    s.push_str(
        "| engine | model | format | size | params | backend | test | t/s | roofline | vs peer |\n",
    );
    s.push_str("|---|---|---|---:|---:|---|---|---:|---:|---:|\n");
    for r in &rep.rows {
        s.push_str(&format!(
            "| {} | {} | {} | {:.1} MiB | {:.1} M | {} | {} | {} | {} | {} |\n",
            r.engine,
            r.model,
            r.format,
            r.size_bytes as f64 / (1 << 20) as f64,
            r.params as f64 / 1e6,
            r.backend,
            r.test,
            fmt_rate(r),
            r.roofline
                .map(|f| format!("{:.1}%", f * 100.0))
                .unwrap_or_else(|| "-".into()),
            r.ratio_vs_peer
                .map(|x| format!("{x:.2}x"))
                .unwrap_or_else(|| "-".into()),
        ));
    }
    for p in &rep.profiles {
        s.push_str(&format!(
            "\n#### {} profile: {} {} gpu, depth {}\n\n{}",
            p.test,
            p.model,
            p.format,
            p.depth,
            p.profile.table()
        ));
    }
    s
}

fn csv(rep: &Report) -> String {
    let mut s = String::from(
        "engine,model,format,backend,params,size_bytes,test,tok_per_s,sd,roofline,ratio_vs_peer\n",
    );
    for r in &rep.rows {
        s.push_str(&format!(
            "{},{},{},{},{},{},{},{:.4},{:.4},{},{}\n",
            r.engine,
            r.model,
            r.format,
            r.backend,
            r.params,
            r.size_bytes,
            r.test,
            r.tok_per_s,
            r.sd,
            r.roofline.map(|f| format!("{f:.5}")).unwrap_or_default(),
            r.ratio_vs_peer
                .map(|f| format!("{f:.4}"))
                .unwrap_or_default()
        ));
    }
    s
}

/// Horizontal bars, one per row, grouped by test.
fn svg(rep: &Report) -> String {
    let bar_h = 18.0;
    let gap = 6.0;
    let label_w = 420.0;
    let plot_w = 480.0;
    let max = rep
        .rows
        .iter()
        .map(|r| r.tok_per_s)
        .fold(0.0f64, f64::max)
        .max(1e-9);
    let height = 40.0 + rep.rows.len() as f64 * (bar_h + gap);
    let mut s = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{height}\" font-family=\"monospace\" font-size=\"12\">\n\
         <text x=\"8\" y=\"20\" font-size=\"14\">tokens/s, {} (commit {})</text>\n",
        label_w + plot_w + 120.0,
        rep.date,
        rep.commit
    );
    for (i, r) in rep.rows.iter().enumerate() {
        let y = 32.0 + i as f64 * (bar_h + gap);
        let w = plot_w * r.tok_per_s / max;
        let colour = if r.engine == "lfm" {
            "#3b7dd8"
        } else {
            "#d8893b"
        };
        let label = format!(
            "{} {} {} {} {}",
            r.engine, r.model, r.format, r.backend, r.test
        );
        s.push_str(&format!(
            "<text x=\"8\" y=\"{:.1}\">{}</text><rect x=\"{label_w}\" y=\"{y:.1}\" width=\"{w:.1}\" height=\"{bar_h}\" fill=\"{colour}\"/>\
             <text x=\"{:.1}\" y=\"{:.1}\">{:.1}</text>\n",
            y + 13.0,
            xml_escape(&label),
            label_w + w + 6.0,
            y + 13.0,
            r.tok_per_s
        ));
    }
    s.push_str("</svg>\n");
    s
}

fn xml_escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// Runs a peer's `cmd` (`exe` and our arguments) with the user's `extra`
/// arguments after ours; its command line and output, or the last line
/// of its errors when it fails.
fn run_peer(
    mut cmd: std::process::Command,
    exe: &Path,
    extra: Option<&str>,
) -> anyhow::Result<(String, std::process::Output)> {
    if let Some(extra) = extra {
        cmd.args(extra.split_whitespace());
    }
    let command = std::iter::once(cmd.get_program())
        .chain(cmd.get_args())
        .map(|a| a.to_string_lossy())
        .collect::<Vec<_>>()
        .join(" ");
    crate::notice!("peer: {command}");
    let out = cmd
        .output()
        .with_context(|| format!("{}: cannot run", exe.display()))?;
    if !out.status.success() {
        bail!(
            "{} failed: {}",
            exe.display(),
            String::from_utf8_lossy(&out.stderr)
                .lines()
                .last()
                .unwrap_or("")
        );
    }
    Ok((command, out))
}

/// Runs llama-bench with the same tests and turns its JSON into rows.
fn llama_bench(
    exe: &Path,
    extra: Option<&str>,
    models: &[PathBuf],
    args: &Args,
) -> anyhow::Result<Vec<Row>> {
    let list = |v: &[usize]| {
        v.iter()
            .map(|n| n.to_string())
            .collect::<Vec<_>>()
            .join(",")
    };
    let mut rows = Vec::new();
    for model in models {
        let mut cmd = std::process::Command::new(exe);
        cmd.arg("-m").arg(model);
        cmd.args([
            "-p",
            &list(&args.n_prompt),
            "-n",
            &list(&args.n_gen),
            "-d",
            &list(&args.depth),
        ]);
        cmd.args(["-r", &args.repetitions.to_string(), "-o", "json"]);
        let (_, out) = run_peer(cmd, exe, extra)?;
        let v: serde_json::Value = serde_json::from_slice(&out.stdout)
            .with_context(|| format!("{}: output is not JSON", exe.display()))?;
        for e in v.as_array().map(Vec::as_slice).unwrap_or_default() {
            let n_prompt = e["n_prompt"].as_u64().unwrap_or(0) as usize;
            let n_gen = e["n_gen"].as_u64().unwrap_or(0) as usize;
            let depth = e["n_depth"].as_u64().unwrap_or(0) as usize;
            let test = if n_gen > 0 {
                Test::Tg(n_gen)
            } else {
                Test::Pp(n_prompt)
            };
            rows.push(Row {
                engine: "llama.cpp".into(),
                model: display_name(model),
                format: e["model_type"].as_str().unwrap_or("").to_string(),
                backend: e["backends"].as_str().unwrap_or("").to_string(),
                params: e["model_n_params"].as_u64().unwrap_or(0) as usize,
                size_bytes: e["model_size"].as_u64().unwrap_or(0) as usize,
                test: test.name(depth),
                tok_per_s: e["avg_ts"].as_f64().unwrap_or(0.0),
                sd: e["stddev_ts"].as_f64().unwrap_or(0.0),
                roofline: None,
                ratio_vs_peer: None,
                samples: e["samples_ts"]
                    .as_array()
                    .map(|a| a.iter().filter_map(|x| x.as_f64()).collect())
                    .unwrap_or_default(),
            });
        }
    }
    Ok(rows)
}

/// Runs llama-batched-bench on `model` with the same prompt, generation and
/// batch sizes (`--output-format jsonl`); its command line and rows.
fn llama_batched_bench(
    exe: &Path,
    extra: Option<&str>,
    model: &Path,
    pp: usize,
    tg: usize,
    batches: &[usize],
) -> anyhow::Result<(String, Vec<bench::BatchedRow>)> {
    let most = batches.iter().max().copied().unwrap_or(1);
    let npl = batches
        .iter()
        .map(|b| b.to_string())
        .collect::<Vec<_>>()
        .join(",");
    let mut cmd = std::process::Command::new(exe);
    cmd.arg("-m").arg(model);
    cmd.args([
        "-npp",
        &pp.to_string(),
        "-ntg",
        &tg.to_string(),
        "-npl",
        &npl,
    ]);
    // Room for the largest batch, as ours gets.
    cmd.args(["-c", &(most * (pp + tg)).to_string()]);
    cmd.args(["--output-format", "jsonl"]);
    let (command, out) = run_peer(cmd, exe, extra)?;
    // Its rows are log lines: stdout, or stderr where its log goes there.
    let mut rows = Vec::new();
    for text in [&out.stdout, &out.stderr] {
        for line in String::from_utf8_lossy(text).lines() {
            let json = line.trim();
            if !json.starts_with('{') {
                continue;
            }
            let v: serde_json::Value = serde_json::from_str(json)
                .with_context(|| format!("{}: a row is not JSON: {json}", exe.display()))?;
            let int = |k: &str| v[k].as_u64().unwrap_or(0) as usize;
            let num = |k: &str| v[k].as_f64().unwrap_or(0.0);
            rows.push(bench::BatchedRow {
                pp: int("pp"),
                tg: int("tg"),
                b: int("pl"),
                n_kv: int("n_kv"),
                t_pp: num("t_pp"),
                s_pp: num("speed_pp"),
                t_tg: num("t_tg"),
                s_tg: num("speed_tg"),
            });
        }
    }
    if rows.is_empty() {
        bail!(
            "{}: printed no rows (is it llama-batched-bench?)",
            exe.display()
        );
    }
    Ok((command, rows))
}

/// The markdown head of a batched table, with the ratio column where a
/// peer ran.
fn write_batched_head(out: &mut impl Write, with_ratio: bool) -> anyhow::Result<()> {
    let (name, rule) = if with_ratio {
        (" S_TG vs llama.cpp |", "---:|")
    } else {
        ("", "")
    };
    writeln!(
        out,
        "| PP | TG | B | N_KV | T_PP s | S_PP t/s | T_TG s | S_TG t/s |{name}"
    )?;
    writeln!(out, "|---:|---:|---:|---:|---:|---:|---:|---:|{rule}")?;
    Ok(())
}

/// One row of a batched table. `ratio`: none without a ratio column, else
/// the row's S_TG against the peer's at its B (if the peer ran that B).
/// One batched row; `products`: how our GPU rows computed their products
/// (JSON says it; the Markdown table's heading does).
fn write_batched_row(
    out: &mut impl Write,
    output: Output,
    model: &Path,
    backend: &str,
    products: Option<BatchProducts>,
    r: &bench::BatchedRow,
    ratio: Option<Option<f64>>,
) -> anyhow::Result<()> {
    match output {
        Output::Json => {
            let mut v = serde_json::json!({
                "model": model.display().to_string(), "backend": backend, "row": r,
            });
            if let Some(p) = products.and_then(|p| clap::ValueEnum::to_possible_value(&p)) {
                v["batch_products"] = p.get_name().into();
            }
            if let Some(Some(x)) = ratio {
                v["s_tg_vs_peer"] = x.into();
            }
            writeln!(out, "{v}")?
        }
        Output::Csv => writeln!(
            out,
            "{},{backend},{},{},{},{},{:.3},{:.2},{:.3},{:.2}{}",
            model.display(),
            r.pp,
            r.tg,
            r.b,
            r.n_kv,
            r.t_pp,
            r.s_pp,
            r.t_tg,
            r.s_tg,
            ratio
                .flatten()
                .map_or(String::new(), |x| format!(",{x:.3}"))
        )?,
        Output::Md => writeln!(
            out,
            "| {} | {} | {} | {} | {:.3} | {:.2} | {:.3} | {:.2} |{}",
            r.pp,
            r.tg,
            r.b,
            r.n_kv,
            r.t_pp,
            r.s_pp,
            r.t_tg,
            r.s_tg,
            match ratio {
                None => String::new(),
                Some(Some(x)) => format!(" {x:.2}x |"),
                Some(None) => " |".to_string(),
            }
        )?,
    }
    Ok(())
}

/// `--batch`: llama-batched-bench's table for each model, format and arm.
fn batched(
    args: &Args,
    models: &[PathBuf],
    types: &[Option<GgmlType>],
    gpu_opts: &GpuOptions,
    batches: &[usize],
) -> anyhow::Result<()> {
    let pp = args.n_prompt.first().copied().unwrap_or(128).max(1);
    let tg = args.n_gen.first().copied().unwrap_or(128).max(1);
    let mut out = std::io::stdout().lock();
    for model in models {
        // The peer first, so each of our rows can carry its ratio.
        let peer = match &args.llama_batched_bench {
            Some(exe) => {
                let (command, rows) = llama_batched_bench(
                    exe,
                    args.llama_batched_bench_args.as_deref(),
                    model,
                    pp,
                    tg,
                    batches,
                )?;
                if args.output == Output::Md {
                    writeln!(out, "\n{} (llama.cpp: `{command}`)\n", model.display())?;
                    write_batched_head(&mut out, false)?;
                }
                for r in &rows {
                    write_batched_row(&mut out, args.output, model, "llama.cpp", None, r, None)?;
                }
                rows
            }
            None => Vec::new(),
        };
        let vs_peer =
            |r: &bench::BatchedRow| peer.iter().find(|p| p.b == r.b).map(|p| r.s_tg / p.s_tg);
        for &ty in types {
            for &arm in &args.backends {
                let device = match arm {
                    Arm::Cpu => DeviceChoice::Cpu,
                    Arm::Gpu => DeviceChoice::Gpu(gpu_opts.clone()),
                };
                let opts = LoadOptions {
                    device,
                    weight_type: ty,
                    cpu_activations: Activations::Int8,
                };
                let most = batches.iter().max().copied().unwrap_or(1);
                // Room for the largest batch, whatever the context.
                let kv = models::KvSize::Sequences(most, pp + tg);
                let mut loaded =
                    models::load_batched_llm(model, &opts, kv, None, args.batch_products)?;
                let backend = loaded.model.backend_name();
                if args.output == Output::Md {
                    let products = match (arm, args.batch_products) {
                        (Arm::Gpu, BatchProducts::Gemm) => ", products on the GEMM",
                        _ => "",
                    };
                    writeln!(
                        out,
                        "\n{} ({}, {backend}{products})\n",
                        model.display(),
                        ty.map_or("as stored".to_string(), |t| t.to_string())
                    )?;
                    write_batched_head(&mut out, !peer.is_empty())?;
                }
                for &b in batches {
                    if b > loaded.model.max_sequences() {
                        crate::util::log::notice(&format!("{backend}: B = {b} is more than the {} sequences this backend runs at once; skipped", loaded.model.max_sequences()));
                        continue;
                    }
                    // One unmeasured run first (other prompts), as llama-batched-bench
                    // warms up: a batch size's first batched steps build its
                    // pipelines. A batch of one runs on the single-sequence path and
                    // is measured unwarmed (BENCHMARKS.md, twenty-second session).
                    if b > 1 {
                        bench::batched_decode(loaded.model.as_mut(), pp, tg.min(2), b, !args.seed)?;
                    }
                    let r = bench::batched_decode(loaded.model.as_mut(), pp, tg, b, args.seed)?;
                    // --profile: a run apart, so the timestamps cost the row nothing.
                    if let Some(steps) = args.profile {
                        if loaded.model.start_profile()? {
                            bench::batched_decode(loaded.model.as_mut(), pp, steps, b, args.seed)?;
                            match loaded.model.take_profile() {
                                // A batch of one runs ahead on the single path.
                                Some(p) if p.steps == 0 => eprintln!(
                                    "\n{backend}, B = {b}: no batched steps to profile (a batch of \
                                     one decodes on the single-sequence path; the decode profile \
                                     without --batch shows it)"
                                ),
                                Some(p) => eprintln!("\n{backend}, B = {b}: {}", p.table()),
                                None => {}
                            }
                        }
                    }
                    let ratio = (!peer.is_empty()).then(|| vs_peer(&r));
                    let products = (arm == Arm::Gpu).then_some(args.batch_products);
                    write_batched_row(&mut out, args.output, model, backend, products, &r, ratio)?;
                }
            }
        }
    }
    Ok(())
}
