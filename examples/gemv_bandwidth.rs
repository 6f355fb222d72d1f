//! How close each decode GEMV comes to the adapter's memory bandwidth: every
//! matrix shape a decode step of LFM2-350M and LFM2-1.2B multiplies, in each
//! weight format, with the epilogue the decoder uses on it (gpu::llm_ops::gemv),
//! timed alone. Each case uploads enough copies of its matrix that one
//! round of them exceeds `--rotate` bytes (default 256 MB, five times an
//! H200's L2), so the weights come from DRAM as in a real decode step.
//!
//!     cargo run --release --example gemv_bandwidth -- [--formats q4_0,q8_0,f16]
//!         [--models 350m,1.2b] [--only MATRIX] [--rotate-mb 256] [--reps 5]
//!         [--rows-per-group R] [--tolerance T]
//!
//! Two figures per case, each the best of `--reps` host-timed submissions of
//! one dispatch per copy: `independent` (each writes its own output, so
//! launches overlap: the kernel's sustained rate) and `dependent` (all write
//! one output, so each waits for the one before, as in a decode step: fixed
//! cost included). GB/s counts the weight bytes read; the
//! share is of the copy bandwidth measured at the start of the same run
//! (bytes read plus bytes written by one large buffer copy).
//! Each case's output is checked against the f32 reference (largest error as a
//! share of the output's rms under `--tolerance`, default 1e-4; printed).
//! `--rows-per-group` overrides the dispatch geometry, for trying a kernel
//! from LFM_SHADER_DIR that covers another number of rows per workgroup
//! (for a matrix the decoder walks, gemv.wgsl's WALK, it sets how many
//! workgroups walk: rows / R).

use anyhow::{bail, Context};
use lfm::cpu::llm::FfnAct;
use lfm::gpu::llm_ops::{self, GemvEpilogue, GpuMatrix};
use lfm::gpu::ops::{groups_1d, Dispatch};
use lfm::gpu::{Gpu, GpuOptions};
use lfm::quant::GgmlType;
use lfm::tensor::Tensor;
use lfm::util::rng::Rng;
use std::time::Instant;

#[derive(Clone, Copy)]
enum Epi {
    Store,
    Add,
    Norm,
    Swiglu,
    Conv,
}

impl Epi {
    fn parts(self) -> usize {
        match self {
            Epi::Swiglu => 2,
            Epi::Conv => 3,
            _ => 1,
        }
    }
    fn kernel(self) -> &'static str {
        match self {
            Epi::Store => "gemv",
            Epi::Add => "gemv_add",
            Epi::Norm => "gemv_norm",
            Epi::Swiglu => "gemv_swiglu",
            Epi::Conv => "gemv_conv",
        }
    }
}

