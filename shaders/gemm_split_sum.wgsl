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
//   SHADOW: ADD, and y's new values also into yh as f16 pairs
//         (pack2x16float), for the GEMMs that read them so (gemm.wgsl's XH);
//         a thread two neighbouring outputs (cols, out_off and y_stride even)
// (`part` holds a matrix's parts side by side, as y does).
//
// bindings: 0 params, 1 part [splits, n, cols] (NORM: then [splits, n] sums
//           of squares), 2 y [n, y_stride] (read_write), SHADOW: 3 yh
//           [n, y_stride / 2] u32
// dispatch: (ceil(outputs / 64), n), outputs = cols (SWIGLU: part_rows;
// SHADOW: cols / 2); a thread an output element (SHADOW: two).

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
@group(0) @binding(1) var<storage, read> part: array<f32>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
#if SHADOW
@group(0) @binding(3) var<storage, read_write> yh: array<u32>;
#endif

// Column `col`'s sum over the splits, in order.
fn split_sum(tok: u32, col: u32) -> f32 {
    var s = 0.0;
    for (var z = 0u; z < p.splits; z++) {
        s += part[(z * p.n + tok) * p.cols + col];
    }
    return s;
}

#if NORM
// The token's norm scale from the splits' sums of squares.
fn token_scale(tok: u32) -> f32 {
    let base = p.splits * p.n * p.cols;
    var t = 0.0;
    for (var z = 0u; z < p.splits; z++) {
        t += part[base + z * p.n + tok];
    }
    return inverseSqrt(t / f32(p.k) + p.eps);
}
#endif

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let tok = gid.y;
#if SHADOW
    let o = 2u * gid.x;
    if (o >= p.cols || tok >= p.n) {
        return;
    }
    let at = tok * p.y_stride + p.out_off + o;
    let v = vec2<f32>(y[at] + split_sum(tok, o), y[at + 1u] + split_sum(tok, o + 1u));
    y[at] = v.x;
    y[at + 1u] = v.y;
    yh[at / 2u] = pack2x16float(v);
#else
    let o = gid.x;
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
