//! Parity cases for the vision kernels in `gpu::vision` (convolutional
//! detectors: PicoDet layout).

use super::{assert_close, Case, SIZES};
use lfm::cpu::{self, Conv2d, ConvActivation, ConvTranspose2d, Pointwise};
use lfm::gpu::{vision, Gpu, Variant};
use lfm::util::rng::Rng;

pub const CASES: &[Case] = &[
    Case {
        kernel: "conv2d",
        run: conv2d,
    },
    Case {
        kernel: "global_avg_pool",
        run: global_avg_pool,
    },
    Case {
        kernel: "scale_channels",
        run: scale_channels,
    },
    Case {
        kernel: "resize_nearest",
        run: resize_nearest,
    },
    Case {
        kernel: "concat",
        run: concat,
    },
    Case {
        kernel: "conv_transpose2d",
        run: conv_transpose2d,
    },
    Case {
        kernel: "pointwise",
        run: pointwise,
    },
];

const ACTIVATIONS: [ConvActivation; 5] = [
    ConvActivation::None,
    ConvActivation::Relu,
    ConvActivation::HardSwish,
    ConvActivation::HardSigmoid {
        alpha: 0.166_666_7,
        beta: 0.5,
    },
    ConvActivation::Sigmoid,
];

/// A k x k convolution with stride 1, no padding, one group.
fn geometry(c_in: usize, c_out: usize, [h_in, w_in]: [usize; 2], k: usize) -> Conv2d {
    Conv2d {
        c_in,
        h_in,
        w_in,
        c_out,
        kh: k,
        kw: k,
        stride: [1, 1],
        pad: [0; 4],
        dilation: [1, 1],
        groups: 1,
    }
}

fn conv2d(gpu: &Gpu, v: &Variant) {
    let mut rng = Rng::new(11);
    let mut shapes = Vec::new();
    if v.defines.contains(&"POINTWISE") {
        // 1x1 only: pixel counts from SIZES, channel counts that are not
        // multiples of the 4x4 register tile.
        for &n in SIZES {
            shapes.push(geometry(3, 5, [1, n], 1));
            shapes.push(geometry(17, 33, [1, n], 1));
        }
        shapes.push(geometry(64, 31, [13, 21], 1));
    } else {
        for &n in SIZES {
            // Depthwise 3x3 over a strip, and a 3x3 full conv, n wide.
            shapes.push(Conv2d {
                pad: [1; 4],
                groups: 3,
                ..geometry(3, 3, [2, n], 3)
            });
            shapes.push(Conv2d {
                pad: [1; 4],
                ..geometry(2, 5, [1, n], 3)
            });
        }
        shapes.extend([
            // The stem: RGB in, stride 2.
            Conv2d {
                stride: [2, 2],
                pad: [1; 4],
                ..geometry(3, 16, [33, 17], 3)
            },
            // Depthwise 5x5, stride 1 and 2.
            Conv2d {
                pad: [2; 4],
                groups: 7,
                ..geometry(7, 7, [9, 13], 5)
            },
            Conv2d {
                stride: [2, 2],
                pad: [2; 4],
                groups: 5,
                ..geometry(5, 5, [17, 11], 5)
            },
            // Two groups, dilation 2, uneven pads.
            Conv2d {
                pad: [1, 0, 2, 1],
                dilation: [2, 2],
                groups: 2,
                ..geometry(6, 4, [10, 9], 3)
            },
            // 1x1 through the direct kernel, and on a 1x1 image (SE block).
            geometry(9, 5, [7, 9], 1),
            geometry(33, 9, [1, 1], 1),
        ]);
    }
    for (i, g) in shapes.iter().enumerate() {
        let act = ACTIVATIONS[i % ACTIVATIONS.len()];
        let x = rng.vec(g.c_in * g.h_in * g.w_in, -2.0, 2.0);
        let w = rng.vec(g.weight_len(), -0.5, 0.5);
        let b = rng.vec(g.c_out, -0.5, 0.5);
        let n_out = g.c_out * g.h_out() * g.w_out();
        let mut want = vec![0.0; n_out];
        cpu::conv2d(g, &x, &w, &b, act, &mut want);
        let (gx, gw, gb) = (
            gpu.upload_f32("x", &x).unwrap(),
            gpu.upload_f32("w", &w).unwrap(),
            gpu.upload_f32("b", &b).unwrap(),
        );
        let gy = gpu.poisoned_f32("y", n_out).unwrap();
        let d = vision::conv2d(gpu, v, g, act, &gx, &gw, &gb, &gy).unwrap();
        gpu.run_all(&[&d]).unwrap();
        let got = gpu.read_f32(&gy).unwrap();
        // Sums of at most 64 products in a different association (and
        // possibly fused multiply-adds): a few f32 ulps per output, squared.
        assert_close(
            &format!("conv2d {} {g:?} {act:?}", v.key()),
            &got[..n_out],
            &want,
            1e-11,
        );
    }
}

