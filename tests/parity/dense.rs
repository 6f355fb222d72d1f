//! Parity cases for the dense-layer kernels in `gpu::dense`.

use super::{assert_close, Case, SIZES};
use lfm::cpu::{self, Activation, AttentionShape, SeqSpan};
use lfm::gpu::dense::{self, Linear, WeightFormat};
use lfm::gpu::{Gpu, Variant};
use lfm::util::rng::Rng;

pub const CASES: &[Case] = &[
    Case {
        kernel: "matmul",
        run: matmul,
    },
    Case {
        kernel: "matmul_thin",
        run: matmul_thin,
    },
    Case {
        kernel: "matmul_thin_norm",
        run: matmul_thin_norm,
    },
    Case {
        kernel: "layer_norm",
        run: layer_norm,
    },
    Case {
        kernel: "gelu",
        run: gelu,
    },
    Case {
        kernel: "attention",
        run: attention,
    },
    Case {
        kernel: "gated",
        run: gated,
    },
    Case {
        kernel: "bias_rows",
        run: bias_rows,
    },
    Case {
        kernel: "seq_pool",
        run: seq_pool,
    },
];

/// Every pooling mode, alone and several at once, over ragged batches
/// (a one-row sequence included) against the CPU's `run::embed::pool`.
fn seq_pool(gpu: &Gpu, _v: &Variant) {
    use lfm::gpu::dense::PoolMode;
    use lfm::run::embed::{pool, Pooling};
    let pairs = [
        (Pooling::Cls, PoolMode::First),
        (Pooling::LastToken, PoolMode::Last),
        (Pooling::Max, PoolMode::Max),
        (Pooling::Mean, PoolMode::Mean),
        (Pooling::MeanSqrtLen, PoolMode::MeanSqrtLen),
        (Pooling::WeightedMean, PoolMode::WeightedMean),
    ];
    let mut rng = Rng::new(63);
    for (i, &d) in SIZES.iter().enumerate() {
        let lens = [[1, 5, 3], [7, 1, 2], [4, 9, 1]][i % 3];
        let mut seqs = Vec::new();
        let mut rows = 0;
        for &n in &lens {
            seqs.push(SeqSpan {
                q_start: rows,
                q_len: n,
                kv_start: rows,
                kv_len: n,
            });
            rows += n;
        }
        let x = rng.vec(rows * d, -2.0, 2.0);
        let gx = gpu.upload_f32("x", &x).unwrap();
        let gs = gpu.upload_u32("seqs", &dense::pack_seqs(&seqs)).unwrap();
        let one_each = pairs.iter().map(|p| vec![*p]);
        for set in one_each.chain([pairs.to_vec(), vec![pairs[3], pairs[0]]]) {
            let (host, device): (Vec<Pooling>, Vec<PoolMode>) = set.iter().copied().unzip();
            let want = pool(&x, d, &seqs, &host);
            let gy = gpu.poisoned_f32("out", want.len()).unwrap();
            let k = dense::seq_pool(gpu, &gx, &gs, seqs.len(), d, &device, &gy).unwrap();
            gpu.run_all(&[&k]).unwrap();
            // The same sums in the same order; a weighted sum may fuse its
            // multiply-add.
            assert_close(
                &format!("seq_pool d={d} lens={lens:?} modes={device:?}"),
                &gpu.read_f32(&gy).unwrap()[..want.len()],
                &want,
                1e-6,
            );
        }
    }
}

