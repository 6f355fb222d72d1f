// qk_rope: prepares the new tokens' queries, keys and values for attention.
// qkv holds each token's projections side by side ([n, q | k | v]). One
// workgroup per (head, token): a query head goes to q_out, a key head to the
// key cache and its value head to the value cache, at cache row pos0 + t
// (pos0 = step[1]). BIAS first adds the projections' biases (Qwen2: laid out
// as a qkv row); QK_NORM applies the per-head RMSNorm (LFM2, Qwen3,
// Gemma-3); then RoPE rotates the first 2 half dimensions in pairs (i, i + half)
// or, when interleaved, (2i, 2i + 1), by the angles in cs ([n, half, 2]
// cos/sin, computed in f64 on the host: cpu::rope_table).
// bindings: 0 params, 1 qkv: [n, qkv_stride], 2 prep: [q norm weights (hd) |
//           k norm weights (hd) | bias (qkv_stride)], the parts the defines
//           use, in that order (gpu::llm_ops::HeadConsts), 3 cs: [n, half, 2],
//           4 step: array<u32> [token, pos0, kv_len, splits],
//           5 q_out: [n, heads * hd], 6 kc, 7 vc: [positions, kv_heads * hd]
//           (q_out, kc, vc read_write)
// dispatch: (heads + kv_heads, n, 1) workgroups of 64 threads; hd <= 512
// ROWS (qk_rope_rows, batched decode): token t is one row of a batch, its
//   own sequence's: step holds a row record per token ([8 t ..], see
//   gpu::llm_ops::ROW_RECORD) and its key and value go to the cache row of
//   its position step[8 t + 1] in its sequence's block table, which starts
//   at step[step[8 t + 4]] (paged_cache.wgsl).

struct Params {
    heads: u32,
    kv_heads: u32,
    hd: u32,
    half: u32,
    interleaved: u32,
    n: u32,
    eps: f32,
    qkv_stride: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> qkv: array<f32>;
@group(0) @binding(2) var<storage, read> prep: array<f32>;
@group(0) @binding(3) var<storage, read> cs: array<f32>;
@group(0) @binding(4) var<storage, read> step: array<u32>;
@group(0) @binding(5) var<storage, read_write> q_out: array<f32>;
@group(0) @binding(6) var<storage, read_write> kc: array<f32>;
@group(0) @binding(7) var<storage, read_write> vc: array<f32>;

// Where the bias starts in prep, in head widths (after the norm weights).
#if QK_NORM
const BIAS_AT: u32 = 2u;
#else
const BIAS_AT: u32 = 0u;
#endif

var<workgroup> head: array<f32, 512>;
var<workgroup> red: array<f32, 64>;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let hi = wid.x;
    let t = wid.y;
    let hd = p.hd;
    let is_q = hi < p.heads;
    let kvw = p.kv_heads * hd;
    let kh = hi - select(p.heads, 0u, is_q);
    let src = t * p.qkv_stride + select(p.heads * hd + kh * hd, hi * hd, is_q);
    // Where this head's values sit in a qkv row (its bias too).
    let col = src - t * p.qkv_stride;
    var ss = 0.0;
    for (var d = lid; d < hd; d += 64u) {
        var v = qkv[src + d];
#if BIAS
        v += prep[BIAS_AT * hd + col + d];
#endif
        head[d] = v;
        ss += v * v;
    }
#if QK_NORM
    red[lid] = ss;
    workgroupBarrier();
    for (var s = 32u; s > 0u; s >>= 1u) {
        if (lid < s) {
            red[lid] += red[lid + s];
        }
        workgroupBarrier();
    }
    let scale = 1.0 / sqrt(red[0] / f32(hd) + p.eps);
    for (var d = lid; d < hd; d += 64u) {
        let g = select(prep[hd + d], prep[d], is_q);
        head[d] = g * (head[d] * scale);
    }
#endif
    workgroupBarrier();
    for (var i = lid; i < p.half; i += 64u) {
        let c = cs[(t * p.half + i) * 2u];
        let s = cs[(t * p.half + i) * 2u + 1u];
        var a = i;
        var b = i + p.half;
        if (p.interleaved != 0u) {
            a = 2u * i;
            b = 2u * i + 1u;
        }
        let x0 = head[a];
        let x1 = head[b];
        head[a] = x0 * c - x1 * s;
        head[b] = x0 * s + x1 * c;
    }
    workgroupBarrier();
    if (is_q) {
        for (var d = lid; d < hd; d += 64u) {
            q_out[(t * p.heads + hi) * hd + d] = head[d];
        }
    } else {
#if ROWS
        let dst = cache_row(step[8u * t + 4u], step[8u * t + 1u]) * kvw + kh * hd;
#else
        let dst = (step[1] + t) * kvw + kh * hd;
#endif
        for (var d = lid; d < hd; d += 64u) {
            kc[dst + d] = head[d];
#if BIAS
            vc[dst + d] = qkv[src + kvw + d] + prep[BIAS_AT * hd + col + kvw + d];
#else
            vc[dst + d] = qkv[src + kvw + d];
#endif
        }
    }
}
