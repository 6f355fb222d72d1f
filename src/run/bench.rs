//! Throughput measurement in llama-bench's terms: `pp<N>` (prompt
//! processing: one forward over N tokens) and `tg<N>` (text generation: N
//! single-token steps), optionally after a context of `depth` tokens,
//! repeated and reported as mean and standard deviation of tokens/s.
//! Tokenisation and sampling are excluded (random token ids, device argmax).

use crate::error::Result;
use crate::models::llm::CausalLm;
use crate::util::rng::Rng;
use serde::Serialize;
use std::time::Instant;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Test {
    /// Prompt processing of n tokens.
    Pp(usize),
    /// Generation of n tokens.
    Tg(usize),
}

impl Test {
    pub fn name(&self, depth: usize) -> String {
        let base = match self {
            Test::Pp(n) => format!("pp{n}"),
            Test::Tg(n) => format!("tg{n}"),
        };
        if depth > 0 {
            format!("{base} @ d{depth}")
        } else {
            base
        }
    }

    pub fn tokens(&self) -> usize {
        match self {
            Test::Pp(n) | Test::Tg(n) => *n,
        }
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct Measurement {
    pub test: String,
    pub depth: usize,
    /// tokens/s of each repetition.
    pub samples: Vec<f64>,
    pub mean: f64,
    pub sd: f64,
}

pub fn mean_sd(xs: &[f64]) -> (f64, f64) {
    let n = xs.len() as f64;
    if xs.is_empty() {
        return (0.0, 0.0);
    }
    let mean = xs.iter().sum::<f64>() / n;
    let var = if xs.len() > 1 {
        xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0)
    } else {
        0.0
    };
    (mean, var.sqrt())
}

/// Runs `test` `reps` times (after one unmeasured warm-up run) at `depth`.
pub fn measure(
    model: &mut dyn CausalLm,
    test: Test,
    depth: usize,
    reps: usize,
    seed: u64,
) -> Result<Measurement> {
    let vocab = model.config().vocab as u64;
    let mut rng = Rng::new(seed);
    let mut ids =
        |n: usize| -> Vec<u32> { (0..n).map(|_| (rng.next_u64() % vocab) as u32).collect() };
    let mut samples = Vec::with_capacity(reps);
    for rep in 0..=reps {
        model.reset();
        if depth > 0 {
            model.forward(&ids(depth), false)?;
        }
        let elapsed = match test {
            Test::Pp(n) => {
                let prompt = ids(n);
                let t = Instant::now();
                model.forward(&prompt, false)?;
                t.elapsed()
            }
            Test::Tg(n) => {
                let tok = ids(1)[0];
                let t = Instant::now();
                model.greedy_run(tok, n, &mut |_| true)?;
                t.elapsed()
            }
        };
        if rep > 0 {
            samples.push(test.tokens() as f64 / elapsed.as_secs_f64().max(1e-12));
        }
    }
    let (mean, sd) = mean_sd(&samples);
    Ok(Measurement {
        test: test.name(depth),
        depth,
        samples,
        mean,
        sd,
    })
}

/// Measured host memory bandwidth (bytes read + written per second) of a
/// large copy, the roofline's denominator for the CPU path.
pub fn host_copy_bandwidth() -> f64 {
    let n = 256 << 20;
    let src = vec![1u8; n];
    let mut dst = vec![0u8; n];
    let mut best = f64::MAX;
    for _ in 0..5 {
        let t = Instant::now();
        dst.copy_from_slice(&src);
        best = best.min(t.elapsed().as_secs_f64());
        std::hint::black_box(&dst);
    }
    2.0 * n as f64 / best
}

/// Measured device memory bandwidth (bytes read + written per second): the
/// better of large buffer-to-buffer copies (the copy engine, timed on the
/// host) and a streaming copy kernel timed with device timestamps where the
/// adapter has them (what a kernel can reach: the roofline's denominator on
/// the GPU).
pub fn gpu_copy_bandwidth(gpu: &crate::gpu::Gpu) -> Result<f64> {
    use crate::gpu::{ops, profile::PassTimer};
    let size = (256u64 << 20)
        .min(gpu.caps.max_buffer / 2)
        .min(gpu.caps.max_binding)
        & !15;
    let src = gpu.scratch("bandwidth-src", size)?;
    let dst = gpu.scratch("bandwidth-dst", size)?;
    let copies = 8;
    let mut best = f64::MAX;
    for _ in 0..4 {
        let mut enc = gpu.device.create_command_encoder(&Default::default());
        for _ in 0..copies {
            enc.copy_buffer_to_buffer(&src, 0, &dst, 0, size);
        }
        let t = Instant::now();
        gpu.submit_and_wait(enc)?;
        best = best.min(t.elapsed().as_secs_f64());
    }
    let engine = 2.0 * (size * copies) as f64 / best;
    if !gpu.caps.timestamps {
        return Ok(engine);
    }
    // Enough workgroups to fill any GPU; each streams a slice many times over.
    let kernel = ops::copy(gpu, &src, &dst, (size / 4) as usize, 8192)?;
    let timer = PassTimer::new(gpu, copies as u32 + 1)?;
    let mut best = f64::MAX;
    for _ in 0..4 {
        let mut enc = gpu.device.create_command_encoder(&Default::default());
        {
            let mut pass = enc.begin_compute_pass(&Default::default());
            timer.mark(&mut pass, 0);
            for i in 0..copies {
                kernel.record(&mut pass);
                timer.mark(&mut pass, i as u32 + 1);
            }
        }
        timer.resolve(&mut enc, copies as u32 + 1);
        let done = gpu.queue.submit([enc.finish()]);
        let ts = timer.read(gpu, copies as u32 + 1, done)?;
        let ns = ts[copies as usize];
        if ns > 0.0 {
            best = best.min(ns * 1e-9);
        }
    }
    let streamed = 2.0 * (size * copies) as f64 / best;
    Ok(engine.max(streamed))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mean_and_sample_sd() {
        let (m, s) = mean_sd(&[1.0, 2.0, 3.0, 4.0]);
        assert_eq!(m, 2.5);
        assert!((s - 1.290_994).abs() < 1e-6);
        assert_eq!(mean_sd(&[5.0]), (5.0, 0.0));
    }
}

/// One row of a batched-decode run, in llama-batched-bench's columns.
#[derive(Clone, Debug, serde::Serialize)]
pub struct BatchedRow {
    /// Prompt tokens per sequence, generated tokens per sequence, sequences.
    pub pp: usize,
    pub tg: usize,
    pub b: usize,
    /// Cache positions in use at the end.
    pub n_kv: usize,
    pub t_pp: f64,
    pub s_pp: f64,
    pub t_tg: f64,
    pub s_tg: f64,
}

/// Prompt tokens one step of [`batched_decode`]'s prefill takes (whole
/// prompts, one at least).
pub const BATCH_PREFILL_TOKENS: usize = 512;

/// Prefills `b` sequences of `pp` tokens (different ones each), then
/// decodes `tg` steps of all `b` together, as llama-batched-bench measures;
/// tokens come from the argmax, sampling and detokenisation are excluded.
pub fn batched_decode(
    model: &mut dyn crate::models::batch::BatchedLm,
    pp: usize,
    tg: usize,
    b: usize,
    seed: u64,
) -> Result<BatchedRow> {
    use crate::models::batch::SeqWork;
    let vocab = model.config().vocab as u64;
    // Prompts of their own for each batch size, so a backend's prefix
    // cache (which keeps finished prompts) finds nothing of an earlier row.
    let mut rng = crate::util::rng::Rng::new(seed ^ (b as u64).rotate_left(32));
    let prompts: Vec<Vec<u32>> = (0..b)
        .map(|_| (0..pp).map(|_| (rng.next_u64() % vocab) as u32).collect())
        .collect();
    let mut ids = Vec::with_capacity(b);
    for p in &prompts {
        let (id, cached) = model.open(p)?.ok_or_else(|| {
            crate::Error::invalid(format!(
                "the KV cache cannot hold {b} sequences of {pp} tokens"
            ))
        })?;
        if cached >= p.len() {
            return Err(crate::Error::invalid(
                "a prompt came back whole from the prefix cache: nothing left to prefill",
            ));
        }
        ids.push((id, cached));
    }
    let t0 = std::time::Instant::now();
    let mut last = Vec::with_capacity(b);
    // Prompts together, a step of about BATCH_PREFILL_TOKENS at a time (one
    // at least), as llama-batched-bench prefills in micro-batches of 512.
    let together = (BATCH_PREFILL_TOKENS / pp).max(1);
    for group in ids.chunks(together).zip(prompts.chunks(together)) {
        let work: Vec<SeqWork> = group
            .0
            .iter()
            .zip(group.1)
            .map(|(&(id, cached), p)| SeqWork {
                id,
                tokens: &p[cached..],
                as_decode: pp == 1,
            })
            .collect();
        for logits in model.step(&work)? {
            last.push(crate::sampling::argmax(&logits) as u32);
        }
    }
    let t_pp = t0.elapsed().as_secs_f64();
    let ids: Vec<_> = ids.into_iter().map(|(id, _)| id).collect();
    let t1 = std::time::Instant::now();
    // The batch decodes as the server decodes greedy sequences: on the
    // backend's run-ahead path, where it has one.
    let ahead = match (b, tg) {
        (_, 0) => None,
        (1, _) => model.greedy_run(ids[0], last[0], tg, &mut |_| true),
        _ => {
            let rows: Vec<(crate::models::batch::SeqId, u32)> =
                ids.iter().copied().zip(last.iter().copied()).collect();
            model.greedy_run_many(&rows, tg, &mut |_| true)
        }
    };
    let steps = match ahead {
        Some(n) => {
            let n = n?;
            if n != tg {
                return Err(crate::Error::invalid(format!(
                    "the batch of {b} stopped after {n} of {tg} tokens"
                )));
            }
            0
        }
        None => tg,
    };
    for _ in 0..steps {
        // The backend's greedy step of the whole batch, where it has one.
        let rows: Vec<(crate::models::batch::SeqId, u32)> =
            ids.iter().copied().zip(last.iter().copied()).collect();
        if let Some(next) = model.step_greedy_many(&rows) {
            last = next?;
            continue;
        }
        let singles: Vec<[u32; 1]> = last.iter().map(|&t| [t]).collect();
        let work: Vec<SeqWork> = ids
            .iter()
            .zip(&singles)
            .map(|(&id, t)| SeqWork {
                id,
                tokens: t,
                as_decode: true,
            })
            .collect();
        let logits = model.step(&work)?;
        last = logits
            .iter()
            .map(|l| crate::sampling::argmax(l) as u32)
            .collect();
    }
    let t_tg = t1.elapsed().as_secs_f64();
    for id in ids {
        model.close(id);
    }
    let rate = |n: usize, t: f64| if t > 0.0 { n as f64 / t } else { 0.0 };
    Ok(BatchedRow {
        pp,
        tg,
        b,
        n_kv: b * (pp + tg),
        t_pp,
        s_pp: rate(b * pp, t_pp),
        t_tg,
        s_tg: rate(b * tg, t_tg),
    })
}