fn bias_rows(gpu: &Gpu, _v: &Variant) {
    let mut rng = Rng::new(62);
    for (i, &cols) in SIZES.iter().enumerate() {
        let rows = [1, 3, 7][i % 3];
        let bias = rng.vec(cols, -1.0, 1.0);
        let residual = rng.vec(rows * cols, -1.0, 1.0);
        let gb = gpu.upload_f32("bias", &bias).unwrap();
        let gr = gpu.upload_f32("residual", &residual).unwrap();
        for (b, r) in [(true, true), (true, false), (false, true)] {
            let mut want = vec![0.0; rows * cols];
            cpu::bias_rows(
                b.then_some(&bias[..]),
                r.then_some(&residual[..]),
                cols,
                &mut want,
            );
            let gy = gpu.poisoned_f32("y", rows * cols).unwrap();
            let d =
                dense::bias_rows(gpu, b.then_some(&gb), r.then_some(&gr), &gy, rows, cols).unwrap();
            gpu.run_all(&[&d]).unwrap();
            // One f32 addition in the same order: exact.
            assert_close(
                &format!("bias_rows cols={cols} rows={rows} bias={b} residual={r}"),
                &gpu.read_f32(&gy).unwrap()[..rows * cols],
                &want,
                0.0,
            );
        }
    }
}

fn gated(gpu: &Gpu, _v: &Variant) {
    let mut rng = Rng::new(61);
    for (i, &f) in SIZES.iter().enumerate() {
        let act = [
            Activation::Gelu,
            Activation::GeluTanh,
            Activation::Relu,
            Activation::Silu,
        ][i % 4];
        for n in [1, 3] {
            let gu = rng.vec(n * 2 * f, -6.0, 6.0);
            let mut want = vec![0.0; n * f];
            cpu::gated_act(&gu, f, act, &mut want);
            let gg = gpu.upload_f32("gu", &gu).unwrap();
            let gy = gpu.poisoned_f32("y", n * f).unwrap();
            let d = dense::gated(gpu, &gg, &gy, f, n, act).unwrap();
            gpu.run_all(&[&d]).unwrap();
            // One exp (or the erf polynomial, 1.4e-7 absolute) and a product:
            // a few ulps, squared and normalised ~1e-13.
            assert_close(
                &format!("gated {act:?} f={f} n={n}"),
                &gpu.read_f32(&gy).unwrap()[..n * f],
                &want,
                1e-12,
            );
        }
    }
}

/// Shapes (m, k, n) for the tiles (more than `MATMUL_THIN_ROWS` rows): every
/// size in SIZES in every dimension, the others odd and around the 64-wide
/// tile, plus one large product.
fn matmul_shapes() -> Vec<(usize, usize, usize)> {
    let mut shapes = Vec::new();
    for &s in SIZES {
        shapes.push((s.max(dense::MATMUL_THIN_ROWS + 1), 65, 33));
        shapes.push((9, s, 63));
        shapes.push((33, 31, s));
    }
    shapes.push((260, 1025, 132));
    shapes
}

/// Shapes (m, k, n) for `matmul_thin`: every row count it takes, odd and
/// even k (the f16 rows' padding half), columns past its 8-wide groups, and
/// Whisper's decoder layers and vocabulary head.
fn matmul_thin_shapes() -> Vec<(usize, usize, usize)> {
    let mut shapes = Vec::new();
    for m in 1..=dense::MATMUL_THIN_ROWS {
        shapes.push((m, 65 + 2 * m, 33 + m));
    }
    for &s in SIZES {
        shapes.push((3, s, 13));
        shapes.push((8, 31, s));
    }
    shapes.extend([(1, 384, 1536), (5, 1536, 384), (2, 384, 51865)]);
    shapes
}

/// The weights [n, k] uploaded in `format`; for f16 `w` becomes the
/// f16-rounded weights the kernel multiplies by, for the reference.
fn upload_weights(
    gpu: &Gpu,
    format: WeightFormat,
    w: &mut [f32],
    n: usize,
    k: usize,
) -> wgpu::Buffer {
    match format {
        WeightFormat::F32 => gpu.upload_f32("w", w).unwrap(),
        WeightFormat::F16 => {
            let packed = dense::pack_f16(w, n, k);
            for v in w.iter_mut() {
                *v = half::f16::from_f32(*v).to_f32();
            }
            gpu.upload_u32("w", &packed).unwrap()
        }
    }
}

