// gemv: one weight chunk (any format of quant_formats.wgsl, dequantised here)
// times one activation vector, for decode. Several output rows per workgroup
// share each activation load; the epilogue is chosen by defines, one kernel
// per combination (gpu::llm_ops):
//   gemv         y[out_off + o] = W[o] . x
//   gemv_add     ADD:           y[out_off + o] += W[o] . x   (residual add)
//   gemv_norm    NORM:          y[out_off + o] = W[o] . n,  n = rms_norm(x) * nw
//   gemv_swiglu  NORM + SWIGLU: y[out_off + o] = silu(W[o] . n) * (W[rows + o] . n)
//   gemv_conv    NORM + CONV:   LFM2's short-conv block for channel c = out_off + o:
//                B, C, X = rows o, rows + o, 2 rows + o of W times n; bx = B X;
//                y[c] = C * (sum_j<L-1 conv[c, j] state[j, c] + conv[c, L-1] bx),
//                and the state [L-1, hidden] shifts by one with bx appended.
// The norm is folded in: sum_i W[o, i] x[i] nw[i] is accumulated alongside
// sum_i x[i]^2, and the result scaled by 1 / sqrt(mean + eps) at the end.
// bindings: 0 params, 1 w: array<u32> (chunk), 2 x: array<f32> (k from x_off),
//           NORM: 3 nw (k); CONV: 4 conv [hidden, L], 5 state [L-1, hidden];
//           last: y (read_write)
// dispatch: ceil(rows / R) workgroups of WG (<= 128, a power of two)
//           threads, spread over x and y (gpu::ops::groups_1d)
// variants: SUBGROUPS reduces with subgroupAdd, otherwise a shared-memory tree.

