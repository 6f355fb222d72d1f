// gemv: one weight chunk (any format of quant_formats.wgsl, dequantised here)
// times activation vectors, for decode. The epilogue is chosen by defines,
// one kernel per combination (gpu::llm_ops):
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
//
// One order of summation, whatever the number of columns (batch
// invariance): every dot product is summed exactly as follows, so the
// single kernel and the many-column kernel (COLS), though laid out
// differently, give the same bits, and a sequence decoded in a batch gets
// the tokens it gets alone.
//   - k is cut into LANES contiguous lanes of `span` elements (a multiple of
//     8; the last lane may be shorter, the last unit of 8 is zero-padded);
//   - a lane's sum is one fma chain from 0 over its elements in order;
//   - lane sums are added in order, from 0, in groups of 8 lanes; the group
//     sums are added in order, from 0.
//   - NORM's sum of squares: each unit of 8 is an fma chain from 0, units
//     are added in order within their lane, lanes and groups as above.
// Every product that meets a sum is an explicit fma(), so no compiler can
// contract one kernel differently from the other.
//
// bindings: 0 params, 1 w: array<u32> (chunk), 2 x: array<f32> (k from x_off),
//           NORM: 3 nw (k); CONV: 4 conv [hidden, L], 5 state [ring, hidden],
//           6 step: array<u32> [token, pos, ...];
//           last: y (read_write)
// dispatch (single): ceil(rows / R) workgroups (gpu::ops::groups_1d over x
//           and y); each of the R rows takes LANES threads, one a lane.
// COLS (the gemv_cols_* kernels, batched decode): the same products for
//   p.cols activation columns, x column j at x_off + j x_stride, y column j at
//   j y_stride (+ out_off). A tile of BR rows (of every part) x BC columns a
//   workgroup; each k-step dequantises a BK-wide slice of the weight tile
//   into workgroup memory once for all the columns, and each thread keeps
//   its 4 rows x 2 columns' lane, group and total sums in registers. CONV
//   reads column j's position and its state's first ring row from a row
//   record, step[8 j + 1] and step[8 j + 5] (models::llm_gpu::batch).
// dispatch (COLS): (ceil(cols / BC), then the row tiles over y and z).

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

// Lanes a row's k is cut into, and lanes a group.
const LANES: u32 = 64u;
const GROUP: u32 = 8u;

#if CONV
const PARTS: u32 = 3u;
#else
#if SWIGLU
const PARTS: u32 = 2u;
#else
const PARTS: u32 = 1u;
#endif
#endif

// Elements of one lane: a multiple of 8, LANES of them cover k.
fn lane_span() -> u32 {
    let units = (p.k + 7u) / 8u;
    return 8u * ((units + LANES - 1u) / LANES);
}

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

// The unit's sum of squares: an fma chain from 0.
fn sq8(v: W8) -> f32 {
    var s = fma(v.a.x, v.a.x, 0.0);
    s = fma(v.a.y, v.a.y, s);
    s = fma(v.a.z, v.a.z, s);
    s = fma(v.a.w, v.a.w, s);
    s = fma(v.b.x, v.b.x, s);
    s = fma(v.b.y, v.b.y, s);
    s = fma(v.b.z, v.b.z, s);
    return fma(v.b.w, v.b.w, s);
}

// The activations times the norm weights (the same products in both layouts).
fn scaled8(v: W8, e0: u32) -> W8 {
    let g = norm8(e0);
    return W8(v.a * g.a, v.b * g.b);
}

fn norm_scale(ss: f32) -> f32 {
    return inverseSqrt(ss / f32(p.k) + p.eps);
}
#endif

// acc + the unit's eight products, in order.
fn fma8(wv: W8, xv: W8, acc: f32) -> f32 {
    var a = fma(wv.a.x, xv.a.x, acc);
    a = fma(wv.a.y, xv.a.y, a);
    a = fma(wv.a.z, xv.a.z, a);
    a = fma(wv.a.w, xv.a.w, a);
    a = fma(wv.b.x, xv.b.x, a);
    a = fma(wv.b.y, xv.b.y, a);
    a = fma(wv.b.z, xv.b.z, a);
    return fma(wv.b.w, xv.b.w, a);
}

