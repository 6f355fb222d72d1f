//! Whisper on the GPU against the CPU reference on real 30 s windows: the
//! encoder (conv stem included) of a batch of two windows, the decoder over
//! both at once step by step (prompt, forked, reordered and dropped
//! sequences; the logits and the device's token choice), and whole
//! transcripts token for token against faster-whisper's: sequential greedy
//! and beam search (gold.json), and two inputs batched together
//! (batched.json). On Mesa lavapipe in CI, where one encoder pass costs
//! tens of seconds: the tests share one GPU backend (one shader compilation
//! and weight upload) that encodes the two windows once, one CPU encoder
//! pass of each, and skip re-encoding windows the backend holds already.

mod common;

use lfm::cpu::whisper::{
    self as select, Draw, Picked, RowRule, RuleState, SampleRules, SelectRules, TimestampRules,
};
use lfm::gpu::{Gpu, GpuOptions};
use lfm::models::whisper::gpu::GpuBackend;
use lfm::models::whisper::model::CrossKv;
use lfm::models::whisper::WhisperFiles;
use lfm::run::transcribe::batch::{chunk_features, transcribe_batched};
use lfm::run::transcribe::{transcribe, Backend, CpuBackend, Options, Pick, Picks, Task, Traffic};
use lfm::Result;
use std::path::PathBuf;
use std::sync::{Mutex, MutexGuard, OnceLock};

const CLIPS: &str = "/usr/share/pocketsphinx/test/data/librivox";
/// Window A: the sequential tests' clip; window B: the other batched one.
const CLIP_A: &str = "sense_and_sensibility_01_austen_64kb-0880";
const CLIP_B: &str = "sense_and_sensibility_01_austen_64kb-0870";
/// Sequences the backend holds: beam 5 of one window.
const MAX_SEQS: usize = 5;
const MAX_WINDOWS: usize = 2;

/// The GPU backend, remembering which windows its slots hold; `ahead`
/// false makes greedy search step one token a submission.
struct Shared {
    gpu: GpuBackend,
    held: Vec<Vec<f32>>,
    ahead: bool,
}

impl Backend for Shared {
    fn encode(&mut self, mels: &[&[f32]]) -> Result<()> {
        // Windows already in their slots (a test after another, a second
        // pass over the same clip): their encoder state is on the device.
        let held = mels.len() <= self.held.len()
            && mels.iter().zip(&self.held).all(|(m, h)| *m == h.as_slice());
        if !held {
            self.held.clear();
            let t0 = std::time::Instant::now();
            self.gpu.encode(mels)?;
            eprintln!(
                "gpu encode of {} windows: {:.1} s",
                mels.len(),
                t0.elapsed().as_secs_f64()
            );
            self.held = mels.iter().map(|m| m.to_vec()).collect();
        }
        Ok(())
    }
    fn cross_kv(&mut self, window: usize) -> Result<&CrossKv> {
        self.gpu.cross_kv(window)
    }
    fn prompt(
        &mut self,
        prompts: &[&[u32]],
        probe: Option<(usize, u32)>,
        pick: &Pick,
    ) -> Result<(Vec<f32>, Picks)> {
        self.gpu.prompt(prompts, probe, pick)
    }
    fn select(&mut self, sources: &[usize]) -> Result<()> {
        self.gpu.select(sources)
    }
    fn step(&mut self, tokens: &[u32], pick: &Pick) -> Result<Picks> {
        self.gpu.step(tokens, pick)
    }
    fn greedy_ahead(
        &mut self,
        tokens: &[u32],
        rules: &SelectRules,
        rows: &[RowRule],
        states: &[RuleState],
        timestamps: &TimestampRules,
        n: usize,
    ) -> Result<Option<Vec<Vec<Picked>>>> {
        if !self.ahead {
            return Ok(None);
        }
        self.gpu
            .greedy_ahead(tokens, rules, rows, states, timestamps, n)
    }
    fn traffic(&self) -> Traffic {
        self.gpu.traffic()
    }
}

fn files() -> &'static WhisperFiles {
    static FILES: OnceLock<WhisperFiles> = OnceLock::new();
    FILES.get_or_init(|| WhisperFiles::load(&common::model("whisper-tiny.en"), None).unwrap())
}

