//! Parity cases for the speech kernels in `gpu::speech` (VITS / HiFi-GAN).

use super::{assert_close, Case, SIZES};
use lfm::cpu::{self, Conv1dShape, ConvTranspose1dShape};
use lfm::gpu::speech::{self, Conv1dExtras, FrameCount, Geometry, InputAct, Steps};
use lfm::gpu::{Gpu, Variant};
use lfm::util::rng::Rng;

pub const CASES: &[Case] = &[
    Case {
        kernel: "conv1d",
        run: conv1d,
    },
    Case {
        kernel: "conv_transpose1d",
        run: conv_transpose1d,
    },
    Case {
        kernel: "wavenet_gate",
        run: wavenet_gate,
    },
    Case {
        kernel: "layer_norm_channels",
        run: layer_norm_channels,
    },
    Case {
        kernel: "conv1d_depthwise",
        run: conv1d_depthwise,
    },
    Case {
        kernel: "rel_attention",
        run: rel_attention,
    },
    Case {
        kernel: "spline_inverse",
        run: spline_inverse,
    },
    Case {
        kernel: "embed_channels",
        run: embed_channels,
    },
    Case {
        kernel: "expand_prior",
        run: expand_prior,
    },
    Case {
        kernel: "durations",
        run: durations,
    },
];

/// The two ways a kernel over a sentence's frames learns its length: fixed
/// when recorded (`None`), or from a frame count on the device (here
/// written by the host), with buffers made for more frames and the
/// dispatch sized on the device. For a length of `t` steps, the count and
/// the steps as frames * mul + add: odd lengths as 2 frames - 1, to cover
/// an affine length.
fn frame_count(gpu: &Gpu, t: usize, on_device: bool) -> Option<(FrameCount, u32, i32)> {
    if !on_device {
        return None;
    }
    let (frames, mul, add) = if t % 2 == 1 {
        (t.div_ceil(2), 2, -1)
    } else {
        (t, 1, 0)
    };
    Some((
        FrameCount::known(gpu, &[frames], frames + 5).unwrap(),
        mul,
        add,
    ))
}

/// The steps `count` gives (see [`frame_count`]), or `t` fixed.
fn steps(count: &Option<(FrameCount, u32, i32)>, t: usize) -> Steps<'_> {
    match count {
        Some((c, mul, add)) => c.steps(*mul, *add),
        None => Steps::fixed(t),
    }
}

/// Runs `d` after writing the count's geometries, and reads `y`: the first
/// `n` values, checked to be all there is when the buffer holds more (the
/// kernel wrote nothing past the sentence's frames).
fn run_and_read(
    gpu: &Gpu,
    d: &lfm::gpu::ops::Dispatch,
    count: &Option<(FrameCount, u32, i32)>,
    y: &wgpu::Buffer,
    n: usize,
    what: &str,
) -> Vec<f32> {
    if let Some((c, _, _)) = count {
        c.finish(gpu);
    }
    gpu.run_all(&[d]).unwrap();
    let mut got = gpu.read_f32(y).unwrap();
    if let Some(i) = got[n..].iter().position(|v| !v.is_nan()) {
        panic!("{what}: wrote element {} past the {n} of its frames", n + i);
    }
    got.truncate(n);
    got
}

fn layer_norm_channels(gpu: &Gpu, _v: &Variant) {
    let mut rng = Rng::new(21);
    for (ci, &c) in [1usize, 7, 192].iter().enumerate() {
        for &t in &SIZES[..9] {
            // An offset mean, so the two-pass variance matters.
            let x: Vec<f32> = rng.vec(c * t, -2.0, 2.0).iter().map(|v| v + 3.0).collect();
            let gamma = rng.vec(c, 0.5, 1.5);
            let beta = rng.vec(c, -0.5, 0.5);
            let res = rng.vec(c * t, -1.0, 1.0);
            let (gelu, with_res) = [(false, false), (true, false), (true, true)][(ci + t) % 3];
            let mut want = vec![0.0; c * t];
            let r = with_res.then_some(res.as_slice());
            cpu::layer_norm_channels(&x, &gamma, &beta, 1e-5, t, gelu, r, &mut want);
            let gx = gpu.upload_f32("x", &x).unwrap();
            let gg = gpu.upload_f32("gamma", &gamma).unwrap();
            let gb = gpu.upload_f32("beta", &beta).unwrap();
            let gr = gpu.upload_f32("res", &res).unwrap();
            let gy = gpu.poisoned_f32("y", c * t).unwrap();
            let d = speech::layer_norm_channels(
                gpu,
                &gx,
                &gg,
                &gb,
                with_res.then_some(&gr),
                &gy,
                c,
                Steps::fixed(t),
                1e-5,
                gelu,
            )
            .unwrap();
            gpu.run_all(&[&d]).unwrap();
            let got = gpu.read_f32(&gy).unwrap();
            // Same sums in the same order; a GPU sqrt and the f32 erf of
            // erf.wgsl (1.4e-7 absolute) against the CPU's f64 one, squared.
            // c = 1 normalises to beta exactly (x - mean = 0).
            assert_close(
                &format!("layer_norm_channels c={c} t={t} gelu={gelu} res={with_res}"),
                &got[..c * t],
                &want,
                1e-11,
            );
        }
    }
    let (c, gelu) = (7, true);
    let gamma = rng.vec(c, 0.5, 1.5);
    let beta = rng.vec(c, -0.5, 0.5);
    let (gg, gb) = (
        gpu.upload_f32("gamma", &gamma).unwrap(),
        gpu.upload_f32("beta", &beta).unwrap(),
    );
    batched(
        gpu,
        "layer_norm_channels",
        &mut rng,
        c,
        c,
        1,
        &|st| st,
        &|x, e, y, st| {
            speech::layer_norm_channels(gpu, x, &gg, &gb, e.first(), y, c, st, 1e-5, gelu).unwrap()
        },
        &|x, e, t| {
            let mut want = vec![0.0; c * t];
            cpu::layer_norm_channels(x, &gamma, &beta, 1e-5, t, gelu, Some(&e[0]), &mut want);
            want
        },
        // As the single-sentence case.
        1e-11,
    );
}