#if SWIGLU
// The gate's activation: silu (SwiGLU) or, with GELU, tanh-approximated
// GELU (GeGLU, Gemma).
fn gate_act(v: f32) -> f32 {
#if GELU
    // tanh through exp of a non-positive argument: no overflow at large |v|.
    let u = 0.7978845608028654 * fma(0.044715 * v * v, v, v);
    let e = exp(-2.0 * abs(u));
    let th = (1.0 - e) / (1.0 + e);
    return 0.5 * v * (1.0 + select(th, -th, u < 0.0));
#else
    return v / (1.0 + exp(-v));
#endif
}
#endif

// Output element of row `row` (of the chunk) in column `col` from its
// parts' sums v0..v2 and the column's sum of squares; CONV reads the
// column's position and first ring row.
fn finish(row: u32, col: u32, v0_in: f32, v1_in: f32, v2_in: f32, ss: f32, pos: u32, base: u32) {
    var v0 = v0_in;
    var v1 = v1_in;
    var v2 = v2_in;
#if NORM
    let scale = norm_scale(ss);
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
    let bx = v0 * v2;
    var a = 0.0;
    let ring = p.ring;
    for (var j = 0u; j + 1u < l; j++) {
        // Position pos - (l - 1) + j, congruent to pos + ring - (l - 1) + j.
        a = fma(conv[ch * l + j], state[(base + (pos + ring + 1u + j - l) % ring) * p.hidden + ch], a);
    }
    a = fma(conv[ch * l + l - 1u], bx, a);
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

#if COLS
// Weight rows (of each part) and columns a workgroup, and k per step.
const BR: u32 = 64u;
const BC: u32 = 32u;
const BK: u32 = 16u;

// [part][kk][BR / 4] row quads of the dequantised weight slice.
var<workgroup> ws: array<vec4<f32>, 768>; // PARTS (<= 3) * BK * BR / 4
// [kk][BC / 2] column pairs of the (NORM: scaled) activation slice.
var<workgroup> xs: array<vec2<f32>, 256>; // BK * BC / 2
#if NORM
// [col][unit]: each column's unit sums of squares of the slice.
var<workgroup> uss: array<f32, 64>; // BC * BK / 8
// Each column's 1 / rms at the end.
var<workgroup> cscale: array<f32, 32>; // BC
#endif

// Whether the unit at e0 ends its lane, and its lane's group.
fn lane_ends(e0: u32, span: u32) -> bool {
    return (e0 + 8u) % span == 0u || e0 + 8u >= p.k;
}
fn group_ends(e0: u32, span: u32) -> bool {
    return ((e0 / span) % GROUP) == GROUP - 1u || e0 + 8u >= p.k;
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let row0 = (wid.z * nwg.y + wid.y) * BR;
    let col0 = wid.x * BC;
    let last_col = p.cols - 1u;
    let last_row = p.rows - 1u;
    let span = lane_span();
    // This thread's outputs: rows row0 + 4 tr .. + 3, columns col0 + 2 tc, + 1.
    let tr = lid & 15u;
    let tc = lid >> 4u;
    // Sums per part and column: lane, group, total (vec4: the 4 rows).
    var l00 = vec4<f32>(); var g00 = vec4<f32>(); var t00 = vec4<f32>();
    var l01 = vec4<f32>(); var g01 = vec4<f32>(); var t01 = vec4<f32>();
    var l10 = vec4<f32>(); var g10 = vec4<f32>(); var t10 = vec4<f32>();
    var l11 = vec4<f32>(); var g11 = vec4<f32>(); var t11 = vec4<f32>();
    var l20 = vec4<f32>(); var g20 = vec4<f32>(); var t20 = vec4<f32>();
    var l21 = vec4<f32>(); var g21 = vec4<f32>(); var t21 = vec4<f32>();
#if NORM
    // Threads lid < BC: column lid's sums of squares.
    var sl = 0.0;
    var sg = 0.0;
    var st = 0.0;
#endif
    for (var k0 = 0u; k0 < p.k; k0 += BK) {
        // The weight slice: unit q of (part, row, unit of the step), two
        // threads a row side by side.
        for (var q = lid; q < PARTS * BR * 2u; q += 256u) {
            let part = q / (BR * 2u);
            let r = (q >> 1u) % BR;
            let u = q & 1u;
            let e0 = k0 + u * 8u;
            var wv = W8(vec4<f32>(), vec4<f32>());
            if (e0 < p.k) {
                wv = w8(part * p.rows + min(row0 + r, last_row), e0, p.k, p.d_off);
            }
            let at = (part * BK + u * 8u) * (BR / 4u) + r / 4u;
            let lane = r & 3u;
            ws[at][lane] = wv.a.x;
            ws[at + (BR / 4u)][lane] = wv.a.y;
            ws[at + 2u * (BR / 4u)][lane] = wv.a.z;
            ws[at + 3u * (BR / 4u)][lane] = wv.a.w;
            ws[at + 4u * (BR / 4u)][lane] = wv.b.x;
            ws[at + 5u * (BR / 4u)][lane] = wv.b.y;
            ws[at + 6u * (BR / 4u)][lane] = wv.b.z;
            ws[at + 7u * (BR / 4u)][lane] = wv.b.w;
        }
        // The activation slice: one unit of one column each.
        if (lid < BC * 2u) {
            let c = lid >> 1u;
            let u = lid & 1u;
            let e0 = k0 + u * 8u;
            var xv = W8(vec4<f32>(), vec4<f32>());
            if (e0 < p.k) {
                xv = load8(p.x_off + min(col0 + c, last_col) * p.x_stride, e0);
#if NORM
                uss[c * 2u + u] = sq8(xv);
                xv = scaled8(xv, e0);
#endif
            }
            let at = u * 8u * (BC / 2u) + c / 2u;
            let h = c & 1u;
            xs[at][h] = xv.a.x;
            xs[at + (BC / 2u)][h] = xv.a.y;
            xs[at + 2u * (BC / 2u)][h] = xv.a.z;
            xs[at + 3u * (BC / 2u)][h] = xv.a.w;
            xs[at + 4u * (BC / 2u)][h] = xv.b.x;
            xs[at + 5u * (BC / 2u)][h] = xv.b.y;
            xs[at + 6u * (BC / 2u)][h] = xv.b.z;
            xs[at + 7u * (BC / 2u)][h] = xv.b.w;
        }
        workgroupBarrier();
#if NORM
        if (lid < BC) {
            for (var u = 0u; u < 2u; u++) {
                let e0 = k0 + u * 8u;
                if (e0 < p.k) {
                    sl += uss[lid * 2u + u];
                    if (lane_ends(e0, span)) {
                        sg += sl;
                        sl = 0.0;
                        if (group_ends(e0, span)) {
                            st += sg;
                            sg = 0.0;
                        }
                    }
                }
            }
        }
#endif
        for (var u = 0u; u < 2u; u++) {
            let e0 = k0 + u * 8u;
            if (e0 >= p.k) {
                break;
            }
            for (var i = 0u; i < 8u; i++) {
                let kk = u * 8u + i;
                let xv = xs[kk * (BC / 2u) + tc];
                let x0 = vec4<f32>(xv.x);
                let x1 = vec4<f32>(xv.y);
                let w0 = ws[kk * (BR / 4u) + tr];
                l00 = fma(w0, x0, l00);
                l01 = fma(w0, x1, l01);
                if (PARTS > 1u) {
                    let w1 = ws[(BK + kk) * (BR / 4u) + tr];
                    l10 = fma(w1, x0, l10);
                    l11 = fma(w1, x1, l11);
                }
                if (PARTS > 2u) {
                    let w2 = ws[(2u * BK + kk) * (BR / 4u) + tr];
                    l20 = fma(w2, x0, l20);
                    l21 = fma(w2, x1, l21);
                }
            }
            if (lane_ends(e0, span)) {
                g00 += l00; l00 = vec4<f32>();
                g01 += l01; l01 = vec4<f32>();
                g10 += l10; l10 = vec4<f32>();
                g11 += l11; l11 = vec4<f32>();
                g20 += l20; l20 = vec4<f32>();
                g21 += l21; l21 = vec4<f32>();
                if (group_ends(e0, span)) {
                    t00 += g00; g00 = vec4<f32>();
                    t01 += g01; g01 = vec4<f32>();
                    t10 += g10; g10 = vec4<f32>();
                    t11 += g11; g11 = vec4<f32>();
                    t20 += g20; g20 = vec4<f32>();
                    t21 += g21; g21 = vec4<f32>();
                }
            }
        }
        workgroupBarrier();
    }
#if NORM
    if (lid < BC) {
        cscale[lid] = st;
    }
    workgroupBarrier();
#endif
    for (var j = 0u; j < 2u; j++) {
        let col = col0 + 2u * tc + j;
        if (col > last_col) {
            break;
        }
        var ss = 0.0;
#if NORM
        ss = cscale[2u * tc + j];
#endif
        var pos = 0u;
        var base = 0u;
#if CONV
        pos = step[8u * col + 1u];
        base = step[8u * col + 5u];
#endif
        let a0 = select(t00, t01, j == 1u);
        let a1 = select(t10, t11, j == 1u);
        let a2 = select(t20, t21, j == 1u);
        for (var i = 0u; i < 4u; i++) {
            let row = row0 + 4u * tr + i;
            if (row < p.rows) {
                finish(row, col, a0[i], a1[i], a2[i], ss, pos, base);
            }
        }
    }
}
#else
// Output rows per workgroup.
const R: u32 = 4u;

// Lane sums [part][row][lane] (NORM: sums of squares after them), then
// group sums [part][row][group] (and of squares).
var<workgroup> lsum: array<f32, 832>; // (PARTS <= 3) * R * LANES + LANES
var<workgroup> gsum: array<f32, 104>; // (PARTS <= 3) * R * (LANES / GROUP) + LANES / GROUP

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let first = (wid.y * nwg.x + wid.x) * R;
    let r = lid / LANES;
    let lane = lid % LANES;
    // Rows past the end repeat the last one; their sums are dropped.
    let row = min(first + r, p.rows - 1u);
    let span = lane_span();
    let units = (p.k + 7u) / 8u;
    let lanes = (units * 8u + span - 1u) / span;
    let groups = (lanes + GROUP - 1u) / GROUP;
    var a0 = 0.0;
    var a1 = 0.0;
    var a2 = 0.0;
    var ss = 0.0;
    let end = min((lane + 1u) * span, units * 8u);
    for (var e0 = lane * span; e0 < end; e0 += 8u) {
        var xv = load8(p.x_off, e0);
#if NORM
        ss += sq8(xv);
        xv = scaled8(xv, e0);
#endif
        a0 = fma8(w8(row, e0, p.k, p.d_off), xv, a0);
        if (PARTS > 1u) {
            a1 = fma8(w8(p.rows + row, e0, p.k, p.d_off), xv, a1);
        }
        if (PARTS > 2u) {
            a2 = fma8(w8(2u * p.rows + row, e0, p.k, p.d_off), xv, a2);
        }
    }
    lsum[r * LANES + lane] = a0;
    if (PARTS > 1u) {
        lsum[(R + r) * LANES + lane] = a1;
    }
    if (PARTS > 2u) {
        lsum[(2u * R + r) * LANES + lane] = a2;
    }
#if NORM
    if (r == 0u) {
        lsum[PARTS * R * LANES + lane] = ss;
    }
#endif
    workgroupBarrier();
    // Group sums: thread (set, g) for set = part * R + row (NORM: the last
    // set is the squares).
    var sets = PARTS * R;
#if NORM
    sets += 1u;
#endif
    if (lid < sets * GROUP) {
        let row_set = lid / GROUP;
        let g = lid % GROUP;
        if (g < groups) {
            var t = 0.0;
            for (var l = g * GROUP; l < min(g * GROUP + GROUP, lanes); l++) {
                t += lsum[row_set * LANES + l];
            }
            gsum[row_set * GROUP + g] = t;
        }
    }
    workgroupBarrier();
    if (lane != 0u || first + r >= p.rows) {
        return;
    }
    var v = vec3<f32>();
    for (var part = 0u; part < PARTS; part++) {
        var t = 0.0;
        for (var g = 0u; g < groups; g++) {
            t += gsum[(part * R + r) * GROUP + g];
        }
        v[part] = t;
    }
    var sq = 0.0;
#if NORM
    for (var g = 0u; g < groups; g++) {
        sq += gsum[PARTS * R * GROUP + g];
    }
#endif
    var pos = 0u;
#if CONV
    pos = step[1];
#endif
    finish(first + r, 0u, v.x, v.y, v.z, sq, pos, 0u);
}
#endif
