//! Parity cases for the decoder-LLM kernels in `gpu::llm_ops`, against their
//! CPU twins in `cpu::llm`. Quantised weights come from `Tensor::quantize_f32`
//! and the CPU side dequantises the very same blocks, so only the order of
//! the f32 additions (and exp/sqrt rounding) differs.

use super::{assert_close, Case, SIZES};
use lfm::cpu::{self, AttnShape};
use lfm::gpu::llm_ops::{
    self, CoopTile, GemmInput, GemmKernel, GemmMode, GemmPlan, GemvEpilogue, GpuMatrix,
};
use lfm::gpu::ops::Dispatch;
use lfm::gpu::{Gpu, Variant};
use lfm::models::llm::{FfnAct, RopeStyle};
use lfm::quant::GgmlType;
use lfm::tensor::Tensor;
use lfm::util::rng::Rng;

pub const CASES: &[Case] = &[
    Case {
        kernel: "gemv",
        run: gemv,
    },
    Case {
        kernel: "gemv_add",
        run: gemv_add,
    },
    Case {
        kernel: "gemv_norm",
        run: gemv_norm,
    },
    Case {
        kernel: "gemv_swiglu",
        run: gemv_swiglu,
    },
    Case {
        kernel: "gemv_geglu",
        run: gemv_swiglu,
    },
    Case {
        kernel: "gemv_conv",
        run: gemv_conv,
    },
    Case {
        kernel: "gemv_cols",
        run: gemv_cols,
    },
    Case {
        kernel: "gemv_cols_add",
        run: gemv_cols,
    },
    Case {
        kernel: "gemv_cols_norm",
        run: gemv_cols,
    },
    Case {
        kernel: "gemv_cols_swiglu",
        run: gemv_cols,
    },
    Case {
        kernel: "gemv_cols_geglu",
        run: gemv_cols,
    },
    Case {
        kernel: "gemv_cols_conv",
        run: gemv_cols,
    },
    Case {
        kernel: "gemv_sum",
        run: gemv_sum,
    },
    Case {
        kernel: "gemv_sum_add",
        run: gemv_sum,
    },
    Case {
        kernel: "gemv_sum_norm",
        run: gemv_sum,
    },
    Case {
        kernel: "gemv_sum_swiglu",
        run: gemv_sum,
    },
    Case {
        kernel: "gemv_sum_geglu",
        run: gemv_sum,
    },
    Case {
        kernel: "gemv_sum_conv",
        run: gemv_sum,
    },
    Case {
        kernel: "gemm_add",
        run: gemm_add,
    },
    Case {
        kernel: "gemm_add_split",
        run: gemm_add_split,
    },
    Case {
        kernel: "gemm_norm_split",
        run: gemm_norm_split,
    },
    Case {
        kernel: "gemm_norm_swiglu_split",
        run: gemm_norm_swiglu_split,
    },
    Case {
        kernel: "gemm_split_sum",
        run: gemm_split_sum,
    },
    Case {
        kernel: "gemm_split_sum_shadow",
        run: gemm_split_sum_shadow,
    },
    Case {
        kernel: "gemm_norm",
        run: gemm_norm,
    },
    Case {
        kernel: "gemm_norm_swiglu",
        run: gemm_norm_swiglu,
    },
    Case {
        kernel: "gemm_norm_geglu",
        run: gemm_norm_swiglu,
    },
    Case {
        kernel: "embedding",
        run: embedding,
    },
    Case {
        kernel: "qk_rope",
        run: qk_rope,
    },
    Case {
        kernel: "flash_attention",
        run: flash_attention,
    },
    Case {
        kernel: "flash_attention_merge",
        run: flash_attention_merge,
    },
    Case {
        kernel: "flash_attention_prep",
        run: flash_attention_prep,
    },
    Case {
        kernel: "qk_rope_rows",
        run: qk_rope_rows,
    },
    Case {
        kernel: "flash_attention_rows",
        run: flash_attention_rows,
    },
    Case {
        kernel: "flash_attention_merge_rows",
        run: flash_attention_rows,
    },
    Case {
        kernel: "prefill_attention",
        run: prefill_attention,
    },
    Case {
        kernel: "prefill_attention_rows",
        run: prefill_attention_rows,
    },
    Case {
        kernel: "short_conv",
        run: short_conv,
    },
    Case {
        kernel: "short_conv_rows",
        run: short_conv_rows,
    },
    Case {
        kernel: "swiglu",
        run: swiglu,
    },
    Case {
        kernel: "argmax",
        run: argmax,
    },
    Case {
        kernel: "argmax_part",
        run: argmax_part,
    },
    Case {
        kernel: "argmax_rows",
        run: argmax_rows,
    },
    Case {
        kernel: "argmax_part_rows",
        run: argmax_rows,
    },
    Case {
        kernel: "sample_rows",
        run: sample_rows,
    },
    Case {
        kernel: "top_k_rows",
        run: top_k_rows,
    },
    Case {
        kernel: "top_k_part_rows",
        run: top_k_rows,
    },
    Case {
        kernel: "top_k",
        run: top_k,
    },
    Case {
        kernel: "top_k_part",
        run: top_k_part,
    },
    Case {
        kernel: "argmax_part_masked",
        run: argmax_masked,
    },
    Case {
        kernel: "top_k_masked",
        run: top_k_masked,
    },
    Case {
        kernel: "top_k_part_masked",
        run: top_k_masked,
    },
];

/// Products over k terms summed in another order: outputs of order one carry
/// absolute errors of a few 1e-7 (f32 roundings of partial sums), so the
/// normalised squared error stays below ~1e-11 (the largest seen on lavapipe:
/// 3e-11). 1e-9 leaves headroom for other drivers while one wrong weight in a
/// row (an error of ~1/sqrt(k) of the output, squared: >= 1e-4) still fails.
const PRODUCT_TOL: f64 = 1e-9;

/// [`assert_close`] for products whose inputs are scaled to give outputs of
/// order one (see [`weights`]): the squared error is measured against
/// max(||want||^2, n * 0.1^2), so that an output that happens to cancel to
/// almost zero (as a single one may) is judged by the size of its terms, not
/// by its own.
#[track_caller]
fn assert_products(what: &str, got: &[f32], want: &[f32], tol: f64) {
    assert_close(what, got, want, f64::INFINITY);
    let num: f64 = got
        .iter()
        .zip(want)
        .map(|(g, w)| ((g - w) as f64).powi(2))
        .sum();
    let den = want
        .iter()
        .map(|w| (*w as f64).powi(2))
        .sum::<f64>()
        .max(0.01 * want.len() as f64);
    let err = num / den;
    assert!(err <= tol, "{what}: normalised error {err:.3e} > {tol:.1e}");
}

fn format_and_subgroups(v: &Variant) -> (GgmlType, bool) {
    let t = llm_ops::variant_format(v).expect("format kernel variant names its format");
    (t, v.defines.contains(&"SUBGROUPS"))
}

/// Row lengths to test: odd ones for the float formats (which accept any
/// length), whole blocks otherwise; the largest spans several passes of the
/// 128-thread x 8-element GEMV workgroup.
fn row_lengths(t: GgmlType) -> Vec<usize> {
    match t.block_size() {
        1 => vec![1, 33, 1025],
        32 => vec![32, 96, 1056],
        _ => vec![256, 1280],
    }
}

/// Output rows: one, the 4-row GEMV workgroup + 1, and several workgroups.
const ROWS: [usize; 3] = [1, 5, 132];

/// Workgroups a WALK variant's cases use: few, so each walks many quads.
const WALK_GROUPS: usize = 3;

/// The row lengths of a single GEMV variant's cases; WALK's add one whose
/// lanes hold three units (the first two stay in registers).
fn single_row_lengths(t: GgmlType, v: &Variant) -> Vec<usize> {
    let mut ks = row_lengths(t);
    if v.defines.contains(&"WALK") {
        ks.push(match t.block_size() {
            1 => 2100,
            32 => 2336,
            _ => 2304,
        });
    }
    ks
}

/// The single GEMV as the variant under test lays it out. A WALK variant
/// is also run in the quad layout, whose output it must match bit for bit
/// (gemv_common.wgsl's one order of summation).
#[allow(clippy::too_many_arguments)]
fn single_gemv(
    gpu: &Gpu,
    v: &Variant,
    m: &GpuMatrix,
    epi: &GemvEpilogue,
    x: &wgpu::Buffer,
    x_off: usize,
    y_init: &[f32],
    out_off: usize,
) -> Vec<f32> {
    let mut outs = Vec::new();
    let mut layouts = vec![llm_ops::GemvLayout::Quads];
    if v.defines.contains(&"WALK") {
        layouts.push(llm_ops::GemvLayout::Walk(WALK_GROUPS));
    }
    for layout in layouts {
        let y = gpu.upload_f32("y", y_init).unwrap();
        run(
            gpu,
            &llm_ops::gemv_layout(gpu, m, epi, x, x_off, &y, out_off, layout).unwrap(),
        );
        outs.push(gpu.read_f32(&y).unwrap());
    }
    if let [quads, walk] = &outs[..] {
        let same = quads
            .iter()
            .zip(walk)
            .all(|(a, b)| a.to_bits() == b.to_bits());
        assert!(same, "{}: WALK differs from the quad layout", v.key());
    }
    outs.pop().unwrap()
}

/// Random weights of `rows` x `k` with the scale of a trained layer
/// (outputs of order one for inputs of order one).
fn weights(t: GgmlType, rows: usize, k: usize, rng: &mut Rng) -> Tensor {
    let a = 2.0 / (k as f32).sqrt();
    let data = rng.vec(rows * k, -a, a);
    Tensor::quantize_f32("w", vec![rows, k], &data, t).unwrap()
}

/// Uploads `parts` of one format as one matrix, split into chunks of at most
/// `max_rows` rows to exercise the splitting a binding limit forces.
fn upload(gpu: &Gpu, parts: &[&Tensor], max_rows: usize) -> GpuMatrix {
    let t = parts[0];
    let bytes: Vec<&[u8]> = parts.iter().map(|p| p.bytes()).collect();
    let max = (max_rows * parts.len() * t.row_bytes() + 4) as u64;
    GpuMatrix::upload(gpu, "w", t.dtype, t.row_len(), t.rows(), &bytes, max).unwrap()
}

/// The CPU's conv state (the gated inputs of positions pos - taps + 1 ..
/// pos - 1, oldest first, [taps - 1, d]) in the GPU's ring layout ([ring, d],
/// position q in row q % ring), the spare rows NaN.
fn to_ring(state: &[f32], taps: usize, ring: usize, d: usize, pos: usize) -> Vec<f32> {
    let mut out = vec![f32::NAN; ring * d];
    for j in 0..taps - 1 {
        let row = (pos + ring + 1 + j - taps) % ring;
        out[row * d..(row + 1) * d].copy_from_slice(&state[j * d..(j + 1) * d]);
    }
    out
}

/// The inverse of [`to_ring`]: the rows the next token at `pos` reads.
fn from_ring(ring: &[f32], taps: usize, rows: usize, d: usize, pos: usize) -> Vec<f32> {
    (0..taps - 1)
        .flat_map(|j| {
            let row = (pos + rows + 1 + j - taps) % rows;
            ring[row * d..(row + 1) * d].to_vec()
        })
        .collect()
}

fn run(gpu: &Gpu, ds: &[Dispatch]) {
    let refs: Vec<&Dispatch> = ds.iter().collect();
    gpu.run_all(&refs).unwrap();
}

fn gemv_case(gpu: &Gpu, v: &Variant, add: bool) {
    let (t, _) = format_and_subgroups(v);
    let mut rng = Rng::new(11);
    for k in single_row_lengths(t, v) {
        for rows in ROWS {
            let w = weights(t, rows, k, &mut rng);
            // x sits after one row of other values; y is written from row 3.
            let xs = rng.vec(2 * k, -2.0, 2.0);
            let (x, x_off, out_off) = (&xs[k..], k, 3);
            let mut want = vec![0.0; rows];
            cpu::gemv(&w, x, &mut want);
            let mut y0 = vec![f32::NAN; out_off + rows];
            if add {
                let base = rng.vec(rows, -1.0, 1.0);
                for (i, b) in base.iter().enumerate() {
                    y0[out_off + i] = *b;
                    want[i] += b;
                }
            }
            let m = upload(gpu, &[&w], 50);
            let gx = gpu.upload_f32("x", &xs).unwrap();
            let epi = if add {
                GemvEpilogue::Add
            } else {
                GemvEpilogue::Store
            };
            let got = single_gemv(gpu, v, &m, &epi, &gx, x_off, &y0, out_off);
            assert_products(
                &format!("{} k={k} rows={rows}", v.key()),
                &got[out_off..out_off + rows],
                &want,
                PRODUCT_TOL,
            );
        }
    }
}

