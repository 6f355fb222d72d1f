// attention: multi-head scaled dot-product attention over a ragged batch
// (sequences of different lengths packed row after row, each attending only
// to its own keys), bidirectional or causal, with grouped-query heads.
//   out[r, h] = softmax_j(scale * q[r, h] . k[j, g]) v[j, g],  g = h / (heads / kv_heads)
// over the keys j visible to row r: all kv_len keys of its sequence, or with
// `causal` keys 0 ..= kv_len - q_len + i for its i-th query; with a `window`
// (encoders, q_len = kv_len) only keys j with |i - j| <= window / 2.
// bindings: 0 params, 1 q, 2 k, 3 v: array<f32>, each row-major, read from column
//           *_col with row stride *_stride (so all three may be one fused QKV
//           buffer bound three times), 4 seqs: array<u32>, per sequence
//           {q_start, q_len, kv_start, kv_len}, the q ranges tiling
//           0..rows in order, 5 out: array<f32> (rows * heads * HEAD_DIM)
// dispatch: (ceil(rows / WG), heads) workgroups, the row blocks spread over x
// and y (see gpu::ops::groups_1d), heads in z. Each thread owns one query row
// of one head: it finds its sequence by binary search and walks the keys
// once with a running max and sum (softmax in f32, max-subtracted as in flash
// attention), keeping q and the output row in registers. No workgroup memory
// and no barriers: the threads of a workgroup read the same key rows at the
// same time, which the caches serve as broadcasts.
// HEAD_DIM is an override constant (pipeline specialisation) so the loops over
// it have a fixed length and the arrays stay in registers.
// An invocation runs ~kv_len * (2 * HEAD_DIM + 6) loop iterations, which on
// lavapipe must stay under its 65535 per invocation (gpu::SOFTWARE_LOOP_LIMIT;
// gpu::dense::attention refuses longer inputs there).

struct Params {
    rows: u32, n_seqs: u32, heads: u32, kv_heads: u32,
    causal: u32, q_stride: u32, k_stride: u32, v_stride: u32,
    q_col: u32, k_col: u32, v_col: u32, scale: f32,
    window: u32, _p0: u32, _p1: u32, _p2: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> q: array<f32>;
@group(0) @binding(2) var<storage, read> k: array<f32>;
@group(0) @binding(3) var<storage, read> v: array<f32>;
@group(0) @binding(4) var<storage, read> seqs: array<u32>;
@group(0) @binding(5) var<storage, read_write> out: array<f32>;

override WG: u32 = 64u;
override HEAD_DIM: u32 = 64u;
const MAX_HEAD_DIM: u32 = 256u;

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let row = (wid.y * nwg.x + wid.x) * WG + lid;
    if (row >= p.rows) {
        return;
    }
    let h = wid.z;
    let g = h / (p.heads / p.kv_heads);
    // Last sequence whose first query row is <= row.
    var lo = 0u;
    var hi = p.n_seqs - 1u;
    while (lo < hi) {
        let mid = (lo + hi + 1u) / 2u;
        if (seqs[4u * mid] <= row) {
            lo = mid;
        } else {
            hi = mid - 1u;
        }
    }
    let q_len = seqs[4u * lo + 1u];
    let kv_start = seqs[4u * lo + 2u];
    let kv_len = seqs[4u * lo + 3u];
    let i = row - seqs[4u * lo];
    var first = 0u;
    var visible = kv_len;
    if (p.causal != 0u) {
        visible = min(kv_len, max(kv_len + i + 1u, q_len) - q_len);
    }
    if (p.window > 0u) {
        // Bidirectional sliding window: keys within window / 2 of the query.
        let r = p.window / 2u;
        first = select(0u, i - r, i > r);
        visible = min(visible, i + r + 1u);
    }

    var qv: array<f32, MAX_HEAD_DIM>;
    var acc: array<f32, MAX_HEAD_DIM>;
    let q_base = row * p.q_stride + p.q_col + h * HEAD_DIM;
    for (var d = 0u; d < HEAD_DIM; d++) {
        qv[d] = q[q_base + d] * p.scale;
        acc[d] = 0.0;
    }
    var m = 0.0;
    var l = 0.0;
    for (var j = first; j < visible; j++) {
        let kr = (kv_start + j) * p.k_stride + p.k_col + g * HEAD_DIM;
        var s = 0.0;
        for (var d = 0u; d < HEAD_DIM; d++) {
            s = fma(qv[d], k[kr + d], s);
        }
        if (j == first || s > m) {
            // New maximum: rescale what was summed so far (nothing for the first key).
            let alpha = select(exp(m - s), 0.0, j == first);
            l *= alpha;
            for (var d = 0u; d < HEAD_DIM; d++) {
                acc[d] *= alpha;
            }
            m = s;
        }
        let pj = exp(s - m);
        l += pj;
        let vr = (kv_start + j) * p.v_stride + p.v_col + g * HEAD_DIM;
        for (var d = 0u; d < HEAD_DIM; d++) {
            acc[d] = fma(pj, v[vr + d], acc[d]);
        }
    }
    let inv = select(0.0, 1.0 / l, visible > first);
    let out_base = (row * p.heads + h) * HEAD_DIM;
    for (var d = 0u; d < HEAD_DIM; d++) {
        out[out_base + d] = acc[d] * inv;
    }
}