/// `cpu::matmul` of x [m, k] and w [n, k] with the epilogue: bias, then
/// the activation, then the residual.
fn reference(
    x: &[f32],
    w: &[f32],
    bias: Option<&[f32]>,
    act: Option<Activation>,
    residual: Option<&[f32]>,
    (m, k, n): (usize, usize, usize),
) -> Vec<f32> {
    let mut want = vec![0.0; m * n];
    cpu::matmul(x, w, bias, m, k, n, &mut want);
    if let Some(a) = act {
        a.apply_all(&mut want);
    }
    if let Some(r) = residual {
        cpu::add_assign(&mut want, r);
    }
    want
}

fn matmul(gpu: &Gpu, v: &Variant) {
    matmul_cases(gpu, v, matmul_shapes());
}

fn matmul_thin(gpu: &Gpu, v: &Variant) {
    matmul_cases(gpu, v, matmul_thin_shapes());
}

/// `dense::matmul` over `shapes` (every epilogue in turn) against
/// `cpu::matmul`.
fn matmul_cases(gpu: &Gpu, v: &Variant, shapes: Vec<(usize, usize, usize)>) {
    let format = if v.defines.contains(&"W_F16") {
        WeightFormat::F16
    } else {
        WeightFormat::F32
    };
    let mut rng = Rng::new(3);
    // Every epilogue in turn, each over several shapes.
    let epilogues = [
        (false, None, false),
        (true, None, false),
        (true, Some(Activation::Gelu), false),
        (true, None, true),
        (false, Some(Activation::GeluTanh), true),
        (true, Some(Activation::Relu), false),
        (true, Some(Activation::Silu), true),
    ];
    for (i, (m, k, n)) in shapes.into_iter().enumerate() {
        let (has_bias, act, has_residual) = epilogues[i % epilogues.len()];
        let x = rng.vec(m * k, -1.0, 1.0);
        let mut w = rng.vec(n * k, -1.0, 1.0);
        let bias = rng.vec(n, -1.0, 1.0);
        let residual = rng.vec(m * n, -1.0, 1.0);
        let gw = upload_weights(gpu, format, &mut w, n, k);
        let want = reference(
            &x,
            &w,
            has_bias.then_some(&bias[..]),
            act,
            has_residual.then_some(&residual[..]),
            (m, k, n),
        );
        let gx = gpu.upload_f32("x", &x).unwrap();
        let gb = gpu.upload_f32("bias", &bias).unwrap();
        let gr = gpu.upload_f32("residual", &residual).unwrap();
        let gy = gpu.poisoned_f32("y", m * n).unwrap();
        let d = dense::matmul(
            gpu,
            &Linear {
                x: &gx,
                w: &gw,
                format,
                bias: has_bias.then_some(&gb),
                residual: has_residual.then_some(&gr),
                y: &gy,
                m,
                k,
                n,
                act,
            },
        )
        .unwrap();
        gpu.run_all(&[&d]).unwrap();
        let got = gpu.read_f32(&gy).unwrap();
        // Only the order of the k products differs (tiles of 32, fma): f32
        // rounding grows like sqrt(k) ulps, ~1e-6 relative at k = 1025 with
        // cancelling random signs; squared, 1e-12. The erf approximation
        // (1.4e-7 absolute) is far below that. 1e-10 leaves headroom without
        // letting a wrong element (error ~1 / (m n) of the norm) through.
        assert_close(
            &format!(
                "matmul {} m={m} k={k} n={n} bias={has_bias} act={act:?} residual={has_residual}",
                v.key()
            ),
            &got[..m * n],
            &want,
            1e-10,
        );
    }
}