fn gemv(gpu: &Gpu, v: &Variant) {
    gemv_case(gpu, v, false);
}

fn gemv_add(gpu: &Gpu, v: &Variant) {
    gemv_case(gpu, v, true);
}

fn gemv_norm(gpu: &Gpu, v: &Variant) {
    let (t, _) = format_and_subgroups(v);
    let mut rng = Rng::new(12);
    for k in single_row_lengths(t, v) {
        for rows in ROWS {
            let w = weights(t, rows, k, &mut rng);
            let x = rng.vec(k, -3.0, 3.0);
            let nw = rng.vec(k, 0.5, 1.5);
            let mut want = vec![0.0; rows];
            cpu::gemv_norm(&w, &x, &nw, 1e-5, &mut want);
            let m = upload(gpu, &[&w], 50);
            let gx = gpu.upload_f32("x", &x).unwrap();
            let gn = gpu.upload_f32("nw", &nw).unwrap();
            let epi = GemvEpilogue::Norm { nw: &gn, eps: 1e-5 };
            let got = single_gemv(gpu, v, &m, &epi, &gx, 0, &vec![f32::NAN; rows], 0);
            // The norm's scale is applied after the sum instead of before:
            // one more rounding per output on top of the product's.
            assert_products(
                &format!("{} k={k} rows={rows}", v.key()),
                &got[..rows],
                &want,
                PRODUCT_TOL,
            );
        }
    }
}

/// The gated activation a variant computes (GELU: GeGLU).
fn act_of(v: &Variant) -> FfnAct {
    if v.defines.contains(&"GELU") {
        FfnAct::GeluTanh
    } else {
        FfnAct::Silu
    }
}

fn gemv_swiglu(gpu: &Gpu, v: &Variant) {
    let (t, _) = format_and_subgroups(v);
    let act = act_of(v);
    let mut rng = Rng::new(13);
    for k in row_lengths(t) {
        for rows in ROWS {
            let gate = weights(t, rows, k, &mut rng);
            let up = weights(t, rows, k, &mut rng);
            let x = rng.vec(k, -3.0, 3.0);
            let nw = rng.vec(k, 0.5, 1.5);
            let mut want = vec![0.0; rows];
            cpu::gemv_swiglu(&gate, &up, &x, &nw, 1e-5, act, &mut want);
            let m = upload(gpu, &[&gate, &up], 50);
            let gx = gpu.upload_f32("x", &x).unwrap();
            let gn = gpu.upload_f32("nw", &nw).unwrap();
            let gy = gpu.poisoned_f32("y", rows).unwrap();
            let epi = GemvEpilogue::Swiglu {
                nw: &gn,
                eps: 1e-5,
                act,
            };
            run(gpu, &llm_ops::gemv(gpu, &m, &epi, &gx, 0, &gy, 0).unwrap());
            let got = gpu.read_f32(&gy).unwrap();
            // Two products (as gemv_norm) multiplied: their errors add.
            assert_products(
                &format!("{} k={k} rows={rows}", v.key()),
                &got[..rows],
                &want,
                2.0 * PRODUCT_TOL,
            );
        }
    }
}

fn gemv_conv(gpu: &Gpu, v: &Variant) {
    let (t, _) = format_and_subgroups(v);
    let mut rng = Rng::new(14);
    let hiddens = match t.block_size() {
        1 => vec![1, 33, 130],
        32 => vec![32, 96],
        _ => vec![256],
    };
    for d in hiddens {
        for taps in [1, 3, 4] {
            let in_proj = weights(t, 3 * d, d, &mut rng);
            let conv = rng.vec(d * taps, -1.0, 1.0);
            let nw = rng.vec(d, 0.5, 1.5);
            let mut state = rng.vec((taps - 1) * d, -1.0, 1.0);
            // The GPU keeps the state as a ring; start at a position that
            // wraps it, with its spare row poisoned (it must not be read).
            let pos0 = 5;
            let rb = in_proj.row_bytes();
            let b = in_proj.bytes();
            let parts: Vec<&[u8]> = (0..3).map(|p| &b[p * d * rb..(p + 1) * d * rb]).collect();
            let max = (20 * 3 * rb + 4) as u64;
            let m = GpuMatrix::upload(gpu, "in_proj", t, d, d, &parts, max).unwrap();
            let gc = gpu.upload_f32("conv", &conv).unwrap();
            let gn = gpu.upload_f32("nw", &nw).unwrap();
            // Spare rows beyond the taps, as the models keep for rewinding.
            let ring = taps + 2;
            let gs = gpu
                .upload_f32("state", &to_ring(&state, taps, ring, d, pos0))
                .unwrap();
            // Two tokens in a row: the second reads the state the first left.
            for step in 0..2 {
                let pos = pos0 + step;
                let gstep = gpu.upload_u32("step", &[0, pos as u32, 0, 0]).unwrap();
                let x = rng.vec(d, -3.0, 3.0);
                let mut want = vec![0.0; d];
                cpu::gemv_conv(&in_proj, &x, &nw, 1e-5, &conv, taps, &mut state, &mut want);
                let gx = gpu.upload_f32("x", &x).unwrap();
                let gy = gpu.poisoned_f32("y", d).unwrap();
                let epi = GemvEpilogue::Conv {
                    nw: &gn,
                    eps: 1e-5,
                    conv: &gc,
                    state: &gs,
                    step: &gstep,
                    taps,
                    ring,
                };
                run(gpu, &llm_ops::gemv(gpu, &m, &epi, &gx, 0, &gy, 0).unwrap());
                let what = format!("{} d={d} taps={taps} step={step}", v.key());
                // Products of three projections and a short sum: a few
                // gemv_norm errors.
                assert_products(
                    &what,
                    &gpu.read_f32(&gy).unwrap()[..d],
                    &want,
                    4.0 * PRODUCT_TOL,
                );
                if taps > 1 {
                    let got = gpu.read_f32(&gs).unwrap();
                    assert_products(
                        &format!("{what} state"),
                        &from_ring(&got, taps, ring, d, pos + 1),
                        &state,
                        PRODUCT_TOL,
                    );
                }
            }
        }
    }
}

/// Which GEMM epilogue a case runs (llm_ops::GemmMode without its buffer).
#[derive(Clone, Copy, PartialEq)]
enum Epilogue {
    Add,
    Norm,
    NormSwiglu(FfnAct),
}

/// `split`: the GEMM split three ways over k (and gemm_split_sum after it).
fn gemm_case(gpu: &Gpu, v: &Variant, epilogue: Epilogue, split: bool) {
    let (t, _) = format_and_subgroups(v);
    let kernel = if v.defines.contains(&"COOP") {
        GemmKernel::CoopTiles(if v.defines.contains(&"BIG") {
            CoopTile::Big
        } else if v.defines.contains(&"WIDE") {
            CoopTile::Wide
        } else {
            CoopTile::Narrow
        })
    } else {
        GemmKernel::Portable
    };
    let read = if v.defines.contains(&"X4") {
        XRows::Vec4
    } else if v.defines.contains(&"XH") {
        XRows::F16
    } else {
        XRows::Scalar
    };
    // YH: outputs as f16 pairs, in a layout of whole pairs.
    let yh = v.defines.contains(&"YH");
    gemm_check(gpu, &v.key(), t, kernel, epilogue, split, read, yh, yh);
}

/// How a GEMM variant under test reads its activations.
#[derive(Clone, Copy, PartialEq)]
enum XRows {
    /// f32s, rows whose stride is not a multiple of 4
    Scalar,
    /// f32s in rows of whole vec4s (X4)
    Vec4,
    /// f16 pairs in rows of whole vec4s (XH)
    F16,
}

/// f16 pairs of `x` (pack2x16float's layout: the first in the low half).
fn f16_pairs(x: &[f32]) -> Vec<u32> {
    x.chunks(2)
        .map(|p| {
            let lo = half::f16::from_f32(p[0]).to_bits() as u32;
            let hi = half::f16::from_f32(p.get(1).copied().unwrap_or(0.0)).to_bits() as u32;
            lo | hi << 16
        })
        .collect()
}

/// The GEMM of `kernel` on weights of `t` against the CPU's products;
/// `read`: for the COOP variants that read activations four at a time (X4,
/// XH), rows whose length and stride are multiples of 4 (the host picks
/// them for such rows), otherwise a stride that is not; XH's as f16 pairs.
#[allow(clippy::too_many_arguments)]
fn gemm_check(
    gpu: &Gpu,
    key: &str,
    t: GgmlType,
    kernel: GemmKernel,
    epilogue: Epilogue,
    split: bool,
    read: XRows,
    out4: bool,
    f16_out: bool,
) {
    let coop = kernel != GemmKernel::Portable;
    let x4 = read != XRows::Scalar;
    // y's layout: `out4`, columns, offset and stride in fours (a split's sum
    // then finishes four at a time: gemm_split_sum's V4).
    let (out_off, pad) = if out4 { (4, 8) } else { (1, 3) };
    let add = epilogue == Epilogue::Add;
    let eps = 1e-5;
    // The COOP variant rounds both factors to f16 (relative 2^-11 each):
    // ~1e-7 of normalised squared error on these sums, while one wrong
    // weight in a row still gives >= 1e-4.
    let tol = if coop { 1e-5 } else { PRODUCT_TOL };
    let mut rng = Rng::new(15);
    for k in row_lengths(t)
        .into_iter()
        .filter(|k| !x4 || k.is_multiple_of(4))
    {
        // Past one COOP tile (64 x 32, WIDE 128 x 64, BIG 128 x 128) in both
        // directions too.
        for (rows, n) in [(1, 1), (65, 33), (132, 5), (70, 130)]
            .into_iter()
            .filter(|(rows, _)| !out4 || (2 * rows) % 4 == 0)
        {
            // Two parts side by side in y: [n, 2 rows + pad] from column out_off.
            let a = weights(t, rows, k, &mut rng);
            let b = weights(t, rows, k, &mut rng);
            let x_stride = if x4 { k + 4 } else { k + 2 };
            // The variant under test is the one the host picks for these rows.
            assert_eq!(
                llm_ops::gemm_reads_x4(x_stride, k),
                x4 && coop,
                "{key} k={k}"
            );
            let xs = rng.vec(n * x_stride, -2.0, 2.0);
            let mut x: Vec<f32> = xs.chunks(x_stride).flat_map(|r| r[..k].to_vec()).collect();
            // NORM: the CPU normalises first, as the unfused model did.
            let nw = rng.vec(k, 0.5, 1.5);
            if matches!(epilogue, Epilogue::Norm | Epilogue::NormSwiglu(_)) {
                let raw = x.clone();
                cpu::rms_norm(&raw, &nw, eps, &mut x);
            }
            let (ya, yb) = (
                {
                    let mut y = vec![0.0; n * rows];
                    cpu::gemm(&a, &x, n, &mut y);
                    y
                },
                {
                    let mut y = vec![0.0; n * rows];
                    cpu::gemm(&b, &x, n, &mut y);
                    y
                },
            );
            let y_stride = 2 * rows + pad;
            if split {
                assert_eq!(
                    llm_ops::split_sum_in_vec4s(2 * rows, out_off, y_stride),
                    out4,
                    "{key} rows={rows}"
                );
            }
            let mut y0 = vec![f32::NAN; n * y_stride];
            if add {
                y0 = rng.vec(n * y_stride, -1.0, 1.0);
            }
            let mut want = Vec::new();
            let mut got_at = Vec::new();
            for tok in 0..n {
                if let Epilogue::NormSwiglu(act) = epilogue {
                    // One column per row pair: act(gate) * up.
                    for r in 0..rows {
                        let i = tok * rows + r;
                        want.push(cpu::ffn_act(act, ya[i]) * yb[i]);
                        got_at.push(tok * y_stride + out_off + r);
                    }
                    continue;
                }
                for (p, yp) in [&ya, &yb].into_iter().enumerate() {
                    for r in 0..rows {
                        let at = tok * y_stride + out_off + p * rows + r;
                        let base = if add { y0[at] } else { 0.0 };
                        want.push(base + yp[tok * rows + r]);
                        got_at.push(at);
                    }
                }
            }
            let m = upload(gpu, &[&a, &b], 50);
            let gx = match read {
                XRows::F16 => gpu.upload_u32("x", &f16_pairs(&xs)).unwrap(),
                _ => gpu.upload_f32("x", &xs).unwrap(),
            };
            let x_in = match read {
                XRows::F16 => GemmInput::F16(&gx),
                _ => GemmInput::F32(&gx),
            };
            let gy = match f16_out {
                true => gpu.upload_u32("y", &f16_pairs(&y0)).unwrap(),
                false => gpu.upload_f32("y", &y0).unwrap(),
            };
            let gnw = gpu.upload_f32("nw", &nw).unwrap();
            let mode = match epilogue {
                Epilogue::Add => GemmMode::Add,
                Epilogue::Norm => GemmMode::Norm { nw: &gnw, eps },
                Epilogue::NormSwiglu(act) => GemmMode::NormSwiglu {
                    nw: &gnw,
                    eps,
                    act,
                    f16_out,
                },
            };
            // The variant under test is the one the host picks for this y.
            if f16_out {
                assert!(llm_ops::gemm_writes_f16(&m, out_off, y_stride), "{key}");
            }
            let ds = if split {
                let part = gpu.poisoned_f32("part", 3 * n * (2 * rows + 1)).unwrap();
                let plan = GemmPlan {
                    tile: match kernel {
                        GemmKernel::CoopTiles(tile) => Some(tile),
                        _ => None,
                    },
                    ways: 3,
                };
                llm_ops::gemm_split(
                    gpu, kernel, &m, mode, x_in, x_stride, &gy, y_stride, out_off, n, &part, plan,
                )
            } else {
                llm_ops::gemm(
                    gpu, kernel, &m, mode, x_in, x_stride, &gy, y_stride, out_off, n,
                )
            };
            run(gpu, &ds.unwrap());
            let all: Vec<f32> = match f16_out {
                true => gpu
                    .read_u32(&gy)
                    .unwrap()
                    .iter()
                    .flat_map(|p| [p & 0xffff, p >> 16])
                    .map(|h| half::f16::from_bits(h as u16).to_f32())
                    .collect(),
                false => gpu.read_f32(&gy).unwrap(),
            };
            let got: Vec<f32> = got_at.iter().map(|&i| all[i]).collect();
            assert_products(&format!("{key} k={k} rows={rows} n={n}"), &got, &want, tol);
        }
    }
}