fn conv1d_depthwise(gpu: &Gpu, _v: &Variant) {
    let mut rng = Rng::new(22);
    // (channels, kernel, dilation): DDSConv's layers (kernel 3, dilation
    // 3^i, "same" padding), and a 1-tap and an even kernel.
    for &(c, kernel, dilation) in &[(5, 3, 1), (33, 3, 9), (4, 1, 1), (3, 4, 2)] {
        let pad = (kernel * dilation - dilation) / 2;
        let s = Conv1dShape {
            c_in: c,
            c_out: c,
            kernel,
            dilation,
            pad_left: pad,
            pad_right: pad,
            groups: c,
        };
        for &t in &SIZES[..9] {
            let t_out = s.t_out(t);
            if t_out == 0 {
                continue;
            }
            let x = rng.vec(c * t, -2.0, 2.0);
            let w = rng.vec(c * kernel, -0.5, 0.5);
            let b = rng.vec(c, -0.5, 0.5);
            let mut want = vec![0.0; c * t_out];
            cpu::conv1d(&x, t, &w, Some(&b), &s, &mut want);
            let gx = gpu.upload_f32("x", &x).unwrap();
            let gw = gpu.upload_f32("w", &w).unwrap();
            let gb = gpu.upload_f32("b", &b).unwrap();
            let gy = gpu.poisoned_f32("y", c * t_out).unwrap();
            let d = speech::conv1d_depthwise(gpu, &gx, &gw, &gb, &gy, &s, Steps::fixed(t)).unwrap();
            gpu.run_all(&[&d]).unwrap();
            let got = gpu.read_f32(&gy).unwrap();
            // At most 4 products and a bias, maybe in another order.
            assert_close(
                &format!("conv1d_depthwise {s:?} t={t}"),
                &got[..c * t_out],
                &want,
                1e-12,
            );
        }
    }
    let (c, kernel, dilation) = (5, 3, 3);
    let s = Conv1dShape {
        c_in: c,
        c_out: c,
        kernel,
        dilation,
        pad_left: dilation,
        pad_right: dilation,
        groups: c,
    };
    let w = rng.vec(c * kernel, -0.5, 0.5);
    let b = rng.vec(c, -0.5, 0.5);
    let (gw, gb) = (
        gpu.upload_f32("w", &w).unwrap(),
        gpu.upload_f32("b", &b).unwrap(),
    );
    batched(
        gpu,
        &format!("conv1d_depthwise {s:?}"),
        &mut rng,
        c,
        c,
        0,
        &|st| st.conv(&s),
        &|x, _, y, st| speech::conv1d_depthwise(gpu, x, &gw, &gb, y, &s, st).unwrap(),
        &|x, _, t| {
            let mut want = vec![0.0; c * s.t_out(t)];
            cpu::conv1d(x, t, &w, Some(&b), &s, &mut want);
            want
        },
        // As the single-sentence case.
        1e-12,
    );
}

/// [rows, cols] -> [cols, rows]
fn transpose(x: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    let mut y = vec![0.0; x.len()];
    for r in 0..rows {
        for c in 0..cols {
            y[c * rows + r] = x[r * cols + c];
        }
    }
    y
}

fn rel_attention(gpu: &Gpu, _v: &Variant) {
    let mut rng = Rng::new(23);
    // (heads, dk, window): Piper's (2 x 96, window 4) and smaller heads,
    // a window wider than short sequences, a head wider than the workgroup.
    for &(heads, dk, window) in &[(2, 96, 4), (3, 5, 1), (1, 7, 10), (1, 130, 2)] {
        for &t in &[1usize, 5, 33, 64, 65, 132] {
            let c = heads * dk;
            let qkv = rng.vec(3 * c * t, -2.0, 2.0);
            let rel_k = rng.vec((2 * window + 1) * dk, -1.0, 1.0);
            let rel_v = rng.vec((2 * window + 1) * dk, -1.0, 1.0);
            let rows = |i: usize| transpose(&qkv[i * c * t..(i + 1) * c * t], c, t);
            let want = transpose(
                &cpu::rel_position_attention(
                    &rows(0),
                    &rows(1),
                    &rows(2),
                    &rel_k,
                    &rel_v,
                    heads,
                    t,
                ),
                t,
                c,
            );
            let gq = gpu.upload_f32("qkv", &qkv).unwrap();
            let gk = gpu.upload_f32("rel_k", &rel_k).unwrap();
            let gv = gpu.upload_f32("rel_v", &rel_v).unwrap();
            let t_fixed = Steps::fixed(t);
            let scores = gpu
                .scratch(
                    "scores",
                    speech::rel_attention_scratch_bytes(heads, t_fixed),
                )
                .unwrap();
            let gy = gpu.poisoned_f32("y", c * t).unwrap();
            let d =
                speech::rel_attention(gpu, &gq, &gk, &gv, &scores, &gy, heads, dk, window, t_fixed)
                    .unwrap();
            gpu.run_all(&[&d]).unwrap();
            let got = gpu.read_f32(&gy).unwrap();
            // Dot products of up to 130 terms in another order, an exp per
            // score and sums over up to 132 keys: a few ulps, squared.
            assert_close(
                &format!("rel_attention heads={heads} dk={dk} window={window} t={t}"),
                &got[..c * t],
                &want,
                1e-10,
            );
        }
    }
    // Each sentence attends to its own steps only.
    let (heads, dk, window) = (2, 5, 2);
    let c = heads * dk;
    let rel_k = rng.vec((2 * window + 1) * dk, -1.0, 1.0);
    let rel_v = rng.vec((2 * window + 1) * dk, -1.0, 1.0);
    let (gk, gv) = (
        gpu.upload_f32("rel_k", &rel_k).unwrap(),
        gpu.upload_f32("rel_v", &rel_v).unwrap(),
    );
    batched(
        gpu,
        "rel_attention",
        &mut rng,
        3 * c,
        c,
        0,
        &|st| st,
        &|x, _, y, st| {
            let scores = gpu
                .scratch("scores", speech::rel_attention_scratch_bytes(heads, st))
                .unwrap();
            speech::rel_attention(gpu, x, &gk, &gv, &scores, y, heads, dk, window, st).unwrap()
        },
        &|x, _, t| {
            let rows = |i: usize| transpose(&x[i * c * t..(i + 1) * c * t], c, t);
            let y =
                cpu::rel_position_attention(&rows(0), &rows(1), &rows(2), &rel_k, &rel_v, heads, t);
            transpose(&y, t, c)
        },
        // As the single-sentence case.
        1e-10,
    );
}

