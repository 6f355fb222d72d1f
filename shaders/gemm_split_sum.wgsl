// gemm_split_sum: the end of a GEMM split over k (gemm.wgsl's SPLIT): adds
// each output's split sums from `part` in order, from 0, and finishes the
// GEMM's epilogue:
//   (default) ADD: y[t, out_off + o] += sum (the residual add of gemm_add)
//   NORM: y[t, out_off + o] = sum * s[t], s[t] = 1 / sqrt(ss[t] / k + eps)
//         from the splits' sums of squares, added in order too
//   NORM + SWIGLU (+ GELU): y[t, out_off + r] = act(gate * s[t]) * up * s[t]
//         (act: gate_act.wgsl)
//         for r < part_rows, gate from column r of `part`, up from column
//         part_rows + r
// (`part` holds a matrix's parts side by side, as y does).
// V4 (ADD and NORM, where cols, out_off and y_stride are multiples of 4): a
// thread four neighbouring outputs, read and written as vec4s (the same
// sums). SHADOW (with V4): ADD, and y's new values also into yh as f16 pairs
// (pack2x16float), for the GEMMs that read them so (gemm.wgsl's XH).
//
// bindings: 0 params, 1 part [splits, n, cols] (NORM: then [splits, n] sums
//           of squares), 2 y [n, y_stride] (read_write), SHADOW: 3 yh
//           [n, y_stride / 2] u32
// dispatch: (ceil(outputs / 64), n), outputs = cols (SWIGLU: part_rows;
// V4: cols / 4); a thread an output element (V4: four).

struct Params {
    cols: u32,        // columns of `part` (every part's rows side by side)
    n: u32,
    splits: u32,
    y_stride: u32,
    out_off: u32,     // y's column of part 0's first row
    part_rows: u32,   // SWIGLU: rows of the gate (and of the up) part
    k: u32,           // NORM
    eps: f32,         // NORM
    _p0: u32,
    _p1: u32,
    _p2: u32,
    _p3: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
#if V4
@group(0) @binding(1) var<storage, read> part: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read_write> y: array<vec4<f32>>;
#if SHADOW
@group(0) @binding(3) var<storage, read_write> yh: array<vec2<u32>>;
#endif

// Columns 4 c4 .. 4 c4 + 3's sums over the splits, in order.
fn split_sum(tok: u32, c4: u32) -> vec4<f32> {
    var s = vec4<f32>(0.0);
    for (var z = 0u; z < p.splits; z++) {
        s += part[(z * p.n + tok) * (p.cols / 4u) + c4];
    }
    return s;
}

// One f32 of `part` (the sums of squares after the sums).
fn part_at(i: u32) -> f32 {
    return part[i / 4u][i % 4u];
}
#else
@group(0) @binding(1) var<storage, read> part: array<f32>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;

// Column `col`'s sum over the splits, in order.
fn split_sum(tok: u32, col: u32) -> f32 {
    var s = 0.0;
    for (var z = 0u; z < p.splits; z++) {
        s += part[(z * p.n + tok) * p.cols + col];
    }
    return s;
}

fn part_at(i: u32) -> f32 {
    return part[i];
}
#endif

#if NORM
// The token's norm scale from the splits' sums of squares.
fn token_scale(tok: u32) -> f32 {
    let base = p.splits * p.n * p.cols;
    var t = 0.0;
    for (var z = 0u; z < p.splits; z++) {
        t += part_at(base + z * p.n + tok);
    }
    return inverseSqrt(t / f32(p.k) + p.eps);
}
#endif

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let o = gid.x;
    let tok = gid.y;
#if V4
    if (4u * o >= p.cols || tok >= p.n) {
        return;
    }
    let at = (tok * p.y_stride + p.out_off) / 4u + o;
#if NORM
    y[at] = split_sum(tok, o) * token_scale(tok);
#else
    let v = y[at] + split_sum(tok, o);
    y[at] = v;
#if SHADOW
    yh[at] = vec2<u32>(pack2x16float(v.xy), pack2x16float(v.zw));
#endif
#endif
#else
#if SWIGLU
    if (o >= p.part_rows || tok >= p.n) {
        return;
    }
    let s = token_scale(tok);
    let gate = split_sum(tok, o) * s;
    let up = split_sum(tok, p.part_rows + o) * s;
    y[tok * p.y_stride + p.out_off + o] = gate_act(gate) * up;
#else
    if (o >= p.cols || tok >= p.n) {
        return;
    }
    let at = tok * p.y_stride + p.out_off + o;
#if NORM
    y[at] = split_sum(tok, o) * token_scale(tok);
#else
    y[at] = y[at] + split_sum(tok, o);
#endif
#endif
#endif
}
