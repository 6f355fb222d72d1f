//! Where an OCR network's CPU time goes, node by node: runs one of the
//! PaddleOCR ONNX files on a seeded random input of the given shape
//! several times and prints, from each node's fastest run, the time per
//! operator kind and the slowest nodes.
//!
//!     cargo run --release --example ocr_nodes -- MODEL.onnx 6,3,48,320 [--runs 10] [--top 15]
//!
//! The whole run's minimum is printed too, for comparison with
//! onnxruntime's on the same shape.

use anyhow::Context;
use lfm::models::ocr::net::{Net, Tensor};
use lfm::util::rng::Rng;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let model = args
        .next()
        .context("usage: ocr_nodes MODEL.onnx N,C,H,W [--runs R] [--top K]")?;
    let shape: Vec<usize> = args
        .next()
        .context("the input shape, such as 6,3,48,320")?
        .split(',')
        .map(str::parse)
        .collect::<Result<_, _>>()?;
    let (mut runs, mut top) = (10usize, 15usize);
    while let Some(a) = args.next() {
        let v: usize = args.next().context("flag needs a value")?.parse()?;
        match a.as_str() {
            "--runs" => runs = v,
            "--top" => top = v,
            _ => anyhow::bail!("unknown flag {a}"),
        }
    }
    // As ocr-layout runs its networks.
    lfm::util::alloc::reuse_freed_memory();
    let (net, _) = Net::open(&model)?;
    let input = Rng::new(1).vec(shape.iter().product(), -1.0, 1.0);
    let mut best: Vec<Duration> = Vec::new();
    let mut nodes = Vec::new();
    let mut whole = Duration::MAX;
    for _ in 0..runs.max(1) {
        let t = Instant::now();
        let (_, times) = net.run_timed(Tensor::F32(input.clone(), shape.clone()))?;
        whole = whole.min(t.elapsed());
        if best.is_empty() {
            best = times.iter().map(|n| n.time).collect();
            nodes = times;
        } else {
            for (b, n) in best.iter_mut().zip(&times) {
                *b = (*b).min(n.time);
            }
        }
    }
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let mut kinds: BTreeMap<&str, (Duration, usize)> = BTreeMap::new();
    for (n, &t) in nodes.iter().zip(&best) {
        let k = kinds.entry(n.op).or_default();
        k.0 += t;
        k.1 += 1;
    }
    let total: Duration = best.iter().sum();
    println!(
        "{model} on {shape:?}: whole run {:.2} ms (min of {runs}), nodes' minima sum to {:.2} ms",
        ms(whole),
        ms(total)
    );
    println!();
    println!("| operator | nodes | ms | share |");
    println!("|---|---:|---:|---:|");
    let mut kinds: Vec<_> = kinds.into_iter().collect();
    kinds.sort_by_key(|k| std::cmp::Reverse(k.1 .0));
    for (op, (t, count)) in kinds {
        println!(
            "| {op} | {count} | {:.3} | {:.1}% |",
            ms(t),
            100.0 * t.as_secs_f64() / total.as_secs_f64()
        );
    }
    println!();
    println!("| node | operator | output | ms |");
    println!("|---|---|---|---:|");
    let mut order: Vec<usize> = (0..nodes.len()).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(best[i]));
    for &i in order.iter().take(top) {
        let n = &nodes[i];
        println!(
            "| {} | {} | {:?} | {:.3} |",
            n.name,
            n.op,
            n.shape,
            ms(best[i])
        );
    }
    Ok(())
}