fn spline_inverse(gpu: &Gpu, _v: &Variant) {
    let mut rng = Rng::new(24);
    // Piper's 10 bins, one bin, and the most the kernel takes.
    for &bins in &[10usize, 1, speech::SPLINE_MAX_BINS] {
        for &t in &SIZES[..9] {
            // Inputs on both sides of the tails (|x| > 5 passes through).
            let x = rng.vec(t, -6.0, 6.0);
            let h = rng.vec((3 * bins - 1) * t, -3.0, 3.0);
            let norm = 1.0 / (192.0f32).sqrt();
            let mut want = vec![0.0; t];
            cpu::spline_inverse_rows(&x, &h, norm, &mut want);
            let gx = gpu.upload_f32("x", &x).unwrap();
            let gh = gpu.upload_f32("h", &h).unwrap();
            let gy = gpu.poisoned_f32("y", t).unwrap();
            let d =
                speech::spline_inverse(gpu, &gx, &gh, &gy, bins, Steps::fixed(t), norm).unwrap();
            gpu.run_all(&[&d]).unwrap();
            let got = gpu.read_f32(&gy).unwrap();
            // Softmaxes of exps, a softplus and a square root: a few ulps of
            // each knot, carried through one quadratic's root, squared.
            assert_close(
                &format!("spline_inverse bins={bins} t={t}"),
                &got[..t],
                &want,
                1e-10,
            );
        }
    }
    // The spline's parameters as the batch's x, the values it inverts as
    // an input shaped as y.
    let bins = 10;
    let norm = 1.0 / (192.0f32).sqrt();
    batched(
        gpu,
        "spline_inverse",
        &mut rng,
        3 * bins - 1,
        1,
        1,
        &|st| st,
        &|h, e, y, st| speech::spline_inverse(gpu, &e[0], h, y, bins, st, norm).unwrap(),
        &|h, e, t| {
            let mut want = vec![0.0; t];
            cpu::spline_inverse_rows(&e[0], h, norm, &mut want);
            want
        },
        // As the single-sentence case.
        1e-10,
    );
}

fn embed_channels(gpu: &Gpu, _v: &Variant) {
    let mut rng = Rng::new(27);
    for &(vocab, hidden) in &[(1usize, 1usize), (7, 5), (256, 192)] {
        let table = rng.vec(vocab * hidden, -3.0, 3.0);
        let gt = gpu.upload_f32("table", &table).unwrap();
        for &t in SIZES {
            // Repeated ids and the last row of the table included.
            let ids: Vec<u32> = (0..t)
                .map(|i| {
                    if i % 5 == 0 {
                        vocab as u32 - 1
                    } else {
                        (rng.uniform(0.0, vocab as f32) as u32).min(vocab as u32 - 1)
                    }
                })
                .collect();
            let scale = (hidden as f32).sqrt();
            let want = cpu::embed_channels(&table, hidden, &ids, scale);
            let gi = gpu.upload_u32("ids", &ids).unwrap();
            let gy = gpu.poisoned_f32("y", hidden * t).unwrap();
            let d =
                speech::embed_channels(gpu, &gt, &gi, &gy, hidden, Steps::fixed(t), scale).unwrap();
            gpu.run_all(&[&d]).unwrap();
            let got = gpu.read_f32(&gy).unwrap();
            // One product: the same bits.
            assert_close(
                &format!("embed_channels vocab={vocab} hidden={hidden} t={t}"),
                &got[..hidden * t],
                &want,
                0.0,
            );
        }
    }
    // A batch in one dispatch: each sentence's ids at its index times the
    // cap, its y there too; the third given 0 steps (nothing runs for it).
    let (vocab, hidden, cap) = (7, 5, 40);
    let table = rng.vec(vocab * hidden, -3.0, 3.0);
    let gt = gpu.upload_f32("table", &table).unwrap();
    let lengths = [7usize, 33, 1, 12];
    let ids: Vec<Vec<u32>> = lengths
        .iter()
        .map(|&t| {
            (0..t)
                .map(|_| (rng.uniform(0.0, vocab as f32) as u32).min(vocab as u32 - 1))
                .collect()
        })
        .collect();
    let mut laid = vec![u32::MAX; cap * lengths.len()];
    for (s, i) in ids.iter().enumerate() {
        laid[s * cap..s * cap + i.len()].copy_from_slice(i);
    }
    let count = FrameCount::known(gpu, &lengths, cap).unwrap();
    let empty = 2;
    let mut lens: Vec<u32> = lengths.iter().flat_map(|&f| [f as u32; 2]).collect();
    lens[2 * empty] = 0;
    gpu.queue
        .write_buffer(&count.lens, 0, bytemuck::cast_slice(&lens));
    let gi = gpu.upload_u32("ids", &laid).unwrap();
    let gy = gpu.poisoned_f32("y", hidden * cap * lengths.len()).unwrap();
    let d = speech::embed_channels(gpu, &gt, &gi, &gy, hidden, count.steps(1, 0), 1.5).unwrap();
    count.finish(gpu);
    gpu.run_all(&[&d]).unwrap();
    let got = gpu.read_f32(&gy).unwrap();
    for (s, i) in ids.iter().enumerate() {
        let mine = &got[s * hidden * cap..(s + 1) * hidden * cap];
        let what = format!("embed_channels, batched sentence {s} of {} ids", i.len());
        let n = if s == empty { 0 } else { hidden * i.len() };
        if let Some(k) = mine[n..].iter().position(|v| !v.is_nan()) {
            panic!("{what}: wrote element {} past its {n}", n + k);
        }
        // One product: the same bits as the CPU's (and so as alone).
        let want = cpu::embed_channels(&table, hidden, i, 1.5);
        assert_close(&what, &mine[..n], &want[..n], 0.0);
    }
}

