//! Parity cases for the Whisper-specific kernels in `gpu::whisper`.

use super::{assert_close, Case};
use lfm::cpu::{self, AttentionShape, SeqSpan};
use lfm::gpu::whisper as wgpu_ops;
use lfm::gpu::{Gpu, Variant};
use lfm::models::whisper::model;
use lfm::util::rng::Rng;

pub const CASES: &[Case] = &[
    Case {
        kernel: "im2col_1d",
        run: im2col_1d,
    },
    Case {
        kernel: "attention_tiled",
        run: attention_tiled,
    },
];

fn im2col_1d(gpu: &Gpu, _v: &Variant) {
    let mut rng = Rng::new(11);
    // (t_in, channels, channel-major?, kernel, stride, pad): Whisper's two
    // convolutions at odd sizes, and a wider kernel.
    for (t_in, channels, channel_major, kernel, stride, pad) in [
        (33, 5, true, 3, 1, 1),
        (257, 3, false, 3, 2, 1),
        (64, 7, false, 5, 3, 2),
        (1, 1, true, 3, 1, 1),
    ] {
        let x = rng.vec(t_in * channels, -2.0, 2.0);
        let (t_stride, c_stride) = if channel_major {
            (1, t_in)
        } else {
            (channels, 1)
        };
        let t_out = (t_in + 2 * pad - kernel) / stride + 1;
        let want = model::im2col_1d(
            &x, t_in, channels, t_stride, c_stride, kernel, stride, pad, t_out,
        );
        let gx = gpu.upload_f32("x", &x).unwrap();
        let gy = gpu.poisoned_f32("cols", want.len()).unwrap();
        let d = wgpu_ops::im2col_1d(
            gpu, &gx, &gy, t_in, channels, t_stride, c_stride, kernel, stride, pad, t_out,
        )
        .unwrap();
        gpu.run_all(&[&d]).unwrap();
        let got = gpu.read_f32(&gy).unwrap();
        // A copy: bit-identical.
        assert_close(
            &format!("im2col_1d t_in={t_in} c={channels} k={kernel} s={stride}"),
            &got[..want.len()],
            &want,
            0.0,
        );
    }
}

fn attention_tiled(gpu: &Gpu, _v: &Variant) {
    let mut rng = Rng::new(12);
    // (rows, kv_rows, heads, head_dim, fused): Whisper's encoder length (1500
    // positions, heads of 64, fused QKV), partial tiles, other head sizes,
    // and the decoder's cross-attention (a few query rows over 1500 keys).
    for (rows, kv_rows, heads, hd, fused) in [
        (1500, 1500, 2, 64, true),
        (1, 1, 2, 64, true),
        (33, 33, 3, 32, false),
        (257, 257, 1, 4, false),
        (65, 65, 8, 64, false),
        (5, 1500, 6, 64, false),
        (17, 33, 2, 64, false),
    ] {
        let d = heads * hd;
        let (stride, cols) = if fused {
            (3 * d, (0, d, 2 * d))
        } else {
            (d, (0, 0, 0))
        };
        let shape = AttentionShape {
            heads,
            kv_heads: heads,
            head_dim: hd,
            scale: 1.0 / (hd as f32).sqrt(),
            causal: false,
            window: 0,
            q_stride: stride,
            k_stride: stride,
            v_stride: stride,
            q_col: cols.0,
            k_col: cols.1,
            v_col: cols.2,
        };
        let q = rng.vec(rows * stride, -2.0, 2.0);
        let (k, v) = if fused {
            (q.clone(), q.clone())
        } else {
            (
                rng.vec(kv_rows * stride, -2.0, 2.0),
                rng.vec(kv_rows * stride, -2.0, 2.0),
            )
        };
        let span = SeqSpan {
            q_start: 0,
            q_len: rows,
            kv_start: 0,
            kv_len: kv_rows,
        };
        let mut want = vec![0.0; rows * d];
        cpu::attention(&q, &k, &v, &[span], &shape, &mut want);
        let gq = gpu.upload_f32("q", &q).unwrap();
        let gk = gpu.upload_f32("k", &k).unwrap();
        let gv = gpu.upload_f32("v", &v).unwrap();
        let out = gpu.poisoned_f32("out", rows * d).unwrap();
        let disp =
            wgpu_ops::attention_tiled(gpu, &gq, &gk, &gv, &out, rows, kv_rows, &shape).unwrap();
        gpu.run_all(&[&disp]).unwrap();
        let got = gpu.read_f32(&out).unwrap();
        // f32 scores and sums in another order (online softmax by tiles of
        // 16): ~1e-6 relative, squared ~1e-12; a wrong key is off by O(1).
        assert_close(
            &format!(
                "attention_tiled rows={rows} kv_rows={kv_rows} heads={heads} head_dim={hd} fused={fused}"
            ),
            &got[..rows * d],
            &want,
            1e-10,
        );
    }
}