struct Params {
    k: u32,
    rows: u32,      // output rows in this chunk (per part)
    out_off: u32,   // first output element
    x_off: u32,     // first element of x
    d_off: u32,     // word offset of the scale tail (quant_formats.wgsl)
    eps: f32,
    conv_l: u32,    // CONV: taps
    hidden: u32,    // CONV: channels (the state's row length)
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> w: array<u32>;
@group(0) @binding(2) var<storage, read> x: array<f32>;
#if NORM
@group(0) @binding(3) var<storage, read> nw: array<f32>;
#if CONV
@group(0) @binding(4) var<storage, read> conv: array<f32>;
@group(0) @binding(5) var<storage, read_write> state: array<f32>;
@group(0) @binding(6) var<storage, read_write> y: array<f32>;
#else
@group(0) @binding(4) var<storage, read_write> y: array<f32>;
#endif
#else
@group(0) @binding(3) var<storage, read_write> y: array<f32>;
#endif

// Output rows per workgroup.
const R: u32 = 4u;
#if SWIGLU
const PARTS: u32 = 2u;
#else
#if CONV
const PARTS: u32 = 3u;
#else
const PARTS: u32 = 1u;
#endif
#endif
const NACC: u32 = R * PARTS;
// Stride of one accumulator's partial sums in `red` (the largest WG).
const S: u32 = 128u;

override WG: u32 = 128u;

var<workgroup> red: array<f32, 1664>; // (3 * R + 1) * S

fn load8(off: u32, e0: u32) -> W8 {
    let b = off + e0;
    if (e0 + 8u <= p.k) {
        return W8(vec4<f32>(x[b], x[b + 1u], x[b + 2u], x[b + 3u]),
                  vec4<f32>(x[b + 4u], x[b + 5u], x[b + 6u], x[b + 7u]));
    }
    var v = array<f32, 8>();
    for (var i = 0u; i < 8u; i++) {
        if (e0 + i < p.k) {
            v[i] = x[b + i];
        }
    }
    return W8(vec4<f32>(v[0], v[1], v[2], v[3]), vec4<f32>(v[4], v[5], v[6], v[7]));
}

#if NORM
fn norm8(e0: u32) -> W8 {
    if (e0 + 8u <= p.k) {
        return W8(vec4<f32>(nw[e0], nw[e0 + 1u], nw[e0 + 2u], nw[e0 + 3u]),
                  vec4<f32>(nw[e0 + 4u], nw[e0 + 5u], nw[e0 + 6u], nw[e0 + 7u]));
    }
    var v = array<f32, 8>();
    for (var i = 0u; i < 8u; i++) {
        if (e0 + i < p.k) {
            v[i] = nw[e0 + i];
        }
    }
    return W8(vec4<f32>(v[0], v[1], v[2], v[3]), vec4<f32>(v[4], v[5], v[6], v[7]));
}
#endif

fn silu(v: f32) -> f32 {
    return v / (1.0 + exp(-v));
}

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32
#if SUBGROUPS
        , @builtin(subgroup_invocation_id) sid: u32, @builtin(subgroup_size) ssize: u32
#endif
) {
    let first = (wid.y * nwg.x + wid.x) * R;
    var acc: array<f32, NACC>;
    var ss = 0.0;
    let units = (p.k + 7u) / 8u;
    for (var u = lid; u < units; u += WG) {
        let e0 = u * 8u;
        var xv = load8(p.x_off, e0);
#if NORM
        ss += dot(xv.a, xv.a) + dot(xv.b, xv.b);
        let g = norm8(e0);
        xv = W8(xv.a * g.a, xv.b * g.b);
#endif
        for (var r = 0u; r < R; r++) {
            // Rows past the end repeat the last one; their sums are dropped.
            let row = min(first + r, p.rows - 1u);
            for (var q = 0u; q < PARTS; q++) {
                let wv = w8(q * p.rows + row, e0, p.k, p.d_off);
                acc[r * PARTS + q] += dot(wv.a, xv.a) + dot(wv.b, xv.b);
            }
        }
    }

    // Workgroup sums of the NACC accumulators and of ss, left in red[i * S].
#if SUBGROUPS
    let nsg = (WG + ssize - 1u) / ssize;
    let sg = lid / ssize;
    for (var i = 0u; i < NACC; i++) {
        let s = subgroupAdd(acc[i]);
        if (sid == 0u) {
            red[i * S + sg] = s;
        }
    }
    let s2 = subgroupAdd(ss);
    if (sid == 0u) {
        red[NACC * S + sg] = s2;
    }
    workgroupBarrier();
    if (lid <= NACC) {
        var t = 0.0;
        for (var s = 0u; s < nsg; s++) {
            t += red[lid * S + s];
        }
        red[lid * S] = t;
    }
    workgroupBarrier();
#else
    for (var i = 0u; i < NACC; i++) {
        red[i * S + lid] = acc[i];
    }
    red[NACC * S + lid] = ss;
    workgroupBarrier();
    for (var stride = WG / 2u; stride > 0u; stride >>= 1u) {
        if (lid < stride) {
            for (var i = 0u; i <= NACC; i++) {
                red[i * S + lid] += red[i * S + lid + stride];
            }
        }
        workgroupBarrier();
    }
#endif

    let row = first + lid;
    if (lid >= R || row >= p.rows) {
        return;
    }
    var v: array<f32, PARTS>;
    for (var q = 0u; q < PARTS; q++) {
        v[q] = red[(lid * PARTS + q) * S];
    }
#if NORM
    let scale = inverseSqrt(red[NACC * S] / f32(p.k) + p.eps);
    for (var q = 0u; q < PARTS; q++) {
        v[q] *= scale;
    }
#endif
    let o = p.out_off + row;
#if SWIGLU
    y[o] = silu(v[0]) * v[1];
#else
#if CONV
    let c = o;
    let l = p.conv_l;
    let bx = v[0] * v[2];
    var a = 0.0;
    for (var j = 0u; j + 1u < l; j++) {
        a += conv[c * l + j] * state[j * p.hidden + c];
    }
    a += conv[c * l + l - 1u] * bx;
    for (var j = 0u; j + 2u < l; j++) {
        state[j * p.hidden + c] = state[(j + 1u) * p.hidden + c];
    }
    if (l > 1u) {
        state[(l - 2u) * p.hidden + c] = bx;
    }
    y[o] = v[1] * a;
#else
#if ADD
    y[o] = y[o] + v[0];
#else
    y[o] = v[0];
#endif
#endif
#endif
}
