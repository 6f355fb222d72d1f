//! The VITS port (CPU reference) against onnxruntime running the same Piper
//! ONNX file on the same phoneme ids with the noise scales at 0
//! (samples/fixtures/speak/hello.*, from scripts/fixtures/piper_gold.py).

use lfm::models::vits::{Scales, Vits};
use lfm::util::rng::Rng;
use safetensors::SafeTensors;
use std::path::PathBuf;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

pub struct Gold {
    pub ids: Vec<i64>,
    pub audio: Vec<f32>,
    pub durations: Vec<f32>,
    pub decoder_input: Vec<f32>,
}

pub fn gold() -> Gold {
    let dir = root().join("samples/fixtures/speak");
    let meta: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("hello.json")).unwrap()).unwrap();
    assert_eq!(meta["format_version"], 1);
    assert_eq!(meta["noise_scale"], 0.0);
    assert_eq!(meta["noise_w"], 0.0);
    assert_eq!(meta["length_scale"], 1.0);
    let bytes = std::fs::read(dir.join("hello.safetensors")).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let f32s =
        |name: &str| -> Vec<f32> { bytemuck::pod_collect_to_vec(st.tensor(name).unwrap().data()) };
    Gold {
        ids: serde_json::from_value(meta["ids"].clone()).unwrap(),
        audio: f32s("audio"),
        durations: f32s("durations"),
        decoder_input: f32s("decoder_input"),
    }
}

pub fn voice() -> Vits {
    let p = root().join("samples/models/piper-joe/en_US-joe-medium.onnx");
    assert!(p.exists(), "{} is missing: run scripts/setup", p.display());
    Vits::open(&p).unwrap()
}

/// Largest absolute difference and signal-to-noise ratio in dB.
pub fn compare(got: &[f32], want: &[f32]) -> (f32, f64) {
    assert_eq!(got.len(), want.len(), "length");
    let max = got
        .iter()
        .zip(want)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0, f32::max);
    let sig: f64 = want.iter().map(|v| (*v as f64).powi(2)).sum();
    let noise: f64 = got
        .iter()
        .zip(want)
        .map(|(a, b)| ((a - b) as f64).powi(2))
        .sum();
    (max, 10.0 * (sig / noise.max(1e-30)).log10())
}

const ZERO_NOISE: Scales = Scales {
    noise_scale: 0.0,
    length_scale: 1.0,
    noise_w: 0.0,
};

#[test]
fn cpu_waveform_matches_onnxruntime() {
    let g = gold();
    let v = voice();
    assert_eq!(v.config.sample_rate, 22050);
    let lat = v
        .latent(&g.ids, None, &ZERO_NOISE, &mut Rng::new(0))
        .unwrap();
    let want_d: Vec<usize> = g.durations.iter().map(|&d| d as usize).collect();
    assert_eq!(lat.durations, want_d, "frames per phoneme");
    let (max, snr) = compare(&lat.z, &g.decoder_input);
    eprintln!("decoder input: max abs err {max:.2e}, SNR {snr:.1} dB");
    assert!(max <= 1e-3, "decoder input max abs err {max}");
    let audio = v.dec.forward(&lat.z, lat.frames, None);
    let (max, snr) = compare(&audio, &g.audio);
    eprintln!(
        "audio ({} samples): max abs err {max:.2e}, SNR {snr:.1} dB",
        audio.len()
    );
    // The bar: max abs error <= 1e-3 or SNR >= 40 dB.
    assert!(
        max <= 1e-3 || snr >= 40.0,
        "max abs err {max}, SNR {snr} dB"
    );
}