/// `dense::matmul_thin_norm` (every epilogue in turn over
/// `matmul_thin_shapes`) against `cpu::layer_norm` then `cpu::matmul`; every
/// other shape also writes its columns from n / 3 on into a cache, its rows
/// split into spans of one and more rows at offsets inside the cache,
/// whose other rows must stay as they were.
fn matmul_thin_norm(gpu: &Gpu, v: &Variant) {
    let format = if v.defines.contains(&"W_F16") {
        WeightFormat::F16
    } else {
        WeightFormat::F32
    };
    let mut rng = Rng::new(64);
    let epilogues = [
        (false, None, false),
        (true, None, false),
        (true, Some(Activation::Gelu), false),
        (true, None, true),
        (false, Some(Activation::GeluTanh), true),
    ];
    let eps = 1e-5;
    for (i, (m, k, n)) in matmul_thin_shapes().into_iter().enumerate() {
        let (has_bias, act, has_residual) = epilogues[i % epilogues.len()];
        // A common offset: the norm's variance must not cancel.
        let x: Vec<f32> = rng.vec(m * k, -2.0, 2.0).iter().map(|v| v + 5.0).collect();
        let gamma_beta = [rng.vec(k, 0.5, 1.5), rng.vec(k, -0.5, 0.5)].concat();
        let mut w = rng.vec(n * k, -1.0, 1.0);
        let bias = rng.vec(n, -1.0, 1.0);
        let residual = rng.vec(m * n, -1.0, 1.0);
        let gw = upload_weights(gpu, format, &mut w, n, k);
        let mut normed = vec![0.0; m * k];
        cpu::layer_norm(&x, &gamma_beta[..k], &gamma_beta[k..], eps, &mut normed);
        let want = reference(
            &normed,
            &w,
            has_bias.then_some(&bias[..]),
            act,
            has_residual.then_some(&residual[..]),
            (m, k, n),
        );
        // Spans of 1, 2, 3, ... rows (the last takes what is left), each
        // sequence's new rows after `past` cached ones, sequences `ctx`
        // rows apart.
        let (from_col, ctx, past) = (n / 3, 5 + m, 2 + i % 3);
        let mut spans = Vec::new();
        let mut start = 0;
        while start < m {
            let len = (spans.len() + 1).min(m - start);
            spans.push(SeqSpan {
                q_start: start,
                q_len: len,
                kv_start: spans.len() * ctx,
                kv_len: past + len,
            });
            start += len;
        }
        let width = n - from_col;
        let gx = gpu.upload_f32("x", &x).unwrap();
        let gln = gpu.upload_f32("gamma_beta", &gamma_beta).unwrap();
        let gb = gpu.upload_f32("bias", &bias).unwrap();
        let gr = gpu.upload_f32("residual", &residual).unwrap();
        let gs = gpu.upload_u32("seqs", &dense::pack_seqs(&spans)).unwrap();
        let gc = gpu
            .poisoned_f32("cache", spans.len() * ctx * width)
            .unwrap();
        let gy = gpu.poisoned_f32("y", m * n).unwrap();
        let with_cache = i % 2 == 1;
        let cache_write = dense::CacheWrite {
            cache: &gc,
            seqs: &gs,
            n_seqs: spans.len(),
            from_col,
        };
        let d = dense::matmul_thin_norm(
            gpu,
            &Linear {
                x: &gx,
                w: &gw,
                format,
                bias: has_bias.then_some(&gb),
                residual: has_residual.then_some(&gr),
                y: &gy,
                m,
                k,
                n,
                act,
            },
            &dense::FoldedNorm {
                gamma_beta: &gln,
                eps,
            },
            with_cache.then_some(&cache_write),
        )
        .unwrap();
        gpu.run_all(&[&d]).unwrap();
        let what = format!(
            "matmul_thin_norm {} m={m} k={k} n={n} bias={has_bias} act={act:?} residual={has_residual} cache={with_cache}",
            v.key()
        );
        let got = gpu.read_f32(&gy).unwrap();
        // The norm's sums in another order (lanes of 32, then their sums)
        // and the product's as in matmul_thin: differences of a few ulps
        // of the normalised values, ~1e-12 squared and normalised.
        assert_close(&what, &got[..m * n], &want, 1e-10);
        let cache = gpu.read_f32(&gc).unwrap();
        for (s, span) in spans.iter().enumerate() {
            for row in 0..ctx {
                let at = (s * ctx + row) * width;
                let slot = &cache[at..at + width];
                let new = row + span.q_len >= span.kv_len && row < span.kv_len;
                if with_cache && new {
                    let r = span.q_start + row + span.q_len - span.kv_len;
                    assert_eq!(
                        slot.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                        got[r * n + from_col..(r + 1) * n]
                            .iter()
                            .map(|v| v.to_bits())
                            .collect::<Vec<_>>(),
                        "{what}: cache row {row} of span {s} is not row {r}'s columns from {from_col}"
                    );
                } else {
                    assert!(
                        slot.iter().all(|v| v.is_nan()),
                        "{what}: cache row {row} of span {s} was written"
                    );
                }
            }
        }
    }
}

