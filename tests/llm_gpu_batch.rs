//! The GPU batch backend against the single-sequence GPU forward (what
//! `generate --gpu` runs), bit for bit: sequences of mixed prompt lengths
//! arriving at different steps, prompt chunks beside batched decode steps,
//! greedy rows picked on the GPU, a lone sequence on the single path,
//! admission when every place or every block of the paged KV cache is
//! taken, and the prefix cache. And speculative decoding's check on the
//! single model (consecutive positions of one sequence as the rows of one
//! batched forward) against as many decode steps, bit for bit. With
//! `BatchProducts::Gemm` (the prompt's GEMM for a decode step's products,
//! not batch invariant by design) the same runs stay within a tolerance of
//! each sequence alone and give its greedy tokens.

mod common;

use lfm::gpu::{Gpu, GpuOptions};
use lfm::models::batch::{BatchedLm, SeqId, SeqWork};
use lfm::models::llm::CausalLm;
use lfm::models::llm_gpu::{BatchProducts, GpuBatch, GpuLlm, GpuLlmOptions};
use lfm::sampling::{Sampler, SamplingOptions};
use std::sync::{Arc, OnceLock};

fn gpu() -> Option<Arc<Gpu>> {
    static GPU: OnceLock<Option<Arc<Gpu>>> = OnceLock::new();
    GPU.get_or_init(|| match Gpu::new(&GpuOptions::default()) {
        Ok(g) => Some(Arc::new(g)),
        Err(e) if std::env::var_os("LFM_SKIP_GPU_TESTS").is_some() => {
            eprintln!("SKIPPING GPU tests (LFM_SKIP_GPU_TESTS set): {e}");
            None
        }
        Err(e) => panic!("GPU tests need an adapter ({e}); set LFM_SKIP_GPU_TESTS=1 to skip them"),
    })
    .clone()
}

fn prompt(seed: u32, len: usize, vocab: usize) -> Vec<u32> {
    (0..len as u32)
        .map(|i| i.wrapping_mul(2654435761).wrapping_add(seed * 97) % vocab as u32)
        .collect()
}

fn argmax(l: &[f32]) -> u32 {
    lfm::sampling::argmax(l) as u32
}

/// Greedy tokens and the logits they came from, each prompt alone on the
/// single-sequence GPU model: the prompt, then `steps` decode steps.
fn alone(m: &mut GpuLlm, p: &[u32], steps: usize) -> Vec<(u32, Vec<f32>)> {
    m.reset();
    let mut l = m.forward(p, false).unwrap();
    let mut out = vec![(argmax(&l), l.clone())];
    for _ in 0..steps {
        l = m.forward(&[argmax(&l)], false).unwrap();
        out.push((argmax(&l), l.clone()));
    }
    out
}

/// How far a batched step's logits `got` are from those of the sequence
/// alone: 0 when bit for bit the same, else the largest difference over
/// the largest logit (infinite for another length or a NaN).
fn parted_by(got: &[f32], alone: &[f32]) -> f32 {
    if bits_equal(got, alone) {
        return 0.0;
    }
    if got.len() != alone.len() {
        return f32::INFINITY;
    }
    let most = alone.iter().fold(0f32, |m, x| m.max(x.abs()));
    got.iter()
        .zip(alone)
        .map(|(a, b)| (a - b).abs() / most)
        .fold(
            0f32,
            |m, d| if d.is_nan() { f32::INFINITY } else { m.max(d) },
        )
}

/// How far a batched step may part from the sequence alone: not at all with
/// batch-invariant products; with the GEMM's, within 1e-4 of the largest
/// logit where it sums f32 factors (the portable GEMM), 5e-3 where it
/// rounds them to f16 on cooperative matrices.
fn allowed(g: &Gpu, products: BatchProducts) -> f32 {
    match products {
        BatchProducts::Invariant => 0.0,
        BatchProducts::Gemm if g.caps.coop_matrix => 5e-3,
        BatchProducts::Gemm => 1e-4,
    }
}

/// The token a sequence alone picked at a step where the batch picked `t`,
/// to go on from: the same one, or, with the GEMM's products (which part
/// from the sums alone by up to `allowed` of the largest logit), one whose
/// logit alone is within twice that of the one picked alone (a near tie,
/// which those products may break the other way). So every later step is
/// compared on the history alone.
fn follow(alone: &(u32, Vec<f32>), t: u32, allowed: f32, at: &str) -> u32 {
    let (w, l) = alone;
    if t != *w {
        let most = l.iter().fold(0f32, |m, x| m.max(x.abs()));
        let gap = (l[*w as usize] - l[t as usize]) / most;
        assert!(
            gap <= 2.0 * allowed,
            "{at}: picked {t} where alone picked {w}, {gap:e} of the largest logit below it"
        );
    }
    *w
}

