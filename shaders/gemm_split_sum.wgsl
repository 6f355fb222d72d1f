// gemm_split_sum: the end of a GEMM split over k (gemm.wgsl's SPLIT): adds
// each output's split sums from `part` in order, from 0, into y (the
// residual add of gemm_add).
//
// bindings: 0 params, 1 part [splits, n, cols], 2 y [n, y_stride] (read_write)
// dispatch: (ceil(cols / 64), n); a thread an output element.

struct Params {
    cols: u32,      // output columns (a matrix's rows)
    n: u32,
    splits: u32,
    y_stride: u32,
    out_off: u32,   // y's first column
    _p0: u32,
    _p1: u32,
    _p2: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> part: array<f32>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let col = gid.x;
    let tok = gid.y;
    if (col >= p.cols || tok >= p.n) {
        return;
    }
    var s = 0.0;
    for (var z = 0u; z < p.splits; z++) {
        s += part[(z * p.n + tok) * p.cols + col];
    }
    let at = tok * p.y_stride + p.out_off + col;
    y[at] = y[at] + s;
}
