//! Parity cases for the general tensor kernels in `gpu::ops`.

use super::{assert_close, Case, SIZES};
use lfm::cpu;
use lfm::gpu::{ops, Gpu, Variant};
use lfm::util::rng::Rng;

pub const CASES: &[Case] = &[
    Case {
        kernel: "add",
        run: add,
    },
    Case {
        kernel: "rms_norm",
        run: rms_norm,
    },
    Case {
        kernel: "copy",
        run: copy,
    },
];

fn copy(gpu: &Gpu, _v: &Variant) {
    let mut rng = Rng::new(3);
    // Fewer invocations than elements too: each strides over the buffer.
    for (n, groups) in [(4, 1), (1028, 1), (1028, 3), (70_000, 5), (70_000, 100)] {
        let x = rng.vec(n, -2.0, 2.0);
        let gx = gpu.upload_f32("x", &x).unwrap();
        let gy = gpu.poisoned_f32("y", n).unwrap();
        let d = ops::copy(gpu, &gx, &gy, n, groups).unwrap();
        gpu.run_all(&[&d]).unwrap();
        let got = gpu.read_f32(&gy).unwrap();
        assert_close(&format!("copy n={n} groups={groups}"), &got[..n], &x, 0.0);
    }
}

fn add(gpu: &Gpu, _v: &Variant) {
    let mut rng = Rng::new(1);
    for &n in SIZES.iter().chain(&[70_000]) {
        let a = rng.vec(n, -2.0, 2.0);
        let b = rng.vec(n, -2.0, 2.0);
        let mut want = vec![0.0; n];
        cpu::add(&a, &b, &mut want);
        let (ga, gb) = (
            gpu.upload_f32("a", &a).unwrap(),
            gpu.upload_f32("b", &b).unwrap(),
        );
        let gy = gpu.poisoned_f32("y", n).unwrap();
        let d = ops::add(gpu, &ga, &gb, &gy, n).unwrap();
        gpu.run_all(&[&d]).unwrap();
        let got = gpu.read_f32(&gy).unwrap();
        // One rounding per element in both: results are bit-identical.
        assert_close(&format!("add n={n}"), &got[..n], &want, 0.0);
    }
}

fn rms_norm(gpu: &Gpu, v: &Variant) {
    let mut rng = Rng::new(2);
    for &n in SIZES {
        for rows in [1, 3] {
            let x = rng.vec(rows * n, -3.0, 3.0);
            let w = rng.vec(n, 0.5, 1.5);
            let mut want = vec![0.0; rows * n];
            cpu::rms_norm(&x, &w, 1e-5, &mut want);
            let gx = gpu.upload_f32("x", &x).unwrap();
            let gw = gpu.upload_f32("w", &w).unwrap();
            let gy = if v.defines.contains(&"ADD") {
                // Accumulates into a residual stream of its own.
                let y0 = rng.vec(rows * n, -2.0, 2.0);
                cpu::add_assign(&mut want, &y0);
                gpu.upload_f32("y", &y0).unwrap()
            } else {
                gpu.poisoned_f32("y", rows * n).unwrap()
            };
            let d = ops::rms_norm(gpu, v, &gx, &gw, &gy, n, rows, 1e-5).unwrap();
            gpu.run_all(&[&d]).unwrap();
            let got = gpu.read_f32(&gy).unwrap();
            // Only the summation order of the mean square differs: a few ulps
            // of f32 relative error, squared.
            assert_close(
                &format!("rms_norm {} n={n} rows={rows}", v.key()),
                &got[..rows * n],
                &want,
                1e-11,
            );
        }
    }
}
