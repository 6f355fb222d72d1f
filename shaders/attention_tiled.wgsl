// attention_tiled: non-causal multi-head attention over spans, each of
// q_len query rows from q_start against kv_len keys from kv_start
// (Whisper's encoder: one span, 1500 positions against themselves; its
// decoder's cross-attention: each sequence's few rows against its window's
// 1500 audio positions), flash-attention style.
//   out[r, h] = softmax_j(scale * q[r, h] . k[j, h]) v[j, h],
//   kv_start <= j < kv_start + kv_len of r's span
// bindings: 0 params {heads, q_stride, k_stride, v_stride, q_col, k_col,
//           v_col, scale, splits}, 1 q, 2 k, 3 v: array<f32>, row-major, read from
//           column *_col with row stride *_stride (one fused QKV buffer may be
//           bound three times), 4 seqs: array<u32> [spans, 4] {q_start, q_len,
//           kv_start, kv_len}, 5 out: array<f32> (rows * heads * HEAD_DIM)
// dispatch: (ceil(longest q_len / BQ), heads, spans * splits) workgroups of
// 64 threads; workgroup (x, h, s * splits + i) takes rows BQ x .. of span s
// (none past its q_len) against split i of its keys (all of them when
// splits is 1). The span is read through workgroupUniformLoad, so the loops
// that hold barriers run a count the whole workgroup agrees on.
// SPLIT (flash-decoding, for a few query rows over many keys: the keys in
// `splits` pieces of whole tiles, one workgroup each, instead of one
// workgroup walking all 94 tiles of 1500 keys): out is the partials
// [rows, heads, splits, HEAD_DIM + 2] (the unnormalised sums, then the
// running max and sum; an empty piece has max -3e38 and sum 0), which
// attention_tiled_merge.wgsl combines. A workgroup
// holds BQ query rows of one head in workgroup memory (16; SPLIT: 4, since a
// decode step has one or a few rows a span) and walks the keys in tiles of
// 16 rows of K and V staged there too: thread (r, c) = (tid / TPR,
// tid % TPR), TPR = 64 / BQ threads a row, scores its row against keys
// KPT c .. KPT c + KPT - 1 (KPT = 16 / TPR) of the tile, then, with the
// tile's 16 scores of its row, updates a running max and sum (online
// softmax) and accumulates head dims c, c + TPR, ... of its output row.
// Global memory is read once per BQ query rows rather than once per row,
// and each thread keeps at most 16 accumulators. Every score and sum is
// taken in the same order whatever BQ is.
// HEAD_DIM is an override constant: a multiple of 4, at most 64.