fn check(dir: &str, products: BatchProducts) {
    let Some(g) = gpu() else { return };
    let path = common::repo().join("samples/fixtures/llm").join(dir);
    let (cfg, w) = lfm::models::open_llm(&path).unwrap();
    let vocab = cfg.vocab;
    let opts = GpuLlmOptions {
        // Chunked prefill on the single path too.
        prefill_chunk: Some(16),
        batch_products: products,
        ..Default::default()
    };
    // Prompts of 1, 5, 23, 40 and 9 tokens; the last arrives later.
    let prompts = [
        prompt(1, 1, vocab),
        prompt(2, 5, vocab),
        prompt(3, 23, vocab),
        prompt(4, 40, vocab),
        prompt(5, 9, vocab),
    ];
    let arrives = [0, 0, 1, 0, 6];
    let steps = 12;
    let mut single = GpuLlm::new(g.clone(), &cfg, &w, &opts).unwrap();
    let want: Vec<_> = prompts
        .iter()
        .map(|p| alone(&mut single, p, steps))
        .collect();
    drop(single);

    // Five sequences over a paged cache of 320 positions: blocks taken as
    // the sequences grow side by side, so each one's are scattered.
    let mut b = GpuBatch::new(g.clone(), &cfg, &w, &opts, 5, 5 * 64).unwrap();
    let mut ids = vec![None; prompts.len()];
    let mut fed = vec![0usize; prompts.len()];
    // Tokens each sequence produced.
    let mut got: Vec<Vec<u32>> = vec![Vec::new(); prompts.len()];
    let mut step = 0;
    // Decode steps of several rows whose logits are not those alone, bit
    // for bit: with the GEMM's products there must be some (it ran).
    let mut parted = 0;
    while got.iter().any(|t| t.len() < steps + 1) {
        for (i, p) in prompts.iter().enumerate() {
            if ids[i].is_none() && arrives[i] <= step {
                ids[i] = Some(b.open(p).unwrap().expect("a free slot").0);
            }
        }
        let live: Vec<usize> = (0..prompts.len())
            .filter(|&i| ids[i].is_some() && got[i].len() <= steps)
            .collect();
        let singles: Vec<[u32; 1]> = got
            .iter()
            .map(|t| [t.last().copied().unwrap_or(0)])
            .collect();
        let decoding = |fed: &[usize], i: usize| fed[i] == prompts[i].len();
        if live.iter().all(|&i| decoding(&fed, i)) && step % 2 == 0 {
            // Every one decoding: the batched greedy step (token ids only).
            let rows: Vec<_> = live
                .iter()
                .map(|&i| (ids[i].unwrap(), singles[i][0]))
                .collect();
            let next = b
                .step_greedy_many(&rows)
                .expect("a GPU greedy step")
                .unwrap();
            for (&i, t) in live.iter().zip(next) {
                let k = got[i].len();
                let at = format!("{dir} ({products:?}): sequence {i} step {k}");
                got[i].push(follow(&want[i][k], t, allowed(&g, products), &at));
            }
        } else {
            // Prompt chunks of at most 7 tokens beside decode steps; the
            // logits come back and must be the single model's, bit for bit.
            let mut work = Vec::new();
            for &i in &live {
                let p = &prompts[i];
                let tokens = if decoding(&fed, i) {
                    &singles[i][..]
                } else {
                    &p[fed[i]..(fed[i] + 7).min(p.len())]
                };
                work.push(SeqWork {
                    id: ids[i].unwrap(),
                    tokens,
                    as_decode: decoding(&fed, i) || p.len() == 1,
                });
            }
            let lens: Vec<usize> = work.iter().map(|w| w.tokens.len()).collect();
            let logits = b.step(&work).unwrap();
            for ((&i, l), n) in live.iter().zip(logits).zip(lens) {
                if !decoding(&fed, i) {
                    fed[i] += n;
                    if !decoding(&fed, i) {
                        continue;
                    }
                }
                let k = got[i].len();
                let by = parted_by(&l, &want[i][k].1);
                assert!(
                    by <= allowed(&g, products),
                    "{dir} ({products:?}): sequence {i} step {k}: logits differ from its run alone \
                     by {by:e} of the largest"
                );
                parted += usize::from(!bits_equal(&l, &want[i][k].1));
                let at = format!("{dir} ({products:?}): sequence {i} step {k}");
                got[i].push(follow(&want[i][k], argmax(&l), allowed(&g, products), &at));
            }
        }
        step += 1;
    }
    assert_eq!(
        parted > 0,
        products == BatchProducts::Gemm,
        "{dir} ({products:?}): {parted} steps' logits not bit-equal to alone"
    );
    for (i, (w, t)) in want.iter().zip(&got).enumerate() {
        let w: Vec<u32> = w.iter().map(|x| x.0).collect();
        assert_eq!(
            &w, t,
            "{dir}: sequence {i}'s tokens differ from its run alone"
        );
    }
    // A sequence running alone takes the single path (a step ahead of the
    // host) from its slot, and on from there in the batch again.
    let i = 3;
    let id = ids[i].unwrap();
    let mut more = Vec::new();
    let n = b
        .greedy_run(id, got[i][steps], 4, &mut |t| {
            more.push(t);
            true
        })
        .expect("a GPU greedy run")
        .unwrap();
    assert_eq!(n, 4);
    let next = b.step_greedy_many(&[(id, more[3]), (ids[1].unwrap(), got[1][steps])]);
    more.push(next.unwrap().unwrap()[0]);
    let mut single = GpuLlm::new(gpu().unwrap(), &cfg, &w, &opts).unwrap();
    let longer = alone(&mut single, &prompts[i], steps + 5);
    // A run picks its own tokens: with the GEMM's products its cache parts
    // from the one alone, and a near tie may send it elsewhere from there.
    for (j, &t) in more.iter().enumerate() {
        let at = format!("{dir} ({products:?}): greedy_run from a slot, token {j}");
        if follow(&longer[steps + 1 + j], t, allowed(&g, products), &at) != t {
            break;
        }
    }

    // Every place taken: admission waits; a prompt past what a sequence
    // may hold is an error (the server clamps requests to that context).
    let most = b.max_len();
    assert_eq!(b.config().context, most);
    assert!(b.usage().in_use >= 5);
    assert!(
        b.open(&prompts[0]).unwrap().is_none(),
        "{dir}: a sixth sequence"
    );
    b.close(id);
    assert!(
        b.open(&prompt(6, most, vocab)).is_err(),
        "{dir}: a prompt past what a sequence holds"
    );
    // The same prompt again.
    let (again, cached) = b.open(&prompts[4]).unwrap().expect("a freed slot");
    let l = b
        .step(&[SeqWork {
            id: again,
            tokens: &prompts[4][cached..],
            as_decode: false,
        }])
        .unwrap();
    assert!(
        bits_equal(&l[0], &want[4][0].1),
        "{dir}: a reused slot ({cached} tokens cached)"
    );
    for id in ids.iter().flatten().chain([&again]) {
        b.close(*id);
    }
    assert_eq!(b.usage().in_use, 0);
}