fn layer_norm(gpu: &Gpu, v: &Variant) {
    let mut rng = Rng::new(4);
    let shapes = SIZES
        .iter()
        .flat_map(|&n| [(n, 1), (n, 3)])
        // More rows than one dispatch dimension holds (65535).
        .chain([(7, 70_000)]);
    for (n, rows) in shapes {
        // Rows with a common offset: a one-pass variance would lose
        // digits to cancellation here.
        let x: Vec<f32> = rng
            .vec(rows * n, -3.0, 3.0)
            .iter()
            .map(|v| v + 10.0)
            .collect();
        let w = rng.vec(n, 0.5, 1.5);
        let b = rng.vec(n, -0.5, 0.5);
        let mut want = vec![0.0; rows * n];
        cpu::layer_norm(&x, &w, &b, 1e-12, &mut want);
        let gx = gpu.upload_f32("x", &x).unwrap();
        let gw = gpu.upload_f32("w", &w).unwrap();
        let gb = gpu.upload_f32("b", &b).unwrap();
        let gy = gpu.poisoned_f32("y", rows * n).unwrap();
        let d = dense::layer_norm(gpu, v, &gx, &gw, &gb, &gy, n, rows, 1e-12).unwrap();
        gpu.run_all(&[&d]).unwrap();
        let got = gpu.read_f32(&gy).unwrap();
        // The summation order of the mean differs (sequential on the
        // CPU, a tree on the GPU): a sum of n values near 10 is off by
        // up to ~sqrt(n) ulps of the sum, a few 1e-6 against deviations
        // of ~1.7; squared, up to ~3e-11 measured at n = 1025.
        assert_close(
            &format!("layer_norm {} n={n} rows={rows}", v.key()),
            &got[..rows * n],
            &want,
            1e-10,
        );
    }
}

fn gelu(gpu: &Gpu, _v: &Variant) {
    let mut rng = Rng::new(5);
    for &n in SIZES.iter().chain(&[70_000]) {
        let x = rng.vec(n, -6.0, 6.0);
        let want: Vec<f32> = x.iter().map(|&v| cpu::gelu(v)).collect();
        let gx = gpu.upload_f32("x", &x).unwrap();
        let gy = gpu.poisoned_f32("y", n).unwrap();
        let d = dense::gelu(gpu, &gx, &gy, n).unwrap();
        gpu.run_all(&[&d]).unwrap();
        let got = gpu.read_f32(&gy).unwrap();
        // The CPU computes erf in f64; the shader's f32 approximation is off
        // by at most 1.4e-7 absolute (plus the GPU's exp): squared and
        // normalised by values of order 1, under 1e-13.
        assert_close(&format!("gelu n={n}"), &got[..n], &want, 1e-12);
        let worst = got[..n]
            .iter()
            .zip(&want)
            .map(|(g, w)| (g - w).abs())
            .fold(0.0f32, f32::max);
        assert!(worst < 1e-6, "gelu n={n}: max abs error {worst}");
    }
}

/// One attention setup: query and key/value matrices (separate, or column
/// blocks of one fused buffer) over ragged sequences.
struct AttentionCase {
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    causal: bool,
    /// A bidirectional sliding window (0: none), as ModernBERT's local layers.
    window: usize,
    /// (q_len, kv_len) per sequence; kv_len > q_len models a cached prefix.
    lens: &'static [(usize, usize)],
    /// q, k and v as column blocks of one [rows, q + k + v] buffer.
    fused: bool,
}

