//! What one compute dispatch costs on this adapter, apart from its work:
//! chains of tiny copy dispatches in one submission, each writing its own
//! buffer (no barrier between them) or each reading the previous one's
//! output (a barrier between every two), timed on the host over the whole
//! submission and, separately, with a device timestamp after every dispatch.
//! The decode step of `generate` is such a chain (scoreboard --profile shows
//! its kernels); this separates the fixed cost from the kernels' own.
//!
//!     cargo run --release --example dispatch_cost -- [--dispatches 200] [--words 256]
//!
//! Prints a markdown table: microseconds per dispatch for each case.

use anyhow::Context;
use lfm::gpu::{ops, profile::PassTimer, Gpu, GpuOptions};
use std::time::Instant;

fn main() -> anyhow::Result<()> {
    let mut n = 200usize;
    let mut words = 256usize;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let v = args.next().context("flag needs a value")?;
        match a.as_str() {
            "--dispatches" => n = v.parse()?,
            "--words" => words = v.parse::<usize>()?.div_ceil(4) * 4,
            _ => anyhow::bail!("unknown flag {a}"),
        }
    }
    let gpu = Gpu::new(&GpuOptions {
        required: true,
        ..Default::default()
    })?;
    eprintln!("{}", gpu.describe());
    let bufs: Vec<wgpu::Buffer> = (0..=n)
        .map(|i| gpu.scratch(&format!("b{i}"), (words * 4) as u64))
        .collect::<lfm::Result<_>>()?;
    let groups = words.div_ceil(4 * 256);
    // Independent: every dispatch reads b0 and writes its own buffer.
    let independent: Vec<ops::Dispatch> = (1..=n)
        .map(|i| ops::copy(&gpu, &bufs[0], &bufs[i], words, groups))
        .collect::<lfm::Result<_>>()?;
    // Dependent: dispatch i reads what i - 1 wrote.
    let dependent: Vec<ops::Dispatch> = (1..=n)
        .map(|i| ops::copy(&gpu, &bufs[i - 1], &bufs[i], words, groups))
        .collect::<lfm::Result<_>>()?;
    let timer = if gpu.caps.timestamps {
        Some(PassTimer::new(&gpu, n as u32 + 1)?)
    } else {
        None
    };

    println!("{n} dispatches of a {words}-word copy, one submission; best of 10 runs\n");
    println!("| chain | host us/dispatch | device us/dispatch (timestamped) |");
    println!("|---|---:|---:|");
    for (name, chain) in [("independent", &independent), ("dependent", &dependent)] {
        let mut host = f64::MAX;
        let mut device = f64::MAX;
        for _ in 0..10 {
            let t = Instant::now();
            let mut enc = gpu.device.create_command_encoder(&Default::default());
            {
                let mut pass = enc.begin_compute_pass(&Default::default());
                for d in chain.iter() {
                    d.record(&mut pass);
                }
            }
            gpu.submit_and_wait(enc)?;
            host = host.min(t.elapsed().as_secs_f64() * 1e6 / n as f64);
            if let Some(timer) = &timer {
                let mut enc = gpu.device.create_command_encoder(&Default::default());
                {
                    let mut pass = enc.begin_compute_pass(&Default::default());
                    timer.mark(&mut pass, 0);
                    for (i, d) in chain.iter().enumerate() {
                        d.record(&mut pass);
                        timer.mark(&mut pass, i as u32 + 1);
                    }
                }
                timer.resolve(&mut enc, n as u32 + 1);
                let done = gpu.queue.submit([enc.finish()]);
                let ts = timer.read(&gpu, n as u32 + 1, done)?;
                device = device.min(ts[n] / 1e3 / n as f64);
            }
        }
        let device = if timer.is_some() {
            format!("{device:.2}")
        } else {
            "-".into()
        };
        println!("| {name} | {host:.2} | {device} |");
    }
    Ok(())
}