#[test]
fn gpu_batch_equals_each_sequence_alone_lfm2() {
    check("tiny-lfm2", BatchProducts::Invariant);
}

#[test]
fn gpu_batch_equals_each_sequence_alone_llama() {
    check("tiny-llama", BatchProducts::Invariant);
}

#[test]
fn gpu_batch_equals_each_sequence_alone_gemma3_post_norms_and_local_rope() {
    check("tiny-gemma3", BatchProducts::Invariant);
}

#[test]
fn gpu_batch_gemm_products_stay_close_to_each_sequence_alone_lfm2() {
    check("tiny-lfm2", BatchProducts::Gemm);
}

#[test]
fn gpu_batch_gemm_products_stay_close_to_each_sequence_alone_llama() {
    check("tiny-llama", BatchProducts::Gemm);
}

#[test]
fn gpu_batch_gemm_products_stay_close_to_each_sequence_alone_gemma3() {
    check("tiny-gemma3", BatchProducts::Gemm);
}

/// Prompts of mixed lengths admitted in the same step, their whole prompts
/// in one `step` (one batched prefill, over several passes where they
/// exceed a prefill chunk), then greedy steps together: every sequence's
/// logits and tokens are those of its prompt alone, bit for bit. Then two
/// prompts admitted together again, one a repeat of a finished one (its
/// prefix cached, the rest of it beside a new prompt in one pass).
fn check_together(dir: &str) {
    let Some(g) = gpu() else { return };
    let path = common::repo().join("samples/fixtures/llm").join(dir);
    let (cfg, w) = lfm::models::open_llm(&path).unwrap();
    let vocab = cfg.vocab;
    let opts = GpuLlmOptions {
        prefill_chunk: Some(16),
        ..Default::default()
    };
    let lens = [2, 17, 33, 40, 9, 16];
    let prompts: Vec<Vec<u32>> = lens
        .iter()
        .enumerate()
        .map(|(i, &n)| prompt(10 + i as u32, n, vocab))
        .collect();
    let fresh = prompt(20, 11, vocab);
    let steps = 4;
    let mut single = GpuLlm::new(g.clone(), &cfg, &w, &opts).unwrap();
    let want: Vec<_> = prompts
        .iter()
        .map(|p| alone(&mut single, p, steps))
        .collect();
    let want_fresh = alone(&mut single, &fresh, steps);
    drop(single);

    let mut b = GpuBatch::new(g, &cfg, &w, &opts, lens.len(), lens.len() * 64).unwrap();
    let ids: Vec<_> = prompts
        .iter()
        .map(|p| b.open(p).unwrap().expect("a free slot").0)
        .collect();
    let work: Vec<SeqWork> = ids
        .iter()
        .zip(&prompts)
        .map(|(&id, p)| SeqWork {
            id,
            tokens: p,
            as_decode: false,
        })
        .collect();
    let logits = b.step(&work).unwrap();
    let mut last: Vec<u32> = Vec::new();
    for (i, l) in logits.iter().enumerate() {
        assert!(
            bits_equal(l, &want[i][0].1),
            "{dir}: prompt {i} ({} tokens): logits differ from its run alone",
            lens[i]
        );
        last.push(argmax(l));
    }
    for k in 1..=steps {
        let rows: Vec<_> = ids.iter().copied().zip(last.iter().copied()).collect();
        last = b
            .step_greedy_many(&rows)
            .expect("a GPU greedy step")
            .unwrap();
        let alone: Vec<u32> = want.iter().map(|w| w[k].0).collect();
        assert_eq!(last, alone, "{dir}: token {k} of each sequence");
    }
    for &id in &ids {
        b.close(id);
    }
    // A repeat of the 33-token prompt (its two full blocks before its last
    // token cached) beside a new prompt.
    let (again, cached) = b.open(&prompts[2]).unwrap().expect("a free slot");
    assert_eq!(cached, 32, "{dir}: a repeat's cached tokens");
    let (new, _) = b.open(&fresh).unwrap().expect("a free slot");
    let work = [
        SeqWork {
            id: again,
            tokens: &prompts[2][cached..],
            as_decode: false,
        },
        SeqWork {
            id: new,
            tokens: &fresh,
            as_decode: false,
        },
    ];
    let logits = b.step(&work).unwrap();
    assert!(bits_equal(&logits[0], &want[2][0].1), "{dir}: the repeat");
    assert!(
        bits_equal(&logits[1], &want_fresh[0].1),
        "{dir}: the new prompt"
    );
    let rows = [(again, argmax(&logits[0])), (new, argmax(&logits[1]))];
    let next = b
        .step_greedy_many(&rows)
        .expect("a GPU greedy step")
        .unwrap();
    assert_eq!(next, [want[2][1].0, want_fresh[1].0], "{dir}: after them");
}