fn clip(name: &str) -> Vec<f32> {
    let path = PathBuf::from(CLIPS).join(format!("{name}.wav"));
    lfm::run::audio::load(&path, 16_000).unwrap().samples
}

/// The one GPU backend of this binary, windows A and B encoded in one
/// batch (None: no adapter, and told to skip).
fn backend() -> Option<MutexGuard<'static, Shared>> {
    static BACKEND: OnceLock<Option<Mutex<Shared>>> = OnceLock::new();
    let b = BACKEND.get_or_init(|| {
        let gpu = match Gpu::new(&GpuOptions::default()) {
            Ok(g) => {
                eprintln!("{}", g.describe());
                std::sync::Arc::new(g)
            }
            Err(e) if std::env::var_os("LFM_SKIP_GPU_TESTS").is_some() => {
                eprintln!("SKIPPING GPU tests (LFM_SKIP_GPU_TESTS set): {e}");
                return None;
            }
            Err(e) => {
                panic!("GPU tests need an adapter ({e}); set LFM_SKIP_GPU_TESTS=1 to skip them")
            }
        };
        let t0 = std::time::Instant::now();
        let gpu = GpuBackend::new(gpu, &files().model, MAX_SEQS, MAX_WINDOWS).unwrap();
        eprintln!("gpu backend: {:.1} s", t0.elapsed().as_secs_f64());
        let mut shared = Shared {
            gpu,
            held: Vec::new(),
            ahead: true,
        };
        let r = reference();
        shared.encode(&[&r.windows[0], &r.windows[1]]).unwrap();
        Some(Mutex::new(shared))
    });
    // A test that failed holding the lock leaves a usable backend: the
    // next encode or prompt resets what it depends on.
    b.as_ref()
        .map(|m| m.lock().unwrap_or_else(|e| e.into_inner()))
}

/// Windows A and B, and the CPU encoder's output and cross K/V for each.
struct Reference {
    windows: [Vec<f32>; 2],
    xa: [Vec<f32>; 2],
    cross: [CrossKv; 2],
}

fn reference() -> &'static Reference {
    static REF: OnceLock<Reference> = OnceLock::new();
    REF.get_or_init(|| {
        let files = files();
        let m = &files.model;
        let a = clip(CLIP_A);
        let mel = files.mel.log_mel(&a);
        let window_a = mel.window(0, mel.content_frames());
        // A clip under 30 s alone: the batched pipeline's features are the
        // sequential window's (same frames, same floor).
        assert!(
            chunk_features(&files.mel, &a) == window_a,
            "batched features of {CLIP_A} differ from its sequential window"
        );
        let window_b = chunk_features(&files.mel, &clip(CLIP_B));
        let t0 = std::time::Instant::now();
        let xa_a = m.encoder.forward(&m.config, &window_a);
        let xa_b = m.encoder.forward(&m.config, &window_b);
        let cross = [m.decoder.cross_kv(&xa_a), m.decoder.cross_kv(&xa_b)];
        eprintln!(
            "cpu encoder, two windows: {:.1} s",
            t0.elapsed().as_secs_f64()
        );
        Reference {
            windows: [window_a, window_b],
            xa: [xa_a, xa_b],
            cross,
        }
    })
}

fn normalised_error(got: &[f32], want: &[f32]) -> f64 {
    assert_eq!(got.len(), want.len());
    if let Some(i) = got.iter().position(|v| !v.is_finite()) {
        panic!("element {i} is {}", got[i]);
    }
    let num: f64 = got
        .iter()
        .zip(want)
        .map(|(a, b)| ((a - b) as f64).powi(2))
        .sum();
    let den: f64 = want.iter().map(|&b| (b as f64).powi(2)).sum();
    num / den
}

#[test]
fn gpu_encoder_matches_cpu() {
    let Some(mut backend) = backend() else { return };
    let r = reference();
    backend.encode(&[&r.windows[0], &r.windows[1]]).unwrap();
    // The encoder's own output is the batch's last window's.
    let got = backend.gpu.encoder().output().unwrap();
    let err = normalised_error(&got, &r.xa[1]);
    eprintln!("encoder output: normalised error {err:.3e}");
    // f32 everywhere; the GPU sums in another order and its erf is a
    // rational approximation (~1e-7 relative): four layers of that.
    assert!(err < 1e-8, "encoder output: normalised error {err:.3e}");
    for w in 0..2 {
        let kv = backend.cross_kv(w).unwrap().clone();
        for (l, (g, want)) in kv.kv.iter().zip(&r.cross[w].kv).enumerate() {
            let err = normalised_error(g, want);
            assert!(
                err < 1e-8,
                "window {w}: cross K/V of decoder layer {l}: normalised error {err:.3e}"
            );
        }
    }
}