fn gemm_add(gpu: &Gpu, v: &Variant) {
    gemm_case(gpu, v, Epilogue::Add, false);
}

fn gemm_add_split(gpu: &Gpu, v: &Variant) {
    gemm_case(gpu, v, Epilogue::Add, true);
}

fn gemm_norm_split(gpu: &Gpu, v: &Variant) {
    gemm_case(gpu, v, Epilogue::Norm, true);
}

/// Both gated epilogues: the split GEMM is the same for them, its sum not.
fn gemm_norm_swiglu_split(gpu: &Gpu, v: &Variant) {
    for act in [FfnAct::Silu, FfnAct::GeluTanh] {
        gemm_case(gpu, v, Epilogue::NormSwiglu(act), true);
    }
}

/// The split sums added in order into y, exactly as the CPU adds them; the
/// variants that end a normalised GEMM, through the whole split GEMM.
fn gemm_split_sum(gpu: &Gpu, v: &Variant) {
    let has = |d| v.defines.contains(&d);
    let epilogue = match (has("NORM"), has("SWIGLU")) {
        (false, _) => None,
        (true, false) => Some(Epilogue::Norm),
        (true, true) => Some(Epilogue::NormSwiglu(act_of(v))),
    };
    if let Some(e) = epilogue {
        gemm_check(
            gpu,
            &v.key(),
            GgmlType::F32,
            GemmKernel::Portable,
            e,
            true,
            XRows::Scalar,
            has("V4"),
            false,
        );
        return;
    }
    let mut rng = Rng::new(21);
    // V4: columns in fours.
    let (rows, k, n) = (if has("V4") { 72 } else { 70 }, 32 * 5 + 8, 3);
    assert_eq!(llm_ops::split_sum_in_vec4s(rows, 0, rows), has("V4"));
    let a = weights(GgmlType::F32, rows, k, &mut rng);
    let m = upload(gpu, &[&a], 40);
    let xs = rng.vec(n * k, -2.0, 2.0);
    let y0 = rng.vec(n * rows, -1.0, 1.0);
    let gx = gpu.upload_f32("x", &xs).unwrap();
    let gy = gpu.upload_f32("y", &y0).unwrap();
    let part = gpu.poisoned_f32("part", 4 * n * rows).unwrap();
    let ds = llm_ops::gemm_split(
        gpu,
        GemmKernel::Portable,
        &m,
        GemmMode::Add,
        &gx,
        k,
        &gy,
        rows,
        0,
        n,
        &part,
        GemmPlan {
            tile: None,
            ways: 4,
        },
    )
    .unwrap();
    run(gpu, &ds);
    // The sum pass alone, again from the same y: the splits' sums in order.
    let splits = gpu.read_f32(&part).unwrap();
    let got = gpu.read_f32(&gy).unwrap();
    let (_, ways) = llm_ops::gemm_split_span(GemmKernel::Portable, k, 4);
    let mut want = y0.clone();
    for (i, w) in want.iter_mut().enumerate() {
        let mut s = 0.0f32;
        for z in 0..ways {
            s += splits[z * n * rows + i];
        }
        *w += s;
    }
    assert_close("gemm_split_sum", &got[..n * rows], &want, 0.0);
}

/// The ADD sum that also writes y's new values as f16 pairs: y as
/// gemm_split_sum's, its copy those values rounded to f16.
fn gemm_split_sum_shadow(gpu: &Gpu, _v: &Variant) {
    let mut rng = Rng::new(22);
    let (rows, k, n, y_stride) = (72, 32 * 5 + 8, 3, 80);
    let a = weights(GgmlType::F32, rows, k, &mut rng);
    let m = upload(gpu, &[&a], 40);
    let xs = rng.vec(n * k, -2.0, 2.0);
    let y0 = rng.vec(n * y_stride, -1.0, 1.0);
    let gx = gpu.upload_f32("x", &xs).unwrap();
    let plain = gpu.upload_f32("y", &y0).unwrap();
    let gy = gpu.upload_f32("y", &y0).unwrap();
    let yh = gpu
        .upload_u32("yh", &vec![0xffff_ffff; n * y_stride / 2])
        .unwrap();
    let part = gpu.poisoned_f32("part", 4 * n * rows).unwrap();
    let plan = GemmPlan {
        tile: None,
        ways: 4,
    };
    for (mode, y) in [
        (GemmMode::Add, &plain),
        (GemmMode::AddShadow { yh: &yh }, &gy),
    ] {
        let ds = llm_ops::gemm_split(
            gpu,
            GemmKernel::Portable,
            &m,
            mode,
            &gx,
            k,
            y,
            y_stride,
            4,
            n,
            &part,
            plan,
        )
        .unwrap();
        run(gpu, &ds);
    }
    let want = gpu.read_f32(&plain).unwrap();
    let got = gpu.read_f32(&gy).unwrap();
    assert_close("gemm_split_sum_shadow y", &got, &want, 0.0);
    // The copy: the new columns 4..4 + rows of each row, rounded to f16
    // (to nearest or toward zero: WGSL leaves it to the device), untouched
    // elsewhere.
    let copy = gpu.read_u32(&yh).unwrap();
    for t in 0..n {
        for c in (0..y_stride).step_by(2) {
            let at = t * y_stride + c;
            let pair = copy[at / 2];
            if !(4..4 + rows).contains(&c) {
                assert_eq!(
                    pair, 0xffff_ffff,
                    "gemm_split_sum_shadow yh token {t} column {c}"
                );
                continue;
            }
            for (i, bits) in [pair & 0xffff, pair >> 16].into_iter().enumerate() {
                let h = half::f16::from_bits(bits as u16).to_f32();
                let v = want[at + i];
                assert!(
                    (h - v).abs() <= v.abs() * 2f32.powi(-10),
                    "gemm_split_sum_shadow yh token {t} column {}: {h} for {v}",
                    c + i
                );
            }
        }
    }
}

fn gemm_norm(gpu: &Gpu, v: &Variant) {
    gemm_case(gpu, v, Epilogue::Norm, false);
}

fn gemm_norm_swiglu(gpu: &Gpu, v: &Variant) {
    gemm_case(gpu, v, Epilogue::NormSwiglu(act_of(v)), false);
}

fn embedding(gpu: &Gpu, v: &Variant) {
    let (t, _) = format_and_subgroups(v);
    let mut rng = Rng::new(16);
    let dims = match t.block_size() {
        1 => vec![1, 33, 520],
        32 => vec![32, 544],
        _ => vec![256, 768],
    };
    for d in dims {
        let vocab = 67;
        let table = weights(t, vocab, d, &mut rng);
        let tokens: Vec<u32> = [0, vocab - 1, 5, 31, 32, 33, 5]
            .iter()
            .map(|&i| i as u32)
            .collect();
        let n = tokens.len();
        let mut want = vec![0.0; n * d];
        cpu::embedding(&table, &tokens, &mut want);
        // Gemma's scale (a power of two, so the product stays exact).
        let scale = if d == 33 { 16.0 } else { 1.0 };
        want.iter_mut().for_each(|w| *w *= scale);
        // Chunks of 32 rows: tokens 31, 32 and 66 fall in different buffers.
        let m = upload(gpu, &[&table], 32);
        assert_eq!(m.chunks.len(), 3);
        // Two leading words, then the tokens one word apart (as the batch
        // reads them from its argmax's [token, flag] pairs); a word read by
        // mistake is no row and leaves y's poison.
        let mut tok_buf = vec![7u32; 2];
        tok_buf.extend(tokens.iter().flat_map(|&t| [t, u32::MAX]));
        let gt = gpu.upload_u32("tokens", &tok_buf).unwrap();
        let gy = gpu.poisoned_f32("y", n * d).unwrap();
        run(
            gpu,
            &llm_ops::embedding(gpu, &m, &gt, 2, 2, scale, &gy, n).unwrap(),
        );
        // Dequantisation is exact on both sides.
        assert_close(
            &format!("{} d={d}", v.key()),
            &gpu.read_f32(&gy).unwrap()[..n * d],
            &want,
            0.0,
        );
    }
}

fn qk_rope(gpu: &Gpu, v: &Variant) {
    let norm = v.defines.contains(&"QK_NORM");
    let with_bias = v.defines.contains(&"BIAS");
    let mut rng = Rng::new(17);
    for (heads, kv_heads, hd, rope_dim, style) in [
        (4, 2, 64, 64, RopeStyle::Halves),
        (3, 1, 34, 32, RopeStyle::Interleaved),
        (2, 2, 130, 130, RopeStyle::Halves),
    ] {
        for (n, pos0) in [(1, 0), (1, 700), (5, 7)] {
            let s = AttnShape {
                heads,
                kv_heads,
                head_dim: hd,
                rope_dim,
                rope_style: style,
                eps: 1e-5,
                scale: cpu::attention_scale(hd),
                window: 0,
            };
            let (qw, kvw) = (heads * hd, kv_heads * hd);
            let qkv = rng.vec(n * (qw + 2 * kvw), -2.0, 2.0);
            let bias = rng.vec(qw + 2 * kvw, -1.0, 1.0);
            let cs = cpu::rope_table(pos0, n, rope_dim, 10_000.0);
            let qn = rng.vec(hd, 0.5, 1.5);
            let kn = rng.vec(hd, 0.5, 1.5);
            let cap = pos0 + n + 2;
            let mut want_q = vec![0.0; n * qw];
            let mut want_k = vec![f32::NAN; cap * kvw];
            let mut want_v = vec![f32::NAN; cap * kvw];
            cpu::qk_rope(
                &qkv,
                n,
                &s,
                norm.then_some(qn.as_slice()),
                norm.then_some(kn.as_slice()),
                with_bias.then_some(bias.as_slice()),
                &cs,
                pos0,
                &mut want_q,
                &mut want_k,
                &mut want_v,
            );
            let gqkv = gpu.upload_f32("qkv", &qkv).unwrap();
            let consts = llm_ops::HeadConsts::upload(
                gpu,
                norm.then_some((qn.as_slice(), kn.as_slice())),
                with_bias.then_some(bias.as_slice()),
            )
            .unwrap();
            let gcs = gpu.upload_f32("cs", &cs).unwrap();
            let step = gpu
                .upload_u32("step", &[0, pos0 as u32, (pos0 + n) as u32, 1])
                .unwrap();
            let gq = gpu.poisoned_f32("q", n * qw).unwrap();
            let gk = gpu.poisoned_f32("kc", cap * kvw).unwrap();
            let gv = gpu.poisoned_f32("vc", cap * kvw).unwrap();
            let kv = llm_ops::AttnBuffers {
                step: &step,
                k_cache: &gk,
                v_cache: &gv,
            };
            let d = llm_ops::qk_rope(gpu, &s, &gqkv, consts.as_ref(), &gcs, &kv, &gq, n).unwrap();
            gpu.run_all(&[&d]).unwrap();
            let what = format!("{} hd={hd} n={n} pos0={pos0}", v.key());
            // The same cos/sin table on both sides; the norm's sum of
            // squares is added in another order: a few ulps.
            assert_close(&what, &gpu.read_f32(&gq).unwrap()[..n * qw], &want_q, 1e-12);
            let rows = pos0 * kvw..(pos0 + n) * kvw;
            let k = gpu.read_f32(&gk).unwrap();
            assert_close(
                &format!("{what} k"),
                &k[rows.clone()],
                &want_k[rows.clone()],
                1e-12,
            );
            let vv = gpu.read_f32(&gv).unwrap();
            // Values are copied.
            assert_close(&format!("{what} v"), &vv[rows.clone()], &want_v[rows], 0.0);
            // Other cache rows are left alone.
            assert!(
                k[..pos0 * kvw].iter().all(|x| x.is_nan()),
                "{what}: wrote outside"
            );
        }
    }
}