#[test]
fn gpu_batch_prompts_admitted_together_lfm2() {
    check_together("tiny-lfm2");
}

#[test]
fn gpu_batch_prompts_admitted_together_llama() {
    check_together("tiny-llama");
}

/// Opens `p` in `b`, steps what the prefix cache did not supply as a prompt
/// in chunks of 7, then `steps` greedy decode steps alone (the single
/// path); the prompt's logits must be `want`'s bit for bit, the tokens its
/// tokens. Returns the sequence and how many prompt tokens were cached.
fn run_alone(
    b: &mut GpuBatch,
    p: &[u32],
    want: &[(u32, Vec<f32>)],
    steps: usize,
    what: &str,
) -> (lfm::models::batch::SeqId, usize) {
    let (id, cached) = b.open(p).unwrap().expect("a free slot");
    let mut logits = Vec::new();
    for chunk in p[cached..].chunks(7) {
        let work = [SeqWork {
            id,
            tokens: chunk,
            as_decode: false,
        }];
        logits = b.step(&work).unwrap().pop().unwrap();
    }
    assert!(
        bits_equal(&logits, &want[0].1),
        "{what}: the prompt's logits differ from its run alone"
    );
    let mut t = argmax(&logits);
    for (k, w) in want.iter().enumerate().skip(1).take(steps) {
        t = b
            .step_greedy_many(&[(id, t)])
            .expect("a GPU greedy step")
            .unwrap()[0];
        assert_eq!(t, w.0, "{what}: token {k}");
    }
    (id, cached)
}

/// The prefix cache, in whole blocks of 16 positions: the same prompt
/// again, and the next turn of a conversation (the first prompt, what it
/// produced, more), continue from the first prompt's blocks after that
/// sequence ended; a prompt sharing only the first block of a running
/// sequence's prompt shares that block (a hybrid model's conv rings start
/// from that block's conv ends). Every sequence's logits and tokens are
/// those of its prompt alone, bit for bit, the running one's included, and
/// closing them all holds no block.
fn check_prefix(dir: &str) {
    let Some(g) = gpu() else { return };
    let path = common::repo().join("samples/fixtures/llm").join(dir);
    let (cfg, w) = lfm::models::open_llm(&path).unwrap();
    let vocab = cfg.vocab;
    let opts = GpuLlmOptions {
        prefill_chunk: Some(16),
        ..Default::default()
    };
    let steps = 3;
    let first = prompt(1, 40, vocab);
    let mut single = GpuLlm::new(g.clone(), &cfg, &w, &opts).unwrap();
    let want_first = alone(&mut single, &first, steps);
    let mut next = first.clone();
    next.extend(want_first[..steps].iter().map(|x| x.0));
    next.extend(prompt(2, 6, vocab));
    let mut other = first[..24].to_vec();
    other.extend(prompt(3, 9, vocab));
    let want_next = alone(&mut single, &next, steps + 1);
    let want_other = alone(&mut single, &other, steps);
    drop(single);

    let mut b = GpuBatch::new(g, &cfg, &w, &opts, 2, 256).unwrap();
    let (id, cached) = run_alone(&mut b, &first, &want_first, steps, dir);
    assert_eq!(cached, 0);
    b.close(id);
    let u = b.usage();
    assert_eq!(
        (u.in_use, u.cached),
        (0, 2),
        "{dir}: the first prompt's full blocks"
    );
    // The same prompt again: its full blocks before its last token.
    let (id, cached) = run_alone(&mut b, &first, &want_first, steps, dir);
    assert_eq!(cached, 32, "{dir}: a repeat's cached tokens");
    b.close(id);

    // The next turn.
    let (id_next, cached) = run_alone(&mut b, &next, &want_next, steps, dir);
    assert_eq!(cached, 32, "{dir}: the next turn's cached tokens");
    let (id_other, cached) = run_alone(&mut b, &other, &want_other, steps, dir);
    assert_eq!(cached, 16, "{dir}: a shared start");
    // The running sequence goes on where it was.
    let t = b
        .step_greedy_many(&[(id_next, want_next[steps].0)])
        .expect("a GPU greedy step")
        .unwrap();
    assert_eq!(t[0], want_next[steps + 1].0, "{dir}: after the other");
    b.close(id_next);
    b.close(id_other);
    assert_eq!(b.usage().in_use, 0, "{dir}: blocks held after closing");
}