fn expand_prior(gpu: &Gpu, _v: &Variant) {
    let mut rng = Rng::new(25);
    let channels = 6;
    for &t in &[1usize, 5, 33, 132] {
        for on_device in [false, true] {
            // 0 to 4 frames a phoneme, at least one frame.
            let mut durations: Vec<u32> = (0..t)
                .map(|_| (rng.uniform(0.0, 5.0) as u32).min(4))
                .collect();
            durations[t / 2] += 1;
            let idx = cpu::frame_phonemes(&durations);
            let frames = idx.len();
            let stats = rng.vec(2 * channels * t, -2.0, 2.0);
            // More noise than the frames need: the kernel reads the start.
            let noise = rng.vec(channels * (frames + 9), -3.0, 3.0);
            let want = cpu::expand_prior(&stats, t, &idx, &noise[..channels * frames], 0.667);
            let gs = gpu.upload_f32("stats", &stats).unwrap();
            let ge = gpu
                .upload_u32("ends", &cpu::frame_ends(&durations))
                .unwrap();
            let gn = gpu.upload_f32("noise", &noise).unwrap();
            // The two halves of the channels, as the voice writes the flow's input.
            for (ch0, c) in [(0, 3), (3, 3), (0, channels)] {
                let count = frame_count(gpu, frames, on_device);
                let f = steps(&count, frames);
                let gy = gpu.poisoned_f32("y", c * f.max().max(frames)).unwrap();
                let d = speech::expand_prior(
                    gpu,
                    (&gs, 0),
                    &ge,
                    &gn,
                    &gy,
                    channels,
                    ch0,
                    c,
                    t,
                    f,
                    0.667,
                )
                .unwrap();
                let what = format!(
                    "expand_prior t={t} channels {ch0}..{} on_device={on_device}",
                    ch0 + c
                );
                let got = run_and_read(gpu, &d, &count, &gy, c * frames, &what);
                // One exp (a few ulps on Vulkan), one product and one sum.
                assert_close(&what, &got, &want[ch0 * frames..(ch0 + c) * frames], 1e-12);
            }
        }
    }
    // Phonemes that all last 0 frames: the one frame of a zero prior
    // (mean 0, log-std 0), as the CPU reference makes it.
    let t = 4;
    let stats = rng.vec(2 * channels * t, -2.0, 2.0);
    let noise = rng.vec(channels, -3.0, 3.0);
    let want: Vec<f32> = noise.iter().map(|n| 0.0 + n * 0.667).collect();
    let gs = gpu.upload_f32("stats", &stats).unwrap();
    let ge = gpu.upload_u32("ends", &[0; 4]).unwrap();
    let gn = gpu.upload_f32("noise", &noise).unwrap();
    for on_device in [false, true] {
        let count = frame_count(gpu, 1, on_device);
        let f = steps(&count, 1);
        let gy = gpu.poisoned_f32("y", channels * f.max().max(1)).unwrap();
        let d = speech::expand_prior(
            gpu,
            (&gs, 0),
            &ge,
            &gn,
            &gy,
            channels,
            0,
            channels,
            t,
            f,
            0.667,
        )
        .unwrap();
        let what = format!("expand_prior without frames, on_device={on_device}");
        let got = run_and_read(gpu, &d, &count, &gy, channels, &what);
        // exp(0) = 1 and one product: the same bits.
        assert_close(&what, &got, &want, 0.0);
    }

    // A batch's sentences, one dispatch each, into their places in one
    // buffer made for `cap` frames a sentence; nothing else written. Their
    // stats lie in one buffer too, `t_cap` phoneme ids apart (as the batched
    // prior writes them).
    let (cap, c, t_cap) = (40, 3, 13);
    let stats_stride = 2 * channels * t_cap;
    let mut all_stats = vec![f32::NAN; 3 * stats_stride];
    let mut wants = Vec::new();
    let mut inputs = Vec::new();
    let mut frames = Vec::new();
    for (s, t) in [5usize, 1, 13].into_iter().enumerate() {
        let mut durations: Vec<u32> = (0..t).map(|_| rng.uniform(0.0, 4.0) as u32).collect();
        durations[t / 2] += 1;
        let idx = cpu::frame_phonemes(&durations);
        let stats = rng.vec(2 * channels * t, -2.0, 2.0);
        let noise = rng.vec(channels * cap, -3.0, 3.0);
        let want = cpu::expand_prior(&stats, t, &idx, &noise[..channels * idx.len()], 0.667);
        all_stats[s * stats_stride..s * stats_stride + stats.len()].copy_from_slice(&stats);
        frames.push(idx.len());
        wants.push(want[..c * idx.len()].to_vec());
        inputs.push((
            t,
            gpu.upload_u32("ends", &cpu::frame_ends(&durations))
                .unwrap(),
            gpu.upload_f32("noise", &noise).unwrap(),
        ));
    }
    let gs = gpu.upload_f32("stats", &all_stats).unwrap();
    let count = FrameCount::known(gpu, &frames, cap).unwrap();
    let all = count.steps(1, 0);
    let gy = gpu.poisoned_f32("y", c * cap * frames.len()).unwrap();
    let ds: Vec<_> = inputs
        .iter()
        .enumerate()
        .map(|(s, (t, ge, gn))| {
            speech::expand_prior(
                gpu,
                (&gs, s * stats_stride),
                ge,
                gn,
                &gy,
                channels,
                0,
                c,
                *t,
                all.sentence(s),
                0.667,
            )
            .unwrap()
        })
        .collect();
    count.finish(gpu);
    gpu.run_all(&ds.iter().collect::<Vec<_>>()).unwrap();
    let got = gpu.read_f32(&gy).unwrap();
    for (s, want) in wants.iter().enumerate() {
        let mine = &got[s * c * cap..(s + 1) * c * cap];
        let what = format!("expand_prior, sentence {s} of a batch");
        if let Some(i) = mine[want.len()..].iter().position(|v| !v.is_nan()) {
            panic!("{what}: wrote element {} past its frames", want.len() + i);
        }
        // As above.
        assert_close(&what, &mine[..want.len()], want, 1e-12);
    }
}