/// One GEMV of a decode step: name, epilogue, rows per part, k.
type Case = (&'static str, Epi, usize, usize);

/// LFM2's decode GEMVs (models/lfm2.rs): hidden d, FFN width f.
fn lfm2_cases(d: usize, f: usize, kv: usize) -> Vec<Case> {
    vec![
        ("attn qkv", Epi::Norm, d + 2 * kv, d),
        ("conv in_proj", Epi::Conv, d, d),
        ("out_proj", Epi::Add, d, d),
        ("ffn gate/up", Epi::Swiglu, f, d),
        ("ffn down", Epi::Add, d, f),
        ("head", Epi::Norm, 65536, d),
        ("plain", Epi::Store, d, d),
    ]
}

fn parse_format(s: &str) -> anyhow::Result<GgmlType> {
    GgmlType::ALL
        .into_iter()
        .find(|t| t.to_string().eq_ignore_ascii_case(s))
        .with_context(|| format!("unknown weight format {s}"))
}

/// Read-plus-write bytes per second of the streaming copy kernel
/// (gpu::ops::copy, 16 bytes per thread and step) over a large buffer, the
/// best over a few workgroup counts: what a kernel can stream. (The copy
/// engine's buffer-to-buffer copy reaches far less on some GPUs.)
fn copy_bandwidth(gpu: &Gpu, bytes: u64, reps: usize) -> anyhow::Result<f64> {
    let a = gpu.scratch("copy src", bytes)?;
    let b = gpu.scratch("copy dst", bytes)?;
    let words = bytes as usize / 4;
    let mut best = f64::MAX;
    for groups in [1024, 4096, 16384, 65535] {
        let d = lfm::gpu::ops::copy(gpu, &a, &b, words, groups)?;
        for _ in 0..=reps {
            let mut enc = gpu.device.create_command_encoder(&Default::default());
            {
                let mut pass = enc.begin_compute_pass(&Default::default());
                for _ in 0..4 {
                    d.record(&mut pass);
                }
            }
            let t = Instant::now();
            gpu.submit_and_wait(enc)?;
            best = best.min(t.elapsed().as_secs_f64() / 4.0);
        }
    }
    Ok(2.0 * bytes as f64 / best)
}

fn main() -> anyhow::Result<()> {
    let mut formats = vec![GgmlType::Q4_0, GgmlType::Q8_0, GgmlType::F16];
    let mut models = vec!["350m".to_string(), "1.2b".to_string()];
    let mut rotate = 256usize << 20;
    let mut reps = 5usize;
    let mut rows_per_group = None;
    let mut tolerance = 1e-4f32;
    let mut only: Option<String> = None;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let v = args.next().with_context(|| format!("{a} needs a value"))?;
        match a.as_str() {
            "--formats" => formats = v.split(',').map(parse_format).collect::<Result<_, _>>()?,
            "--models" => models = v.split(',').map(str::to_string).collect(),
            "--rotate-mb" => rotate = v.parse::<usize>()? << 20,
            "--reps" => reps = v.parse()?,
            "--rows-per-group" => rows_per_group = Some(v.parse::<usize>()?),
            "--tolerance" => tolerance = v.parse()?,
            "--only" => only = Some(v),
            _ => bail!("unknown flag {a}"),
        }
    }
    let gpu = Gpu::new(&GpuOptions {
        required: true,
        ..Default::default()
    })?;
    eprintln!("{}", gpu.describe());
    let copy = copy_bandwidth(&gpu, gpu.caps.max_binding.min(512 << 20), reps)?;
    println!(
        "copy bandwidth (copy kernel over up to 512 MiB, read + write): {:.0} GB/s\n",
        copy / 1e9
    );
    println!(
        "| model | matrix | kernel | format | shape | MB | independent us | GB/s | share | \
         dependent us | GB/s | share | max err |"
    );
    println!("|---|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    for model in &models {
        let cases = match model.as_str() {
            "350m" => lfm2_cases(1024, 4608, 512),
            "1.2b" => lfm2_cases(2048, 8192, 1024),
            _ => bail!("unknown model {model} (350m, 1.2b)"),
        };
        for &(name, epi, rows, k) in &cases {
            if only.as_deref().is_some_and(|o| !name.contains(o)) {
                continue;
            }
            for &t in &formats {
                run_case(
                    &gpu,
                    copy,
                    tolerance,
                    rotate,
                    reps,
                    rows_per_group,
                    (model, name, epi, rows, k, t),
                )?;
            }
        }
    }
    Ok(())
}

