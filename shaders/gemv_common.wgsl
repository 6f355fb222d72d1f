// gemv_common: what the decode GEMVs (gemv.wgsl) and the sum of their
// k-split partials (gemv_sum.wgsl) share: the params, the one order of
// summation's lane layout, and the epilogue that turns a row's dot products
// into its output. The kernel file declares the bindings `finish` writes.
//
// One order of summation, whatever the number of columns (batch
// invariance): every dot product is summed exactly as follows, so the
// single kernel, the many-column kernel (COLS) and the many-column kernel
// split over k (COLS with p.split, then gemv_sum), though laid out
// differently, give the same bits, and a sequence decoded in a batch gets
// the tokens it gets alone.
//   - k is cut into units of 8 elements (the last one zero-padded); unit u
//     belongs to lane u % LANES, so a lane's units are LANES units apart
//     (the single kernel's threads read adjacent units: coalesced);
//   - a lane's sum is one fma chain from 0 over its units' elements, units
//     in order;
//   - lane sums are added in order, from 0, in groups of GROUP lanes; the
//     group sums are added in order, from 0.
//   - NORM's sum of squares: each unit of 8 is an fma chain from 0, units
//     are added in order within their lane, lanes and groups as above.
// The COLS kernel sums a few neighbouring lanes side by side, each in its
// own registers, and adds them to their group in order when they end.
// Every product that meets a sum is an explicit fma(), so no compiler can
// contract one kernel differently from another.

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
    split: u32,     // COLS: 0, or lane groups a workgroup (sums to `part`)
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}

@group(0) @binding(0) var<uniform> p: Params;

// Lanes a row's k is cut into, and lanes a group.
const LANES: u32 = 128u;
const GROUP: u32 = 8u;
// Most lane groups a row has.
const GROUPS: u32 = LANES / GROUP;

#if CONV
const PARTS: u32 = 3u;
#else
#if SWIGLU
const PARTS: u32 = 2u;
#else
const PARTS: u32 = 1u;
#endif
#endif

// Units of 8 in k; lanes that hold units, and their groups.
fn unit_count() -> u32 {
    return (p.k + 7u) / 8u;
}
fn lane_count() -> u32 {
    return min(unit_count(), LANES);
}
fn group_count() -> u32 {
    return (lane_count() + GROUP - 1u) / GROUP;
}

// Units of lane l: the first units % LANES lanes hold one more.
fn lane_len(l: u32) -> u32 {
    let units = unit_count();
    return units / LANES + select(0u, 1u, l < units % LANES);
}

// The k-split partials (`part`): per group, part and column the chunk's row
// sums, then per group and column the sum of squares.
fn part_at(g: u32, part: u32, col: u32, row: u32) -> u32 {
    return ((g * PARTS + part) * p.cols + col) * p.rows + row;
}
fn part_ss_at(g: u32, col: u32) -> u32 {
    return GROUPS * PARTS * p.cols * p.rows + g * p.cols + col;
}

#if CONV
// A batched conv column's position and first ring row, from its row record
// (models::llm_gpu::batch).
fn conv_place(col: u32) -> vec2<u32> {
    return vec2<u32>(step[8u * col + 1u], step[8u * col + 5u]);
}
#endif

#if NORM
fn norm_scale(ss: f32) -> f32 {
    return inverseSqrt(ss / f32(p.k) + p.eps);
}
#endif

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
