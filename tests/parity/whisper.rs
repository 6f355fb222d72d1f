//! Parity cases for the Whisper-specific kernels in `gpu::whisper`.

use super::{assert_close, Case};
use lfm::cpu::whisper::{
    self as select, Draw, RowRule, RuleState, SampleRules, SelectRules, TimestampRules, NO_TOKEN,
    ROW_FIRST,
};
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
        kernel: "whisper_select_part",
        run: whisper_select,
    },
    Case {
        kernel: "whisper_select",
        run: whisper_select,
    },
    Case {
        kernel: "whisper_sample",
        run: whisper_sample,
    },
    Case {
        kernel: "whisper_next",
        run: whisper_next,
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

/// Whisper's vocabulary (51864: text below 50257, timestamps from 50364)
/// or an odd small one, with a seventh of the tokens always suppressed.
fn select_rules(vocab: usize, tb: u32, eot: u32) -> SelectRules {
    SelectRules {
        vocab,
        timestamp_begin: tb,
        timestamps: true,
        masks: select::token_masks(
            vocab,
            &(0..vocab as u32).filter(|t| t % 7 == 3).collect::<Vec<_>>(),
            &[220, eot],
        ),
    }
}

/// Every kind of row the search sends: the first token (blank suppression,
/// text banned, initial timestamps only), after a closed pair (no
/// timestamps), after an opened segment (no text, no earlier timestamp),
/// in text with a probe, the raw distribution with a probe, timestamps
/// likelier than text, damaged logits, and only the last three
/// timestamps left (fewer tokens than picks). Logits [rows, vocab].
fn select_rows(vocab: usize, tb: u32, eot: u32, rng: &mut Rng) -> (Vec<RowRule>, Vec<f32>) {
    let open = RowRule {
        text_end: 0,
        ts_from: 0,
        ts_end: vocab as u32,
        flags: 0,
        probe: NO_TOKEN,
        _pad: [0; 3],
    };
    let rows = vec![
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
        RowRule {
            text_end: tb,
            ts_from: vocab as u32 - 3,
            ..open
        },
    ];
    let mut logits = rng.vec(rows.len() * vocab, -8.0, 8.0);
    for t in tb as usize..vocab {
        logits[5 * vocab + t] += 12.0;
    }
    logits[6 * vocab + 17] = f32::NAN;
    (rows, logits)
}

const DAMAGED_ROW: usize = 6;

fn whisper_select(gpu: &Gpu, _v: &Variant) {
    let mut rng = Rng::new(13);
    for (vocab, tb, eot) in [(51864usize, 50364u32, 50256u32), (1025, 1000, 900)] {
        let rules = select_rules(vocab, tb, eot);
        let (rows, logits) = select_rows(vocab, tb, eot, &mut rng);
        for k in [1, 6, 33] {
            let want = select::whisper_select(&logits, &rules, &rows, k);
            let g_logits = gpu.upload_f32("logits", &logits).unwrap();
            let g_rules = gpu.upload("rules", bytemuck::cast_slice(&rows)).unwrap();
            let g_masks = gpu.upload_u32("masks", &rules.masks).unwrap();
            let part = gpu
                .poisoned_f32("part", wgpu_ops::select_part_words(vocab, rows.len(), k))
                .unwrap();
            let out = gpu
                .poisoned_f32("picks", rows.len() * select::select_words(k))
                .unwrap();
            let d = wgpu_ops::whisper_select(
                gpu,
                &g_logits,
                &g_rules,
                &g_masks,
                &part,
                &out,
                rows.len(),
                &rules,
                k,
                0.0,
            )
            .unwrap();
            gpu.run_all(&[&d[0], &d[1]]).unwrap();
            let got_words = gpu.read_u32(&out).unwrap();
            let words = select::select_words(k);
            let (got, want_picks) = (
                select::read_picks(&got_words, k),
                select::read_picks(&want, k),
            );
            for (r, (g, w)) in got.iter().zip(&want_picks).enumerate() {
                let what = format!("whisper_select vocab={vocab} k={k} row {r}");
                // The choice is exact: same tokens in the same order, and
                // the same flags (damage, text banned by the timestamps).
                assert_eq!(g.tokens, w.tokens, "{what}: tokens");
                assert_eq!(
                    got_words[r * words + 1],
                    want[r * words + 1],
                    "{what}: flags"
                );
                if r == DAMAGED_ROW {
                    assert!(
                        g.logprobs.iter().all(|v| v.is_nan()),
                        "{what}: damage not flagged"
                    );
                    continue;
                }
                // The maximum is one of the logits: exact.
                assert_eq!(
                    got_words[r * words + 3],
                    want[r * words + 3],
                    "{what}: maximum"
                );
                // Log probabilities: the row's log-sum-exp summed in another
                // order (chunk sums moved to the row's maximum against one
                // pass): ~1e-6 relative. Banned picks are -inf on both sides.
                let close = |a: f32, b: f32| a == b || (a - b).abs() <= 1e-5 * (1.0 + b.abs());
                let lse = |w: &[u32]| f32::from_bits(w[r * words + 2]);
                assert!(
                    close(lse(&got_words), lse(&want)),
                    "{what}: log-sum-exp {} against {}",
                    lse(&got_words),
                    lse(&want)
                );
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

fn whisper_sample(gpu: &Gpu, _v: &Variant) {
    let mut rng = Rng::new(14);
    for (vocab, tb, eot) in [(51864usize, 50364u32, 50256u32), (1025, 1000, 900)] {
        let rules = select_rules(vocab, tb, eot);
        let (rows, mut logits) = select_rows(vocab, tb, eot, &mut rng);
        // A peaked row, as a decoder's usually is: a few tokens far above
        // the rest (which are below 8).
        for (t, x) in [(11usize, 20.0), (300, 19.0), (301, 18.0), (645, 17.5)] {
            logits[3 * vocab + t] = x;
        }
        for temperature in [0.2f32, 0.6, 1.0] {
            let sample_rules = SampleRules {
                select: &rules,
                rows: &rows,
                temperature,
            };
            // Per row: random draws, then draws on the CPU's own interval
            // edges (u = its running sum / total at the likeliest tokens),
            // where the device must hand the draw back or agree.
            let mut draws = Vec::new();
            let mut random = 0;
            for r in 0..rows.len() {
                for _ in 0..24 {
                    draws.push(Draw {
                        row: r as u32,
                        u: rng.next_f32(),
                    });
                    random += 1;
                }
            }
            for (r, rule) in rows.iter().enumerate() {
                let mut row = logits[r * vocab..(r + 1) * vocab].to_vec();
                select::filter_row(&mut row, &rules, rule);
                let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let w: Vec<f64> = row
                    .iter()
                    .map(|&l| (((l - max) / temperature) as f64).exp())
                    .collect();
                let total: f64 = w.iter().sum();
                let mut run = 0.0;
                for (t, &wt) in w.iter().enumerate() {
                    run += wt;
                    if wt > 1e-3 * total && run < total {
                        draws.push(Draw {
                            row: r as u32,
                            u: (run / total) as f32,
                        });
                    }
                    if draws.len() > random + 40 * (r + 1) || t > 5000 {
                        break;
                    }
                }
            }
            let want = select::whisper_sample(&logits, &sample_rules, &draws);
            let g_logits = gpu.upload_f32("logits", &logits).unwrap();
            let g_rules = gpu.upload("rules", bytemuck::cast_slice(&rows)).unwrap();
            let g_masks = gpu.upload_u32("masks", &rules.masks).unwrap();
            let g_draws = gpu.upload("draws", bytemuck::cast_slice(&draws)).unwrap();
            let part = gpu
                .poisoned_f32("part", wgpu_ops::select_part_words(vocab, rows.len(), 1))
                .unwrap();
            let picks = gpu
                .poisoned_f32("picks", rows.len() * select::select_words(1))
                .unwrap();
            let out = gpu
                .poisoned_f32("drawn", draws.len() * select::SAMPLE_WORDS)
                .unwrap();
            let d = wgpu_ops::whisper_select(
                gpu,
                &g_logits,
                &g_rules,
                &g_masks,
                &part,
                &picks,
                rows.len(),
                &rules,
                1,
                temperature,
            )
            .unwrap();
            let s = wgpu_ops::whisper_sample(
                gpu,
                &g_logits,
                &g_rules,
                &g_masks,
                &part,
                &picks,
                &g_draws,
                &out,
                draws.len(),
                &rules,
                temperature,
            )
            .unwrap();
            gpu.run_all(&[&d[0], &d[1], &s]).unwrap();
            let got = gpu.read_u32(&out).unwrap();
            let mut handed_back = 0;
            let mut random_handed_back = 0;
            let mut peaked_handed_back = 0;
            for (i, (g, w)) in got
                .chunks_exact(select::SAMPLE_WORDS)
                .zip(&want)
                .enumerate()
            {
                let what = format!(
                    "whisper_sample vocab={vocab} T={temperature} draw {i} {:?}",
                    draws[i]
                );
                assert!(g[2] <= select::DRAW_ON_CPU, "{what}: flags {}", g[2]);
                if g[2] == select::DRAW_ON_CPU {
                    handed_back += 1;
                    random_handed_back +=
                        (i < random && draws[i].row as usize != DAMAGED_ROW) as usize;
                    peaked_handed_back += (i < random && draws[i].row == 3) as usize;
                    continue;
                }
                assert_ne!(
                    draws[i].row as usize, DAMAGED_ROW,
                    "{what}: damage not handed back"
                );
                // The token is the CPU's, exactly. Its log probability has
                // the row's log-sum-exp summed in another order; the CPU
                // adds the 51,864 terms one after another in f32, each
                // rounding the running sum (vocab x 2^-24 ~ 3e-3 relative
                // at worst; 7e-5 seen where tiny terms pile onto a peak).
                assert_eq!(g[0], w.token, "{what}: token");
                let lp = f32::from_bits(g[1]);
                assert!(
                    (lp - w.logprob).abs() <= 5e-4 + 1e-5 * w.logprob.abs(),
                    "{what}: log probability {lp} against {}",
                    w.logprob
                );
            }
            eprintln!(
                "whisper_sample vocab={vocab} T={temperature}: {handed_back} of {} draws handed \
                 back ({random_handed_back} of {random} random ones)",
                draws.len()
            );
            // A random draw falls within 2^-14 of the total from an edge of
            // its token's interval rarely where the row is peaked (as a
            // decoder's rows are; row 3), and often only where tens of
            // thousands of tokens share the weight evenly (the plain random
            // rows at T = 0.2: intervals ~2e-5 of the total wide).
            assert!(
                peaked_handed_back <= 1,
                "{peaked_handed_back} random draws of the peaked row handed back"
            );
            assert!(
                random_handed_back <= (random - 24) / 3,
                "{random_handed_back} of {random} random draws handed back"
            );
            // A draw on an edge is within 2^-24 of it: always handed back
            // (and so are the damaged row's random ones).
            assert_eq!(
                handed_back - random_handed_back,
                draws.len() - random + 24,
                "draws on an edge decided on the device"
            );
        }
    }
}

/// Rows of every rule state the search meets (after text, after an opened
/// and a closed pair of timestamps, after one token, with and without a
/// timestamp so far) take every kind of token (text, end of text, a
/// timestamp, a pick past the vocabulary as a damaged row may give), with
/// timestamps on and off: the states, the rules and the embedding rows
/// equal the CPU twin's bit for bit, and rows past `rows` stay untouched.
fn whisper_next(gpu: &Gpu, _v: &Variant) {
    let mut rng = Rng::new(15);
    let (vocab, tb, eot, d) = (1025usize, 1000u32, 900u32, 24usize);
    let histories: [&[u32]; 6] = [
        &[5, 17],
        &[1003, 40, 1007],
        &[1003, 40, 1007, 1007],
        &[1004],
        &[300],
        &[1002, 9, 1005, 1005, 12],
    ];
    let picked = [7u32, eot, 1010, 1006, 4000];
    let mut starts = Vec::new();
    let mut tokens = Vec::new();
    for h in histories {
        for &t in &picked {
            starts.push(RuleState::of(h, tb));
            tokens.push(t);
        }
    }
    let rows = starts.len();
    let table = rng.vec(vocab * d, -1.0, 1.0);
    for timestamps in [true, false] {
        let t = TimestampRules {
            vocab: vocab as u32,
            timestamp_begin: tb,
            eot,
            timestamps,
            max_initial_timestamp: Some(50),
        };
        let words = select::select_words(1);
        let mut picks = vec![0u32; (rows + 1) * words];
        for (r, &tok) in tokens.iter().enumerate() {
            picks[r * words + 4] = tok;
        }
        let mut want_states = starts.clone();
        let want_rules = select::whisper_next(&picks[..rows * words], &mut want_states, &t);
        let g_picks = gpu.upload_u32("picks", &picks).unwrap();
        let g_table = gpu.upload_f32("table", &table).unwrap();
        let mut states = starts.clone();
        states.push(RuleState::EMPTY);
        let g_states = gpu.upload("states", bytemuck::cast_slice(&states)).unwrap();
        let g_rules = gpu.poisoned_f32("rules", (rows + 1) * 8).unwrap();
        let g_emb = gpu.poisoned_f32("emb", (rows + 1) * d).unwrap();
        let dispatch = wgpu_ops::whisper_next(
            gpu, &g_picks, &g_table, &g_states, &g_rules, &g_emb, rows, d, &t,
        )
        .unwrap();
        gpu.run_all(&[&dispatch]).unwrap();
        let what = format!("whisper_next timestamps={timestamps}");
        let got_states: Vec<RuleState> =
            bytemuck::cast_slice(&gpu.read_u32(&g_states).unwrap()).to_vec();
        assert_eq!(&got_states[..rows], &want_states[..], "{what}: states");
        assert_eq!(got_states[rows], RuleState::EMPTY, "{what}: past the rows");
        let got_rules = gpu.read_u32(&g_rules).unwrap();
        let got_rules: &[RowRule] = bytemuck::cast_slice(&got_rules);
        assert_eq!(&got_rules[..rows], &want_rules[..], "{what}: rules");
        assert!(
            f32::from_bits(bytemuck::cast::<RowRule, [u32; 8]>(got_rules[rows])[0]).is_nan(),
            "{what}: a rule written past the rows"
        );
        let emb = gpu.read_f32(&g_emb).unwrap();
        for (r, &tok) in tokens.iter().enumerate() {
            let tok = (tok as usize).min(vocab - 1);
            let (g, w) = (&emb[r * d..(r + 1) * d], &table[tok * d..(tok + 1) * d]);
            assert!(
                g.iter().zip(w).all(|(a, b)| a.to_bits() == b.to_bits()),
                "{what}: embedding row {r}"
            );
        }
        assert!(
            emb[rows * d..].iter().all(|v| v.is_nan()),
            "{what}: an embedding past the rows"
        );
    }
}