#[test]
fn gpu_decoder_matches_cpu_over_a_batch_of_windows() {
    let Some(mut gpu) = backend() else { return };
    let files = files();
    let s = &files.tokenizer.specials;
    let r = reference();
    let mut cpu = CpuBackend::with_windows(&files.model, r.cross.to_vec());
    gpu.encode(&[&r.windows[0], &r.windows[1]]).unwrap();
    // A previous-text prompt, so the prompt pass has many rows, one per
    // window; the no-speech probability after its start-of-transcript row.
    let mut prompt = vec![s.sot_prev];
    prompt.extend(
        files
            .tokenizer
            .encode(" He was not an ill disposed")
            .unwrap(),
    );
    let sot = prompt.len();
    prompt.push(s.sot);
    let prompts: [&[u32]; 2] = [&prompt, &prompt];
    let probe = s.no_speech.map(|t| (sot, t)).or(Some((sot, s.eot)));
    let check = |what: &str, got: Picks, want: Picks| {
        let (got, want) = (got.logits(), want.logits());
        let err = normalised_error(&got, &want);
        eprintln!("{what}: normalised error {err:.3e}");
        // f32 on both sides, f16 weights widened alike; sums in another
        // order through four layers and the 51864-wide head: ~1e-12 seen,
        // a wrong row, window or position is O(1).
        assert!(err < 1e-9, "{what}: normalised error {err:.3e}");
    };
    let (gp, g) = gpu.prompt(&prompts, probe, &Pick::Logits).unwrap();
    let (cp, c) = cpu.prompt(&prompts, probe, &Pick::Logits).unwrap();
    check("prompt", g, c);
    for (a, b) in gp.iter().zip(&cp) {
        assert!((a - b).abs() < 1e-5, "probe probability {a} against {b}");
    }
    // Fork into three sequences of window 0 and two of window 1, step,
    // reorder across windows (one dropped, one doubled), step, then keep
    // window 1 alone and step again.
    let steps: [(&[usize], &[u32]); 3] = [
        (&[0, 0, 0, 1, 1], &[s.timestamp_begin, 440, 1544, 373, 50]),
        (&[2, 0, 2, 4], &[373, 407, 13, 11]),
        (&[3], &[50]),
    ];
    for (i, (sources, tokens)) in steps.iter().enumerate() {
        cpu.select(sources).unwrap();
        gpu.select(sources).unwrap();
        check(
            &format!("step {i}"),
            gpu.step(tokens, &Pick::Logits).unwrap(),
            cpu.step(tokens, &Pick::Logits).unwrap(),
        );
    }
    // Sampling (the temperature fallback): draws from the prompt (two a
    // window) and from a step of the forked sequences, at a low and a
    // high temperature: the device's tokens are the CPU sampler's for the
    // same u, exactly (draws it cannot be sure of are drawn on the CPU).
    let vocab = files.model.config.n_vocab;
    let rules = SelectRules {
        vocab,
        timestamp_begin: s.timestamp_begin,
        timestamps: true,
        masks: select::token_masks(vocab, &[s.no_timestamps], &[s.eot]),
    };
    let first = RowRule {
        text_end: s.timestamp_begin,
        ts_from: 0,
        ts_end: vocab as u32,
        flags: select::ROW_FIRST,
        probe: select::NO_TOKEN,
        _pad: [0; 3],
    };
    let mut rng = lfm::util::rng::Rng::new(21);
    for temperature in [0.2f32, 1.0] {
        let draws = |rows: usize, per: usize, rng: &mut lfm::util::rng::Rng| -> Vec<Draw> {
            (0..rows * per)
                .map(|i| Draw {
                    row: (i / per) as u32,
                    u: rng.next_f32(),
                })
                .collect()
        };
        let check = |what: &str, got: Picks, want: Picks| -> Vec<u32> {
            let (got, want) = (got.sampled(), want.sampled());
            for (g, w) in got.iter().zip(&want) {
                assert_eq!(g.token, w.token, "{what} T={temperature}: token");
                // The row's log-sum-exp in another order (the CPU's adds
                // 51,864 terms one after another in f32).
                assert!(
                    (g.logprob - w.logprob).abs() <= 5e-4 + 1e-5 * w.logprob.abs(),
                    "{what} T={temperature}: log probability {} against {}",
                    g.logprob,
                    w.logprob
                );
            }
            got.iter().map(|d| d.token).collect()
        };
        let prompt_draws = draws(2, 2, &mut rng);
        let rows = [first; 2];
        let pick = Pick::Sample {
            rules: SampleRules {
                select: &rules,
                rows: &rows,
                temperature,
            },
            draws: &prompt_draws,
        };
        let (gp, g) = gpu.prompt(&prompts, probe, &pick).unwrap();
        let (cp, c) = cpu.prompt(&prompts, probe, &pick).unwrap();
        for (a, b) in gp.iter().zip(&cp) {
            assert!((a - b).abs() < 1e-5, "probe probability {a} against {b}");
        }
        let tokens = check("prompt", g, c);
        cpu.select(&[0, 0, 1, 1]).unwrap();
        gpu.select(&[0, 0, 1, 1]).unwrap();
        let rows: Vec<RowRule> = tokens
            .iter()
            .map(|&t| RowRule {
                flags: 0,
                text_end: 0,
                ts_from: if t >= s.timestamp_begin { t } else { 0 },
                ..first
            })
            .collect();
        let step_draws = draws(4, 1, &mut rng);
        let pick = Pick::Sample {
            rules: SampleRules {
                select: &rules,
                rows: &rows,
                temperature,
            },
            draws: &step_draws,
        };
        check(
            "step",
            gpu.step(&tokens, &pick).unwrap(),
            cpu.step(&tokens, &pick).unwrap(),
        );
    }
    assert!(
        gpu.select(&[0; 2 * MAX_SEQS + 1]).is_err(),
        "more sequences than the decoder holds"
    );
}

