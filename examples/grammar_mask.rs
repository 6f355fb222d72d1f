//! Per-token cost of the grammar's token mask: replays a JSON output valid
//! against a schema token by token and times each mask (as generation uses
//! it, with the per-state cache) and the first, uncached one.
//!
//! cargo run --release --example grammar_mask -- MODEL.gguf SCHEMA.json JSON_TEXT

use lfm::cli::DeviceChoice;
use lfm::models::{self, LoadOptions};
use lfm::run::grammar::{json_schema, Constraint, Grammar, TokenTable};
use lfm::tensor::Activations;
use std::rc::Rc;
use std::time::Instant;

fn main() -> anyhow::Result<()> {
    let a: Vec<String> = std::env::args().collect();
    let [_, model, schema, text] = &a[..] else {
        anyhow::bail!("usage: grammar_mask MODEL SCHEMA.json JSON_TEXT");
    };
    let m = models::load_llm(
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
    let mut c = Constraint::new(grammar, table, tok.eos_ids.clone());
    let mut times = Vec::new();
    for &id in &ids {
        let t = Instant::now();
        let mask = c.mask();
        times.push(t.elapsed().as_secs_f64() * 1e3);
        assert!(mask[id as usize], "token {id} masked out");
        c.accept(id)?;
    }
    let first = times[0];
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
    Ok(())
}