#[test]
fn gpu_batch_prefix_cache_equals_each_prompt_alone_lfm2() {
    check_prefix("tiny-lfm2");
}

#[test]
fn gpu_batch_prefix_cache_equals_each_prompt_alone_llama() {
    check_prefix("tiny-llama");
}

/// Admission by blocks: a prompt waits while the cache's free blocks
/// cannot hold it and its first token, and opens once a sequence ends and
/// gives its blocks back; a sequence growing past the blocks left fails
/// with an error, not a panic, and its blocks come back.
fn check_blocks(dir: &str) {
    let Some(g) = gpu() else { return };
    let path = common::repo().join("samples/fixtures/llm").join(dir);
    let (cfg, w) = lfm::models::open_llm(&path).unwrap();
    let vocab = cfg.vocab;
    let opts = GpuLlmOptions::default();
    // Four blocks of 16 positions for up to four sequences.
    let mut b = GpuBatch::new(g, &cfg, &w, &opts, 4, 64).unwrap();
    let long = prompt(7, 40, vocab);
    let (a, _) = b.open(&long).unwrap().expect("three blocks free");
    assert_eq!(b.free_blocks(), 1, "{dir}: three blocks promised");
    let short = prompt(8, 20, vocab);
    assert!(
        b.open(&short).unwrap().is_none(),
        "{dir}: two blocks wanted, one free"
    );
    let l = b
        .step(&[SeqWork {
            id: a,
            tokens: &long,
            as_decode: false,
        }])
        .unwrap();
    assert_eq!(b.usage().in_use, 3, "{dir}: the prompt's blocks");
    // Growing into the fourth block works; past it fails cleanly.
    let mut t = argmax(&l[0]);
    for _ in 0..(64 - 40) {
        t = b
            .step_greedy_many(&[(a, t)])
            .expect("a GPU greedy step")
            .unwrap()[0];
    }
    assert!(
        b.step_greedy_many(&[(a, t)])
            .expect("a GPU greedy step")
            .is_err(),
        "{dir}: a 65th position"
    );
    b.close(a);
    assert_eq!(b.usage().in_use, 0, "{dir}: blocks held after closing");
    assert!(b.open(&short).unwrap().is_some(), "{dir}: room again");
}

#[test]
fn gpu_batch_admits_by_blocks_lfm2() {
    check_blocks("tiny-lfm2");
}

#[test]
fn gpu_batch_admits_by_blocks_llama() {
    check_blocks("tiny-llama");
}

fn bits_equal(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
}

