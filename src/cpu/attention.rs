//! Multi-head scaled dot-product attention over a ragged batch: several
//! sequences of different lengths packed row after row, each attending only
//! to its own keys. Serves encoders (bidirectional) and causal prefill, with
//! grouped-query attention (fewer key/value heads than query heads).

use super::softmax_rows;
use rayon::prelude::*;

/// Where one sequence of a ragged batch lives: its query rows and its
/// key/value rows. For an encoder both are the same rows; for causal prefill
/// with a cache the keys may start earlier and be more than the queries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SeqSpan {
    pub q_start: usize,
    pub q_len: usize,
    pub kv_start: usize,
    pub kv_len: usize,
}

impl SeqSpan {
    /// A sequence attending to itself (encoder self-attention).
    pub fn same(start: usize, len: usize) -> SeqSpan {
        SeqSpan {
            q_start: start,
            q_len: len,
            kv_start: start,
            kv_len: len,
        }
    }
}

/// How q, k and v are laid out and what to compute. Each of q, k, v is a
/// row-major matrix read from column `*_col` with row stride `*_stride`
/// (elements), so the three may be slices of one fused QKV projection.
/// Head `h` of q is columns `q_col + h * head_dim ..`; query head `h` reads
/// key/value head `h / (heads / kv_heads)`.
#[derive(Clone, Copy, Debug)]
pub struct AttentionShape {
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    /// Multiplies q.k (usually 1 / sqrt(head_dim)).
    pub scale: f32,
    /// Query i of a sequence sees keys 0 ..= kv_len - q_len + i only.
    pub causal: bool,
    /// 0: every key. Otherwise a bidirectional sliding window (ModernBERT's
    /// local attention; encoders, where q_len = kv_len): query i sees keys j
    /// with |i - j| <= window / 2 only.
    pub window: usize,
    pub q_stride: usize,
    pub k_stride: usize,
    pub v_stride: usize,
    pub q_col: usize,
    pub k_col: usize,
    pub v_col: usize,
}

impl AttentionShape {
    /// Checks the invariants shared by the CPU and GPU versions.
    pub fn check(&self, seqs: &[SeqSpan], rows: usize) {
        assert!(
            self.heads > 0 && self.kv_heads > 0 && self.heads.is_multiple_of(self.kv_heads),
            "attention: {} heads not a multiple of {} kv heads",
            self.heads,
            self.kv_heads
        );
        assert!(self.head_dim > 0, "attention: head_dim is 0");
        let mut next = 0;
        for s in seqs {
            assert_eq!(
                s.q_start, next,
                "attention: query rows of the sequences must tile the batch in order"
            );
            next += s.q_len;
        }
        assert_eq!(
            next, rows,
            "attention: sequences cover {next} of {rows} rows"
        );
    }

    /// The keys (offsets from `kv_start`) query `i` of sequence `s` may attend to.
    pub fn visible_keys(&self, s: &SeqSpan, i: usize) -> std::ops::Range<usize> {
        let mut end = if self.causal {
            (s.kv_len + i + 1).saturating_sub(s.q_len).min(s.kv_len)
        } else {
            s.kv_len
        };
        let mut start = 0;
        if self.window > 0 {
            let r = self.window / 2;
            start = i.saturating_sub(r);
            end = end.min(i + r + 1);
        }
        start..end.max(start)
    }
}

