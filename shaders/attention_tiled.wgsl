// attention_tiled: non-causal multi-head attention of `rows` queries over
// `kv_rows` keys (Whisper's encoder: 1500 positions against themselves; its
// decoder's cross-attention: a few rows against the 1500 audio positions),
// flash-attention style.
//   out[r, h] = softmax_j(scale * q[r, h] . k[j, h]) v[j, h], j < kv_rows
// bindings: 0 params {rows, heads, q_stride, k_stride, v_stride, q_col, k_col,
//           v_col, scale, kv_rows}, 1 q, 2 k, 3 v: array<f32>, row-major, read from
//           column *_col with row stride *_stride (one fused QKV buffer may be
//           bound three times), 4 out: array<f32> (rows * heads * HEAD_DIM)
// dispatch: (ceil(rows / 16), heads, 1) workgroups of 64 threads. A workgroup
// holds 16 query rows of one head in workgroup memory and walks the keys in
// tiles of 16 rows of K and V staged there too: thread (r, c) = (tid / 4,
// tid % 4) scores its row against keys 4c .. 4c + 3 of the tile, then, with
// the tile's 16 scores of its row, updates a running max and sum (online
// softmax) and accumulates head dims c * HEAD_DIM / 4 .. of its output row.
// Global memory is read once per 16 query rows rather than once per row, and
// each thread keeps only HEAD_DIM / 4 accumulators.
// HEAD_DIM is an override constant: a multiple of 4, at most 64.

struct Params {
    rows: u32, heads: u32, q_stride: u32, k_stride: u32,
    v_stride: u32, q_col: u32, k_col: u32, v_col: u32,
    scale: f32, kv_rows: u32, _p1: u32, _p2: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> q: array<f32>;
@group(0) @binding(2) var<storage, read> k: array<f32>;
@group(0) @binding(3) var<storage, read> v: array<f32>;
@group(0) @binding(4) var<storage, read_write> out: array<f32>;

override HEAD_DIM: u32 = 64u;
const BQ: u32 = 16u;
const TK: u32 = 16u;
const MAX_HEAD_DIM: u32 = 64u;
// Below any score, and exp(LOWEST - finite) is 0.
const LOWEST: f32 = -3.0e38;

var<workgroup> qs: array<f32, 1024>; // BQ * MAX_HEAD_DIM
var<workgroup> ks: array<f32, 1024>; // TK * MAX_HEAD_DIM
var<workgroup> vs: array<f32, 1024>;
var<workgroup> ss: array<f32, 256>;  // BQ * TK

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
    let h = wid.y;
    let row0 = wid.x * BQ;
    let r = tid / 4u;
    let c = tid % 4u;
    let dq = HEAD_DIM / 4u;
    for (var i = tid; i < BQ * HEAD_DIM; i += 64u) {
        let qr = row0 + i / HEAD_DIM;
        var val = 0.0;
        if (qr < p.rows) {
            val = q[qr * p.q_stride + p.q_col + h * HEAD_DIM + i % HEAD_DIM] * p.scale;
        }
        qs[i] = val;
    }
    var acc: array<f32, 16>;
    for (var e = 0u; e < 16u; e++) {
        acc[e] = 0.0;
    }
    var m = LOWEST;
    var l = 0.0;
    for (var j0 = 0u; j0 < p.kv_rows; j0 += TK) {
        // The previous tile is used up (and the query block is stored).
        workgroupBarrier();
        for (var i = tid; i < TK * HEAD_DIM; i += 64u) {
            let j = j0 + i / HEAD_DIM;
            var kv = 0.0;
            var vv = 0.0;
            if (j < p.kv_rows) {
                kv = k[j * p.k_stride + p.k_col + h * HEAD_DIM + i % HEAD_DIM];
                vv = v[j * p.v_stride + p.v_col + h * HEAD_DIM + i % HEAD_DIM];
            }
            ks[i] = kv;
            vs[i] = vv;
        }
        workgroupBarrier();
        for (var t = 0u; t < 4u; t++) {
            let jj = c * 4u + t;
            var s = 0.0;
            for (var d = 0u; d < HEAD_DIM; d++) {
                s = fma(qs[r * HEAD_DIM + d], ks[jj * HEAD_DIM + d], s);
            }
            ss[r * TK + jj] = s;
        }
        workgroupBarrier();
        let n_keys = min(TK, p.kv_rows - j0);
        var tile_max = LOWEST;
        for (var jj = 0u; jj < n_keys; jj++) {
            tile_max = max(tile_max, ss[r * TK + jj]);
        }
        let m_new = max(m, tile_max);
        let alpha = exp(m - m_new);
        l *= alpha;
        for (var e = 0u; e < dq; e++) {
            acc[e] *= alpha;
        }
        for (var jj = 0u; jj < n_keys; jj++) {
            let pj = exp(ss[r * TK + jj] - m_new);
            l += pj;
            for (var e = 0u; e < dq; e++) {
                acc[e] = fma(pj, vs[jj * HEAD_DIM + c * dq + e], acc[e]);
            }
        }
        m = m_new;
    }
    let row = row0 + r;
    if (row < p.rows) {
        let inv = 1.0 / l;
        let base = (row * p.heads + h) * HEAD_DIM + c * dq;
        for (var e = 0u; e < dq; e++) {
            out[base + e] = acc[e] * inv;
        }
    }
}