/// The CPU path decodes a sentence beside the prior and flow of the next:
/// each sentence's audio is, bit for bit, what it gives alone with its own
/// generator, in order; a sentence that fails (here, an id the voice does
/// not have) is reported after the audio of those before it.
#[test]
fn cpu_pipelined_sentences_match_each_sentence_alone() {
    let scales = Scales {
        noise_scale: 0.667,
        length_scale: 1.0,
        noise_w: 0.8,
    };
    let ids = gold().ids;
    let sentences: Vec<Vec<i64>> = [24, 9, ids.len(), 17]
        .iter()
        .map(|&n| ids[..n.min(ids.len())].to_vec())
        .collect();
    let synth =
        lfm::models::vits::Synthesizer::new(voice(), &lfm::device::DeviceChoice::Cpu).unwrap();
    let v = synth.vits();
    let bad = vec![1, 0, v.vocab() as i64 + 5, 0, 2];
    let mut items: Vec<lfm::Result<Vec<i64>>> = sentences.iter().cloned().map(Ok).collect();
    items.push(Ok(bad));
    items.push(Ok(sentences[0].clone()));
    let mut got = Vec::new();
    let err = synth
        .speak(
            items,
            None,
            &scales,
            &mut Rng::new(3),
            &mut |s, audio, _| {
                got.push((s, audio));
                Ok(())
            },
        )
        .expect_err("an id past the voice's vocabulary");
    eprintln!("{err}");
    assert_eq!(
        got.len(),
        sentences.len(),
        "the sentences before the bad one"
    );
    let mut rng = Rng::new(3);
    for (i, (s, (ids, audio))) in sentences.iter().zip(got).enumerate() {
        assert_eq!(&ids, s, "sentence {i} out of order");
        let mut own = lfm::models::vits::sentence_rng(&mut rng);
        let want = v.synthesize(s, None, &scales, &mut own).unwrap();
        assert!(
            same_bits(&audio, &want),
            "sentence {i}: the pipelined audio differs from the sentence alone"
        );
    }
}

/// The GPU generator on onnxruntime's own decoder input: the waveform must
/// meet the same bar as the CPU path.
#[test]
fn gpu_waveform_matches_onnxruntime() {
    use lfm::gpu::{Gpu, GpuOptions};
    let gpu = match Gpu::new(&GpuOptions::default()) {
        Ok(g) => std::sync::Arc::new(g),
        Err(e) if std::env::var_os("LFM_SKIP_GPU_TESTS").is_some() => {
            eprintln!("SKIPPING GPU test (LFM_SKIP_GPU_TESTS set): {e}");
            return;
        }
        Err(e) => panic!("GPU tests need an adapter ({e}); set LFM_SKIP_GPU_TESTS=1 to skip them"),
    };
    eprintln!("{}", gpu.describe());
    let g = gold();
    let v = voice();
    let dec = lfm::models::vits::GpuGenerator::new(gpu, &v.dec).unwrap();
    let frames = g.decoder_input.len() / v.inter_channels();
    let t0 = std::time::Instant::now();
    let audio = dec.forward(&g.decoder_input, frames, None).unwrap();
    let (max, snr) = compare(&audio, &g.audio);
    eprintln!(
        "gpu audio ({} samples, {:.2} s): max abs err {max:.2e}, SNR {snr:.1} dB",
        audio.len(),
        t0.elapsed().as_secs_f64()
    );
    assert!(
        max <= 1e-3 || snr >= 40.0,
        "max abs err {max}, SNR {snr} dB"
    );
}

/// The multi-speaker fixture (scripts/fixtures/piper_multispeaker.py: Piper's
/// own model definition, random weights, exported as Piper exports) and
/// onnxruntime's outputs for every speaker at zero noise.
struct MultiGold {
    ids: Vec<i64>,
    speakers: Vec<(String, u32)>,
    st: Vec<u8>,
}

impl MultiGold {
    fn open() -> MultiGold {
        let dir = root().join("samples/fixtures/speak");
        let meta: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("multi.json")).unwrap())
                .unwrap();
        assert_eq!(meta["format_version"], 1);
        assert_eq!(meta["noise_scale"], 0.0);
        assert_eq!(meta["noise_w"], 0.0);
        let mut speakers: Vec<(String, u32)> = serde_json::from_value::<
            std::collections::BTreeMap<String, u32>,
        >(meta["speakers"].clone())
        .unwrap()
        .into_iter()
        .collect();
        speakers.sort_by_key(|s| s.1);
        MultiGold {
            ids: serde_json::from_value(meta["ids"].clone()).unwrap(),
            speakers,
            st: std::fs::read(dir.join("multi.safetensors")).unwrap(),
        }
    }

    fn f32s(&self, name: &str) -> Vec<f32> {
        let st = SafeTensors::deserialize(&self.st).unwrap();
        bytemuck::pod_collect_to_vec(st.tensor(name).unwrap().data())
    }
}