/// Runs flash attention (and its merge when split) for `n_q` queries over
/// `kv_len` cached positions and compares with `cpu::flash_attention`.
#[allow(clippy::too_many_arguments)]
fn attention_case(
    gpu: &Gpu,
    v: &Variant,
    heads: usize,
    kv_heads: usize,
    hd: usize,
    n_q: usize,
    kv_len: usize,
    splits: usize,
    window: usize,
    rng: &mut Rng,
) {
    let sub = v.defines.contains(&"SUBGROUPS");
    let s = AttnShape {
        heads,
        kv_heads,
        head_dim: hd,
        rope_dim: hd,
        rope_style: RopeStyle::Halves,
        eps: 1e-5,
        // A checkpoint's own scale (Gemma's query_pre_attn_scalar).
        scale: 1.0 / (hd as f32 + 7.0).sqrt(),
        window,
    };
    let kvw = kv_heads * hd;
    // Peaked scores (|q.k| up to ~hd) test the running max; the cache has
    // spare poisoned rows past kv_len that must never be read.
    let q = rng.vec(n_q * heads * hd, -1.5, 1.5);
    let k = rng.vec(kv_len * kvw, -1.5, 1.5);
    let vv = rng.vec(kv_len * kvw, -1.0, 1.0);
    let mut want = vec![0.0; n_q * heads * hd];
    cpu::flash_attention(&q, &k, &vv, n_q, kv_len, &s, &mut want);
    let pad = |x: &[f32]| {
        let mut p = x.to_vec();
        p.extend(std::iter::repeat_n(f32::NAN, 3 * kvw));
        p
    };
    let gq = gpu.upload_f32("q", &q).unwrap();
    let gk = gpu.upload_f32("kc", &pad(&k)).unwrap();
    let gv = gpu.upload_f32("vc", &pad(&vv)).unwrap();
    let step = gpu
        .upload_u32(
            "step",
            &[0, (kv_len - n_q) as u32, kv_len as u32, splits as u32],
        )
        .unwrap();
    let out = gpu.poisoned_f32("out", n_q * heads * hd).unwrap();
    let part = gpu
        .poisoned_f32("part", llm_ops::attention_part_len(heads, hd, n_q))
        .unwrap();
    let kv = llm_ops::AttnBuffers {
        step: &step,
        k_cache: &gk,
        v_cache: &gv,
    };
    let coop = v.defines.contains(&"COOP");
    let mut enc = gpu.device.create_command_encoder(&Default::default());
    if coop {
        let d = llm_ops::prefill_attention(gpu, &s, &gq, &kv, &out, n_q)
            .unwrap()
            .expect("the adapter runs the COOP variant");
        let mut pass = enc.begin_compute_pass(&Default::default());
        d.record(&mut pass);
    } else {
        let att = llm_ops::flash_attention(gpu, sub, &s, &gq, &kv, &out, &part, n_q).unwrap();
        let mut pass = enc.begin_compute_pass(&Default::default());
        att.record(&mut pass, splits);
    }
    gpu.submit_and_wait(enc).unwrap();
    // exp and the online rescaling round differently from the CPU's
    // two-pass softmax: ~1e-6 relative per element, squared. The COOP
    // prefill kernel rounds q, k, v and the probabilities to f16 (relative
    // 2^-11 each, ~1e-6 squared); one key dropped from 65 gives ~1e-4.
    let tol = if coop { 1e-5 } else { 1e-10 };
    assert_close(
        &format!(
            "{} heads={heads}/{kv_heads} hd={hd} n_q={n_q} kv_len={kv_len} splits={splits} window={window}",
            v.key()
        ),
        &gpu.read_f32(&out).unwrap(),
        &want,
        tol,
    );
}

fn flash_attention(gpu: &Gpu, v: &Variant) {
    let mut rng = Rng::new(18);
    for hd in [64, 33, 256] {
        // Decode over every interesting length, with the splits decode uses.
        for kv_len in [1, 63, 64, 65, 257, 1025] {
            let splits = llm_ops::attention_splits(kv_len);
            attention_case(gpu, v, 4, 2, hd, 1, kv_len, splits, 0, &mut rng);
        }
        // Causal prefill: 33 new queries after 7 cached positions.
        attention_case(gpu, v, 4, 1, hd, 33, 40, 1, 0, &mut rng);
        attention_case(gpu, v, 2, 2, hd, 1, 1, 1, 0, &mut rng);
        // Sliding windows: shorter than the cache (split or not), one
        // position, and longer than the cache.
        attention_case(
            gpu,
            v,
            4,
            2,
            hd,
            1,
            257,
            llm_ops::attention_splits(257),
            100,
            &mut rng,
        );
        attention_case(gpu, v, 4, 1, hd, 33, 40, 1, 9, &mut rng);
        attention_case(gpu, v, 2, 2, hd, 3, 20, 1, 1, &mut rng);
        attention_case(gpu, v, 2, 1, hd, 5, 12, 1, 4096, &mut rng);
    }
    // Query heads computed together (llm_ops::query_heads_together): 8 of
    // one key head, 7, and 16 (two workgroups of 8).
    for (heads, kv_heads) in [(8, 1), (14, 2), (16, 1)] {
        for kv_len in [1, 65, 300] {
            let splits = llm_ops::attention_splits(kv_len);
            attention_case(gpu, v, heads, kv_heads, 64, 1, kv_len, splits, 0, &mut rng);
        }
        attention_case(gpu, v, heads, kv_heads, 40, 3, 20, 1, 7, &mut rng);
    }
}

/// Decode attention with qk_rope's work in the same dispatch, against
/// cpu::qk_rope then cpu::flash_attention: the output, and the new
/// position's key and value in the caches (every other row left alone).
fn flash_attention_prep(gpu: &Gpu, v: &Variant) {
    let sub = v.defines.contains(&"SUBGROUPS");
    let norm = v.defines.contains(&"QK_NORM");
    let with_bias = v.defines.contains(&"BIAS");
    let mut rng = Rng::new(23);
    for (heads, kv_heads, hd, rope_dim, style, window) in [
        (4, 2, 64, 64, RopeStyle::Halves, 0),
        (3, 1, 34, 32, RopeStyle::Interleaved, 0),
        (8, 1, 256, 128, RopeStyle::Halves, 0),
        (6, 3, 64, 64, RopeStyle::Halves, 100),
    ] {
        for kv_len in [1, 64, 65, 257, 1025] {
            let s = AttnShape {
                heads,
                kv_heads,
                head_dim: hd,
                rope_dim,
                rope_style: style,
                eps: 1e-5,
                scale: cpu::attention_scale(hd),
                window,
            };
            let (qw, kvw) = (heads * hd, kv_heads * hd);
            let pos = kv_len - 1;
            let splits = llm_ops::attention_splits(kv_len);
            let qkv = rng.vec(qw + 2 * kvw, -2.0, 2.0);
            let bias = rng.vec(qw + 2 * kvw, -1.0, 1.0);
            let qn = rng.vec(hd, 0.5, 1.5);
            let kn = rng.vec(hd, 0.5, 1.5);
            let cs = cpu::rope_table(pos, 1, rope_dim, 10_000.0);
            // The earlier positions cached; the new one and two spare rows
            // poisoned.
            let cap = kv_len + 2;
            let mut k = rng.vec(cap * kvw, -1.5, 1.5);
            let mut vv = rng.vec(cap * kvw, -1.0, 1.0);
            k[pos * kvw..].fill(f32::NAN);
            vv[pos * kvw..].fill(f32::NAN);
            let (mut want_k, mut want_v) = (k.clone(), vv.clone());
            let mut q = vec![0.0; qw];
            cpu::qk_rope(
                &qkv,
                1,
                &s,
                norm.then_some(qn.as_slice()),
                norm.then_some(kn.as_slice()),
                with_bias.then_some(bias.as_slice()),
                &cs,
                pos,
                &mut q,
                &mut want_k,
                &mut want_v,
            );
            let mut want = vec![0.0; qw];
            let cached = ..kv_len * kvw;
            cpu::flash_attention(
                &q,
                &want_k[cached],
                &want_v[cached],
                1,
                kv_len,
                &s,
                &mut want,
            );
            let gqkv = gpu.upload_f32("qkv", &qkv).unwrap();
            let consts = llm_ops::HeadConsts::upload(
                gpu,
                norm.then_some((qn.as_slice(), kn.as_slice())),
                with_bias.then_some(bias.as_slice()),
            )
            .unwrap();
            let gcs = gpu.upload_f32("cs", &cs).unwrap();
            let gk = gpu.upload_f32("kc", &k).unwrap();
            let gv = gpu.upload_f32("vc", &vv).unwrap();
            let step = gpu
                .upload_u32("step", &[0, pos as u32, kv_len as u32, splits as u32])
                .unwrap();
            let out = gpu.poisoned_f32("out", qw).unwrap();
            let part = gpu
                .poisoned_f32("part", llm_ops::attention_part_len(heads, hd, 1))
                .unwrap();
            let kv = llm_ops::AttnBuffers {
                step: &step,
                k_cache: &gk,
                v_cache: &gv,
            };
            let att = llm_ops::flash_attention_prep(
                gpu,
                sub,
                &s,
                &gqkv,
                consts.as_ref(),
                &gcs,
                &kv,
                &out,
                &part,
            )
            .unwrap()
            .expect("one workgroup takes every query head of a key head");
            let mut enc = gpu.device.create_command_encoder(&Default::default());
            {
                let mut pass = enc.begin_compute_pass(&Default::default());
                att.record(&mut pass, splits);
            }
            gpu.submit_and_wait(enc).unwrap();
            let what = format!(
                "{} heads={heads}/{kv_heads} hd={hd} kv_len={kv_len} window={window}",
                v.key()
            );
            // As the flash_attention and qk_rope cases: the softmax's
            // rounding, and the norm's sum of squares in another order.
            assert_close(&what, &gpu.read_f32(&out).unwrap(), &want, 1e-10);
            let new = pos * kvw..kv_len * kvw;
            let got_k = gpu.read_f32(&gk).unwrap();
            let got_v = gpu.read_f32(&gv).unwrap();
            assert_close(
                &format!("{what} k"),
                &got_k[new.clone()],
                &want_k[new.clone()],
                1e-12,
            );
            assert_close(&format!("{what} v"), &got_v[new.clone()], &want_v[new], 0.0);
            let same =
                |a: &[f32], b: &[f32]| a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits());
            assert!(
                same(&got_k[..pos * kvw], &k[..pos * kvw])
                    && same(&got_v[..pos * kvw], &vv[..pos * kvw])
                    && same(&got_k[kv_len * kvw..], &k[kv_len * kvw..])
                    && same(&got_v[kv_len * kvw..], &vv[kv_len * kvw..]),
                "{what}: wrote another cache row"
            );
        }
    }
    // More query heads to a key head than a workgroup takes: not fused.
    let s = AttnShape {
        heads: 16,
        kv_heads: 1,
        head_dim: 64,
        rope_dim: 64,
        rope_style: RopeStyle::Halves,
        eps: 1e-5,
        scale: cpu::attention_scale(64),
        window: 0,
    };
    let buf = gpu.upload_f32("any", &[0.0; 64]).unwrap();
    let kv = llm_ops::AttnBuffers {
        step: &buf,
        k_cache: &buf,
        v_cache: &buf,
    };
    let att = llm_ops::flash_attention_prep(gpu, sub, &s, &buf, None, &buf, &kv, &buf, &buf);
    assert!(att.unwrap().is_none(), "16 query heads a key head fused");
}