/// faster-whisper's options of gold.json, as ours.
fn gold_options(gold: &serde_json::Value, beam_size: usize) -> Options {
    let o = &gold["options"];
    let f = |k: &str| o[k].as_f64().unwrap() as f32;
    Options {
        language: Some("en".into()),
        task: Task::Transcribe,
        temperatures: o["temperature"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t.as_f64().unwrap() as f32)
            .collect(),
        best_of: o["best_of"].as_u64().unwrap() as usize,
        beam_size,
        patience: f("patience"),
        length_penalty: None,
        compression_ratio_threshold: Some(f("compression_ratio_threshold")),
        logprob_threshold: Some(f("log_prob_threshold")),
        no_speech_threshold: Some(f("no_speech_threshold")),
        max_initial_timestamp: Some(f("max_initial_timestamp")),
        ..Options::default()
    }
}

/// Every segment's tokens, timestamps included.
fn token_ids(t: &lfm::run::transcribe::Transcript) -> Vec<Vec<u64>> {
    t.segments
        .iter()
        .map(|s| s.tokens.iter().map(|t| t.id as u64).collect())
        .collect()
}

#[test]
fn gpu_transcripts_match_faster_whisper() {
    let Some(mut backend) = backend() else { return };
    let gold: serde_json::Value = serde_json::from_slice(
        &std::fs::read(common::repo().join("samples/fixtures/whisper/gold.json")).unwrap(),
    )
    .unwrap();
    let files = files();
    // Clip A greedy and with beam search, sequentially (its window is the
    // one the backend holds first; each new 30 s window would cost lavapipe
    // tens of seconds of encoder, and each beam step five rows of the
    // 51864-wide head).
    for (name, beams) in [(CLIP_A, &[1, 5][..])] {
        let samples = clip(name);
        for &beam in beams {
            let opts = gold_options(&gold, beam);
            let clip = gold["faster_whisper"][format!("beam_size_{beam}")]["clips"]
                .as_array()
                .unwrap()
                .iter()
                .find(|c| c["clip"] == name)
                .unwrap();
            let t0 = std::time::Instant::now();
            let t = transcribe(files, &mut *backend, &samples, &opts, &mut |_, _| Ok(())).unwrap();
            let secs = t0.elapsed().as_secs_f64();
            let want: Vec<Vec<u64>> = clip["segments"]
                .as_array()
                .unwrap()
                .iter()
                .map(|s| {
                    s["tokens"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .map(|t| t.as_u64().unwrap())
                        .collect()
                })
                .collect();
            eprintln!("beam {beam} {name} ({secs:.1} s): {}", t.text.trim());
            assert_eq!(
                t.text.trim(),
                clip["text"].as_str().unwrap().trim(),
                "beam {beam} {name}"
            );
            assert_eq!(token_ids(&t), want, "beam {beam} {name}: tokens");
        }
    }
}

/// Greedy search running several passes a submission (the device feeding
/// its own picks back through `whisper_next`) gives the tokens and log
/// probabilities, bit for bit, of one pass a submission; in fewer
/// submissions.
#[test]
fn greedy_ahead_gives_what_one_step_at_a_time_gives() {
    let Some(mut backend) = backend() else { return };
    let gold: serde_json::Value = serde_json::from_slice(
        &std::fs::read(common::repo().join("samples/fixtures/whisper/gold.json")).unwrap(),
    )
    .unwrap();
    let opts = gold_options(&gold, 1);
    let samples = clip(CLIP_A);
    let mut runs = Vec::new();
    for ahead in [false, true] {
        backend.ahead = ahead;
        let before = backend.traffic().submissions;
        let t = transcribe(files(), &mut *backend, &samples, &opts, &mut |_, _| Ok(()));
        backend.ahead = true;
        let t = t.unwrap();
        let tokens: Vec<(u32, u32)> = t
            .segments
            .iter()
            .flat_map(|s| s.tokens.iter().map(|k| (k.id, k.logprob.to_bits())))
            .collect();
        runs.push((tokens, backend.traffic().submissions - before));
    }
    let ((one, one_subs), (many, many_subs)) = (&runs[0], &runs[1]);
    assert!(one.len() > 8, "too few tokens to run ahead: {}", one.len());
    assert_eq!(many, one, "tokens and log probabilities");
    assert!(
        many_subs < one_subs,
        "{many_subs} submissions ahead against {one_subs} one step at a time"
    );
}

#[test]
fn gpu_batched_transcripts_match_faster_whisper() {
    let Some(mut backend) = backend() else { return };
    let gold: serde_json::Value = serde_json::from_slice(
        &std::fs::read(common::repo().join("samples/fixtures/whisper/batched.json")).unwrap(),
    )
    .unwrap();
    let files = files();
    // Two inputs, one window each, decoded as one batch (the windows the
    // backend holds), against faster-whisper's batched pipeline on each.
    let (a, b) = (clip(CLIP_A), clip(CLIP_B));
    let opts = Options {
        language: Some("en".into()),
        temperatures: vec![0.0],
        ..Options::default()
    };
    let traffic = backend.traffic();
    let t0 = std::time::Instant::now();
    let got = transcribe_batched(files, &mut *backend, &[&a, &b], &opts, None, 2).unwrap();
    let secs = t0.elapsed().as_secs_f64();
    let read = backend.traffic().bytes_read - traffic.bytes_read;
    for (t, name) in got.iter().zip([CLIP_A, CLIP_B]) {
        let want = &gold["cases"][format!("clip {name}")];
        eprintln!("batched {name} ({secs:.1} s): {}", t.text.trim());
        let want_text: String = want
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["text"].as_str().unwrap())
            .collect();
        assert_eq!(t.text, want_text, "batched {name}");
        let want_tokens: Vec<Vec<u64>> = want
            .as_array()
            .unwrap()
            .iter()
            .map(|s| {
                s["tokens"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|t| t.as_u64().unwrap())
                    .collect()
            })
            .collect();
        assert_eq!(token_ids(t), want_tokens, "batched {name}: tokens");
    }
    // The device chose every token: each pass read back a few words a
    // row (the picks), never a row of 51864 logits.
    let tokens: usize = got
        .iter()
        .flat_map(|t| &t.segments)
        .map(|s| s.tokens.len())
        .sum();
    assert!(
        read < 64 * (tokens as u64 + 4),
        "{read} bytes read back for {tokens} tokens"
    );
}