fn multi_voice() -> Vits {
    Vits::open(&root().join("samples/fixtures/speak/multi.onnx")).unwrap()
}

#[test]
fn multi_speaker_cpu_matches_onnxruntime_for_every_speaker() {
    let g = MultiGold::open();
    let v = multi_voice();
    assert_eq!(v.num_speakers(), 3);
    assert_eq!(v.config.speakers, g.speakers);
    let mut audios = Vec::new();
    for (name, sid) in &g.speakers {
        assert_eq!(v.config.speaker(name).unwrap(), *sid);
        let off = v.speaker_offsets(*sid).unwrap().expect("multi-speaker");
        let lat = v
            .latent(&g.ids, Some(&off), &ZERO_NOISE, &mut Rng::new(0))
            .unwrap();
        let want_d: Vec<usize> = g
            .f32s(&format!("durations.{sid}"))
            .iter()
            .map(|&d| d as usize)
            .collect();
        assert_eq!(lat.durations, want_d, "speaker {name}: frames per phoneme");
        let (max, snr) = compare(&lat.z, &g.f32s(&format!("decoder_input.{sid}")));
        eprintln!("speaker {name}: decoder input max abs err {max:.2e}, SNR {snr:.1} dB");
        assert!(
            max <= 1e-3,
            "speaker {name}: decoder input max abs err {max}"
        );
        let audio = v.dec.forward(&lat.z, lat.frames, Some(off.dec.as_slice()));
        let want = g.f32s(&format!("audio.{sid}"));
        let (max, snr) = compare(&audio, &want);
        eprintln!("speaker {name}: audio max abs err {max:.2e}, SNR {snr:.1} dB");
        assert!(
            max <= 1e-3 || snr >= 40.0,
            "speaker {name}: max abs err {max}, SNR {snr} dB"
        );
        audios.push(want);
    }
    // The speakers really differ, by far more than the tolerance (else the
    // test above would prove little).
    for (a, b) in [(0, 1), (1, 2), (0, 2)] {
        let n = audios[a].len().min(audios[b].len());
        let (max, snr) = compare(&audios[a][..n], &audios[b][..n]);
        eprintln!("speakers {a} and {b}: max abs difference {max:.2e}, SNR {snr:.1} dB");
        assert!(max > 1e-2, "speakers {a} and {b} sound the same");
    }
    assert!(v.speaker_offsets(3).is_err());
}

#[test]
fn multi_speaker_gpu_generator_matches_onnxruntime() {
    let Some(gpu) = gpu_or_skip() else { return };
    let g = MultiGold::open();
    let v = multi_voice();
    let dec = lfm::models::vits::GpuGenerator::new(gpu, &v.dec).unwrap();
    for (name, sid) in &g.speakers {
        let off = v.speaker_offsets(*sid).unwrap().unwrap();
        let z = g.f32s(&format!("decoder_input.{sid}"));
        let audio = dec
            .forward(&z, z.len() / v.inter_channels(), Some(off.dec.as_slice()))
            .unwrap();
        let (max, snr) = compare(&audio, &g.f32s(&format!("audio.{sid}")));
        eprintln!("gpu speaker {name}: audio max abs err {max:.2e}, SNR {snr:.1} dB");
        assert!(
            max <= 1e-3 || snr >= 40.0,
            "speaker {name}: max abs err {max}, SNR {snr} dB"
        );
    }
}

fn gpu_or_skip() -> Option<std::sync::Arc<lfm::gpu::Gpu>> {
    use lfm::gpu::{Gpu, GpuOptions};
    match Gpu::new(&GpuOptions::default()) {
        Ok(g) => Some(std::sync::Arc::new(g)),
        Err(e) if std::env::var_os("LFM_SKIP_GPU_TESTS").is_some() => {
            eprintln!("SKIPPING GPU test (LFM_SKIP_GPU_TESTS set): {e}");
            None
        }
        Err(e) => panic!("GPU tests need an adapter ({e}); set LFM_SKIP_GPU_TESTS=1 to skip them"),
    }
}

