// gemv: one weight chunk (any format of quant_formats.wgsl, dequantised here)
// times one activation vector, for decode. Several output rows per workgroup
// share each activation load; the epilogue is chosen by defines, one kernel
// per combination (gpu::llm_ops):
//   gemv         y[out_off + o] = W[o] . x
//   gemv_add     ADD:           y[out_off + o] += W[o] . x   (residual add)
//   gemv_norm    NORM:          y[out_off + o] = W[o] . n,  n = rms_norm(x) * nw
//   gemv_swiglu  NORM + SWIGLU: y[out_off + o] = silu(W[o] . n) * (W[rows + o] . n)
//   gemv_geglu   NORM + SWIGLU + GELU: the same with gelu_tanh for silu
//   gemv_conv    NORM + CONV:   LFM2's short-conv block for channel c = out_off + o
//                at position pos = step[1]: B, C, X = rows o, rows + o, 2 rows + o
//                of W times n; bx = B X; y[c] = C * (sum_j<L-1 conv[c, j]
//                bx(pos - L + 1 + j) + conv[c, L-1] bx). The state is a ring of
//                `ring` rows [ring, hidden] (ring >= L): bx of position q in
//                row q % ring. L - 1 rows are read, bx(pos) is written over
//                the oldest; the spare rows let steps be undone by moving pos
//                back (models::llm::REWIND_DEPTH).
// The norm is folded in: sum_i W[o, i] x[i] nw[i] is accumulated alongside
// sum_i x[i]^2, and the result scaled by 1 / sqrt(mean + eps) at the end.
// bindings: 0 params, 1 w: array<u32> (chunk), 2 x: array<f32> (k from x_off),
//           NORM: 3 nw (k); CONV: 4 conv [hidden, L], 5 state [ring, hidden],
//           6 step: array<u32> [token, pos, ...];
//           last: y (read_write)
// dispatch: ceil(rows / R) workgroups of WG threads (a power of two: 256
//           with subgroups, 128 without)
//           threads, spread over x and y (gpu::ops::groups_1d)
// variants: SUBGROUPS reduces with subgroupAdd, otherwise a shared-memory tree.
// COLS (the gemv_cols_* kernels, batched decode): the same products for
//   p.cols activation columns, x column j at x_off + j x_stride, y column j at
//   j y_stride (+ out_off); each workgroup loads its weights once and applies
//   them to NB columns (wid.x: the column group, so the workgroups reading
//   the same weights run side by side and share them in cache), every column with exactly
//   the single kernel's per-thread sums and reduction, so column j equals
//   the single kernel on column j bit for bit. CONV reads column j's position
//   and its state's first ring row from a row record, step[8 j + 1] and
//   step[8 j + 5] (models::llm_gpu::batch).
// dispatch (COLS): (ceil(cols / NB), then the row groups over y and z).
// Accumulators are vec4s (one lane per row), not arrays: arrays indexed in
// loops may be left in memory by a driver's compiler.