/// out: [rows, heads * head_dim], rows = total query rows of `seqs`.
/// out[r, h] = softmax(scale * q[r, h] . k[j, h']) v[j, h'] over the visible
/// keys j of r's sequence; a query that sees no key gets zeros.
pub fn attention(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    seqs: &[SeqSpan],
    shape: &AttentionShape,
    out: &mut [f32],
) {
    let AttentionShape {
        heads,
        kv_heads,
        head_dim: hd,
        ..
    } = *shape;
    let width = heads * hd;
    let rows = out.len() / width.max(1);
    assert_eq!(
        out.len(),
        rows * width,
        "attention: out is not [rows, heads * head_dim]"
    );
    shape.check(seqs, rows);
    let group = heads / kv_heads;
    // Row -> its sequence, so rows can be computed in parallel.
    let row_seq: Vec<&SeqSpan> = seqs
        .iter()
        .flat_map(|s| std::iter::repeat_n(s, s.q_len))
        .collect();
    out.par_chunks_mut(width)
        .zip(row_seq.par_iter())
        .enumerate()
        .for_each(|(r, (out_row, s))| {
            let i = r - s.q_start;
            let keys = shape.visible_keys(s, i);
            let visible = keys.len();
            let mut scores = vec![0.0f32; visible];
            for h in 0..heads {
                let kvh = h / group;
                let o = &mut out_row[h * hd..(h + 1) * hd];
                o.fill(0.0);
                if visible == 0 {
                    continue;
                }
                let qo = r * shape.q_stride + shape.q_col + h * hd;
                let qh = &q[qo..qo + hd];
                for (j, sc) in scores.iter_mut().enumerate() {
                    let ko =
                        (s.kv_start + keys.start + j) * shape.k_stride + shape.k_col + kvh * hd;
                    *sc = shape.scale * super::dot(qh, &k[ko..ko + hd]);
                }
                softmax_rows(&mut scores, visible);
                for (j, p) in scores.iter().enumerate() {
                    let vo =
                        (s.kv_start + keys.start + j) * shape.v_stride + shape.v_col + kvh * hd;
                    for (o, v) in o.iter_mut().zip(&v[vo..vo + hd]) {
                        *o += p * v;
                    }
                }
            }
        });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(heads: usize, kv_heads: usize, hd: usize, causal: bool) -> AttentionShape {
        AttentionShape {
            heads,
            kv_heads,
            head_dim: hd,
            scale: 1.0 / (hd as f32).sqrt(),
            causal,
            window: 0,
            q_stride: heads * hd,
            k_stride: kv_heads * hd,
            v_stride: kv_heads * hd,
            q_col: 0,
            k_col: 0,
            v_col: 0,
        }
    }

    #[test]
    fn single_key_returns_its_value() {
        // One sequence of one token: softmax over one key is 1.
        let q = [0.3, -0.2];
        let k = [1.0, 2.0];
        let v = [5.0, -7.0];
        let mut out = [0.0; 2];
        attention(
            &q,
            &k,
            &v,
            &[SeqSpan::same(0, 1)],
            &shape(1, 1, 2, false),
            &mut out,
        );
        assert_eq!(out, [5.0, -7.0]);
    }

    #[test]
    fn sequences_do_not_see_each_other() {
        // Two sequences; changing the second's keys must not move the first's output.
        let s = shape(2, 1, 4, false);
        let seqs = [SeqSpan::same(0, 3), SeqSpan::same(3, 2)];
        let mut rng = crate::util::rng::Rng::new(7);
        let q = rng.vec(5 * 8, -1.0, 1.0);
        let mut k = rng.vec(5 * 4, -1.0, 1.0);
        let v = rng.vec(5 * 4, -1.0, 1.0);
        let mut a = vec![0.0; 5 * 8];
        attention(&q, &k, &v, &seqs, &s, &mut a);
        for x in &mut k[3 * 4..] {
            *x += 10.0;
        }
        let mut b = vec![0.0; 5 * 8];
        attention(&q, &k, &v, &seqs, &s, &mut b);
        assert_eq!(a[..3 * 8], b[..3 * 8]);
        assert_ne!(a[3 * 8..], b[3 * 8..]);
    }

    #[test]
    fn causal_first_query_sees_only_first_key() {
        let s = shape(1, 1, 2, true);
        let q = [1.0, 0.0, 0.0, 1.0];
        let k = [1.0, 1.0, -3.0, 2.0];
        let v = [0.5, 0.25, 9.0, 9.0];
        let mut out = [0.0; 4];
        attention(&q, &k, &v, &[SeqSpan::same(0, 2)], &s, &mut out);
        assert_eq!(out[..2], [0.5, 0.25]);
        assert!(out[2] > 0.5 && out[2] < 9.0);
    }
}