/// `forward_verify` and `verify_greedy` of token runs of 1 to more than
/// VERIFY_ROWS (two submissions), from a prompt, across KV-cache growth,
/// after rejected rows are truncated away, and followed by decode steps:
/// every row's logits are the decode step's, bit for bit.
fn check_verify(dir: &str) {
    let Some(g) = gpu() else { return };
    let path = common::repo().join("samples/fixtures/llm").join(dir);
    let (cfg, w) = lfm::models::open_llm(&path).unwrap();
    let vocab = cfg.vocab;
    let opts = GpuLlmOptions {
        prefill_chunk: Some(16),
        // The cache grows during the checks (their plans are rebuilt).
        kv_positions: Some(24),
        ..Default::default()
    };
    let mut m = GpuLlm::new(g, &cfg, &w, &opts).unwrap();
    let p = prompt(7, 21, vocab);
    let extra = prompt(8, 48, vocab);
    m.forward(&p, false).unwrap();
    // Row i: the logits after extra[..=i], one decode step at a time.
    let want: Vec<Vec<f32>> = extra
        .iter()
        .map(|&t| m.forward(&[t], false).unwrap())
        .collect();
    let rows = |from: usize, to: usize| want[from..to].concat();

    m.reset();
    m.forward(&p, false).unwrap();
    let mut at = 0;
    for n in [1, 4, 17, 20, 6] {
        let got = m.forward_verify(&extra[at..at + n]).unwrap();
        assert!(
            bits_equal(&got, &rows(at, at + n)),
            "{dir}: {n} rows from {at}: logits differ from decode steps"
        );
        at += n;
    }
    assert_eq!(m.position(), p.len() + at);

    // Twelve checked, the last eight rejected; then again from there, a
    // greedy check, and a decode step after it.
    let base = p.len();
    m.reset();
    m.forward(&p, false).unwrap();
    m.forward_verify(&extra[..12]).unwrap();
    m.truncate(base + 4).unwrap();
    let got = m.forward_verify(&extra[4..13]).unwrap();
    assert!(
        bits_equal(&got, &rows(4, 13)),
        "{dir}: rows after a truncation"
    );
    m.truncate(base + 6).unwrap();
    let ids = m.verify_greedy(&extra[6..23]).unwrap();
    let argmaxes: Vec<u32> = want[6..23].iter().map(|l| argmax(l)).collect();
    assert_eq!(ids, argmaxes, "{dir}: greedy check");
    let next = m.forward(&[extra[23]], false).unwrap();
    assert!(
        bits_equal(&next, &want[23]),
        "{dir}: a decode step after a check"
    );
}

#[test]
fn gpu_verify_equals_decode_steps_lfm2() {
    check_verify("tiny-lfm2");
}

#[test]
fn gpu_verify_equals_decode_steps_llama() {
    check_verify("tiny-llama");
}

#[test]
fn gpu_verify_equals_decode_steps_gemma3() {
    check_verify("tiny-gemma3");
}

/// Each prompt's greedy tokens alone on the single-sequence GPU model: the
/// prompt's, then `steps` more.
fn greedy_alone(
    g: &Arc<Gpu>,
    cfg: &lfm::models::llm::LlmConfig,
    w: &lfm::models::llm::Weights,
    opts: &GpuLlmOptions,
    prompts: &[Vec<u32>],
    steps: usize,
) -> Vec<Vec<u32>> {
    let mut single = GpuLlm::new(g.clone(), cfg, w, opts).unwrap();
    prompts
        .iter()
        .map(|p| alone(&mut single, p, steps).iter().map(|x| x.0).collect())
        .collect()
}

/// Opens a sequence for each prompt and prefills them in one step; returns
/// their ids and each one's first token.
fn prefill_together(b: &mut GpuBatch, prompts: &[Vec<u32>]) -> (Vec<SeqId>, Vec<Vec<u32>>) {
    let ids: Vec<_> = prompts
        .iter()
        .map(|p| b.open(p).unwrap().expect("a free slot").0)
        .collect();
    let work: Vec<SeqWork> = ids
        .iter()
        .zip(prompts)
        .map(|(&id, p)| SeqWork {
            id,
            tokens: p,
            as_decode: false,
        })
        .collect();
    let first = b
        .step(&work)
        .unwrap()
        .iter()
        .map(|l| vec![argmax(l)])
        .collect();
    (ids, first)
}

/// Each sequence with the last token it produced.
fn last_rows(ids: &[SeqId], got: &[Vec<u32>]) -> Vec<(SeqId, u32)> {
    ids.iter()
        .zip(got)
        .map(|(&id, t)| (id, *t.last().unwrap()))
        .collect()
}

/// Greedy runs of several sequences with the device a step ahead
/// (`greedy_run_many`), stopped early by the caller and at `max`, then
/// single batched steps: every sequence's tokens are those alone (the step
/// run ahead of a stop is taken back, its KV rows and conv rows rewritten).
fn check_run_ahead(dir: &str, products: BatchProducts) {
    let Some(g) = gpu() else { return };
    let path = common::repo().join("samples/fixtures/llm").join(dir);
    let (cfg, w) = lfm::models::open_llm(&path).unwrap();
    let vocab = cfg.vocab;
    let opts = GpuLlmOptions {
        prefill_chunk: Some(16),
        batch_products: products,
        ..Default::default()
    };
    // Prompts whose decode crosses blocks of 16 positions at different steps.
    let lens = [3, 17, 30, 9];
    let prompts: Vec<Vec<u32>> = lens
        .iter()
        .enumerate()
        .map(|(i, &n)| prompt(30 + i as u32, n, vocab))
        .collect();
    let steps = 14;
    let want = greedy_alone(&g, &cfg, &w, &opts, &prompts, steps);

    let mut b = GpuBatch::new(g, &cfg, &w, &opts, lens.len(), lens.len() * 64).unwrap();
    let (ids, mut got) = prefill_together(&mut b, &prompts);
    let rows = |got: &[Vec<u32>]| last_rows(&ids, got);
    // Stopped by the caller after 5 steps, then by `max` after 4.
    for (stop, max) in [(5, 100), (usize::MAX, 4)] {
        let mut seen = 0;
        let n = b
            .greedy_run_many(&rows(&got), max, &mut |tokens| {
                for (g, &t) in got.iter_mut().zip(tokens) {
                    g.push(t);
                }
                seen += 1;
                seen < stop
            })
            .expect("a GPU run ahead")
            .unwrap();
        assert_eq!(n, stop.min(max), "{dir}: steps of the run");
    }
    while got[0].len() <= steps {
        let next = b
            .step_greedy_many(&rows(&got))
            .expect("a GPU greedy step")
            .unwrap();
        for (g, t) in got.iter_mut().zip(next) {
            g.push(t);
        }
    }
    for (i, (w, t)) in want.iter().zip(&got).enumerate() {
        assert_eq!(
            w, t,
            "{dir} ({products:?}): sequence {i}'s tokens differ from its run alone"
        );
    }
    for &id in &ids {
        b.close(id);
    }
    assert_eq!(b.usage().in_use, 0, "{dir}: blocks left in use");
}