fn prefill_attention(gpu: &Gpu, v: &Variant) {
    let mut rng = Rng::new(21);
    // Blocks of 64 queries and 32 keys: one query, part of a block, exact
    // blocks and past them; with nothing, a little and a lot cached before.
    for (n_q, cached) in [(1, 0), (33, 7), (64, 0), (65, 31), (130, 100), (200, 0)] {
        attention_case(gpu, v, 4, 2, 64, n_q, n_q + cached, 1, 0, &mut rng);
    }
    attention_case(gpu, v, 6, 6, 64, 40, 40, 1, 0, &mut rng);
    // Sliding windows inside a block, across blocks, and of one position.
    attention_case(gpu, v, 4, 2, 64, 130, 230, 1, 17, &mut rng);
    attention_case(gpu, v, 4, 2, 64, 65, 96, 1, 70, &mut rng);
    attention_case(gpu, v, 2, 1, 64, 33, 33, 1, 1, &mut rng);
}

fn flash_attention_merge(gpu: &Gpu, _v: &Variant) {
    // The merge only runs after a split pass: drive it through the portable
    // split kernel with more splits than positions need (empty splits too,
    // and splits over a sliding window).
    let v = Variant::default();
    let mut rng = Rng::new(19);
    for (kv_len, splits) in [(2, 2), (65, 3), (300, llm_ops::MAX_SPLITS), (1025, 7)] {
        attention_case(gpu, &v, 4, 2, 64, 1, kv_len, splits, 0, &mut rng);
    }
    attention_case(gpu, &v, 4, 2, 64, 1, 300, llm_ops::MAX_SPLITS, 31, &mut rng);
}

fn short_conv(gpu: &Gpu, _v: &Variant) {
    let mut rng = Rng::new(20);
    for &d in SIZES {
        // 40 tokens: three blocks of the kernel's 16, only the first of
        // which reads and writes the state.
        for (n, taps) in [(1, 3), (4, 3), (7, 4), (2, 1), (40, 3), (40, 17)] {
            let bcx = rng.vec(n * 3 * d, -2.0, 2.0);
            let conv = rng.vec(d * taps, -1.0, 1.0);
            let mut state = rng.vec((taps - 1) * d, -1.0, 1.0);
            let pos0 = 6;
            // Spare rows, as the models keep for rewinding; fewer than the
            // 40-token cases' tokens, so only the last ones are kept.
            let ring = taps + 3;
            let gs = gpu
                .upload_f32("state", &to_ring(&state, taps, ring, d, pos0))
                .unwrap();
            let gstep = gpu.upload_u32("step", &[0, pos0 as u32, 0, 0]).unwrap();
            let mut want = vec![0.0; n * d];
            cpu::short_conv(&bcx, &conv, taps, d, &mut state, &mut want);
            let gb = gpu.upload_f32("bcx", &bcx).unwrap();
            let gc = gpu.upload_f32("conv", &conv).unwrap();
            let gy = gpu.poisoned_f32("y", n * d).unwrap();
            let disp =
                llm_ops::short_conv(gpu, &gb, &gc, &gs, &gstep, &gy, d, taps, ring, n).unwrap();
            gpu.run_all(&[&disp]).unwrap();
            let what = format!("short_conv d={d} n={n} taps={taps}");
            // Sums of `taps` terms in the same order; products may fuse.
            assert_close(&what, &gpu.read_f32(&gy).unwrap()[..n * d], &want, 1e-12);
            if taps > 1 {
                assert_close(
                    &format!("{what} state"),
                    &from_ring(&gpu.read_f32(&gs).unwrap(), taps, ring, d, pos0 + n),
                    &state,
                    1e-12,
                );
            }
        }
    }
}

fn swiglu(gpu: &Gpu, v: &Variant) {
    let act = act_of(v);
    let mut rng = Rng::new(21);
    for &f in SIZES {
        for n in [1, 3] {
            let gu = rng.vec(n * 2 * f, -6.0, 6.0);
            let mut want = vec![0.0; n * f];
            cpu::gated(&gu, f, act, &mut want);
            let gg = gpu.upload_f32("gu", &gu).unwrap();
            let gy = gpu.poisoned_f32("y", n * f).unwrap();
            let d = llm_ops::swiglu(gpu, &gg, &gy, f, n, act).unwrap();
            gpu.run_all(&[&d]).unwrap();
            // One exp and a division: a few ulps of the GPU's exp.
            assert_close(
                &format!("swiglu {} f={f} n={n}", v.key()),
                &gpu.read_f32(&gy).unwrap()[..n * f],
                &want,
                1e-12,
            );
        }
    }
}

fn argmax(gpu: &Gpu, _v: &Variant) {
    let mut rng = Rng::new(22);
    for &n in SIZES.iter().chain(&[65_536]) {
        let mut x = rng.vec(n, -5.0, 5.0);
        // A tie for the maximum: the first must win, as on the CPU.
        let at = n / 3;
        x[at] = 7.0;
        x[n - 1] = 7.0;
        let gx = gpu.upload_f32("x", &x).unwrap();
        let out = gpu.upload_u32("out", &[u32::MAX, u32::MAX]).unwrap();
        let ds = llm_ops::argmax(gpu, &gx, None, &out, n).unwrap();
        run(gpu, &ds);
        let got = gpu.read_u32(&out).unwrap();
        assert_eq!(got[0] as usize, cpu::argmax(&x), "argmax n={n}");
        assert_eq!(got[1], 0, "argmax n={n}: finite input flagged");
    }
    // A NaN or an infinity anywhere is flagged (the greedy decode's check
    // for damaged weights); the index stays the best number's.
    for (n, at, bad) in [
        (1, 0, f32::NAN),
        (33, 20, f32::INFINITY),
        (1025, 1024, f32::NEG_INFINITY),
        (65_536, 40_000, -f32::NAN),
    ] {
        let mut x = rng.vec(n, -5.0, 5.0);
        x[at] = bad;
        let gx = gpu.upload_f32("x", &x).unwrap();
        let out = gpu.upload_u32("out", &[u32::MAX, u32::MAX]).unwrap();
        let ds = llm_ops::argmax(gpu, &gx, None, &out, n).unwrap();
        run(gpu, &ds);
        let got = gpu.read_u32(&out).unwrap();
        assert_eq!(got[1], 1, "argmax n={n}: {bad} at {at} not flagged");
        if bad.is_nan() && n > 1 {
            assert_eq!(got[0] as usize, cpu::argmax(&x), "argmax n={n} with NaN");
        }
    }
}

fn argmax_part(gpu: &Gpu, _v: &Variant) {
    let mut rng = Rng::new(24);
    let chunk = llm_ops::ARGMAX_CHUNK;
    for n in [1, 1000, chunk, chunk + 1, 3 * chunk + 5] {
        let mut x = rng.vec(n, -5.0, 5.0);
        // A tie inside the last slice, and a NaN that must never win.
        let last = (n - 1) / chunk * chunk;
        x[n - 1] = 9.0;
        x[last] = 9.0;
        if n > 2 {
            x[1] = f32::NAN;
        }
        // An infinity in the last slice of the larger inputs: flagged, and
        // (negative) never the best.
        if n > 2 * chunk {
            x[last + 1] = f32::NEG_INFINITY;
        }
        let groups = n.div_ceil(chunk);
        let gx = gpu.upload_f32("x", &x).unwrap();
        let part = gpu.upload_u32("part", &vec![7; 3 * groups]).unwrap();
        let d = llm_ops::argmax_part(gpu, &gx, None, &part, n).unwrap();
        gpu.run_all(&[&d]).unwrap();
        let got = gpu.read_u32(&part).unwrap();
        for g in 0..groups {
            let slice = &x[g * chunk..((g + 1) * chunk).min(n)];
            let i = cpu::argmax(slice);
            let what = format!("argmax_part n={n} slice {g}");
            assert_eq!(got[3 * g + 1] as usize, g * chunk + i, "{what}: index");
            assert_eq!(f32::from_bits(got[3 * g]), slice[i], "{what}: value");
            let flagged = slice.iter().any(|v| !v.is_finite()) as u32;
            assert_eq!(got[3 * g + 2], flagged, "{what}: non-finite flag");
        }
    }
}

/// A grammar's bitmap over n tokens: each allowed with probability
/// `density`, bits past n clear.
fn random_mask(rng: &mut Rng, n: usize, density: f32) -> Vec<u32> {
    let mut words = vec![0u32; n.div_ceil(32)];
    for i in 0..n {
        if rng.next_f32() < density {
            words[i / 32] |= 1 << (i % 32);
        }
    }
    words
}

fn argmax_masked(gpu: &Gpu, _v: &Variant) {
    let mut rng = Rng::new(26);
    let chunk = llm_ops::ARGMAX_CHUNK;
    for &n in SIZES.iter().chain(&[3 * chunk + 5, 65_536]) {
        // Dense and sparse masks (a JSON key allows a few hundred of 49k
        // tokens), and one allowing a single token.
        for density in [0.5, 0.01, 0.0] {
            let mut x = rng.vec(n, -5.0, 5.0);
            let mut mask = random_mask(&mut rng, n, density);
            let only = n * 2 / 3;
            mask[only / 32] |= 1 << (only % 32);
            // The largest value is refused; a tie between allowed tokens
            // goes to the first; an allowed NaN never wins, a refused
            // infinity is still flagged.
            let refused = (0..n).find(|&i| !cpu::mask_allows(&mask, i));
            if let Some(r) = refused {
                x[r] = 50.0;
            }
            let allowed: Vec<usize> = (0..n).filter(|&i| cpu::mask_allows(&mask, i)).collect();
            if let [a, .., b] = allowed[..] {
                x[a] = 9.0;
                x[b] = 9.0;
            }
            if allowed.len() > 2 {
                x[allowed[1]] = f32::NAN;
            }
            let gx = gpu.upload_f32("x", &x).unwrap();
            let gm = gpu.upload_u32("mask", &mask).unwrap();
            let out = gpu.upload_u32("out", &[u32::MAX, u32::MAX]).unwrap();
            let ds = llm_ops::argmax(gpu, &gx, Some(&gm), &out, n).unwrap();
            run(gpu, &ds);
            let got = gpu.read_u32(&out).unwrap();
            let what = format!("masked argmax n={n} density {density}");
            let want = cpu::masked_argmax(&x, &mask).unwrap();
            assert_eq!(got[0] as usize, want, "{what}");
            let nonfinite = x.iter().any(|v| !v.is_finite()) as u32;
            assert_eq!(got[1], nonfinite, "{what}: non-finite flag");
            if let Some(r) = refused {
                x[r] = f32::INFINITY;
                let gx = gpu.upload_f32("x", &x).unwrap();
                run(gpu, &llm_ops::argmax(gpu, &gx, Some(&gm), &out, n).unwrap());
                let got = gpu.read_u32(&out).unwrap();
                assert_eq!(got, [want as u32, 1], "{what}: refused infinity");
            }
        }
    }
}

fn top_k_masked(gpu: &Gpu, _v: &Variant) {
    let mut rng = Rng::new(27);
    let slice = llm_ops::TOP_K_SLICE;
    // One workgroup, and the PARTIAL + MERGE pair past two slices.
    for n in [1000, 2 * slice - 1, 3 * slice + 77] {
        for density in [0.5, 0.002] {
            // Coarse values, so ties fall at the k-th allowed value; a
            // refused +inf stays a candidate (the host's damaged-logits
            // check), a refused -inf is what the mask makes anyway.
            let mut x: Vec<f32> = rng
                .vec(n, -8.0, 8.0)
                .iter()
                .map(|v| (v * 2.0).round() / 2.0)
                .collect();
            let mask = random_mask(&mut rng, n, density);
            let refused: Vec<usize> = (0..n).filter(|&i| !cpu::mask_allows(&mask, i)).collect();
            x[refused[0]] = 100.0;
            x[refused[1]] = f32::INFINITY;
            x[refused[2]] = f32::NEG_INFINITY;
            let want_x = cpu::masked_logits(&x, &mask);
            let gx = gpu.upload_f32("x", &x).unwrap();
            let gm = gpu.upload_u32("mask", &mask).unwrap();
            for k in [1, 40, llm_ops::MAX_TOP_K] {
                let out = gpu.upload_u32("out", &vec![u32::MAX; 2 * k]).unwrap();
                let ds = llm_ops::top_k(gpu, &gx, Some(&gm), &out, n, k).unwrap();
                run(gpu, &ds);
                let got = llm_ops::sort_candidates(&gpu.read_u32(&out).unwrap());
                let want = cpu::top_k(&want_x, k);
                // Masked-out values are all -inf: which of them fill the
                // tail is the selection's tie rule, the same on both.
                assert_eq!(got, want, "masked top_k n={n} k={k} density {density}");
            }
        }
    }
}