fn durations(gpu: &Gpu, _v: &Variant) {
    let mut rng = Rng::new(28);
    let (m, inv) = (-0.3f32, 1.7f32);
    for &t in &[1usize, 5, 33, 64, 65, 132, 257, 1025] {
        for (case, length_scale) in [(0, 1.0f32), (1, 0.7), (2, 2.5)] {
            // Durations a fraction past or before whole frames (the GPU's
            // exp is a few ulps from Rust's; at a whole number the ceil
            // could go either way), some 0, and past the ends of the range:
            // -inf, NaN, overflowing exp and a duration past
            // MAX_PHONEME_FRAMES.
            let z: Vec<f32> = (0..t)
                .map(|j| {
                    let whole = rng.uniform(0.0, 12.0).floor();
                    let d = (whole + rng.uniform(0.1, 0.9)) / length_scale;
                    let logw = match (j * 7 + case) % 41 {
                        3 => -200.0,
                        11 => f32::NAN,
                        17 => 120.0,
                        29 => 30.0,
                        _ => d.ln(),
                    };
                    logw / inv + m
                })
                .collect();
            let logw: Vec<f32> = z.iter().map(|v| (v - m) * inv).collect();
            let want_d = cpu::durations(&logw, length_scale);
            let want_ends = cpu::frame_ends(&want_d);
            let total = *want_ends.last().unwrap();
            // Buffers for all the frames, or (case 1) fewer than they sum to.
            let cap = if case == 1 {
                (total / 2).max(1)
            } else {
                total.max(1)
            } as usize;
            let count = FrameCount::new(gpu, cap).unwrap();
            // Geometries as the voice's dispatches register them: a
            // convolution's, a WaveNet gate's, an upsampled and padded
            // length's, and one of more than 65535 workgroups.
            let geometries = [
                Geometry {
                    mul: 1,
                    add: 0,
                    per: 64,
                    rows: 24,
                    z: 1,
                },
                Geometry {
                    mul: 96,
                    add: 0,
                    per: 256,
                    rows: 0,
                    z: 1,
                },
                Geometry {
                    mul: 8,
                    add: -3,
                    per: 64,
                    rows: 4,
                    z: 1,
                },
                Geometry {
                    mul: 300_000,
                    add: 5,
                    per: 256,
                    rows: 0,
                    z: 1,
                },
            ];
            let slots: Vec<u64> = geometries.iter().map(|&g| count.slot(g).unwrap()).collect();
            let gz = gpu.upload_f32("z", &z).unwrap();
            let ends = gpu.upload_u32("ends", &vec![u32::MAX; t]).unwrap();
            let d = speech::durations(gpu, (&gz, 0), &ends, &count, 0, t, m, inv, length_scale)
                .unwrap();
            count.finish(gpu);
            gpu.run_all(&[&d]).unwrap();
            let what = format!("durations t={t} length_scale={length_scale} cap={cap}");
            assert_eq!(
                gpu.read_u32(&ends).unwrap()[..t],
                want_ends[..],
                "{what}: ends"
            );
            // Past the cap, no frames: nothing over them runs.
            let frames = if total as usize > cap {
                0
            } else {
                total.max(1) as usize
            };
            assert_eq!(
                gpu.read_u32(&count.lens).unwrap()[..2],
                [frames as u32, total],
                "{what}: [frames, total]"
            );
            let args = gpu.read_u32(&count.args).unwrap();
            for (g, at) in geometries.iter().zip(slots) {
                let at = at as usize / 4;
                assert_eq!(args[at..at + 3], g.groups(frames), "{what}: {g:?}");
            }
        }
    }
    // A batch of three sentences, one dispatch each in order, the second
    // past the buffers: each one's count, and the dispatches sized for the
    // most frames of them, in as many slices along z as they run.
    let cap = 60;
    let count = FrameCount::batch(gpu, cap, 3).unwrap();
    let geometries = [
        Geometry {
            mul: 1,
            add: 0,
            per: 64,
            rows: 24,
            z: 3,
        },
        Geometry {
            mul: 96,
            add: 0,
            per: 256,
            rows: 0,
            z: 1,
        },
    ];
    let slots: Vec<u64> = geometries.iter().map(|&g| count.slot(g).unwrap()).collect();
    let mut wants = Vec::new();
    // Their z in one buffer, 33 apart (as the batched prior writes them).
    let z_stride = 33;
    let mut all_z = vec![f32::NAN; 3 * z_stride];
    let mut ts = Vec::new();
    for (s, (t, per)) in [(5usize, 6.0f32), (33, 4.0), (17, 1.5)]
        .into_iter()
        .enumerate()
    {
        // `per` frames a phoneme, a fraction past the whole frames.
        let z: Vec<f32> = (0..t)
            .map(|_| (rng.uniform(0.5, 2.0 * per - 0.5).floor() + 0.5).ln() / inv + m)
            .collect();
        let logw: Vec<f32> = z.iter().map(|v| (v - m) * inv).collect();
        let want_ends = cpu::frame_ends(&cpu::durations(&logw, 1.0));
        all_z[s * z_stride..s * z_stride + t].copy_from_slice(&z);
        let ends = gpu.upload_u32("ends", &vec![u32::MAX; t]).unwrap();
        ts.push(t);
        wants.push((ends, want_ends));
    }
    let gz = gpu.upload_f32("z", &all_z).unwrap();
    let ds: Vec<_> = wants
        .iter()
        .zip(&ts)
        .enumerate()
        .map(|(s, ((ends, _), &t))| {
            speech::durations(gpu, (&gz, s * z_stride), ends, &count, s, t, m, inv, 1.0).unwrap()
        })
        .collect();
    count.finish(gpu);
    gpu.run_all(&ds.iter().collect::<Vec<_>>()).unwrap();
    let lens = gpu.read_u32(&count.lens).unwrap();
    let mut most = 0;
    for (s, (ends, want_ends)) in wants.iter().enumerate() {
        assert_eq!(
            gpu.read_u32(ends).unwrap(),
            *want_ends,
            "batch sentence {s}: ends"
        );
        let total = *want_ends.last().unwrap();
        let frames = if total as usize > cap {
            0
        } else {
            total.max(1)
        };
        assert_eq!(
            lens[2 * s..2 * s + 2],
            [frames, total],
            "batch sentence {s}"
        );
        most = most.max(frames as usize);
    }
    assert!(
        lens[3] as usize > cap && lens[2] == 0,
        "the second sentence is past the buffers: {lens:?}"
    );
    let args = gpu.read_u32(&count.args).unwrap();
    for (g, at) in geometries.iter().zip(slots) {
        let at = at as usize / 4;
        assert_eq!(args[at..at + 3], g.groups(most), "batch: {g:?}");
        assert_eq!(args[at + 2], g.z, "batch: {g:?}");
    }

    // Every phoneme 0 frames: one frame, total 0.
    let count = FrameCount::new(gpu, 3).unwrap();
    let gz = gpu.upload_f32("z", &[-500.0; 7]).unwrap();
    let ends = gpu.upload_u32("ends", &[9; 7]).unwrap();
    let d = speech::durations(gpu, (&gz, 0), &ends, &count, 0, 7, 0.0, 1.0, 1.0).unwrap();
    count.finish(gpu);
    gpu.run_all(&[&d]).unwrap();
    assert_eq!(gpu.read_u32(&ends).unwrap(), [0; 7]);
    assert_eq!(gpu.read_u32(&count.lens).unwrap(), [1, 0]);
}

