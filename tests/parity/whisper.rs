//! Parity cases for the Whisper-specific kernels in `gpu::whisper`.

use super::{assert_close, Case};
use lfm::cpu::whisper::{self as select, RowRule, SelectRules, NO_TOKEN, ROW_FIRST};
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
    Case {
        kernel: "attention_tiled_merge",
        run: attention_tiled_merge,
    },
    Case {
        kernel: "whisper_select",
        run: whisper_select,
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

fn attention_tiled(gpu: &Gpu, v: &Variant) {
    // SPLIT writes partials: checked through the merge that combines them.
    let split = Variant::new(&["SPLIT"]);
    let splits: &[usize] = if v.defines == split.defines {
        &[1, 3, 8]
    } else {
        &[]
    };
    tiled(gpu, splits);
}

fn attention_tiled_merge(gpu: &Gpu, _v: &Variant) {
    // Flash-decoding's pieces: one, a few, more than some spans have tiles
    // (empty pieces), and more than there are keys.
    tiled(gpu, &[1, 5, 8, 200]);
}

/// `attention_tiled` whole (no `splits`), or split into each of `splits`
/// pieces and merged, against `cpu::attention` over the same spans.
fn tiled(gpu: &Gpu, splits: &[usize]) {
    let mut rng = Rng::new(12);
    // (spans as (q_len, kv_len), heads, head_dim, fused): Whisper's encoder
    // length (1500 positions, heads of 64, fused QKV), partial tiles, other
    // head sizes, and the decoder's cross-attention (a few query rows of
    // each sequence over its own window's 1500 keys, windows shared and
    // out of order).
    type Spans = &'static [(usize, usize)];
    let cases: [(Spans, usize, usize, bool); 7] = [
        (&[(1500, 1500)], 2, 64, true),
        (&[(1, 1)], 2, 64, true),
        (&[(33, 33)], 3, 32, false),
        (&[(257, 257)], 1, 4, false),
        (&[(65, 65)], 8, 64, false),
        (&[(5, 1500), (5, 1500), (5, 1500)], 6, 64, false),
        (&[(17, 33), (1, 20), (40, 7)], 2, 64, false),
    ];
    for (lens, heads, hd, fused) in cases {
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
        let rows: usize = lens.iter().map(|l| l.0).sum();
        let kv_total: usize = lens.iter().map(|l| l.1).sum();
        // Key blocks in reverse order of the spans, the first shared by two.
        let mut spans = Vec::new();
        let (mut q_at, mut kv_at) = (0, kv_total);
        for (i, &(q_len, kv_len)) in lens.iter().enumerate() {
            if i != 1 || lens.len() < 3 {
                kv_at -= kv_len;
            }
            spans.push(SeqSpan {
                q_start: q_at,
                q_len,
                kv_start: kv_at,
                kv_len,
            });
            q_at += q_len;
        }
        let q = rng.vec(rows * stride, -2.0, 2.0);
        let (k, v) = if fused {
            (q.clone(), q.clone())
        } else {
            (
                rng.vec(kv_total * stride, -2.0, 2.0),
                rng.vec(kv_total * stride, -2.0, 2.0),
            )
        };
        let mut want = vec![0.0; rows * d];
        cpu::attention(&q, &k, &v, &spans, &shape, &mut want);
        let gq = gpu.upload_f32("q", &q).unwrap();
        let gk = gpu.upload_f32("k", &k).unwrap();
        let gv = gpu.upload_f32("v", &v).unwrap();
        let seqs = gpu
            .upload_u32("seqs", &lfm::gpu::dense::pack_seqs(&spans))
            .unwrap();
        let longest = lens.iter().map(|l| l.0).max().unwrap();
        let pieces: Vec<Option<usize>> = if splits.is_empty() {
            vec![None]
        } else {
            splits.iter().map(|&s| Some(s)).collect()
        };
        for piece in pieces {
            let out = gpu.poisoned_f32("out", rows * d).unwrap();
            let work = match piece {
                None => vec![wgpu_ops::attention_tiled(
                    gpu,
                    &gq,
                    &gk,
                    &gv,
                    &seqs,
                    spans.len(),
                    longest,
                    &out,
                    &shape,
                )
                .unwrap()],
                Some(n) => {
                    // The encoder's 1500 rows in at most 8 pieces (memory).
                    let n = if rows > 64 { n.min(8) } else { n };
                    let part = gpu
                        .poisoned_f32("part", rows * heads * n * (hd + 2))
                        .unwrap();
                    wgpu_ops::attention_tiled_split(
                        gpu,
                        &gq,
                        &gk,
                        &gv,
                        &seqs,
                        spans.len(),
                        longest,
                        rows,
                        &part,
                        &out,
                        &shape,
                        n,
                    )
                    .unwrap()
                    .into()
                }
            };
            gpu.run_all(&work.iter().collect::<Vec<_>>()).unwrap();
            let got = gpu.read_f32(&out).unwrap();
            // f32 scores and sums in another order (online softmax by
            // tiles of 16, pieces merged): ~1e-6 relative, squared ~1e-12;
            // a wrong key or piece is off by O(1).
            assert_close(
                &format!(
                    "attention_tiled spans={lens:?} heads={heads} head_dim={hd} fused={fused} \
                     splits={piece:?}"
                ),
                &got[..rows * d],
                &want,
                1e-10,
            );
        }
    }
}

fn whisper_select(gpu: &Gpu, _v: &Variant) {
    let mut rng = Rng::new(13);
    // Whisper's vocabulary (51864: text below 50257, timestamps from 50364)
    // and an odd small one.
    for (vocab, tb, eot) in [(51864usize, 50364u32, 50256u32), (1025, 1000, 900)] {
        let rules = SelectRules {
            vocab,
            timestamp_begin: tb,
            timestamps: true,
            masks: select::token_masks(
                vocab,
                &(0..vocab as u32).filter(|t| t % 7 == 3).collect::<Vec<_>>(),
                &[220, eot],
            ),
        };
        let open = RowRule {
            text_end: 0,
            ts_from: 0,
            ts_end: vocab as u32,
            flags: 0,
            probe: NO_TOKEN,
            _pad: [0; 3],
        };
        // Every kind of row the search sends: the first token (blank
        // suppression, text banned, initial timestamps only), after a
        // closed pair (no timestamps), after an opened segment (no text, no
        // earlier timestamp), in text, the raw distribution with a probe,
        // timestamps likelier than text, and damaged logits.
        let rows = [
            RowRule {
                text_end: tb,
                ts_end: tb + 51,
                flags: ROW_FIRST,
                ..open
            },
            RowRule {
                ts_from: tb + 20,
                ts_end: tb,
                ..open
            },
            RowRule {
                text_end: eot,
                ts_from: tb + 20,
                ..open
            },
            RowRule {
                ts_from: tb + 3,
                probe: eot,
                ..open
            },
            RowRule::raw(vocab, 7),
            open,
            open,
        ];
        let mut logits = rng.vec(rows.len() * vocab, -8.0, 8.0);
        for t in tb as usize..vocab {
            logits[5 * vocab + t] += 12.0;
        }
        logits[6 * vocab + 17] = f32::NAN;
        for k in [1, 6, 33] {
            let want = select::whisper_select(&logits, &rules, &rows, k);
            let g_logits = gpu.upload_f32("logits", &logits).unwrap();
            let g_rules = gpu.upload("rules", bytemuck::cast_slice(&rows)).unwrap();
            let g_masks = gpu.upload_u32("masks", &rules.masks).unwrap();
            let out = gpu
                .poisoned_f32("picks", rows.len() * select::select_words(k))
                .unwrap();
            let d = wgpu_ops::whisper_select(
                gpu,
                &g_logits,
                &g_rules,
                &g_masks,
                &out,
                rows.len(),
                &rules,
                k,
            )
            .unwrap();
            gpu.run_all(&[&d]).unwrap();
            let got = gpu.read_u32(&out).unwrap();
            let (got, want) = (select::read_picks(&got, k), select::read_picks(&want, k));
            for (r, (g, w)) in got.iter().zip(&want).enumerate() {
                let what = format!("whisper_select vocab={vocab} k={k} row {r}");
                // The choice is exact: same tokens in the same order.
                assert_eq!(g.tokens, w.tokens, "{what}: tokens");
                if r == 6 {
                    assert!(
                        g.logprobs.iter().all(|v| v.is_nan()),
                        "{what}: damage not flagged"
                    );
                    continue;
                }
                // Log probabilities: the row's log-sum-exp summed in another
                // order (a tree over 256 threads against one pass): ~1e-6
                // relative. Banned picks are -inf on both sides.
                let close = |a: f32, b: f32| a == b || (a - b).abs() <= 1e-5 * (1.0 + b.abs());
                for (a, b) in g.logprobs.iter().zip(&w.logprobs) {
                    assert!(close(*a, *b), "{what}: log probability {a} against {b}");
                }
                assert!(
                    close(g.probe, w.probe),
                    "{what}: probe {} against {}",
                    g.probe,
                    w.probe
                );
            }
        }
    }
}