fn top_k(gpu: &Gpu, v: &Variant) {
    let mut rng = Rng::new(23);
    // The MERGE variant runs after top_k_part, on inputs of two slices or more.
    let slice = llm_ops::TOP_K_SLICE;
    let sizes: Vec<usize> = if v.defines.contains(&"MERGE") {
        vec![2 * slice, 3 * slice + 77, 65_536]
    } else {
        SIZES.iter().copied().chain([2 * slice - 1]).collect()
    };
    for n in sizes {
        // Values on a coarse grid, so many are tied (also at the k-th value),
        // with both signs and a few infinities.
        let mut x: Vec<f32> = rng
            .vec(n, -8.0, 8.0)
            .iter()
            .map(|v| (v * 2.0).round() / 2.0)
            .collect();
        x[n / 2] = f32::NEG_INFINITY;
        x[n - 1] = f32::INFINITY;
        for k in [1, 40, llm_ops::MAX_TOP_K] {
            let k = k.min(n);
            let gx = gpu.upload_f32("x", &x).unwrap();
            let out = gpu.upload_u32("out", &vec![u32::MAX; 2 * k]).unwrap();
            let ds = llm_ops::top_k(gpu, &gx, None, &out, n, k).unwrap();
            assert_eq!(ds.len(), if n < 2 * slice { 1 } else { 2 });
            run(gpu, &ds);
            let got = llm_ops::sort_candidates(&gpu.read_u32(&out).unwrap());
            // A selection: exactly the same candidates, in the same order.
            assert_eq!(got, cpu::top_k(&x, k), "top_k n={n} k={k}");
        }
    }
}

/// The top-k of each row of a batch equals `cpu::top_k` of that row (tied
/// values at the k-th, infinities), below and past two slices (the part
/// and merge kernels).
fn top_k_rows(gpu: &Gpu, _v: &Variant) {
    let mut rng = Rng::new(24);
    let slice = llm_ops::TOP_K_SLICE;
    for n in [300, 2 * slice + 5, 65_536] {
        let rows = 3;
        let mut x: Vec<f32> = rng
            .vec(rows * n, -8.0, 8.0)
            .iter()
            .map(|v| (v * 2.0).round() / 2.0)
            .collect();
        x[n + 7] = f32::INFINITY;
        x[2 * n + n / 2] = f32::NEG_INFINITY;
        for k in [1, 40, llm_ops::MAX_TOP_K] {
            let gx = gpu.upload_f32("x", &x).unwrap();
            let out = gpu
                .upload_u32("out", &vec![u32::MAX; 2 * k * rows])
                .unwrap();
            run(
                gpu,
                &llm_ops::top_k_rows(gpu, &gx, &out, n, k, rows).unwrap(),
            );
            let raw = gpu.read_u32(&out).unwrap();
            for r in 0..rows {
                let got = llm_ops::sort_candidates(&raw[2 * k * r..2 * k * (r + 1)]);
                let want = cpu::top_k(&x[r * n..(r + 1) * n], k);
                assert_eq!(got, want, "top_k_rows n={n} k={k} row {r}");
            }
        }
    }
}

fn top_k_part(gpu: &Gpu, _v: &Variant) {
    let mut rng = Rng::new(25);
    let slice = llm_ops::TOP_K_SLICE;
    // One slice, and several with a longer last one; coarse values so that
    // ties fall at each slice's k-th value.
    for n in [slice, 3 * slice + 100] {
        let x: Vec<f32> = rng
            .vec(n, -8.0, 8.0)
            .iter()
            .map(|v| (v * 2.0).round() / 2.0)
            .collect();
        let groups = n / slice;
        for k in [1, 40, llm_ops::MAX_TOP_K] {
            let gx = gpu.upload_f32("x", &x).unwrap();
            let cand = gpu
                .upload_u32("cand", &vec![u32::MAX; 2 * k * groups])
                .unwrap();
            let d = llm_ops::top_k_part(gpu, &gx, None, &cand, n, k).unwrap();
            gpu.run_all(&[&d]).unwrap();
            let got = gpu.read_u32(&cand).unwrap();
            for g in 0..groups {
                let (lo, hi) = (g * slice, if g + 1 == groups { n } else { (g + 1) * slice });
                let want: Vec<(u32, f32)> = cpu::top_k(&x[lo..hi], k)
                    .into_iter()
                    .map(|(i, v)| (i + lo as u32, v))
                    .collect();
                let mine = llm_ops::sort_candidates(&got[2 * k * g..2 * k * (g + 1)]);
                assert_eq!(mine, want, "top_k_part n={n} k={k} slice {g}");
            }
        }
    }
}

#[track_caller]
fn assert_bits(what: &str, got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            g.to_bits() == w.to_bits(),
            "{what}: element {i} is {g:e}, the single kernel gave {w:e}"
        );
    }
}

/// Batched GEMVs: for 1, 6 and (once) 34 columns (past one tile of 32),
/// k summed whole and split over lane groups, column j of the batched
/// kernel equals the single kernel (checked against the CPU by its own
/// case) on column j, bit for bit: every kernel follows gemv_common.wgsl's
/// one order of summation, so batched decode yields the tokens of a
/// sequence decoded alone.
fn gemv_cols(gpu: &Gpu, v: &Variant) {
    gemv_cols_check(gpu, v, &[llm_ops::KSplit::Whole, llm_ops::KSplit::Groups]);
}

/// The sum of a split batched GEMV (gemv_sum_*), as the batched decode
/// reaches it: the COLS kernel of the same epilogue (Q8_0 weights) left to
/// choose its split, which thin shapes take, against the single kernel.
fn gemv_sum(gpu: &Gpu, v: &Variant) {
    let mut defines = v.defines.clone();
    defines.extend(["COLS", "W_Q8_0"]);
    gemv_cols_check(gpu, &Variant::new(&defines), &[llm_ops::KSplit::Auto]);
}

fn gemv_cols_check(gpu: &Gpu, v: &Variant, splits: &[llm_ops::KSplit]) {
    let (t, _) = format_and_subgroups(v);
    let has = |d: &str| v.defines.contains(&d);
    let (swiglu, conv, add) = (has("SWIGLU"), has("CONV"), has("ADD"));
    let mut rng = Rng::new(31);
    // Short rows (an odd count of lanes, under LANES), then rows whose
    // lanes hold one or two units and (last) two or three, so neighbouring
    // lanes summed in one step of the batched kernel differ in length
    // (kept few: each column is checked against a dispatch of its own).
    let ks = match t.block_size() {
        1 => vec![33, 1025, 2100],
        32 => vec![32, 288, 2336],
        _ => vec![256, 2304],
    };
    for (ki, &k) in ks.iter().enumerate() {
        // The conv block's projections are square ([3 d, d]); long rows
        // are checked on a few.
        let rows_set: &[usize] = if k > 2000 {
            &[5]
        } else if conv {
            &[k]
        } else {
            &[5, 132]
        };
        for &rows in rows_set {
            // Past one tile of 32 columns once, and the tiles of up to 16
            // columns (rows fastest) and of more (columns fastest) with
            // columns past the last.
            let ns: &[usize] = if ki == 0 {
                &[1, 6, 16, 20, 34]
            } else {
                &[1, 6]
            };
            for &n in ns {
                let parts = if conv {
                    3
                } else if swiglu {
                    2
                } else {
                    1
                };
                let ws: Vec<Tensor> = (0..parts).map(|_| weights(t, rows, k, &mut rng)).collect();
                let refs: Vec<&Tensor> = ws.iter().collect();
                let m = upload(gpu, &refs, 50);
                // A conv block's output offset is its first channel: 0.
                let out_off = if conv { 0 } else { 3 };
                let (x_off, x_stride, y_stride) = (2, k + 3, rows + 5);
                let xs = rng.vec(x_off + n * x_stride, -2.0, 2.0);
                let nw = rng.vec(k, 0.5, 1.5);
                let y0 = if add {
                    rng.vec(n * y_stride, -1.0, 1.0)
                } else {
                    vec![f32::NAN; n * y_stride]
                };
                let gx = gpu.upload_f32("x", &xs).unwrap();
                let gn = gpu.upload_f32("nw", &nw).unwrap();
                let taps = 3;
                let ring = taps + 1;
                let convw = rng.vec(rows * taps, -1.0, 1.0);
                let gc = gpu.upload_f32("conv", &convw).unwrap();
                let states: Vec<Vec<f32>> =
                    (0..n).map(|_| rng.vec(ring * rows, -1.0, 1.0)).collect();
                let positions: Vec<usize> = (0..n).map(|j| 3 + 5 * j).collect();
                // The batch's row records: column j at position 3 + 5 j, its
                // ring rows from j ring.
                let mut records = vec![0u32; n * llm_ops::ROW_RECORD];
                for j in 0..n {
                    records[j * llm_ops::ROW_RECORD + 1] = positions[j] as u32;
                    records[j * llm_ops::ROW_RECORD + 5] = (j * ring) as u32;
                }
                let gstep = gpu.upload_u32("rows", &records).unwrap();
                // Each column alone, through the single kernel.
                let mut want = Vec::with_capacity(n);
                for j in 0..n {
                    let sy = gpu
                        .upload_f32("y", &y0[j * y_stride..(j + 1) * y_stride])
                        .unwrap();
                    let sstate = gpu.upload_f32("state", &states[j]).unwrap();
                    let sstep = gpu
                        .upload_u32("step", &[0, positions[j] as u32, 0, 0])
                        .unwrap();
                    let e = epilogue(v, &gn, &gc, &sstate, &sstep, taps, ring);
                    let ds = llm_ops::gemv(gpu, &m, &e, &gx, x_off + j * x_stride, &sy, out_off)
                        .unwrap();
                    run(gpu, &ds);
                    want.push((gpu.read_f32(&sy).unwrap(), gpu.read_f32(&sstate).unwrap()));
                }
                for &split in splits {
                    let gstate = gpu.upload_f32("state", &states.concat()).unwrap();
                    let gy = gpu.upload_f32("y", &y0).unwrap();
                    let cols = llm_ops::Cols {
                        split,
                        ..llm_ops::Cols::new(n, x_stride, y_stride)
                    };
                    let e = epilogue(v, &gn, &gc, &gstate, &gstep, taps, ring);
                    let ds =
                        llm_ops::gemv_cols(gpu, &m, &e, &gx, x_off, &gy, out_off, cols).unwrap();
                    run(gpu, &ds);
                    let got = gpu.read_f32(&gy).unwrap();
                    let got_state = gpu.read_f32(&gstate).unwrap();
                    for (j, (want_y, want_state)) in want.iter().enumerate() {
                        let what =
                            format!("{} k={k} rows={rows} n={n} {split:?} column {j}", v.key());
                        let out = out_off..out_off + rows;
                        let base = j * y_stride;
                        assert_bits(&what, &got[base + out.start..base + out.end], &want_y[out]);
                        if conv {
                            assert_bits(
                                &format!("{what} state"),
                                &got_state[j * ring * rows..(j + 1) * ring * rows],
                                want_state,
                            );
                        }
                    }
                    // The columns' gaps are left alone.
                    if !add && out_off > 0 {
                        assert!(got[..out_off].iter().all(|x| x.is_nan()), "wrote outside");
                    }
                }
            }
        }
    }
}

/// The epilogue a gemv_cols variant computes, over these buffers.
fn epilogue<'a>(
    v: &Variant,
    nw: &'a wgpu::Buffer,
    conv: &'a wgpu::Buffer,
    state: &'a wgpu::Buffer,
    step: &'a wgpu::Buffer,
    taps: usize,
    ring: usize,
) -> GemvEpilogue<'a> {
    let has = |d: &str| v.defines.contains(&d);
    if has("CONV") {
        GemvEpilogue::Conv {
            nw,
            eps: 1e-5,
            conv,
            state,
            step,
            taps,
            ring,
        }
    } else if has("SWIGLU") {
        GemvEpilogue::Swiglu {
            nw,
            eps: 1e-5,
            act: act_of(v),
        }
    } else if has("NORM") {
        GemvEpilogue::Norm { nw, eps: 1e-5 }
    } else if has("ADD") {
        GemvEpilogue::Add
    } else {
        GemvEpilogue::Store
    }
}

/// Shapes of the batched attention cases: (heads, kv_heads, head_dim).
const ROWS_SHAPES: [(usize, usize, usize); 2] = [(4, 2, 64), (3, 1, 34)];

fn rows_shape(heads: usize, kv_heads: usize, hd: usize, window: usize) -> AttnShape {
    AttnShape {
        heads,
        kv_heads,
        head_dim: hd,
        rope_dim: hd - hd % 2,
        rope_style: RopeStyle::Halves,
        eps: 1e-5,
        scale: cpu::attention_scale(hd),
        window,
    }
}