fn wavenet_gate(gpu: &Gpu, _v: &Variant) {
    let mut rng = Rng::new(13);
    for (hi, &h) in [1usize, 5, 32, 96].iter().enumerate() {
        for &t in SIZES {
            // Two layers' offsets; the second layer's are read at g_off = 2h.
            // Inputs past the tanh's saturation (|v| > 15) included.
            let x = rng.vec(2 * h * t, -20.0, 20.0);
            let g = rng.vec(4 * h, -1.0, 1.0);
            let layer = (hi + t) % 2;
            let mut want = vec![0.0; h * t];
            cpu::wavenet_gate(&x, Some(&g[layer * 2 * h..]), h, t, &mut want);
            let gx = gpu.upload_f32("x", &x).unwrap();
            let gg = gpu.upload_f32("g", &g).unwrap();
            for on_device in [false, true] {
                let count = frame_count(gpu, t, on_device);
                let st = steps(&count, t);
                let gy = gpu.poisoned_f32("y", h * st.max().max(t)).unwrap();
                let d = speech::wavenet_gate(gpu, &gx, &gg, &gy, h, st, layer * 2 * h).unwrap();
                let what = format!("wavenet_gate h={h} t={t} layer={layer} on_device={on_device}");
                let got = run_and_read(gpu, &d, &count, &gy, h * t, &what);
                // One tanh, one exp and a division: the GPU's transcendentals
                // are a few ulps from Rust's (Vulkan allows more for exp),
                // squared.
                assert_close(&what, &got, &want, 1e-11);
            }
        }
    }
    wavenet_gate_batched(gpu);
}

/// The CPU twin of a fused input read: scale, then leaky ReLU.
fn act_in(x: &[f32], act: InputAct) -> Vec<f32> {
    let mut v: Vec<f32> = x.iter().map(|v| v * act.scale).collect();
    cpu::leaky_relu(&mut v, act.slope);
    v
}

fn conv1d(gpu: &Gpu, _v: &Variant) {
    let mut rng = Rng::new(11);
    // (c_in, c_out, kernel, dilation, pad_left, pad_right): the decoder's
    // shapes scaled down, an output count that is not a multiple of the 8
    // channels per invocation, asymmetric and zero padding.
    let shapes = [
        (5, 9, 3, 1, 1, 1),
        (4, 8, 7, 12, 36, 36),
        (6, 1, 7, 1, 3, 3),
        (3, 17, 5, 2, 0, 4),
    ];
    for (si, &(c_in, c_out, kernel, dilation, pad_left, pad_right)) in shapes.iter().enumerate() {
        let s = Conv1dShape {
            c_in,
            c_out,
            kernel,
            dilation,
            pad_left,
            pad_right,
            groups: 1,
        };
        for &t in SIZES {
            let t_out = s.t_out(t);
            if t_out == 0 {
                continue;
            }
            let x = rng.vec(c_in * t, -2.0, 2.0);
            let w = rng.vec(c_out * c_in * kernel, -0.5, 0.5);
            let b = rng.vec(c_out, -0.5, 0.5);
            let res = rng.vec(c_out * t_out, -1.0, 1.0);
            // Every fused option in turn: plain, leaky input with residual,
            // scaled leaky input with tanh output.
            let variants = [
                (InputAct::NONE, false, false),
                (InputAct::leaky(0.1), true, false),
                (
                    InputAct {
                        scale: 1.0 / 3.0,
                        slope: 0.01,
                    },
                    false,
                    true,
                ),
            ];
            let (act, with_res, tanh) = variants[(si + t) % variants.len()];
            // A running sum after the residual (the decoder's blocks).
            let with_sum = with_res && t % 2 == 1;
            let sum = rng.vec(c_out * t_out, -1.0, 1.0);
            let mut want = vec![0.0; c_out * t_out];
            cpu::conv1d(&act_in(&x, act), t, &w, Some(&b), &s, &mut want);
            if with_res {
                cpu::add_assign(&mut want, &res);
            }
            if with_sum {
                cpu::add_assign(&mut want, &sum);
            }
            if tanh {
                want.iter_mut().for_each(|v| *v = v.tanh());
            }
            let gx = gpu.upload_f32("x", &x).unwrap();
            let gw = gpu
                .upload_f32("w", &speech::pack_conv1d_weights(&w, &s))
                .unwrap();
            let gb = gpu.upload_f32("b", &b).unwrap();
            let gres = gpu.upload_f32("res", &res).unwrap();
            let gsum = gpu.upload_f32("sum", &sum).unwrap();
            for on_device in [false, true] {
                let count = frame_count(gpu, t, on_device);
                let st = steps(&count, t);
                let gy = gpu
                    .poisoned_f32("y", c_out * st.conv(&s).max().max(t_out))
                    .unwrap();
                let extras = Conv1dExtras {
                    residual: with_res.then_some(&gres),
                    sum: with_sum.then_some(&gsum),
                    tanh,
                };
                let d = speech::conv1d(gpu, &gx, &gw, &gb, &gy, &s, st, act, extras).unwrap();
                let what = format!(
                    "conv1d {s:?} t={t} act={act:?} res={with_res} sum={with_sum} tanh={tanh} \
                     on_device={on_device}"
                );
                let got = run_and_read(gpu, &d, &count, &gy, c_out * t_out, &what);
                // Sums of up to 42 products in a different order (taps outer
                // on the GPU, channels outer on the CPU): a few f32 ulps
                // relative, squared.
                assert_close(&what, &got, &want, 1e-11);
            }
        }
    }
    conv1d_batched(gpu);
}