#[test]
fn gpu_batch_runs_ahead_as_single_steps_lfm2() {
    check_run_ahead("tiny-lfm2", BatchProducts::Invariant);
}

#[test]
fn gpu_batch_runs_ahead_as_single_steps_llama() {
    check_run_ahead("tiny-llama", BatchProducts::Invariant);
}

#[test]
fn gpu_batch_runs_ahead_with_gemm_products_lfm2() {
    check_run_ahead("tiny-lfm2", BatchProducts::Gemm);
}

/// A run ahead that fills the paged cache stops (no step submitted without
/// room), its tokens still each sequence's alone; the next step has no room.
#[test]
fn gpu_batch_run_ahead_stops_when_the_cache_is_full() {
    let Some(g) = gpu() else { return };
    let path = common::repo().join("samples/fixtures/llm/tiny-lfm2");
    let (cfg, w) = lfm::models::open_llm(&path).unwrap();
    let opts = GpuLlmOptions {
        prefill_chunk: Some(16),
        ..Default::default()
    };
    let prompts = vec![prompt(40, 10, cfg.vocab), prompt(41, 20, cfg.vocab)];
    let steps = 40;
    let want = greedy_alone(&g, &cfg, &w, &opts, &prompts, steps);
    // Five blocks of 16 positions for both.
    let mut b = GpuBatch::new(g, &cfg, &w, &opts, 2, 80).unwrap();
    let (ids, mut got) = prefill_together(&mut b, &prompts);
    let n = b
        .greedy_run_many(&last_rows(&ids, &got), 100, &mut |tokens| {
            for (g, &t) in got.iter_mut().zip(tokens) {
                g.push(t);
            }
            true
        })
        .expect("a GPU run ahead")
        .unwrap();
    assert!(n > 0 && n < steps, "{n} steps in a full cache");
    for (i, (w, t)) in want.iter().zip(&got).enumerate() {
        assert_eq!(&w[..=n], &t[..], "sequence {i}'s tokens");
    }
    assert!(
        b.step_greedy_many(&last_rows(&ids, &got)).unwrap().is_err(),
        "a step past a full cache"
    );
}

/// Each prompt's tokens alone on the single-sequence GPU model, sampled
/// with `sampling(i)` for prompt i: the prompt's argmax, then `steps` draws.
fn sampled_alone(
    g: &Arc<Gpu>,
    cfg: &lfm::models::llm::LlmConfig,
    w: &lfm::models::llm::Weights,
    opts: &GpuLlmOptions,
    prompts: &[Vec<u32>],
    sampling: &dyn Fn(usize) -> SamplingOptions,
    steps: usize,
) -> Vec<Vec<u32>> {
    let mut single = GpuLlm::new(g.clone(), cfg, w, opts).unwrap();
    let mut want = Vec::new();
    for (i, p) in prompts.iter().enumerate() {
        single.reset();
        let mut sampler = Sampler::new(sampling(i));
        let mut seq = vec![argmax(&single.forward(p, false).unwrap())];
        for _ in 0..steps {
            let t = single
                .step_sample(*seq.last().unwrap(), &mut sampler, &[])
                .unwrap();
            seq.push(t);
        }
        want.push(seq);
    }
    want
}

/// One batched step of sampled rows: the batch, each row's (id, last
/// token) and their samplers in; each row's next token out.
type SampledStep<'a> = dyn FnMut(&mut GpuBatch, Vec<(SeqId, u32)>, &mut [Sampler]) -> Vec<u32> + 'a;