/// Positions per block of the batched kernels' paged caches.
const KV_BLOCK: usize = lfm::models::kv_blocks::BLOCK;

/// The block table of sequence `slot` of a paged cache holding `slots`
/// sequences of `cap` positions (a whole number of blocks): block b at
/// cache block (blocks - 1) - (b slots + slot), so every sequence's blocks
/// are scattered among the others' and in reverse.
fn slot_table(slots: usize, cap: usize, slot: usize) -> Vec<u32> {
    assert_eq!(cap % KV_BLOCK, 0);
    let per = cap / KV_BLOCK;
    (0..per)
        .map(|b| (slots * per - 1 - (b * slots + slot)) as u32)
        .collect()
}

/// The cache row of position `pos` of `slot` in that layout.
fn paged_row(slots: usize, cap: usize, slot: usize, pos: usize) -> usize {
    slot_table(slots, cap, slot)[pos / KV_BLOCK] as usize * KV_BLOCK + pos % KV_BLOCK
}

/// Positions 0..len of `slot` gathered from a paged cache of rows of
/// `width`, in order: the contiguous cache the single kernels read.
fn gather_slot(
    cache: &[f32],
    slots: usize,
    cap: usize,
    slot: usize,
    len: usize,
    width: usize,
) -> Vec<f32> {
    (0..len)
        .flat_map(|p| {
            let r = paged_row(slots, cap, slot, p);
            cache[r * width..(r + 1) * width].iter().copied()
        })
        .collect()
}

/// Row records of a batch whose row j is at position positions[j] of
/// sequence slots[j], over a paged cache of `n_slots` sequences of `cap`
/// positions, each row's block table after the records.
fn row_records(positions: &[usize], slots: &[usize], n_slots: usize, cap: usize) -> Vec<u32> {
    let n = positions.len();
    let mut r = vec![0u32; n * llm_ops::ROW_RECORD];
    let mut tables = Vec::new();
    for (j, (&pos, &slot)) in positions.iter().zip(slots).enumerate() {
        let kv_len = pos + 1;
        let rec = &mut r[j * llm_ops::ROW_RECORD..(j + 1) * llm_ops::ROW_RECORD];
        rec[0] = slot as u32;
        rec[1] = pos as u32;
        rec[2] = kv_len as u32;
        rec[3] = llm_ops::attention_splits(kv_len) as u32;
        rec[4] = (n * llm_ops::ROW_RECORD + tables.len()) as u32;
        tables.extend(slot_table(n_slots, cap, slot));
    }
    r.extend(tables);
    r
}

/// qk_rope over a batch's rows, each at its own position in its own slot of
/// the caches: row j equals the single kernel on row j alone.
fn qk_rope_rows(gpu: &Gpu, v: &Variant) {
    let norm = v.defines.contains(&"QK_NORM");
    let with_bias = v.defines.contains(&"BIAS");
    let mut rng = Rng::new(32);
    for (heads, kv_heads, hd) in ROWS_SHAPES {
        let s = rows_shape(heads, kv_heads, hd, 0);
        let (qw, kvw) = (heads * hd, kv_heads * hd);
        let qkv_w = qw + 2 * kvw;
        let cap = 80;
        let positions = [5, 0, 70];
        let slots = [2, 0, 1];
        let n = positions.len();
        let qkv = rng.vec(n * qkv_w, -2.0, 2.0);
        let bias = rng.vec(qkv_w, -1.0, 1.0);
        let qn = rng.vec(hd, 0.5, 1.5);
        let kn = rng.vec(hd, 0.5, 1.5);
        let cs: Vec<f32> = positions
            .iter()
            .flat_map(|&p| cpu::rope_table(p, 1, s.rope_dim, 10_000.0))
            .collect();
        let consts = llm_ops::HeadConsts::upload(
            gpu,
            norm.then_some((qn.as_slice(), kn.as_slice())),
            with_bias.then_some(bias.as_slice()),
        )
        .unwrap();
        let gqkv = gpu.upload_f32("qkv", &qkv).unwrap();
        let gcs = gpu.upload_f32("cs", &cs).unwrap();
        let rec = gpu
            .upload_u32("rows", &row_records(&positions, &slots, 3, cap))
            .unwrap();
        let gq = gpu.poisoned_f32("q", n * qw).unwrap();
        let gk = gpu.poisoned_f32("kc", 3 * cap * kvw).unwrap();
        let gv = gpu.poisoned_f32("vc", 3 * cap * kvw).unwrap();
        let kv = llm_ops::AttnBuffers {
            step: &rec,
            k_cache: &gk,
            v_cache: &gv,
        };
        let d = llm_ops::qk_rope_rows(gpu, &s, &gqkv, consts.as_ref(), &gcs, &kv, &gq, n).unwrap();
        gpu.run_all(&[&d]).unwrap();
        let (q, k, vv) = (
            gpu.read_f32(&gq).unwrap(),
            gpu.read_f32(&gk).unwrap(),
            gpu.read_f32(&gv).unwrap(),
        );
        for j in 0..n {
            let what = format!("{} hd={hd} row {j}", v.key());
            let pos = positions[j];
            let sqkv = gpu
                .upload_f32("qkv", &qkv[j * qkv_w..(j + 1) * qkv_w])
                .unwrap();
            let scs = gpu
                .upload_f32("cs", &cs[j * s.rope_dim..(j + 1) * s.rope_dim])
                .unwrap();
            let step = gpu
                .upload_u32("step", &[0, pos as u32, pos as u32 + 1, 1])
                .unwrap();
            let sq = gpu.poisoned_f32("q", qw).unwrap();
            let sk = gpu.poisoned_f32("kc", cap * kvw).unwrap();
            let sv = gpu.poisoned_f32("vc", cap * kvw).unwrap();
            let skv = llm_ops::AttnBuffers {
                step: &step,
                k_cache: &sk,
                v_cache: &sv,
            };
            let d = llm_ops::qk_rope(gpu, &s, &sqkv, consts.as_ref(), &scs, &skv, &sq, 1).unwrap();
            gpu.run_all(&[&d]).unwrap();
            assert_bits(&what, &q[j * qw..(j + 1) * qw], &gpu.read_f32(&sq).unwrap());
            let at = paged_row(3, cap, slots[j], pos) * kvw;
            let row = pos * kvw..(pos + 1) * kvw;
            assert_bits(
                &format!("{what} k"),
                &k[at..at + kvw],
                &gpu.read_f32(&sk).unwrap()[row.clone()],
            );
            assert_bits(
                &format!("{what} v"),
                &vv[at..at + kvw],
                &gpu.read_f32(&sv).unwrap()[row],
            );
        }
        // Only the rows' own cache rows are written.
        let written = k.iter().filter(|x| !x.is_nan()).count();
        assert_eq!(written, n * kvw, "{}: cache rows written", v.key());
    }
}

/// Batched decode attention (and its merge): rows of different lengths (one
/// split, several, a window), each over its own slot of the caches, equal
/// the single kernels on each row alone.
fn flash_attention_rows(gpu: &Gpu, v: &Variant) {
    let sub = v.defines.contains(&"SUBGROUPS");
    let mut rng = Rng::new(33);
    // ROWS_SHAPES, and 14 query heads of 2 key heads (7 computed together).
    for (heads, kv_heads, hd) in ROWS_SHAPES.into_iter().chain([(14, 2, 16)]) {
        for window in [0, 100] {
            let s = rows_shape(heads, kv_heads, hd, window);
            let (qw, kvw) = (heads * hd, kv_heads * hd);
            let cap = 304;
            let positions = [4, 299, 64, 150];
            let slots = [1, 3, 0, 2];
            let n = positions.len();
            let kc = rng.vec(4 * cap * kvw, -2.0, 2.0);
            let vc = rng.vec(4 * cap * kvw, -2.0, 2.0);
            let q = rng.vec(n * qw, -2.0, 2.0);
            let records = row_records(&positions, &slots, 4, cap);
            let gk = gpu.upload_f32("kc", &kc).unwrap();
            let gv = gpu.upload_f32("vc", &vc).unwrap();
            let gq = gpu.upload_f32("q", &q).unwrap();
            let rec = gpu.upload_u32("rows", &records).unwrap();
            let out = gpu.poisoned_f32("out", n * qw).unwrap();
            // The partial results hold the most splits a row of the slots
            // can have.
            let max_splits = llm_ops::attention_splits(cap);
            let part_len = llm_ops::attention_rows_part_len(heads, hd, n, max_splits);
            let part = gpu.scratch("part", 4 * part_len as u64).unwrap();
            let kv = llm_ops::AttnBuffers {
                step: &rec,
                k_cache: &gk,
                v_cache: &gv,
            };
            let a =
                llm_ops::flash_attention_rows(gpu, sub, &s, &gq, &kv, &out, &part, n, max_splits)
                    .unwrap();
            let most = positions
                .iter()
                .map(|p| llm_ops::attention_splits(p + 1))
                .max()
                .unwrap();
            let mut enc = gpu.device.create_command_encoder(&Default::default());
            {
                let mut pass = enc.begin_compute_pass(&Default::default());
                a.record(&mut pass, most);
            }
            gpu.queue.submit([enc.finish()]);
            let got = gpu.read_f32(&out).unwrap();
            for j in 0..n {
                let kv_len = positions[j] + 1;
                let splits = llm_ops::attention_splits(kv_len);
                let what = format!(
                    "{} hd={hd} window={window} row {j} kv_len={kv_len}",
                    v.key()
                );
                let sk = gather_slot(&kc, 4, cap, slots[j], cap, kvw);
                let sv = gather_slot(&vc, 4, cap, slots[j], cap, kvw);
                let sk = gpu.upload_f32("kc", &sk).unwrap();
                let sv = gpu.upload_f32("vc", &sv).unwrap();
                let sq = gpu.upload_f32("q", &q[j * qw..(j + 1) * qw]).unwrap();
                let step = gpu
                    .upload_u32(
                        "step",
                        &[0, kv_len as u32 - 1, kv_len as u32, splits as u32],
                    )
                    .unwrap();
                let sout = gpu.poisoned_f32("out", qw).unwrap();
                let spart = gpu
                    .scratch("part", 4 * llm_ops::attention_part_len(heads, hd, 1) as u64)
                    .unwrap();
                let skv = llm_ops::AttnBuffers {
                    step: &step,
                    k_cache: &sk,
                    v_cache: &sv,
                };
                let sa =
                    llm_ops::flash_attention(gpu, sub, &s, &sq, &skv, &sout, &spart, 1).unwrap();
                let mut enc = gpu.device.create_command_encoder(&Default::default());
                {
                    let mut pass = enc.begin_compute_pass(&Default::default());
                    sa.record(&mut pass, splits);
                }
                gpu.queue.submit([enc.finish()]);
                assert_bits(
                    &what,
                    &got[j * qw..(j + 1) * qw],
                    &gpu.read_f32(&sout).unwrap(),
                );
            }
        }
    }
}

/// Argmax of each row of a batch equals the single argmax of that row
/// (ties to the first, non-finite flags per row).
fn argmax_rows(gpu: &Gpu, _v: &Variant) {
    let mut rng = Rng::new(34);
    for n in [1, 33, 1025, 5000] {
        let rows = 3;
        let mut x = rng.vec(rows * n, -5.0, 5.0);
        // Row 1 ties at its maximum; row 2 holds an infinity.
        x[n + n / 3] = 7.0;
        x[2 * n - 1] = 7.0;
        x[2 * n + n / 2] = f32::INFINITY;
        let gx = gpu.upload_f32("x", &x).unwrap();
        let out = gpu.upload_u32("out", &vec![u32::MAX; 2 * rows]).unwrap();
        run(gpu, &llm_ops::argmax_rows(gpu, &gx, &out, n, rows).unwrap());
        let got = gpu.read_u32(&out).unwrap();
        for r in 0..rows {
            let sx = gpu.upload_f32("x", &x[r * n..(r + 1) * n]).unwrap();
            let sout = gpu.upload_u32("out", &[u32::MAX, u32::MAX]).unwrap();
            run(gpu, &llm_ops::argmax(gpu, &sx, None, &sout, n).unwrap());
            let want = gpu.read_u32(&sout).unwrap();
            assert_eq!(
                &got[2 * r..2 * r + 2],
                &want[..],
                "argmax_rows n={n} row {r}"
            );
        }
        assert_eq!(got[5], 1, "argmax_rows n={n}: the infinity is flagged");
    }
}