fn conv_transpose1d(gpu: &Gpu, _v: &Variant) {
    let mut rng = Rng::new(12);
    // HiFi-GAN's upsampling geometry (kernel 2 x stride, pad (k - s) / 2),
    // channel counts scaled down, plus an odd stride with no padding.
    let shapes = [(6, 9, 16, 8, 4), (5, 3, 8, 4, 2), (3, 8, 3, 2, 0)];
    for &(c_in, c_out, kernel, stride, pad) in &shapes {
        let s = ConvTranspose1dShape {
            c_in,
            c_out,
            kernel,
            stride,
            pad,
        };
        for &t in &SIZES[..9] {
            let t_out = s.t_out(t);
            let x = rng.vec(c_in * t, -2.0, 2.0);
            let w = rng.vec(c_in * c_out * kernel, -0.5, 0.5);
            let b = rng.vec(c_out, -0.5, 0.5);
            let act = if t % 2 == 0 {
                InputAct::leaky(0.1)
            } else {
                InputAct {
                    scale: 1.0 / 3.0,
                    slope: 0.1,
                }
            };
            let mut want = vec![0.0; c_out * t_out];
            cpu::conv_transpose1d(&act_in(&x, act), t, &w, Some(&b), &s, &mut want);
            let gx = gpu.upload_f32("x", &x).unwrap();
            let gw = gpu
                .upload_f32("w", &speech::pack_conv_transpose1d_weights(&w, &s))
                .unwrap();
            let gb = gpu.upload_f32("b", &b).unwrap();
            for on_device in [false, true] {
                let count = frame_count(gpu, t, on_device);
                let st = steps(&count, t);
                let gy = gpu
                    .poisoned_f32("y", c_out * st.conv_transpose(&s).max().max(t_out))
                    .unwrap();
                let d = speech::conv_transpose1d(gpu, &gx, &gw, &gb, &gy, &s, st, act).unwrap();
                let what =
                    format!("conv_transpose1d {s:?} t={t} act={act:?} on_device={on_device}");
                let got = run_and_read(gpu, &d, &count, &gy, c_out * t_out, &what);
                // At most 2 taps x 6 channels per output, summed in another
                // order.
                assert_close(&what, &got, &want, 1e-11);
            }
        }
    }
    conv_transpose1d_batched(gpu);
}

/// Records a kernel on (x, its extra inputs, y, the steps).
type RecordBatched<'a> = dyn Fn(&wgpu::Buffer, &[wgpu::Buffer], &wgpu::Buffer, Steps<'_>) -> lfm::gpu::ops::Dispatch
    + 'a;
/// The CPU twin on (x, the extra inputs, the frames).
type WantBatched<'a> = dyn Fn(&[f32], &[Vec<f32>], usize) -> Vec<f32> + 'a;