fn global_avg_pool(gpu: &Gpu, _v: &Variant) {
    let mut rng = Rng::new(12);
    for &n in SIZES.iter().chain(&[7600]) {
        for c in [1, 3, 17] {
            let x = rng.vec(c * n, -1.0, 3.0);
            let mut want = vec![0.0; c];
            cpu::global_avg_pool(&x, c, n, &mut want);
            let gx = gpu.upload_f32("x", &x).unwrap();
            let gy = gpu.poisoned_f32("y", c).unwrap();
            let d = vision::global_avg_pool(gpu, &gx, &gy, c, n).unwrap();
            gpu.run_all(&[&d]).unwrap();
            let got = gpu.read_f32(&gy).unwrap();
            // A tree sum against a running sum of up to 7600 values of one
            // sign mostly: relative error ~ n * 2^-24 at worst, squared.
            assert_close(
                &format!("global_avg_pool c={c} n={n}"),
                &got[..c],
                &want,
                1e-9,
            );
        }
    }
}

fn scale_channels(gpu: &Gpu, _v: &Variant) {
    let mut rng = Rng::new(13);
    for &n in SIZES {
        let c = 5;
        let x = rng.vec(c * n, -2.0, 2.0);
        let s = rng.vec(c, 0.0, 1.0);
        let mut want = vec![0.0; c * n];
        cpu::scale_channels(&x, &s, n, &mut want);
        let (gx, gs) = (
            gpu.upload_f32("x", &x).unwrap(),
            gpu.upload_f32("s", &s).unwrap(),
        );
        let gy = gpu.poisoned_f32("y", c * n).unwrap();
        let d = vision::scale_channels(gpu, &gx, &gs, &gy, c, n).unwrap();
        gpu.run_all(&[&d]).unwrap();
        let got = gpu.read_f32(&gy).unwrap();
        // One rounded product per element in both: identical.
        assert_close(&format!("scale_channels n={n}"), &got[..c * n], &want, 0.0);
    }
}

fn resize_nearest(gpu: &Gpu, _v: &Variant) {
    let mut rng = Rng::new(14);
    let mut cases = vec![
        (3, [5, 7], [10, 14], [2.0, 2.0]),
        (2, [1, 1], [2, 2], [2.0, 2.0]),
        (4, [13, 10], [26, 20], [2.0, 2.0]),
        (2, [3, 5], [4, 7], [1.5, 1.5]),
    ];
    for &n in SIZES {
        cases.push((2, [3, n], [6, 2 * n], [2.0, 2.0]));
    }
    for (c, hw, out, scale) in cases {
        let x = rng.vec(c * hw[0] * hw[1], -1.0, 1.0);
        let n_out = c * out[0] * out[1];
        let mut want = vec![0.0; n_out];
        cpu::resize_nearest(&x, c, hw, out, scale, &mut want);
        let gx = gpu.upload_f32("x", &x).unwrap();
        let gy = gpu.poisoned_f32("y", n_out).unwrap();
        let d = vision::resize_nearest(gpu, &gx, &gy, c, hw, out, scale).unwrap();
        gpu.run_all(&[&d]).unwrap();
        let got = gpu.read_f32(&gy).unwrap();
        // A copy: identical.
        assert_close(
            &format!("resize_nearest {hw:?} -> {out:?}"),
            &got[..n_out],
            &want,
            0.0,
        );
    }
}

fn concat(gpu: &Gpu, _v: &Variant) {
    let mut rng = Rng::new(15);
    for (&a, &b) in SIZES.iter().zip(SIZES.iter().rev()) {
        let (xa, xb) = (rng.vec(a, -1.0, 1.0), rng.vec(b, -1.0, 1.0));
        let mut want = vec![0.0; a + b];
        cpu::concat(&[&xa, &xb], &mut want);
        let (ga, gb) = (
            gpu.upload_f32("a", &xa).unwrap(),
            gpu.upload_f32("b", &xb).unwrap(),
        );
        let gy = gpu.poisoned_f32("y", a + b).unwrap();
        let da = vision::concat_part(gpu, &ga, &gy, a, 0).unwrap();
        let db = vision::concat_part(gpu, &gb, &gy, b, a).unwrap();
        gpu.run_all(&[&da, &db]).unwrap();
        let got = gpu.read_f32(&gy).unwrap();
        // A copy: identical.
        assert_close(&format!("concat {a}+{b}"), &got[..a + b], &want, 0.0);
    }
}