/// The flow on the GPU against the CPU flow, on a noisy prior (seeded),
/// for the real voice and for every speaker of the multi-speaker one.
#[test]
fn gpu_flow_matches_the_cpu_flow() {
    let Some(gpu) = gpu_or_skip() else { return };
    let scales = Scales {
        noise_scale: 0.667,
        length_scale: 1.0,
        noise_w: 0.8,
    };
    let ids = gold().ids;
    let multi = multi_voice();
    let joe = voice();
    let mut cases: Vec<(&Vits, Option<u32>)> = vec![(&joe, None)];
    cases.extend((0..3).map(|s| (&multi, Some(s))));
    for (v, speaker) in cases {
        let off = speaker.and_then(|s| v.speaker_offsets(s).unwrap());
        let prior = v
            .prior(&ids, off.as_ref(), &scales, &mut Rng::new(7))
            .unwrap();
        let mut want = prior.z.clone();
        v.flow_reverse(&mut want, prior.frames, off.as_ref());
        let flow = lfm::models::vits::GpuFlow::new(gpu.clone(), v).unwrap();
        let got = flow.forward(&prior.z, prior.frames, off.as_ref()).unwrap();
        let (max, snr) = compare(&got, &want);
        eprintln!("gpu flow, speaker {speaker:?}: max abs err {max:.2e}, SNR {snr:.1} dB");
        // 4 couplings of 4 WaveNet layers in f32 with sums in another order:
        // the decoder input test above holds the CPU to 1e-3 of onnxruntime.
        assert!(max <= 1e-3, "speaker {speaker:?}: max abs err {max}");
    }
}

/// The whole graph on the GPU (prior, flow, generator) at zero noise
/// against onnxruntime's waveform, for the real voice and every speaker of
/// the multi-speaker one.
#[test]
fn gpu_voice_matches_onnxruntime() {
    let Some(gpu) = gpu_or_skip() else { return };
    let g = gold();
    let v = voice();
    let gv = lfm::models::vits::GpuVoice::new(gpu.clone(), &v).unwrap();
    let (audio, _) = gv
        .synthesize(&v, &g.ids, None, &ZERO_NOISE, &Rng::new(0))
        .unwrap();
    let (max, snr) = compare(&audio, &g.audio);
    eprintln!("gpu voice: max abs err {max:.2e}, SNR {snr:.1} dB");
    assert!(
        max <= 1e-3 || snr >= 40.0,
        "max abs err {max}, SNR {snr} dB"
    );
    let m = MultiGold::open();
    let v = multi_voice();
    let gv = lfm::models::vits::GpuVoice::new(gpu, &v).unwrap();
    for (name, sid) in &m.speakers {
        let off = v.speaker_offsets(*sid).unwrap();
        let (audio, _) = gv
            .synthesize(&v, &m.ids, off.as_ref(), &ZERO_NOISE, &Rng::new(0))
            .unwrap();
        let (max, snr) = compare(&audio, &m.f32s(&format!("audio.{sid}")));
        eprintln!("gpu voice, speaker {name}: max abs err {max:.2e}, SNR {snr:.1} dB");
        assert!(
            max <= 1e-3 || snr >= 40.0,
            "speaker {name}: max abs err {max}, SNR {snr} dB"
        );
    }
}