/// A batch of sentences through one dispatch over a count of several
/// (workgroup z a sentence): sentences of `frames` frames, in buffers made
/// for `cap` frames each, the one at index `empty` given 0 frames (past its
/// buffers: nothing must run for it). Each sentence's x (`c_in` channels)
/// and its `extras` inputs shaped as its y (`c_out` channels) lie at its
/// index times the stride; `record` records the dispatch on (x, extras, y,
/// steps), `want` is the CPU twin on (x, extras, frames). Every sentence's
/// output must be close to the twin's, bit for bit what the same dispatch
/// gives it alone, and nothing outside the sentences' outputs written.
#[allow(clippy::too_many_arguments)]
fn batched(
    gpu: &Gpu,
    what: &str,
    rng: &mut Rng,
    c_in: usize,
    c_out: usize,
    extras: usize,
    out_steps: &dyn Fn(Steps<'_>) -> Steps<'_>,
    record: &RecordBatched<'_>,
    want: &WantBatched<'_>,
    tol: f64,
) {
    let (frames, cap, empty) = ([7usize, 33, 1, 12], 40, 2);
    let t_out = |f: usize| out_steps(Steps::fixed(f)).max();
    let xs: Vec<Vec<f32>> = frames
        .iter()
        .map(|&f| rng.vec(c_in * f, -2.0, 2.0))
        .collect();
    let es: Vec<Vec<Vec<f32>>> = frames
        .iter()
        .map(|&f| {
            (0..extras)
                .map(|_| rng.vec(c_out * t_out(f), -1.0, 1.0))
                .collect()
        })
        .collect();
    let count = FrameCount::known(gpu, &frames, cap).unwrap();
    let mut lens: Vec<u32> = frames.iter().flat_map(|&f| [f as u32; 2]).collect();
    lens[2 * empty] = 0;
    lens[2 * empty + 1] = cap as u32 + 1;
    gpu.queue
        .write_buffer(&count.lens, 0, bytemuck::cast_slice(&lens));
    let st = count.steps(1, 0);
    let (xs_stride, ys_stride) = (st.stride(c_in), out_steps(st).stride(c_out));
    let lay = |parts: &[&Vec<f32>], stride: usize| {
        let mut all = vec![f32::NAN; stride * parts.len()];
        for (b, p) in parts.iter().enumerate() {
            all[b * stride..b * stride + p.len()].copy_from_slice(p);
        }
        all
    };
    let gx = gpu
        .upload_f32("x", &lay(&xs.iter().collect::<Vec<_>>(), xs_stride))
        .unwrap();
    let ge: Vec<wgpu::Buffer> = (0..extras)
        .map(|e| {
            let parts: Vec<&Vec<f32>> = es.iter().map(|s| &s[e]).collect();
            gpu.upload_f32("extra", &lay(&parts, ys_stride)).unwrap()
        })
        .collect();
    let gy = gpu.poisoned_f32("y", ys_stride * frames.len()).unwrap();
    let d = record(&gx, &ge, &gy, st);
    count.finish(gpu);
    gpu.run_all(&[&d]).unwrap();
    let got = gpu.read_f32(&gy).unwrap();
    for (b, &f) in frames.iter().enumerate() {
        let n = c_out * t_out(f);
        let mine = &got[b * ys_stride..(b + 1) * ys_stride];
        let what = format!("{what}, batched sentence {b} of {} frames", f);
        let written = if b == empty { 0 } else { n };
        if let Some(i) = mine[written..].iter().position(|v| !v.is_nan()) {
            panic!("{what}: wrote element {} past its {written}", written + i);
        }
        if b == empty {
            continue;
        }
        assert_close(&what, &mine[..n], &want(&xs[b], &es[b], f), tol);
        // The sentence alone, through the same kernel: the same bits.
        let one = FrameCount::known(gpu, &[f], f).unwrap();
        let st1 = one.steps(1, 0);
        let gx1 = gpu.upload_f32("x", &xs[b]).unwrap();
        let ge1: Vec<wgpu::Buffer> = es[b]
            .iter()
            .map(|e| gpu.upload_f32("extra", e).unwrap())
            .collect();
        let gy1 = gpu.poisoned_f32("y", n).unwrap();
        let d1 = record(&gx1, &ge1, &gy1, st1);
        one.finish(gpu);
        gpu.run_all(&[&d1]).unwrap();
        let alone = gpu.read_f32(&gy1).unwrap();
        assert!(
            alone
                .iter()
                .zip(&mine[..n])
                .all(|(a, b)| a.to_bits() == b.to_bits()),
            "{what}: not the bits of the sentence alone"
        );
    }
}

fn conv1d_batched(gpu: &Gpu) {
    let mut rng = Rng::new(31);
    // A dilated "same" convolution (the decoder's residual blocks) with a
    // residual, a running sum and a leaky input, and one with tanh.
    for (c_in, c_out, kernel, dilation, pad, res, sum, tanh) in [
        (5usize, 9usize, 3usize, 3usize, 3usize, true, true, false),
        (4, 1, 7, 1, 3, false, false, true),
    ] {
        let s = Conv1dShape {
            c_in,
            c_out,
            kernel,
            dilation,
            pad_left: pad,
            pad_right: pad,
            groups: 1,
        };
        let act = InputAct::leaky(0.1);
        let w = rng.vec(c_out * c_in * kernel, -0.5, 0.5);
        let b = rng.vec(c_out, -0.5, 0.5);
        let gw = gpu
            .upload_f32("w", &speech::pack_conv1d_weights(&w, &s))
            .unwrap();
        let gb = gpu.upload_f32("b", &b).unwrap();
        batched(
            gpu,
            &format!("conv1d {s:?} res={res} sum={sum} tanh={tanh}"),
            &mut rng,
            c_in,
            c_out,
            res as usize + sum as usize,
            &|st| st.conv(&s),
            &|x, e, y, st| {
                let extras = Conv1dExtras {
                    residual: e.first().filter(|_| res),
                    sum: e.get(1),
                    tanh,
                };
                speech::conv1d(gpu, x, &gw, &gb, y, &s, st, act, extras).unwrap()
            },
            &|x, e, t| {
                let mut want = vec![0.0; c_out * s.t_out(t)];
                cpu::conv1d(&act_in(x, act), t, &w, Some(&b), &s, &mut want);
                for extra in e {
                    cpu::add_assign(&mut want, extra);
                }
                if tanh {
                    want.iter_mut().for_each(|v| *v = v.tanh());
                }
                want
            },
            // As the single-sentence case: sums in another order.
            1e-11,
        );
    }
}

fn conv_transpose1d_batched(gpu: &Gpu) {
    let mut rng = Rng::new(32);
    let s = ConvTranspose1dShape {
        c_in: 6,
        c_out: 9,
        kernel: 8,
        stride: 4,
        pad: 2,
    };
    let act = InputAct {
        scale: 1.0 / 3.0,
        slope: 0.1,
    };
    let w = rng.vec(s.c_in * s.c_out * s.kernel, -0.5, 0.5);
    let b = rng.vec(s.c_out, -0.5, 0.5);
    let gw = gpu
        .upload_f32("w", &speech::pack_conv_transpose1d_weights(&w, &s))
        .unwrap();
    let gb = gpu.upload_f32("b", &b).unwrap();
    batched(
        gpu,
        &format!("conv_transpose1d {s:?}"),
        &mut rng,
        s.c_in,
        s.c_out,
        0,
        &|st| st.conv_transpose(&s),
        &|x, _, y, st| speech::conv_transpose1d(gpu, x, &gw, &gb, y, &s, st, act).unwrap(),
        &|x, _, t| {
            let mut want = vec![0.0; s.c_out * s.t_out(t)];
            cpu::conv_transpose1d(&act_in(x, act), t, &w, Some(&b), &s, &mut want);
            want
        },
        // As the single-sentence case.
        1e-11,
    );
}

fn wavenet_gate_batched(gpu: &Gpu) {
    let mut rng = Rng::new(33);
    let h = 5;
    let g = rng.vec(4 * h, -1.0, 1.0);
    let gg = gpu.upload_f32("g", &g).unwrap();
    batched(
        gpu,
        "wavenet_gate",
        &mut rng,
        2 * h,
        h,
        0,
        &|st| st,
        &|x, _, y, st| speech::wavenet_gate(gpu, x, &gg, y, h, st, 2 * h).unwrap(),
        &|x, _, t| {
            let mut want = vec![0.0; h * t];
            cpu::wavenet_gate(x, Some(&g[2 * h..]), h, t, &mut want);
            want
        },
        // As the single-sentence case.
        1e-11,
    );
}
