//! Parity cases for the speech kernels in `gpu::speech` (VITS / HiFi-GAN).

use super::{assert_close, Case, SIZES};
use lfm::cpu::{self, Conv1dShape, ConvTranspose1dShape};
use lfm::gpu::speech::{self, Conv1dExtras, InputAct};
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
];

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
            let gy = gpu.poisoned_f32("y", h * t).unwrap();
            let d = speech::wavenet_gate(gpu, &gx, &gg, &gy, h, t, layer * 2 * h).unwrap();
            gpu.run_all(&[&d]).unwrap();
            let got = gpu.read_f32(&gy).unwrap();
            // One tanh, one exp and a division: the GPU's transcendentals are
            // a few ulps from Rust's (Vulkan allows more for exp), squared.
            assert_close(
                &format!("wavenet_gate h={h} t={t} layer={layer}"),
                &got[..h * t],
                &want,
                1e-11,
            );
        }
    }
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
            let mut want = vec![0.0; c_out * t_out];
            cpu::conv1d(&act_in(&x, act), t, &w, Some(&b), &s, &mut want);
            if with_res {
                cpu::add_assign(&mut want, &res);
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
            let gy = gpu.poisoned_f32("y", c_out * t_out).unwrap();
            let extras = Conv1dExtras {
                residual: with_res.then_some(&gres),
                tanh,
            };
            let d = speech::conv1d(gpu, &gx, &gw, &gb, &gy, &s, t, act, extras).unwrap();
            gpu.run_all(&[&d]).unwrap();
            let got = gpu.read_f32(&gy).unwrap();
            // Sums of up to 42 products in a different order (taps outer on
            // the GPU, channels outer on the CPU): a few f32 ulps relative,
            // squared.
            assert_close(
                &format!("conv1d {s:?} t={t} act={act:?} res={with_res} tanh={tanh}"),
                &got[..c_out * t_out],
                &want,
                1e-11,
            );
        }
    }
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
            let gy = gpu.poisoned_f32("y", c_out * t_out).unwrap();
            let d = speech::conv_transpose1d(gpu, &gx, &gw, &gb, &gy, &s, t, act).unwrap();
            gpu.run_all(&[&d]).unwrap();
            let got = gpu.read_f32(&gy).unwrap();
            // At most 2 taps x 6 channels per output, summed in another order.
            assert_close(
                &format!("conv_transpose1d {s:?} t={t} act={act:?}"),
                &got[..c_out * t_out],
                &want,
                1e-11,
            );
        }
    }
}