/// Four sampled sequences, prompts of `lens` tokens (ids from `seed`),
/// sequence i sampled with `sampling(i)`, `greedy` the one at temperature
/// 0: each row of a batch stepping them with `step` draws
/// what its sequence draws alone on the single path with the same seed;
/// the greedy one alone is the argmax, and some other one leaves it.
fn check_sampled(
    dir: &str,
    seed: u32,
    lens: [usize; 4],
    sampling: &dyn Fn(usize) -> SamplingOptions,
    greedy: usize,
    step: &mut SampledStep,
) {
    let Some(g) = gpu() else { return };
    let path = common::repo().join("samples/fixtures/llm").join(dir);
    let (cfg, w) = lfm::models::open_llm(&path).unwrap();
    let vocab = cfg.vocab;
    let opts = GpuLlmOptions {
        prefill_chunk: Some(16),
        ..Default::default()
    };
    let prompts: Vec<Vec<u32>> = lens
        .iter()
        .enumerate()
        .map(|(i, &n)| prompt(seed + i as u32, n, vocab))
        .collect();
    let steps = 12;
    let want = sampled_alone(&g, &cfg, &w, &opts, &prompts, sampling, steps);
    let argmax_alone = greedy_alone(&g, &cfg, &w, &opts, &prompts, steps);
    assert_eq!(
        want[greedy], argmax_alone[greedy],
        "{dir}: a greedy row alone is the argmax"
    );
    assert!(
        (0..lens.len()).any(|i| i != greedy && want[i] != argmax_alone[i]),
        "{dir}: no sampled row left the argmax"
    );

    let mut b = GpuBatch::new(g, &cfg, &w, &opts, lens.len(), lens.len() * 64).unwrap();
    let (ids, mut got) = prefill_together(&mut b, &prompts);
    let mut samplers: Vec<Sampler> = (0..lens.len()).map(|i| Sampler::new(sampling(i))).collect();
    for _ in 0..steps {
        let tokens = step(&mut b, last_rows(&ids, &got), &mut samplers);
        for (g, t) in got.iter_mut().zip(tokens) {
            g.push(t);
        }
    }
    assert_eq!(
        got, want,
        "{dir}: a batch's draws against each sequence alone"
    );
}

/// Sampled sequences drawn where the logits are (`step_drawn_many`, the
/// batch-invariant products), greedy rows among them.
fn check_drawn(dir: &str) {
    let sampling = |i: usize| SamplingOptions {
        temperature: [1.5, 0.8, 1.2, 0.0][i],
        min_p: [0.0, 0.0, 0.05, 0.0][i],
        seed: 70 + i as u64,
        ..Default::default()
    };
    check_sampled(
        dir,
        50,
        [5, 18, 9, 12],
        &sampling,
        3,
        &mut |b, rows, samplers| {
            let rows: Vec<_> = rows
                .into_iter()
                .zip(samplers.iter_mut())
                .map(|((id, t), s)| (id, t, s.device_draw().expect("a plain sampler")))
                .collect();
            b.step_drawn_many(&rows).expect("drawn on the GPU").unwrap()
        },
    );
}

#[test]
fn gpu_batch_draws_as_each_sequence_alone_lfm2() {
    check_drawn("tiny-lfm2");
}

#[test]
fn gpu_batch_draws_as_each_sequence_alone_llama() {
    check_drawn("tiny-llama");
}

/// Top-k samplers on the candidates path (`step_candidates_many`: each
/// row's best tokens selected on the device, the draw on the host, as the
/// server's scheduler does), a greedy row among them.
fn check_candidates(dir: &str) {
    // llama.cpp's defaults (top-k 40, top-p 0.95, min-p 0.05) and others.
    let sampling = |i: usize| SamplingOptions {
        temperature: [1.0, 0.7, 0.0, 1.3][i],
        top_k: [40, 5, 40, 200][i],
        top_p: [0.95, 1.0, 1.0, 0.9][i],
        min_p: [0.05, 0.0, 0.0, 0.0][i],
        seed: 80 + i as u64,
        ..Default::default()
    };
    check_sampled(
        dir,
        60,
        [7, 16, 3, 21],
        &sampling,
        2,
        &mut |b, rows, samplers| {
            assert!(b.candidates_on_device() >= 200, "{dir}: candidates a row");
            // Each row's own top-k (a greedy row's first).
            let rows: Vec<_> = rows
                .into_iter()
                .zip(samplers.iter())
                .map(|((id, t), s)| (id, t, s.candidates_needed().unwrap_or(1)))
                .collect();
            let cands = b
                .step_candidates_many(&rows)
                .expect("candidates on the GPU")
                .unwrap();
            samplers
                .iter_mut()
                .zip(cands)
                .map(|(s, c)| {
                    if s.is_greedy() {
                        c[0].0
                    } else {
                        s.sample_top(c)
                    }
                })
                .collect()
        },
    );
}

#[test]
fn gpu_batch_top_k_candidates_as_each_sequence_alone_lfm2() {
    check_candidates("tiny-lfm2");
}

#[test]
fn gpu_batch_top_k_candidates_as_each_sequence_alone_llama() {
    check_candidates("tiny-llama");
}