/// The prior on the GPU against the CPU's, stage by stage, with noise
/// (seeded): the text encoder's statistics and the duration predictor's
/// log-durations on the same duration noise, then the latent z_p after
/// length regulation (same durations, same noise), for the real voice and
/// every speaker of the multi-speaker one.
#[test]
fn gpu_prior_matches_the_cpu_prior() {
    let Some(gpu) = gpu_or_skip() else { return };
    let scales = Scales {
        noise_scale: 0.667,
        length_scale: 1.0,
        noise_w: 0.8,
    };
    let ids = gold().ids;
    let multi = multi_voice();
    let joe = voice();
    let mut cases: Vec<(&Vits, Option<u32>)> = vec![(&joe, None)];
    cases.extend((0..3).map(|s| (&multi, Some(s))));
    for (v, speaker) in cases {
        let off = speaker.and_then(|s| v.speaker_offsets(s).unwrap());
        let gv = lfm::models::vits::GpuVoice::new(gpu.clone(), v).unwrap();
        let mut rng = Rng::new(9);
        let noise: Vec<f32> = (0..2 * ids.len())
            .map(|_| rng.normal() * scales.noise_w)
            .collect();
        let (stats, logw) = v.encode(&ids, off.as_ref(), noise.clone()).unwrap();
        let (gstats, glogw) = gv.prior.encode(v, &ids, &noise, off.as_ref()).unwrap();
        let gstats = gpu.read_f32(&gstats).unwrap();
        let (max_s, snr_s) = compare(&gstats[..stats.len()], &stats);
        let (max_w, snr_w) = compare(&glogw, &logw);
        eprintln!(
            "gpu prior, speaker {speaker:?}: encoder stats max abs err {max_s:.2e} \
             (SNR {snr_s:.1} dB), log-durations {max_w:.2e} (SNR {snr_w:.1} dB)"
        );
        // 6 transformer layers and 3 spline flows in f32 with sums in
        // another order; the CPU itself is held to 1e-3 of onnxruntime on
        // the decoder's input.
        assert!(
            max_s <= 1e-4,
            "speaker {speaker:?}: stats max abs err {max_s}"
        );
        assert!(
            max_w <= 1e-4,
            "speaker {speaker:?}: log-durations max abs err {max_w}"
        );
        let want = v
            .prior(&ids, off.as_ref(), &scales, &mut Rng::new(7))
            .unwrap();
        let got = gv
            .prior(v, &ids, off.as_ref(), &scales, &Rng::new(7))
            .unwrap();
        assert_eq!(
            got.durations, want.durations,
            "speaker {speaker:?}: durations"
        );
        let (max, snr) = compare(&got.z, &want.z);
        eprintln!("gpu prior, speaker {speaker:?}: z_p max abs err {max:.2e}, SNR {snr:.1} dB");
        assert!(max <= 1e-4, "speaker {speaker:?}: z_p max abs err {max}");
    }
}

/// Whether two sounds are the same samples, bit for bit.
fn same_bits(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
}

/// What `gv.speak` emits for `sentences`, the text's generator seeded with
/// `seed`: each sentence with its audio, in the order they came out.
fn speak_all(
    gv: &lfm::models::vits::GpuVoice,
    v: &Vits,
    sentences: &[Vec<i64>],
    scales: &Scales,
    seed: u64,
) -> Vec<(Vec<i64>, Vec<f32>)> {
    let mut out = Vec::new();
    gv.speak(
        v,
        &mut sentences.iter().cloned().map(Ok),
        None,
        scales,
        &mut Rng::new(seed),
        &mut |s, audio, _| {
            out.push((s, audio));
            Ok(())
        },
    )
    .unwrap();
    out
}

/// A text's sentences pipelined on the GPU (the priors of the next ones
/// queued behind this one's audio) give, bit for bit, what each sentence
/// gives alone with its own generator, in order.
#[test]
fn gpu_pipelined_sentences_match_each_sentence_alone() {
    let Some(gpu) = gpu_or_skip() else { return };
    let scales = Scales {
        noise_scale: 0.667,
        length_scale: 1.0,
        noise_w: 0.8,
    };
    let v = voice();
    let ids = gold().ids;
    // More sentences than the pipeline keeps ahead, of different lengths.
    let sentences: Vec<Vec<i64>> = [24, 9, ids.len(), 17, 31]
        .iter()
        .map(|&n| ids[..n.min(ids.len())].to_vec())
        .collect();
    let gv = lfm::models::vits::GpuVoice::new(gpu, &v).unwrap();
    let got = speak_all(&gv, &v, &sentences, &scales, 3);
    let mut rng = Rng::new(3);
    assert_eq!(got.len(), sentences.len());
    for (i, (s, (ids, audio))) in sentences.iter().zip(got).enumerate() {
        assert_eq!(&ids, s, "sentence {i} out of order");
        let own = lfm::models::vits::sentence_rng(&mut rng);
        let (want, _) = gv.synthesize(&v, s, None, &scales, &own).unwrap();
        assert!(
            same_bits(&audio, &want),
            "sentence {i}: the pipelined audio differs from the sentence alone"
        );
    }
}

