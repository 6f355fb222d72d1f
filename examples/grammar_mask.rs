//! Per-token cost of the grammar's token mask: replays a JSON output valid
//! against a schema token by token and times each mask as the GPU path
//! takes it (the bitmap, with the per-state cache) and the first, uncached
//! one. Then
//! generates N tokens under the schema on the CPU (greedy, and top-k 40 at
//! temperature 0.8) with the mask over the whole vocabulary at every step,
//! recording each step's logits and forward time, and replays the logits
//! through the sampler: full mask, the top-candidates-first path
//! (`Sampler::sample_unmasked`: the same tokens, checked), and no grammar.
//!
//! cargo run --example grammar_mask -- MODEL.gguf SCHEMA.json JSON_TEXT [PROMPT N]

use lfm::cli::DeviceChoice;
use lfm::models::{self, LoadOptions};
use lfm::run::grammar::{json_schema, Constraint, Grammar, TokenTable};
use lfm::run::sampling::{Sampler, SamplingOptions};
use lfm::tensor::Activations;
use std::rc::Rc;
use std::time::Instant;

fn main() -> anyhow::Result<()> {
    let a: Vec<String> = std::env::args().collect();
    let (model, schema, text) = match &a[..] {
        [_, m, s, t, ..] => (m, s, t),
        _ => anyhow::bail!("usage: grammar_mask MODEL SCHEMA.json JSON_TEXT [PROMPT N]"),
    };
    let mut m = models::load_llm(
        model.as_ref(),
        &LoadOptions {
            device: DeviceChoice::Cpu,
            weight_type: None,
            cpu_activations: Activations::Int8,
        },
    )?;
    let tok = m.tokenizer.as_ref().expect("a tokenizer");
    let t0 = Instant::now();
    let mut bytes = tok.token_bytes();
    bytes.resize(m.model.config().vocab, None);
    let table = Rc::new(TokenTable::new(bytes));
    let build = t0.elapsed();
    let schema: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(schema)?)?;
    let grammar = Grammar::parse(&json_schema::to_gbnf(&schema, "schema")?, "schema")?;
    let ids = tok.encode(text, false)?;
    let mut c = Constraint::new(grammar.clone(), table.clone(), tok.eos_ids.clone());
    let mut times = Vec::new();
    for &id in &ids {
        let t = Instant::now();
        // The bitmap the GPU applies (the mask, packed; both kept per state).
        let mask = c.mask_bits();
        times.push(t.elapsed().as_secs_f64() * 1e3);
        assert!(
            lfm::cpu::mask_allows(&mask, id as usize),
            "token {id} masked out"
        );
        c.accept(id)?;
    }
    let first = times[0];
    // The slowest masks, with where in the text they fall.
    let mut slow: Vec<usize> = (0..ids.len()).collect();
    slow.sort_by(|&a, &b| times[b].total_cmp(&times[a]));
    for &i in slow.iter().take(3) {
        println!(
            "slow mask: {:.2} ms after {:?}",
            times[i],
            tok.decode(&ids[..i]).unwrap_or_default()
        );
    }
    times.sort_by(f64::total_cmp);
    println!(
        "vocab {}: table {:.0} ms once; {} tokens: mask median {:.3} ms, mean {:.3} ms, max {:.2} ms, first {:.2} ms",
        m.model.config().vocab,
        build.as_secs_f64() * 1e3,
        ids.len(),
        times[times.len() / 2],
        times.iter().sum::<f64>() / times.len() as f64,
        times[times.len() - 1],
        first
    );
    if let [_, _, _, _, prompt, n] = &a[..] {
        let n: usize = n.parse()?;
        let prompt = tok.encode(prompt, true)?;
        let eos = tok.eos_ids.clone();
        let constrained = |opts: &SamplingOptions| {
            let mut s = Sampler::new(opts.clone());
            s.set_constraint(Constraint::new(grammar.clone(), table.clone(), eos.clone()));
            s
        };
        for (what, opts) in [
            ("greedy", SamplingOptions::default()),
            (
                "top-k 40, T 0.8",
                SamplingOptions {
                    temperature: 0.8,
                    top_k: 40,
                    seed: 5,
                    ..Default::default()
                },
            ),
        ] {
            // Generate with the full mask, keeping every step's logits.
            let mut s = constrained(&opts);
            s.set_full_mask(true);
            m.model.reset();
            let mut steps = Vec::new();
            let mut forward = Vec::new();
            let mut feed = prompt.clone();
            let mut history = prompt.clone();
            let mut out = Vec::new();
            for _ in 0..n {
                let t = Instant::now();
                let logits = m.model.forward(&feed, false)?;
                if feed.len() == 1 {
                    forward.push(t.elapsed().as_secs_f64() * 1e3);
                }
                let id = s.sample(&logits, &history);
                steps.push(logits);
                out.push(id);
                if eos.contains(&id) || s.is_finished() {
                    break;
                }
                history.push(id);
                feed = vec![id];
            }
            // Replay: the same draws, timed.
            let replay = |s: &mut Sampler| -> (Vec<u32>, f64) {
                let mut h = prompt.clone();
                let mut ids = Vec::new();
                let t = Instant::now();
                for l in &steps {
                    let id = s.sample(l, &h);
                    h.push(id);
                    ids.push(id);
                }
                (ids, t.elapsed().as_secs_f64() * 1e3 / steps.len() as f64)
            };
            let full = fastest(
                &|| {
                    let mut s = constrained(&opts);
                    s.set_full_mask(true);
                    s
                },
                &replay,
            );
            let lazy = fastest(&|| constrained(&opts), &replay);
            let plain = fastest(&|| Sampler::new(opts.clone()), &replay);
            assert_eq!(full.0, out, "{what}: the full-mask replay differs");
            assert_eq!(lazy.0, out, "{what}: the top-candidates-first path differs");
            forward.sort_by(f64::total_cmp);
            let step = forward[forward.len() / 2];
            println!(
                "{what}: {} tokens; sampling per token: no grammar {:.3} ms, full mask {:.3} ms, \
                 top candidates first {:.3} ms; forward median {step:.1} ms; grammar overhead \
                 full {:.1}%, top first {:.1}% of a step",
                steps.len(),
                plain.1,
                full.1,
                lazy.1,
                100.0 * (full.1 - plain.1) / (step + plain.1),
                100.0 * (lazy.1 - plain.1) / (step + plain.1),
            );
        }
    }
    Ok(())
}

/// The fastest of three replays with fresh samplers (a shared machine).
fn fastest(
    make: &dyn Fn() -> Sampler,
    replay: &dyn Fn(&mut Sampler) -> (Vec<u32>, f64),
) -> (Vec<u32>, f64) {
    let mut runs: Vec<(Vec<u32>, f64)> = (0..3).map(|_| replay(&mut make())).collect();
    runs.sort_by(|a, b| a.1.total_cmp(&b.1));
    runs.swap_remove(0)
}