/// Tokens drawn from each row on the device are those the CPU's
/// `draw_unsorted` draws (same weights, same order of sums): temperatures,
/// min-p, draws at the ends of [0, 1), argmax rows (ties to the first), a
/// row with a non-finite logit flagged, vocabularies below and above the 256
/// blocks.
fn sample_rows(gpu: &Gpu, _v: &Variant) {
    use lfm::sampling::{draw_unsorted, finite_max, Draw};
    let mut rng = Rng::new(35);
    for n in [1, 100, 1000, 65_536] {
        let draws = [
            Draw {
                u: 0.0,
                inv_t: 1.0,
                cut: f32::NEG_INFINITY,
                sampled: true,
            },
            Draw {
                u: 0.37,
                inv_t: 1.0,
                cut: f32::NEG_INFINITY,
                sampled: true,
            },
            Draw {
                u: 0.999_999_9,
                inv_t: 1.0 / 0.7,
                cut: f32::NEG_INFINITY,
                sampled: true,
            },
            Draw {
                u: 0.61,
                inv_t: 1.0 / 1.5,
                cut: 0.05f32.ln(),
                sampled: true,
            },
            Draw {
                u: 0.5,
                inv_t: 0.25,
                cut: f32::NEG_INFINITY,
                sampled: true,
            },
            Draw::GREEDY,
            Draw {
                u: 0.8,
                inv_t: 1.0,
                cut: f32::NEG_INFINITY,
                sampled: true,
            },
        ];
        let rows = draws.len();
        let mut x = rng.vec(rows * n, -4.0, 4.0);
        // The greedy row ties at its maximum; the last row holds a NaN.
        x[5 * n + n / 3] = 9.0;
        x[6 * n - 1] = 9.0;
        x[6 * n + n / 2] = f32::NAN;
        let gx = gpu.upload_f32("x", &x).unwrap();
        let params: Vec<f32> = draws.iter().flat_map(|d| d.to_gpu()).collect();
        let gd = gpu.upload_f32("draws", &params).unwrap();
        let out = gpu.upload_u32("out", &vec![u32::MAX; 2 * rows]).unwrap();
        run(
            gpu,
            &[llm_ops::sample_rows(gpu, &gx, &gd, &out, n, rows).unwrap()],
        );
        let got = gpu.read_u32(&out).unwrap();
        let mut weights = Vec::new();
        for (r, d) in draws.iter().enumerate() {
            let row = &x[r * n..(r + 1) * n];
            let flagged = row.iter().any(|v| !v.is_finite());
            assert_eq!(
                got[2 * r + 1],
                u32::from(flagged),
                "sample_rows n={n} row {r}: flag"
            );
            if flagged {
                continue;
            }
            let want = draw_unsorted(row, finite_max(row), *d, &mut weights);
            assert_eq!(got[2 * r], want, "sample_rows n={n} row {r} ({d:?})");
        }
        if n > 1 {
            assert_eq!(
                got[10],
                (n / 3) as u32,
                "sample_rows n={n}: argmax ties to the first"
            );
        }
    }
}

/// Segments of a batched prefill's rows: (slot, position of the first row,
/// rows), with a one-row chunk, chunks past a conv block (16) and an
/// attention block (64), and one starting at position 0.
const PREFILL_SEGS: [(usize, usize, usize); 5] =
    [(2, 6, 1), (0, 0, 40), (3, 70, 3), (1, 5, 70), (4, 31, 17)];

/// One chunk of [`PREFILL_SEGS`].
struct PrefillSeg {
    slot: usize,
    pos: usize,
    len: usize,
}

/// The row table of [`PREFILL_SEGS`] over a paged cache of sequences of
/// `cap` positions ([`slot_table`]; 0: no cache) and rings of `ring` rows.
fn prefill_rows(cap: usize, ring: usize) -> (Vec<PrefillSeg>, llm_ops::PrefillRows) {
    let slots = PREFILL_SEGS.len();
    let tables: Vec<Vec<u32>> = PREFILL_SEGS
        .iter()
        .map(|&(slot, ..)| match cap {
            0 => Vec::new(),
            _ => slot_table(slots, cap, slot),
        })
        .collect();
    let segs: Vec<_> = PREFILL_SEGS
        .iter()
        .zip(&tables)
        .map(|(&(slot, pos, len), t)| llm_ops::RowsSegment {
            slot,
            pos,
            len,
            blocks: t,
            ring_row: slot * ring,
        })
        .collect();
    let table = llm_ops::PrefillRows::new(&segs);
    let segs = PREFILL_SEGS
        .iter()
        .map(|&(slot, pos, len)| PrefillSeg { slot, pos, len })
        .collect();
    (segs, table)
}

/// The batched prefill's conv block: several sequences' chunks, each at its
/// own positions with its own ring, equal the single kernel on each chunk
/// alone, bit for bit (y and the ring), and the CPU's; and the gated inputs
/// of the last positions of each KV cache block they fill are kept at that
/// block's id.
fn short_conv_rows(gpu: &Gpu, _v: &Variant) {
    let mut rng = Rng::new(34);
    for d in [33, 260] {
        for taps in [3, 17] {
            let ring = taps + 3;
            let cap = 80;
            let (segs, table) = prefill_rows(cap, ring);
            let n: usize = segs.iter().map(|s| s.len).sum();
            let slots = segs.len();
            let bcx = rng.vec(n * 3 * d, -2.0, 2.0);
            let conv = rng.vec(d * taps, -1.0, 1.0);
            let states: Vec<Vec<f32>> = segs
                .iter()
                .map(|_| rng.vec((taps - 1) * d, -1.0, 1.0))
                .collect();
            let mut rings = vec![f32::NAN; slots * ring * d];
            for (seg, st) in segs.iter().zip(&states) {
                let at = seg.slot * ring * d;
                rings[at..at + ring * d].copy_from_slice(&to_ring(st, taps, ring, d, seg.pos));
            }
            let gs = gpu.upload_f32("state", &rings).unwrap();
            let gt = gpu.upload_u32("rows", &table.words).unwrap();
            let gb = gpu.upload_f32("bcx", &bcx).unwrap();
            let gc = gpu.upload_f32("conv", &conv).unwrap();
            let gy = gpu.poisoned_f32("y", n * d).unwrap();
            let hist = taps - 1;
            let gends = gpu
                .poisoned_f32("ends", slots * cap / KV_BLOCK * hist * d)
                .unwrap();
            let (_, tiles) = llm_ops::PrefillRows::most_blocks(n, slots);
            let disp = llm_ops::short_conv_rows(
                gpu, &gb, &gc, &gs, &gt, &gy, &gends, d, taps, ring, n, tiles,
            )
            .unwrap();
            gpu.run_all(&[&disp]).unwrap();
            let (y, rings) = (gpu.read_f32(&gy).unwrap(), gpu.read_f32(&gs).unwrap());
            // The gated inputs of each block's last `hist` positions, at the
            // block's id.
            let ends = gpu.read_f32(&gends).unwrap();
            let mut first = 0;
            for seg in &segs {
                for t in 0..seg.len {
                    let q = seg.pos + t;
                    let r = q % KV_BLOCK;
                    if r + hist < KV_BLOCK {
                        continue;
                    }
                    let b = paged_row(slots, cap, seg.slot, q) / KV_BLOCK;
                    let at = (b * hist + r + hist - KV_BLOCK) * d;
                    let row = &bcx[(first + t) * 3 * d..(first + t + 1) * 3 * d];
                    let bx: Vec<f32> = (0..d).map(|c| row[c] * row[2 * d + c]).collect();
                    assert_bits(
                        &format!(
                            "short_conv_rows d={d} taps={taps} slot {} ends of {q}",
                            seg.slot
                        ),
                        &ends[at..at + d],
                        &bx,
                    );
                }
                first += seg.len;
            }
            let mut first = 0;
            for (seg, st) in segs.iter().zip(&states) {
                let what = format!("short_conv_rows d={d} taps={taps} slot {}", seg.slot);
                let rows = first * d..(first + seg.len) * d;
                let sb = &bcx[first * 3 * d..(first + seg.len) * 3 * d];
                let mut state = st.clone();
                let mut want = vec![0.0; seg.len * d];
                cpu::short_conv(sb, &conv, taps, d, &mut state, &mut want);
                assert_close(&what, &y[rows.clone()], &want, 1e-12);
                // The single kernel on the chunk alone.
                let ss = gpu
                    .upload_f32("state", &to_ring(st, taps, ring, d, seg.pos))
                    .unwrap();
                let sstep = gpu.upload_u32("step", &[0, seg.pos as u32, 0, 0]).unwrap();
                let sgb = gpu.upload_f32("bcx", sb).unwrap();
                let sy = gpu.poisoned_f32("y", seg.len * d).unwrap();
                let disp =
                    llm_ops::short_conv(gpu, &sgb, &gc, &ss, &sstep, &sy, d, taps, ring, seg.len)
                        .unwrap();
                gpu.run_all(&[&disp]).unwrap();
                assert_bits(&what, &y[rows], &gpu.read_f32(&sy).unwrap());
                let mine = &rings[seg.slot * ring * d..(seg.slot + 1) * ring * d];
                assert_bits(&format!("{what} ring"), mine, &gpu.read_f32(&ss).unwrap());
                first += seg.len;
            }
        }
    }
}

/// The batched prefill's attention on cooperative matrices: several
/// sequences' chunks, each over its own slot of the caches, equal the
/// single kernel on each chunk alone, bit for bit, and the CPU's.
fn prefill_attention_rows(gpu: &Gpu, v: &Variant) {
    assert!(v.defines.contains(&"COOP"), "{}: a COOP variant", v.key());
    let mut rng = Rng::new(35);
    for (heads, kv_heads, window) in [(4, 2, 0), (2, 1, 17)] {
        let hd = 64;
        let s = rows_shape(heads, kv_heads, hd, window);
        let (qw, kvw) = (heads * hd, kv_heads * hd);
        let cap = 160;
        let (segs, table) = prefill_rows(cap, 0);
        let n: usize = segs.iter().map(|s| s.len).sum();
        let slots = segs.len();
        let kc = rng.vec(slots * cap * kvw, -1.5, 1.5);
        let vc = rng.vec(slots * cap * kvw, -1.0, 1.0);
        let q = rng.vec(n * qw, -1.5, 1.5);
        let gk = gpu.upload_f32("kc", &kc).unwrap();
        let gv = gpu.upload_f32("vc", &vc).unwrap();
        let gq = gpu.upload_f32("q", &q).unwrap();
        let gt = gpu.upload_u32("rows", &table.words).unwrap();
        let out = gpu.poisoned_f32("out", n * qw).unwrap();
        let kv = llm_ops::AttnBuffers {
            step: &gt,
            k_cache: &gk,
            v_cache: &gv,
        };
        let (tiles, _) = llm_ops::PrefillRows::most_blocks(n, slots);
        let d = llm_ops::prefill_attention_rows(gpu, &s, &gq, &kv, &out, n, tiles)
            .unwrap()
            .expect("the adapter runs the COOP variant");
        gpu.run_all(&[&d]).unwrap();
        let got = gpu.read_f32(&out).unwrap();
        let mut first = 0;
        for seg in &segs {
            let what = format!(
                "{} heads={heads}/{kv_heads} window={window} slot {}",
                v.key(),
                seg.slot
            );
            let kv_len = seg.pos + seg.len;
            let sk = gather_slot(&kc, slots, cap, seg.slot, kv_len, kvw);
            let sv = gather_slot(&vc, slots, cap, seg.slot, kv_len, kvw);
            let sq = &q[first * qw..(first + seg.len) * qw];
            let rows = &got[first * qw..(first + seg.len) * qw];
            let mut want = vec![0.0; seg.len * qw];
            cpu::flash_attention(sq, &sk, &sv, seg.len, kv_len, &s, &mut want);
            // As prefill_attention's own case: f16 inputs.
            assert_close(&what, rows, &want, 1e-5);
            let sk = gpu.upload_f32("kc", &sk).unwrap();
            let sv = gpu.upload_f32("vc", &sv).unwrap();
            let sgq = gpu.upload_f32("q", sq).unwrap();
            let step = gpu
                .upload_u32("step", &[0, seg.pos as u32, kv_len as u32, 1])
                .unwrap();
            let sout = gpu.poisoned_f32("out", seg.len * qw).unwrap();
            let skv = llm_ops::AttnBuffers {
                step: &step,
                k_cache: &sk,
                v_cache: &sv,
            };
            let d = llm_ops::prefill_attention(gpu, &s, &sgq, &skv, &sout, seg.len)
                .unwrap()
                .expect("the adapter runs the COOP variant");
            gpu.run_all(&[&d]).unwrap();
            assert_bits(&what, rows, &gpu.read_f32(&sout).unwrap());
            first += seg.len;
        }
    }
}