/// A sentence whose frames outgrow the buffers it was first given is run
/// again with buffers of its size: the same noise, so the same audio, bit
/// for bit, alone and in the pipeline; and one past what the adapter (or
/// the CPU reference) takes is refused with an error, not a panic.
#[test]
fn gpu_sentences_past_their_first_buffers_are_run_again_with_the_same_audio() {
    let Some(gpu) = gpu_or_skip() else { return };
    let scales = Scales {
        noise_scale: 0.667,
        length_scale: 1.0,
        noise_w: 0.8,
    };
    let v = voice();
    let ids = gold().ids;
    let roomy = lfm::models::vits::GpuVoice::new(gpu.clone(), &v).unwrap();
    // One frame a phoneme id: every sentence needs more. Each alone (in a
    // group the sentences share the buffers the longest is given).
    let tight = lfm::models::vits::GpuVoice::new(gpu, &v)
        .unwrap()
        .with_first_frames(0.0, 1)
        .with_batch(1);
    let rng = Rng::new(5);
    let (want, _) = roomy.synthesize(&v, &ids, None, &scales, &rng).unwrap();
    assert_eq!(
        roomy.reruns(),
        0,
        "the default buffers hold the fixture sentence"
    );
    let (got, _) = tight.synthesize(&v, &ids, None, &scales, &rng).unwrap();
    assert_eq!(tight.reruns(), 1);
    assert!(same_bits(&got, &want), "the rerun sentence's audio differs");
    let sentences: Vec<Vec<i64>> = [ids.len(), 9, 24]
        .iter()
        .map(|&n| ids[..n].to_vec())
        .collect();
    let a = speak_all(&roomy, &v, &sentences, &scales, 8);
    let b = speak_all(&tight, &v, &sentences, &scales, 8);
    assert_eq!(tight.reruns(), 1 + sentences.len());
    for (i, ((_, a), (_, b))) in a.iter().zip(&b).enumerate() {
        assert!(same_bits(a, b), "sentence {i}: the rerun audio differs");
    }

    // Frames far past what either path takes: errors that say so.
    let slow = Scales {
        length_scale: 1e4,
        ..scales
    };
    let e = roomy
        .synthesize(&v, &ids, None, &slow, &Rng::new(5))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("frames") && e.contains("GPU") && e.contains("shorter sentences"),
        "{e}"
    );
    let e = v
        .synthesize(&ids, None, &slow, &mut Rng::new(5))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("frames") && e.contains("shorter sentences"),
        "{e}"
    );
}

/// In a group of sentences run in the same dispatches, one that outgrows
/// the group's buffers is run again alone while the others keep the
/// group's results: every sentence's audio is, bit for bit, what it is
/// alone, and only that one is run again. With groups of one, the same.
#[test]
fn gpu_batched_sentences_with_one_past_the_buffers_match_each_sentence_alone() {
    let Some(gpu) = gpu_or_skip() else { return };
    let scales = Scales {
        noise_scale: 0.667,
        length_scale: 1.0,
        noise_w: 0.8,
    };
    let v = voice();
    let ids = gold().ids;
    // The first runs alone; the group after it holds the long one.
    let sentences: Vec<Vec<i64>> = [9, ids.len(), 17, 24]
        .iter()
        .map(|&n| ids[..n].to_vec())
        .collect();
    let roomy = lfm::models::vits::GpuVoice::new(gpu.clone(), &v).unwrap();
    let mut rng = Rng::new(11);
    let mut alone = Vec::new();
    let mut frames = Vec::new();
    for s in &sentences {
        let own = lfm::models::vits::sentence_rng(&mut rng);
        frames.push(roomy.prior(&v, s, None, &scales, &own).unwrap().frames);
        alone.push(roomy.synthesize(&v, s, None, &scales, &own).unwrap().0);
    }
    // Buffers of as many frames as the short ones need, for every sentence.
    let most_short = frames
        .iter()
        .enumerate()
        .filter(|&(i, _)| i != 1)
        .map(|(_, f)| *f)
        .max();
    let most_short = most_short.unwrap();
    assert!(frames[1] > most_short, "frames {frames:?}");
    for batch in [4, 1] {
        let tight = lfm::models::vits::GpuVoice::new(gpu.clone(), &v)
            .unwrap()
            .with_first_frames(0.0, most_short)
            .with_batch(batch);
        let got = speak_all(&tight, &v, &sentences, &scales, 11);
        assert_eq!(tight.reruns(), 1, "batch {batch}: only the long sentence");
        assert_eq!(got.len(), sentences.len());
        for (i, ((_, a), b)) in got.iter().zip(&alone).enumerate() {
            assert!(
                same_bits(a, b),
                "batch {batch}, sentence {i}: differs from the sentence alone"
            );
        }
    }
}
