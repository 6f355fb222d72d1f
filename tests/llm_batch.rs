//! The CPU batch backend against the single-sequence forward, bit for bit:
//! sequences stepped together (prompt chunks beside decode tokens), a
//! prefix taken from the cache (with LFM2's conv state), blocks freed.

mod common;

use lfm::models::batch::{BatchedLm, SeqWork};
use lfm::models::llm::{CausalLm, CpuLlm};
use lfm::models::llm_cpu::CpuBatch;
use lfm::quant::GgmlType;
use lfm::tensor::Activations;

fn prompt(seed: u32, len: usize, vocab: usize) -> Vec<u32> {
    (0..len as u32)
        .map(|i| i.wrapping_mul(2654435761).wrapping_add(seed * 97) % vocab as u32)
        .collect()
}

fn argmax(l: &[f32]) -> u32 {
    lfm::sampling::argmax(l) as u32
}

fn check(dir: &str) {
    check_as(dir, None)
}

/// [`check`] with the matrices converted to `t` first: Q4_0, Q4_1 and Q8_0
/// layers are repacked for the int8 decode products
/// (`quant::fast::rows8`), a batch's inputs then go one at a time through
/// the repacked kernel.
fn check_as(dir: &str, t: Option<GgmlType>) {
    let path = common::repo().join("samples/fixtures/llm").join(dir);
    let (cfg, mut w) = lfm::models::open_llm(&path).unwrap();
    if let Some(t) = t {
        w = w.converted(t).unwrap().0;
        let gate = &w.layers[0].gate;
        assert!(
            gate.dtype == t && gate.rows() % 8 == 0,
            "{dir}: {t} matrices that the int8 decode does not repack"
        );
    }
    let vocab = cfg.vocab;
    // Prompts of 1, 5, 23 and 40 tokens; the last two share 32 tokens.
    let mut prompts = vec![
        prompt(1, 1, vocab),
        prompt(2, 5, vocab),
        prompt(3, 23, vocab),
    ];
    let mut shared = prompts[2][..16].to_vec();
    shared.extend(prompt(9, 16, vocab));
    let mut long = shared.clone();
    long.extend(prompt(4, 8, vocab));
    prompts.push(long);
    let steps = 6;

    // Each alone: prompt, then greedy decode steps; logits of every step.
    let mut alone = Vec::new();
    for p in &prompts {
        let mut m = CpuLlm::new(cfg.clone(), w.clone()).with_activations(Activations::Int8);
        let mut l = m.forward(p, false).unwrap();
        let mut all = vec![l.clone()];
        for _ in 0..steps {
            l = m.forward(&[argmax(&l)], false).unwrap();
            all.push(l.clone());
        }
        alone.push(all);
    }

    // Together: the prompts in chunks of at most 7 tokens, each sequence
    // decoding as soon as its prompt is in, all in the same steps.
    let mut b = CpuBatch::new(cfg.clone(), w.clone(), Activations::Int8, 4096);
    let ids: Vec<u64> = prompts
        .iter()
        .map(|p| b.open(p).unwrap().unwrap().0)
        .collect();
    let mut fed = vec![0usize; prompts.len()];
    let mut got: Vec<Vec<Vec<f32>>> = vec![Vec::new(); prompts.len()];
    while got.iter().any(|g| g.len() < steps + 1) {
        let singles: Vec<[u32; 1]> = got
            .iter()
            .map(|g| [g.last().map_or(0, |l| argmax(l))])
            .collect();
        let mut work = Vec::new();
        let mut who = Vec::new();
        for (i, p) in prompts.iter().enumerate() {
            if got[i].len() > steps {
                continue;
            }
            if fed[i] < p.len() {
                let end = (fed[i] + 7).min(p.len());
                work.push(SeqWork {
                    id: ids[i],
                    tokens: &p[fed[i]..end],
                    as_decode: p.len() == 1,
                });
                who.push((i, end));
            } else {
                work.push(SeqWork {
                    id: ids[i],
                    tokens: &singles[i],
                    as_decode: true,
                });
                who.push((i, fed[i]));
            }
        }
        let logits = b.step(&work).unwrap();
        for ((i, end), l) in who.into_iter().zip(logits) {
            let was = fed[i];
            fed[i] = end;
            if end == prompts[i].len() && (was < end || !got[i].is_empty()) {
                got[i].push(l);
            }
        }
    }
    for (i, (a, g)) in alone.iter().zip(&got).enumerate() {
        assert_eq!(a, g, "{dir}: sequence {i} differs from its run alone");
    }
    for id in ids {
        b.close(id);
    }
    assert_eq!(b.usage().in_use, 0, "{dir}: blocks held after closing");

    // The shared 32 tokens come from the prefix cache now; what follows
    // is the same as computing everything.
    let (id, reused) = b.open(&prompts[3]).unwrap().unwrap();
    assert_eq!(reused, 32, "{dir}: the cached prefix was not reused");
    let l = b
        .step(&[SeqWork {
            id,
            tokens: &prompts[3][reused..],
            as_decode: false,
        }])
        .unwrap();
    assert_eq!(
        l[0], alone[3][0],
        "{dir}: logits after a cached prefix differ"
    );
    b.close(id);
    assert_eq!(b.usage().in_use, 0);
}

#[test]
fn batched_steps_equal_each_sequence_alone_llama() {
    check("tiny-llama");
}

#[test]
fn batched_steps_equal_each_sequence_alone_lfm2_with_conv_snapshots() {
    check("tiny-lfm2");
}

#[test]
fn batched_steps_equal_each_sequence_alone_llama_repacked_q4_1() {
    check_as("tiny-llama", Some(GgmlType::Q4_1));
}

#[test]
fn batched_steps_equal_each_sequence_alone_lfm2_repacked_q4_0_and_q8_0() {
    check_as("tiny-lfm2", Some(GgmlType::Q4_0));
    check_as("tiny-lfm2", Some(GgmlType::Q8_0));
}

#[test]
fn a_full_cache_refuses_admission_instead_of_failing_later() {
    let path = common::repo().join("samples/fixtures/llm/tiny-llama");
    let (cfg, w) = lfm::models::open_llm(&path).unwrap();
    // Two blocks: one 20-token prompt takes both.
    let mut b = CpuBatch::new(cfg.clone(), w, Activations::F32, 32);
    let p = prompt(5, 20, cfg.vocab);
    let (a, _) = b.open(&p).unwrap().unwrap();
    assert!(
        b.open(&p).unwrap().is_none(),
        "a second prompt does not fit"
    );
    b.close(a);
    assert!(
        b.open(&p).unwrap().is_some(),
        "it fits once the first is closed"
    );
}