const ATTENTION_CASES: &[AttentionCase] = &[
    // ModernBERT's local attention: a window of 8 (4 keys each side), and
    // an odd one (7: 3 each side), over sequences shorter and longer than it.
    AttentionCase {
        heads: 2,
        kv_heads: 2,
        head_dim: 16,
        causal: false,
        window: 8,
        lens: &[(1, 1), (5, 5), (33, 33), (65, 65)],
        fused: true,
    },
    AttentionCase {
        heads: 3,
        kv_heads: 3,
        head_dim: 8,
        causal: false,
        window: 7,
        lens: &[(132, 132), (4, 4)],
        fused: false,
    },
    // An encoder batch: lengths around the 64-thread workgroup, fused QKV.
    AttentionCase {
        heads: 3,
        kv_heads: 3,
        head_dim: 33,
        causal: false,
        window: 0,
        lens: &[(1, 1), (33, 33), (63, 63), (64, 64), (65, 65), (132, 132)],
        fused: true,
    },
    // BERT-base shape with a 260-token sequence beside short ones.
    AttentionCase {
        heads: 12,
        kv_heads: 12,
        head_dim: 32,
        causal: false,
        window: 0,
        lens: &[(260, 260), (1, 1), (7, 7)],
        fused: true,
    },
    // One long sequence, head size 1.
    AttentionCase {
        heads: 2,
        kv_heads: 2,
        head_dim: 1,
        causal: false,
        window: 0,
        lens: &[(1025, 1025)],
        fused: false,
    },
    // Causal prefill with grouped-query heads and cached prefixes.
    AttentionCase {
        heads: 4,
        kv_heads: 2,
        head_dim: 64,
        causal: true,
        window: 0,
        lens: &[(33, 33), (5, 70), (1, 1), (65, 257)],
        fused: false,
    },
    // The largest head size, causal, one key-value head.
    AttentionCase {
        heads: 3,
        kv_heads: 1,
        head_dim: 256,
        causal: true,
        window: 0,
        lens: &[(63, 63), (2, 9)],
        fused: false,
    },
];

