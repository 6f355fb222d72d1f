//! Where a Whisper decoder step's device time goes on this adapter: every
//! dispatch of a step timed with device timestamps, for batches of 1 to N
//! windows decoded greedily (one sequence a window), one window with 5
//! beams and one with 5 samples at temperature 0.2 (the fallback's
//! best-of), the token choice on the device (`whisper_select`,
//! `whisper_sample`) included.
//! Steps run after a prompt of `<|startoftranscript|>` over real 30 s
//! windows (one clip's, in every slot, encoded once).
//!
//!     cargo run --release --example whisper_profile -- [--model DIR] [--audio FILE]
//!         [--windows 1,8,32] [--steps 32]
//!
//! Prints, per case, the host's record and wait per step, the device's
//! busy time and a table of kernels (`scoreboard --profile`'s format).

use anyhow::Context;
use lfm::cpu::whisper::{token_masks, Draw, RowRule, SampleRules, SelectRules, NO_TOKEN};
use lfm::gpu::{Gpu, GpuOptions};
use lfm::models::whisper::gpu::GpuBackend;
use lfm::models::whisper::WhisperFiles;
use lfm::run::transcribe::{Backend, Pick};
use std::path::PathBuf;

fn main() -> anyhow::Result<()> {
    let mut model = PathBuf::from("samples/models/whisper-tiny.en");
    let mut audio = PathBuf::from(
        "/usr/share/pocketsphinx/test/data/librivox/sense_and_sensibility_01_austen_64kb-0870.wav",
    );
    let mut windows = vec![1usize, 8, 32];
    let mut steps = 32usize;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let v = args.next().context("flag needs a value")?;
        match a.as_str() {
            "--model" => model = v.into(),
            "--audio" => audio = v.into(),
            "--windows" => windows = v.split(',').map(|w| w.parse()).collect::<Result<_, _>>()?,
            "--steps" => steps = v.parse()?,
            _ => anyhow::bail!("unknown flag {a}"),
        }
    }
    let files = WhisperFiles::load(&model, None)?;
    let c = &files.model.config;
    let s = &files.tokenizer.specials;
    let gpu = std::sync::Arc::new(Gpu::new(&GpuOptions {
        required: true,
        ..Default::default()
    })?);
    eprintln!("{}", gpu.describe());
    let samples = lfm::run::audio::load(&audio, 16_000)?.samples;
    let mel = files.mel.log_mel(&samples);
    let window = mel.window(0, mel.content_frames().min(3000));
    let most = windows.iter().copied().max().unwrap_or(1);
    let mut backend = GpuBackend::new(gpu, &files.model, most.max(5), most)?;
    let vocab = c.n_vocab;
    let rules = SelectRules {
        vocab,
        timestamp_begin: s.timestamp_begin,
        timestamps: true,
        masks: token_masks(vocab, &[], &[]),
    };
    let open = RowRule {
        text_end: 0,
        ts_from: 0,
        ts_end: vocab as u32,
        flags: 0,
        probe: NO_TOKEN,
        _pad: [0; 3],
    };
    // (windows, sequences a window, temperature, what)
    let mut cases: Vec<(usize, usize, f32, String)> = windows
        .iter()
        .map(|&w| (w, 1, 0.0, format!("decode step, {w} windows greedy")))
        .collect();
    cases.push((1, 5, 0.0, "decode step, 1 window, 5 beams".into()));
    cases.push((
        1,
        5,
        0.2,
        "decode step, 1 window, 5 samples at T 0.2".into(),
    ));
    let mut rng = lfm::util::rng::Rng::new(1);
    // Every case's windows are the first of these slots.
    backend.encode(&vec![&window[..]; most])?;
    for (w, per, temperature, what) in cases {
        let sot = [s.sot];
        let prompts: Vec<&[u32]> = vec![&sot[..]; w];
        let first = vec![open; w];
        let k = if per > 1 { per + 1 } else { 1 };
        let pick = Pick::Top {
            k,
            rules: &rules,
            rows: &first,
        };
        backend.prompt(&prompts, None, &pick)?;
        let forks: Vec<usize> = (0..w).flat_map(|i| std::iter::repeat_n(i, per)).collect();
        backend.select(&forks)?;
        let rows = vec![open; w * per];
        let tokens = vec![440u32; w * per];
        let draws: Vec<Draw> = (0..rows.len())
            .map(|r| Draw {
                row: r as u32,
                u: rng.next_f32(),
            })
            .collect();
        let pick = if temperature > 0.0 {
            Pick::Sample {
                rules: SampleRules {
                    select: &rules,
                    rows: &rows,
                    temperature,
                },
                draws: &draws,
            }
        } else {
            Pick::Top {
                k,
                rules: &rules,
                rows: &rows,
            }
        };
        // One untimed step: the step's shape binds its dispatches.
        backend.step(&tokens, &pick)?;
        backend.start_profile(&what)?;
        for _ in 0..steps.min(c.n_text_ctx - 2) {
            backend.step(&tokens, &pick)?;
        }
        let prof = backend.take_profile().context("no profile")?;
        println!("{}", prof.table());
    }
    Ok(())
}