struct Params {
    heads: u32, q_stride: u32, k_stride: u32, v_stride: u32,
    q_col: u32, k_col: u32, v_col: u32, scale: f32,
    splits: u32, _p0: u32, _p1: u32, _p2: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> q: array<f32>;
@group(0) @binding(2) var<storage, read> k: array<f32>;
@group(0) @binding(3) var<storage, read> v: array<f32>;
@group(0) @binding(4) var<storage, read> seqs: array<u32>;
@group(0) @binding(5) var<storage, read_write> out: array<f32>;

override HEAD_DIM: u32 = 64u;
#if SPLIT
const BQ: u32 = 4u;
#else
const BQ: u32 = 16u;
#endif
const TK: u32 = 16u;
// Threads a query row, and keys each scores a tile.
const TPR: u32 = 64u / BQ;
const KPT: u32 = TK / TPR;
const MAX_HEAD_DIM: u32 = 64u;
// Below any score, and exp(LOWEST - finite) is 0.
const LOWEST: f32 = -3.0e38;

var<workgroup> qs: array<f32, 1024>; // BQ * MAX_HEAD_DIM
var<workgroup> ks: array<f32, 1024>; // TK * MAX_HEAD_DIM
var<workgroup> vs: array<f32, 1024>;
var<workgroup> ss: array<f32, 256>;  // BQ * TK
var<workgroup> span: vec4<u32>;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
    let h = wid.y;
    let split = wid.z % p.splits;
    if (tid == 0u) {
        let at = 4u * (wid.z / p.splits);
        span = vec4<u32>(seqs[at], seqs[at + 1u], seqs[at + 2u], seqs[at + 3u]);
    }
    let sp = workgroupUniformLoad(&span);
    let q_len = sp.y;
    let kv_start = sp.z;
    let kv_len = sp.w;
    let row0 = wid.x * BQ;
    if (row0 >= q_len) {
        return;
    }
    // This workgroup's keys: split `split` of whole tiles.
    let chunk = ((kv_len + p.splits - 1u) / p.splits + TK - 1u) / TK * TK;
    let j_begin = min(kv_len, split * chunk);
    let j_end = min(kv_len, j_begin + chunk);
    let r = tid / TPR;
    let c = tid % TPR;
    // Head dims c + TPR e, e < dq (a constant, so the sums stay in
    // registers); past HEAD_DIM (TPR not dividing it) a thread sums values
    // of the next key's row, inside the tile, and never writes them.
    let dq = (HEAD_DIM + TPR - 1u) / TPR;
    for (var i = tid; i < BQ * HEAD_DIM; i += 64u) {
        let qr = row0 + i / HEAD_DIM;
        var val = 0.0;
        if (qr < q_len) {
            val = q[(sp.x + qr) * p.q_stride + p.q_col + h * HEAD_DIM + i % HEAD_DIM] * p.scale;
        }
        qs[i] = val;
    }
    var acc: array<f32, 16>;
    for (var e = 0u; e < 16u; e++) {
        acc[e] = 0.0;
    }
    var m = LOWEST;
    var l = 0.0;
    for (var j0 = j_begin; j0 < j_end; j0 += TK) {
        // The previous tile is used up (and the query block is stored).
        workgroupBarrier();
        for (var i = tid; i < TK * HEAD_DIM; i += 64u) {
            let j = j0 + i / HEAD_DIM;
            var kv = 0.0;
            var vv = 0.0;
            if (j < j_end) {
                kv = k[(kv_start + j) * p.k_stride + p.k_col + h * HEAD_DIM + i % HEAD_DIM];
                vv = v[(kv_start + j) * p.v_stride + p.v_col + h * HEAD_DIM + i % HEAD_DIM];
            }
            ks[i] = kv;
            vs[i] = vv;
        }
        workgroupBarrier();
        for (var t = 0u; t < KPT; t++) {
            let jj = c * KPT + t;
            var s = 0.0;
            for (var d = 0u; d < HEAD_DIM; d++) {
                s = fma(qs[r * HEAD_DIM + d], ks[jj * HEAD_DIM + d], s);
            }
            ss[r * TK + jj] = s;
        }
        workgroupBarrier();
        let n_keys = min(TK, j_end - j0);
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
                acc[e] = fma(pj, vs[jj * HEAD_DIM + c + TPR * e], acc[e]);
            }
        }
        m = m_new;
    }
    let row = row0 + r;
    if (row < q_len) {
#if SPLIT
        let base = (((sp.x + row) * p.heads + h) * p.splits + split) * (HEAD_DIM + 2u);
        for (var e = 0u; e < dq; e++) {
            if (c + TPR * e < HEAD_DIM) {
                out[base + c + TPR * e] = acc[e];
            }
        }
        if (c == 0u) {
            out[base + HEAD_DIM] = m;
            out[base + HEAD_DIM + 1u] = l;
        }
#else
        let inv = 1.0 / l;
        let base = ((sp.x + row) * p.heads + h) * HEAD_DIM + c;
        for (var e = 0u; e < dq; e++) {
            if (c + TPR * e < HEAD_DIM) {
                out[base + TPR * e] = acc[e] * inv;
            }
        }
#endif
    }
}