fn attention(gpu: &Gpu, _v: &Variant) {
    let mut rng = Rng::new(6);
    for c in ATTENTION_CASES {
        let hd = c.head_dim;
        let (qw, kw) = (c.heads * hd, c.kv_heads * hd);
        let mut seqs = Vec::new();
        let (mut rows, mut kv_rows) = (0, 0);
        for &(q_len, kv_len) in c.lens {
            seqs.push(SeqSpan {
                q_start: rows,
                q_len,
                kv_start: kv_rows,
                kv_len,
            });
            rows += q_len;
            kv_rows += kv_len;
        }
        let shape = if c.fused {
            assert_eq!(rows, kv_rows, "a fused case has no cached prefix");
            let stride = qw + 2 * kw;
            AttentionShape {
                heads: c.heads,
                kv_heads: c.kv_heads,
                head_dim: hd,
                scale: 1.0 / (hd as f32).sqrt(),
                causal: c.causal,
                window: c.window,
                q_stride: stride,
                k_stride: stride,
                v_stride: stride,
                q_col: 0,
                k_col: qw,
                v_col: qw + kw,
            }
        } else {
            AttentionShape {
                heads: c.heads,
                kv_heads: c.kv_heads,
                head_dim: hd,
                scale: 1.0 / (hd as f32).sqrt(),
                causal: c.causal,
                window: c.window,
                q_stride: qw,
                k_stride: kw,
                v_stride: kw,
                q_col: 0,
                k_col: 0,
                v_col: 0,
            }
        };
        // Scores of a few units: peaked enough that a wrong key shows.
        let (q, k, v) = if c.fused {
            let all = rng.vec(rows * (qw + 2 * kw), -2.0, 2.0);
            (all.clone(), all.clone(), all)
        } else {
            (
                rng.vec(rows * qw, -2.0, 2.0),
                rng.vec(kv_rows * kw, -2.0, 2.0),
                rng.vec(kv_rows * kw, -2.0, 2.0),
            )
        };
        let mut want = vec![0.0; rows * qw];
        cpu::attention(&q, &k, &v, &seqs, &shape, &mut want);
        let gq = gpu.upload_f32("q", &q).unwrap();
        let (gk, gv) = if c.fused {
            (gq.clone(), gq.clone())
        } else {
            (
                gpu.upload_f32("k", &k).unwrap(),
                gpu.upload_f32("v", &v).unwrap(),
            )
        };
        let gs = gpu.upload_u32("seqs", &dense::pack_seqs(&seqs)).unwrap();
        let gout = gpu.poisoned_f32("out", rows * qw).unwrap();
        let d = dense::attention(gpu, &gq, &gk, &gv, &gs, &seqs, &shape, &gout).unwrap();
        gpu.run_all(&[&d]).unwrap();
        let got = gpu.read_f32(&gout).unwrap();
        // Scores, exponentials and the weighted sums are f32 in both, in a
        // different order (running max on the GPU): ~1e-6 relative, squared
        // ~1e-12; a query reading another sequence's keys is off by O(1).
        assert_close(
            &format!(
                "attention heads={} kv_heads={} head_dim={hd} causal={} window={} lens={:?}",
                c.heads, c.kv_heads, c.causal, c.window, c.lens
            ),
            &got[..rows * qw],
            &want,
            1e-10,
        );
    }
}

/// Attention longer than a software driver's loop budget
/// (`gpu::SOFTWARE_LOOP_LIMIT`: lavapipe would cut the key loop short and
/// return NaNs): refused there with an error naming the limit, computed like
/// the CPU elsewhere.
pub fn long_attention_is_refused_on_software_adapters_and_right_elsewhere(gpu: &Gpu) {
    let (heads, hd, kv_len) = (2, 64, 600);
    let seqs = [SeqSpan {
        q_start: 0,
        q_len: 2,
        kv_start: 0,
        kv_len,
    }];
    let shape = AttentionShape {
        heads,
        kv_heads: heads,
        head_dim: hd,
        scale: 1.0 / (hd as f32).sqrt(),
        causal: false,
        window: 0,
        q_stride: heads * hd,
        k_stride: heads * hd,
        v_stride: heads * hd,
        q_col: 0,
        k_col: 0,
        v_col: 0,
    };
    let mut rng = Rng::new(7);
    let q = rng.vec(2 * heads * hd, -2.0, 2.0);
    let k = rng.vec(kv_len * heads * hd, -2.0, 2.0);
    let v = rng.vec(kv_len * heads * hd, -2.0, 2.0);
    let (gq, gk, gv) = (
        gpu.upload_f32("q", &q).unwrap(),
        gpu.upload_f32("k", &k).unwrap(),
        gpu.upload_f32("v", &v).unwrap(),
    );
    let gs = gpu.upload_u32("seqs", &dense::pack_seqs(&seqs)).unwrap();
    let gout = gpu.poisoned_f32("out", 2 * heads * hd).unwrap();
    let result = dense::attention(gpu, &gq, &gk, &gv, &gs, &seqs, &shape, &gout);
    if gpu.is_software() {
        let err = result
            .err()
            .expect("a software adapter must refuse 600 keys")
            .to_string();
        assert!(err.contains("65535") && err.contains("--cpu"), "{err}");
        return;
    }
    gpu.run_all(&[&result.unwrap()]).unwrap();
    let mut want = vec![0.0; 2 * heads * hd];
    cpu::attention(&q, &k, &v, &seqs, &shape, &mut want);
    assert_close(
        "attention over 600 keys",
        &gpu.read_f32(&gout).unwrap(),
        &want,
        1e-10,
    );
}