fn conv_transpose2d(gpu: &Gpu, _v: &Variant) {
    let mut rng = Rng::new(16);
    let base = ConvTranspose2d {
        c_in: 3,
        h_in: 1,
        w_in: 1,
        c_out: 2,
        kh: 2,
        kw: 2,
        stride: [2, 2],
        pad: [0; 4],
        groups: 1,
    };
    let mut shapes = Vec::new();
    for &n in SIZES {
        // DB's upsampling head: 2x2, stride 2, over a strip n wide.
        shapes.push(ConvTranspose2d {
            h_in: 2,
            w_in: n,
            ..base
        });
    }
    shapes.extend([
        // 3x3 stride 2 with pads, two groups; 4x4 stride 3 (taps that skip).
        ConvTranspose2d {
            c_in: 4,
            h_in: 5,
            w_in: 7,
            c_out: 6,
            kh: 3,
            kw: 3,
            pad: [1, 1, 0, 1],
            groups: 2,
            ..base
        },
        ConvTranspose2d {
            c_in: 5,
            h_in: 4,
            w_in: 3,
            c_out: 3,
            kh: 4,
            kw: 4,
            stride: [3, 3],
            pad: [2; 4],
            ..base
        },
    ]);
    for g in &shapes {
        let x = rng.vec(g.c_in * g.h_in * g.w_in, -2.0, 2.0);
        let w = rng.vec(g.weight_len(), -0.5, 0.5);
        let b = rng.vec(g.c_out, -0.5, 0.5);
        let n_out = g.c_out * g.h_out() * g.w_out();
        let mut want = vec![0.0; n_out];
        cpu::conv_transpose2d(g, &x, &w, &b, &mut want);
        let (gx, gw, gb) = (
            gpu.upload_f32("x", &x).unwrap(),
            gpu.upload_f32("w", &w).unwrap(),
            gpu.upload_f32("b", &b).unwrap(),
        );
        let gy = gpu.poisoned_f32("y", n_out).unwrap();
        let d = vision::conv_transpose2d(gpu, g, &gx, &gw, &gb, &gy).unwrap();
        gpu.run_all(&[&d]).unwrap();
        let got = gpu.read_f32(&gy).unwrap();
        // The same products summed in the same order, maybe with fused
        // multiply-adds: an ulp or two per output, squared.
        assert_close(
            &format!("conv_transpose2d {g:?}"),
            &got[..n_out],
            &want,
            1e-12,
        );
    }
}

fn pointwise(gpu: &Gpu, _v: &Variant) {
    let mut rng = Rng::new(17);
    // PP-LCNet's learnable affine around a hard-swish, a batch norm then
    // ReLU, a DB head's sigmoid, and every other step once.
    let chains: [&[Pointwise]; 4] = [
        &[
            Pointwise::Mul(1.3),
            Pointwise::Add(-0.2),
            Pointwise::HardSwish,
            Pointwise::Mul(0.9),
            Pointwise::Add(0.1),
        ],
        &[Pointwise::ChannelAffine, Pointwise::Relu],
        &[Pointwise::ChannelAffine, Pointwise::Sigmoid],
        &[
            Pointwise::Sub(0.3),
            Pointwise::Div(1.7),
            Pointwise::Clip {
                min: -0.5,
                max: 0.75,
            },
            Pointwise::HardSigmoid {
                alpha: 0.2,
                beta: 0.5,
            },
        ],
    ];
    for &n in SIZES {
        for steps in chains {
            let (c, plane) = (3, n);
            let x = rng.vec(c * plane, -5.0, 5.0);
            let affine = rng.vec(2 * c, -1.5, 1.5);
            let channels = if steps.contains(&Pointwise::ChannelAffine) {
                c
            } else {
                0
            };
            let mut want = x.clone();
            cpu::pointwise_chain(steps, &affine[..2 * channels], plane, &mut want);
            let gx = gpu.upload_f32("x", &x).unwrap();
            let ga = gpu.upload_f32("affine", &affine).unwrap();
            let d = vision::pointwise(gpu, steps, &gx, &ga, c * plane, plane, channels).unwrap();
            gpu.run_all(&[&d]).unwrap();
            let got = gpu.read_f32(&gx).unwrap();
            // Each step rounds once, as on the CPU; the GPU's exp (sigmoid)
            // is within a few ulps of Rust's: ~1e-6 relative, squared.
            assert_close(
                &format!("pointwise n={n} {steps:?}"),
                &got[..c * plane],
                &want,
                1e-11,
            );
        }
    }
}