struct Params {
    k: u32,
    rows: u32,      // output rows in this chunk (per part)
    out_off: u32,   // first output element
    x_off: u32,     // first element of x
    d_off: u32,     // word offset of the scale tail (quant_formats.wgsl)
    eps: f32,
    conv_l: u32,    // CONV: taps
    hidden: u32,    // CONV: channels (the state's row length)
    ring: u32,      // CONV: rows of the state
    cols: u32,      // COLS: activation columns
    x_stride: u32,  // COLS: floats between columns of x
    y_stride: u32,  // COLS: floats between columns of y
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> w: array<u32>;
@group(0) @binding(2) var<storage, read> x: array<f32>;
#if NORM
@group(0) @binding(3) var<storage, read> nw: array<f32>;
#if CONV
@group(0) @binding(4) var<storage, read> conv: array<f32>;
@group(0) @binding(5) var<storage, read_write> state: array<f32>;
@group(0) @binding(6) var<storage, read> step: array<u32>;
@group(0) @binding(7) var<storage, read_write> y: array<f32>;
#else
@group(0) @binding(4) var<storage, read_write> y: array<f32>;
#endif
#else
@group(0) @binding(3) var<storage, read_write> y: array<f32>;
#endif

// Output rows per workgroup: one lane of a vec4 accumulator each.
const R: u32 = 4u;

// 256 threads with subgroups measured fastest on an H200 (decode of
// LFM2-350M: 1.10 ms/token at 256, 1.16 at 64, 1.23 at 128, 1.95 at 32; f16
// weights by a wider margin); the shared-memory tree holds 128.
#if SUBGROUPS
override WG: u32 = 256u;
#else
override WG: u32 = 128u;
#endif

// Partial sums of the workgroup: per part a vec4 (R rows), then ss, one slot
// per subgroup (256 threads, at least 4 per subgroup) or per thread (no subgroups).
#if SUBGROUPS
const S: u32 = 64u;
#else
const S: u32 = 128u;
#endif
var<workgroup> red: array<vec4<f32>, 512>; // (3 parts + ss) * S

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

// The gate's activation: silu (SwiGLU) or, with GELU, tanh-approximated
// GELU (GeGLU, Gemma).
fn gate_act(v: f32) -> f32 {
#if GELU
    // tanh through exp of a non-positive argument: no overflow at large |v|.
    let u = 0.7978845608028654 * (v + 0.044715 * v * v * v);
    let e = exp(-2.0 * abs(u));
    let th = (1.0 - e) / (1.0 + e);
    return 0.5 * v * (1.0 + select(th, -th, u < 0.0));
#else
    return v / (1.0 + exp(-v));
#endif
}

// Workgroup sums of the parts' row sums a0..a2 and of ss, left in
// red[q * S] (q = 3: ss); every thread calls it (it has barriers).
#if SUBGROUPS
fn reduce_parts(a0: vec4<f32>, a1: vec4<f32>, a2: vec4<f32>, ss: f32, lid: u32, sid: u32,
                ssize: u32) {
    let nsg = (WG + ssize - 1u) / ssize;
    let sg = lid / ssize;
    let s0 = subgroupAdd(a0);
    let s1 = subgroupAdd(a1);
    let s2 = subgroupAdd(a2);
    let s3 = subgroupAdd(ss);
    if (sid == 0u) {
        red[sg] = s0;
        red[S + sg] = s1;
        red[2u * S + sg] = s2;
        red[3u * S + sg] = vec4<f32>(s3);
    }
    workgroupBarrier();
    if (lid < 4u) {
        var t = vec4<f32>();
        for (var s = 0u; s < nsg; s++) {
            t += red[lid * S + s];
        }
        red[lid * S] = t;
    }
    workgroupBarrier();
}
#else
fn reduce_parts(a0: vec4<f32>, a1: vec4<f32>, a2: vec4<f32>, ss: f32, lid: u32) {
    red[lid] = a0;
    red[S + lid] = a1;
    red[2u * S + lid] = a2;
    red[3u * S + lid] = vec4<f32>(ss);
    workgroupBarrier();
    for (var stride = WG / 2u; stride > 0u; stride >>= 1u) {
        if (lid < stride) {
            for (var q = 0u; q < 4u; q++) {
                red[q * S + lid] += red[q * S + lid + stride];
            }
        }
        workgroupBarrier();
    }
}
#endif

// Eight weights times eight activations.
fn dotw(wv: W8, xv: W8) -> f32 {
    return dot(wv.a, xv.a) + dot(wv.b, xv.b);
}

// Row r of the chunk's matrix times xv, elements e0..e0+7.
fn dot8(r: u32, e0: u32, xv: W8) -> f32 {
    return dotw(w8(r, e0, p.k, p.d_off), xv);
}

// Rows r0..r0+3 of part `base` (its first row) times xv. Rows past the end
// repeat the last one; their sums are dropped.
fn dot8x4(base: u32, r0: u32, e0: u32, xv: W8) -> vec4<f32> {
    let last = p.rows - 1u;
    return vec4<f32>(dot8(base + min(r0, last), e0, xv), dot8(base + min(r0 + 1u, last), e0, xv),
                     dot8(base + min(r0 + 2u, last), e0, xv), dot8(base + min(r0 + 3u, last), e0, xv));
}

#if COLS
// Activation columns per workgroup.
const NB: u32 = 4u;

// The four rows r0..r0+3 of part `base` at elements e0.., as dot8x4 reads them.
struct W8x4 { r0: W8, r1: W8, r2: W8, r3: W8 }

fn w8x4(base: u32, r0: u32, e0: u32) -> W8x4 {
    let last = p.rows - 1u;
    return W8x4(w8(base + min(r0, last), e0, p.k, p.d_off), w8(base + min(r0 + 1u, last), e0, p.k, p.d_off),
                w8(base + min(r0 + 2u, last), e0, p.k, p.d_off), w8(base + min(r0 + 3u, last), e0, p.k, p.d_off));
}

fn dotw4(wv: W8x4, xv: W8) -> vec4<f32> {
    return vec4<f32>(dotw(wv.r0, xv), dotw(wv.r1, xv), dotw(wv.r2, xv), dotw(wv.r3, xv));
}

// Column `col` (clamped to the last) of x at elements e0..e0+7.
fn col_x(col: u32, last_col: u32, e0: u32) -> W8 {
    return load8(p.x_off + min(col, last_col) * p.x_stride, e0);
}

fn sq8(v: W8) -> f32 {
    return dot(v.a, v.a) + dot(v.b, v.b);
}

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32
#if SUBGROUPS
        , @builtin(subgroup_invocation_id) sid: u32, @builtin(subgroup_size) ssize: u32
#endif
) {
    let first = (wid.z * nwg.y + wid.y) * R;
    let col0 = wid.x * NB;
    // Columns past the last repeat it; their results are dropped.
    let last_col = p.cols - 1u;
    // One vec4 per (part, column), named rather than an array indexed in a
    // loop, which NVIDIA's compiler kept in memory (the products then cost
    // as much per column as the single kernel's whole pass).
    var a0c0 = vec4<f32>();
    var a0c1 = vec4<f32>();
    var a0c2 = vec4<f32>();
    var a0c3 = vec4<f32>();
    var a1c0 = vec4<f32>();
    var a1c1 = vec4<f32>();
    var a1c2 = vec4<f32>();
    var a1c3 = vec4<f32>();
    var a2c0 = vec4<f32>();
    var a2c1 = vec4<f32>();
    var a2c2 = vec4<f32>();
    var a2c3 = vec4<f32>();
    var ss = vec4<f32>();
    let units = (p.k + 7u) / 8u;
    for (var u = lid; u < units; u += WG) {
        let e0 = u * 8u;
        let w0 = w8x4(0u, first, e0);
#if SWIGLU
        let w1 = w8x4(p.rows, first, e0);
#endif
#if CONV
        let w1 = w8x4(p.rows, first, e0);
        let w2 = w8x4(2u * p.rows, first, e0);
#endif
        let x0 = col_x(col0, last_col, e0);
        let x1 = col_x(col0 + 1u, last_col, e0);
        let x2 = col_x(col0 + 2u, last_col, e0);
        let x3 = col_x(col0 + 3u, last_col, e0);
#if NORM
        ss += vec4<f32>(sq8(x0), sq8(x1), sq8(x2), sq8(x3));
        let g = norm8(e0);
        let n0 = W8(x0.a * g.a, x0.b * g.b);
        let n1 = W8(x1.a * g.a, x1.b * g.b);
        let n2 = W8(x2.a * g.a, x2.b * g.b);
        let n3 = W8(x3.a * g.a, x3.b * g.b);
#else
        let n0 = x0;
        let n1 = x1;
        let n2 = x2;
        let n3 = x3;
#endif
        a0c0 += dotw4(w0, n0);
        a0c1 += dotw4(w0, n1);
        a0c2 += dotw4(w0, n2);
        a0c3 += dotw4(w0, n3);
#if SWIGLU
        a1c0 += dotw4(w1, n0);
        a1c1 += dotw4(w1, n1);
        a1c2 += dotw4(w1, n2);
        a1c3 += dotw4(w1, n3);
#endif
#if CONV
        a1c0 += dotw4(w1, n0);
        a1c1 += dotw4(w1, n1);
        a1c2 += dotw4(w1, n2);
        a1c3 += dotw4(w1, n3);
        a2c0 += dotw4(w2, n0);
        a2c1 += dotw4(w2, n1);
        a2c2 += dotw4(w2, n2);
        a2c3 += dotw4(w2, n3);
#endif
    }

    // Each column reduced in turn as the single kernel reduces its one;
    // threads lid < R keep their row's sums of every column.
    var o0 = vec4<f32>();
    var o1 = vec4<f32>();
    var o2 = vec4<f32>();
    var osq = vec4<f32>();
    for (var c = 0u; c < NB; c++) {
        var c0 = a0c0;
        var c1 = a1c0;
        var c2 = a2c0;
        if (c == 1u) {
            c0 = a0c1;
            c1 = a1c1;
            c2 = a2c1;
        } else if (c == 2u) {
            c0 = a0c2;
            c1 = a1c2;
            c2 = a2c2;
        } else if (c == 3u) {
            c0 = a0c3;
            c1 = a1c3;
            c2 = a2c3;
        }
#if SUBGROUPS
        reduce_parts(c0, c1, c2, ss[c], lid, sid, ssize);
#else
        reduce_parts(c0, c1, c2, ss[c], lid);
#endif
        if (lid < R) {
            o0[c] = red[0][lid];
            o1[c] = red[S][lid];
            o2[c] = red[2u * S][lid];
            osq[c] = red[3u * S].x;
        }
        workgroupBarrier();
    }

    let row = first + lid;
    if (lid >= R || row >= p.rows) {
        return;
    }
    for (var c = 0u; c < NB; c++) {
        let col = col0 + c;
        if (col > last_col) {
            break;
        }
        var v0 = o0[c];
        var v1 = o1[c];
        var v2 = o2[c];
#if NORM
        let scale = inverseSqrt(osq[c] / f32(p.k) + p.eps);
        v0 *= scale;
        v1 *= scale;
        v2 *= scale;
#endif
        let o = col * p.y_stride + p.out_off + row;
#if SWIGLU
        y[o] = gate_act(v0) * v1;
#else
#if CONV
        let ch = p.out_off + row;
        let l = p.conv_l;
        let pos = step[8u * col + 1u];
        let base = step[8u * col + 5u];
        let bx = v0 * v2;
        var a = 0.0;
        let ring = p.ring;
        for (var j = 0u; j + 1u < l; j++) {
            a += conv[ch * l + j] * state[(base + (pos + ring + 1u + j - l) % ring) * p.hidden + ch];
        }
        a += conv[ch * l + l - 1u] * bx;
        state[(base + pos % ring) * p.hidden + ch] = bx;
        y[o] = v1 * a;
#else
#if ADD
        y[o] = y[o] + v0;
#else
        y[o] = v0;
#endif
#endif
#endif
    }
}
#else
@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32
#if SUBGROUPS
        , @builtin(subgroup_invocation_id) sid: u32, @builtin(subgroup_size) ssize: u32