#[allow(clippy::too_many_arguments)]
fn run_case(
    gpu: &Gpu,
    copy: f64,
    tolerance: f32,
    rotate: usize,
    reps: usize,
    rows_per_group: Option<usize>,
    (model, name, epi, rows, k, t): (&str, &str, Epi, usize, usize, GgmlType),
) -> anyhow::Result<()> {
    let parts = epi.parts();
    let mut rng = Rng::new(7);
    let data = rng.vec(rows * k, -1.0, 1.0);
    let Ok(w) = Tensor::quantize_f32("w", vec![rows, k], &data, t) else {
        return Ok(());
    };
    let bytes = w.bytes().len() * parts;
    let copies = rotate.div_ceil(bytes).clamp(2, 256);
    let ps: Vec<&[u8]> = (0..parts).map(|_| w.bytes()).collect();
    let mats: Vec<GpuMatrix> = (0..copies)
        .map(|i| GpuMatrix::upload(gpu, &format!("w{i}"), t, k, rows, &ps, gpu.caps.max_binding))
        .collect::<lfm::Result<_>>()?;
    let xs = rng.vec(k, -1.0, 1.0);
    let nws = rng.vec(k, 0.5, 1.5);
    let x = gpu.upload_f32("x", &xs)?;
    let nw = gpu.upload_f32("nw", &nws)?;
    let taps = 3;
    let ring = lfm::models::llm::conv_ring_rows(taps);
    let convs = rng.vec(rows * taps, -1.0, 1.0);
    let states = rng.vec(ring * rows, -1.0, 1.0);
    let conv = gpu.upload_f32("conv", &convs)?;
    let state = gpu.upload_f32("state", &states)?;
    let step = gpu.upload_u32("step", &[0, 5, 0, 0])?;
    let ys: Vec<wgpu::Buffer> = (0..copies)
        .map(|i| gpu.scratch(&format!("y{i}"), (rows * 4) as u64))
        .collect::<lfm::Result<_>>()?;
    let e = match epi {
        Epi::Store => GemvEpilogue::Store,
        Epi::Add => GemvEpilogue::Add,
        Epi::Norm => GemvEpilogue::Norm { nw: &nw, eps: 1e-5 },
        Epi::Swiglu => GemvEpilogue::Swiglu {
            nw: &nw,
            eps: 1e-5,
            act: FfnAct::Silu,
        },
        Epi::Conv => GemvEpilogue::Conv {
            nw: &nw,
            eps: 1e-5,
            conv: &conv,
            state: &state,
            step: &step,
            taps,
            ring,
        },
    };
    // Independent: each copy writes its own output. Dependent: all write y0,
    // so every dispatch waits for the one before, as in a decode step.
    let mut independent: Vec<Dispatch> = Vec::new();
    let mut dependent: Vec<Dispatch> = Vec::new();
    for (m, y) in mats.iter().zip(&ys) {
        for (chain, out) in [(&mut independent, y), (&mut dependent, &ys[0])] {
            let ds = llm_ops::gemv(gpu, m, &e, &x, 0, out, 0)?;
            for (mut d, c) in ds.into_iter().zip(&m.chunks) {
                if let Some(r) = rows_per_group {
                    d.groups = groups_1d(c.rows, r);
                }
                chain.push(d);
            }
        }
    }
    // The best of `reps` rounds, after one to warm up, in us per dispatch.
    let time = |chain: &[Dispatch]| -> anyhow::Result<f64> {
        let mut best = f64::MAX;
        for _ in 0..=reps {
            let mut enc = gpu.device.create_command_encoder(&Default::default());
            {
                let mut pass = enc.begin_compute_pass(&Default::default());
                for d in chain {
                    d.record(&mut pass);
                }
            }
            let t0 = Instant::now();
            gpu.submit_and_wait(enc)?;
            best = best.min(t0.elapsed().as_secs_f64() * 1e6 / chain.len() as f64);
        }
        Ok(best)
    };
    let (indep_us, dep_us) = (time(&independent)?, time(&dependent)?);
    // Copy 1 ran `reps + 1` times into its own output: check it against the
    // f32 reference, so that a kernel under trial cannot report a speed
    // while computing something else.
    let got = gpu.read_f32(&ys[1])?;
    let want = reference(&w, epi, &xs, &nws, &convs, &states, taps, ring, 5, reps + 1);
    let rms = (want.iter().map(|v| v * v).sum::<f32>() / want.len() as f32).sqrt();
    let err = got
        .iter()
        .zip(&want)
        .map(|(g, w)| (g - w).abs() / rms)
        .fold(0.0f32, f32::max);
    if err.is_nan() || err >= tolerance {
        bail!(
            "{model} {name} {t}: GPU result differs from the reference (max error {err} of the output's rms)"
        );
    }
    let gbs = |us: f64| bytes as f64 / us / 1e3;
    let shape = if parts > 1 {
        format!("{parts} x {rows} x {k}")
    } else {
        format!("{rows} x {k}")
    };
    println!(
        "| {model} | {name} | {} | {t} | {shape} | {:.2} | {indep_us:.2} | {:.0} | {:.0}% | {dep_us:.2} | {:.0} | {:.0}% | {err:.1e} |",
        epi.kernel(),
        bytes as f64 / 1e6,
        gbs(indep_us),
        100.0 * gbs(indep_us) * 1e9 / copy,
        gbs(dep_us),
        100.0 * gbs(dep_us) * 1e9 / copy,
    );
    Ok(())
}

/// What gemv.wgsl computes, in f32 on the CPU: every part is `w`; Add has
/// run `runs` times into zeros; Conv is at position `pos`.
#[allow(clippy::too_many_arguments)]
fn reference(
    w: &Tensor,
    epi: Epi,
    x: &[f32],
    nw: &[f32],
    conv: &[f32],
    state: &[f32],
    taps: usize,
    ring: usize,
    pos: usize,
    runs: usize,
) -> Vec<f32> {
    let (rows, k) = (w.rows(), w.row_len());
    let dense = w.to_f32();
    let normed: Vec<f32> = match epi {
        Epi::Store | Epi::Add => x.to_vec(),
        _ => {
            let ms = x.iter().map(|v| v * v).sum::<f32>() / k as f32;
            let s = 1.0 / (ms + 1e-5).sqrt();
            x.iter().zip(nw).map(|(v, g)| v * g * s).collect()
        }
    };
    (0..rows)
        .map(|r| {
            let d: f32 = dense[r * k..(r + 1) * k]
                .iter()
                .zip(&normed)
                .map(|(a, b)| a * b)
                .sum();
            match epi {
                Epi::Store | Epi::Norm => d,
                Epi::Add => d * runs as f32,
                Epi::Swiglu => d / (1.0 + (-d).exp()) * d,
                Epi::Conv => {
                    // Parts B, C, X are all `w`: bx = d * d, y = C * conv(bx).
                    let mut a = conv[r * taps + taps - 1] * d * d;
                    for j in 0..taps - 1 {
                        let q = (pos + ring + 1 + j - taps) % ring;
                        a += conv[r * taps + j] * state[q * rows + r];
                    }
                    d * a
                }
            }
        })
        .collect()
}