#endif
) {
    let first = (wid.y * nwg.x + wid.x) * R;
    // One vec4 per part: lane r is row first + r. No arrays, so everything
    // stays in registers.
    var a0 = vec4<f32>();
    var a1 = vec4<f32>();
    var a2 = vec4<f32>();
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
        a0 += dot8x4(0u, first, e0, xv);
#if SWIGLU
        a1 += dot8x4(p.rows, first, e0, xv);
#endif
#if CONV
        a1 += dot8x4(p.rows, first, e0, xv);
        a2 += dot8x4(2u * p.rows, first, e0, xv);
#endif
    }

    // Workgroup sums of a0..a2 and ss, left in red[q * S] (q = 3: ss).
#if SUBGROUPS
    reduce_parts(a0, a1, a2, ss, lid, sid, ssize);
#else
    reduce_parts(a0, a1, a2, ss, lid);
#endif

    let row = first + lid;
    if (lid >= R || row >= p.rows) {
        return;
    }
    var v0 = red[0][lid];
    var v1 = red[S][lid];
    var v2 = red[2u * S][lid];
#if NORM
    let scale = inverseSqrt(red[3u * S].x / f32(p.k) + p.eps);
    v0 *= scale;
    v1 *= scale;
    v2 *= scale;
#endif
    let o = p.out_off + row;
#if SWIGLU
    y[o] = gate_act(v0) * v1;
#else
#if CONV
    let c = o;
    let l = p.conv_l;
    let pos = step[1];
    let bx = v0 * v2;
    var a = 0.0;
    let ring = p.ring;
    for (var j = 0u; j + 1u < l; j++) {
        // Position pos - (l - 1) + j, congruent to pos + ring - (l - 1) + j.
        a += conv[c * l + j] * state[((pos + ring + 1u + j - l) % ring) * p.hidden + c];
    }
    a += conv[c * l + l - 1u] * bx;
    state[(pos % ring) * p.hidden + c] = bx;
    y[o] = v1 * a;
#else
#if ADD
    y[o] = y[o] + v0;
#else
    y[o] = v0;
#endif
#endif
#endif
}
#endif
