// matmul_thin: matmul_common.wgsl's y = act(x . w^T + bias) + residual for
// a few rows (m <= 8: a decode step's sequences), as matrix-vector products.
// matmul's 64 x 64 tiles leave all but m of their rows idle and give a
// 384-column layer 6 workgroups; here every weight row is read once, by 32
// neighbouring threads, for all m rows of x. Bindings and params:
// matmul_common.wgsl.
// dispatch: (ceil(n / 8), 1, 1) workgroups of 256 threads; workgroup g
// computes columns 8 g .. 8 g + 7 of every row: thread t takes column
// 8 g + t / 32 and k (f32) or k-pair words (W_F16) t % 32, t % 32 + 32, ...,
// one partial sum a row; the 32 partials of a (row, column) are then added
// in a fixed order, so a result does not depend on the scheduling.
// variants: W_F16 as matmul.wgsl.
// NORM (the kernel matmul_thin_norm): x goes through a LayerNorm first,
// (x - mean) / sqrt(var + eps) * gamma + beta per row, as
// layer_norm.wgsl computes it (two passes over the row), so a decoder's
// norm needs no dispatch of its own: warp r finds row r's mean and
// variance, every thread normalises the elements it reads.

const ROWS: u32 = 8u;
const COLS: u32 = 8u;
const LANES: u32 = 32u;

// part[(row * COLS + column) * LANES + lane]
var<workgroup> part: array<f32, 2048>;

#if NORM
// Each row's mean and 1 / sqrt(var + eps).
var<workgroup> stats: array<vec2<f32>, 8>;

// Sum over lanes of each warp's `v` (warp r: row r), to every thread of
// the warp, in a fixed order.
fn row_sum(t: u32, v: f32) -> f32 {
    part[t] = v;
    workgroupBarrier();
    let base = t / LANES * LANES;
    var s = 0.0;
    for (var l = 0u; l < LANES; l++) {
        s += part[base + l];
    }
    workgroupBarrier();
    return s;
}

// Row r's element kk normalised.
fn x_at(r: u32, kk: u32, g: f32, b: f32) -> f32 {
    let s = stats[r];
    return (x[r * p.k + kk] - s.x) * s.y * g + b;
}
#else
fn x_at(r: u32, kk: u32, g: f32, b: f32) -> f32 {
    return x[r * p.k + kk];
}
#endif

#if W_F16
// Adds weight word i of the column's row (two f16 halves, elements 2i and
// 2i + 1) times each row of x to the row's sum.
fn add_weight(acc: ptr<function, array<f32, 8>>, i: u32, word: u32) {
    let pair = unpack2x16float(word);
    let kk = 2u * i;
    // A row of odd length ends with a padding half (0): no x there.
    let second = kk + 1u < p.k;
    var g = vec2<f32>();
    var b = vec2<f32>();
#if NORM
    g.x = ln[kk];
    b.x = ln[p.k + kk];
    if (second) {
        g.y = ln[kk + 1u];
        b.y = ln[p.k + kk + 1u];
    }
#endif
    for (var r = 0u; r < ROWS; r++) {
        if (r < p.m) {
            var s = pair.x * x_at(r, kk, g.x, b.x);
            if (second) {
                s = fma(pair.y, x_at(r, kk + 1u, g.y, b.y), s);
            }
            (*acc)[r] += s;
        }
    }
}
#else
// Adds weight kk of the column's row times each row of x to the row's sum.
fn add_weight(acc: ptr<function, array<f32, 8>>, kk: u32, wv: f32) {
    var g = 0.0;
    var b = 0.0;
#if NORM
    g = ln[kk];
    b = ln[p.k + kk];
#endif
    for (var r = 0u; r < ROWS; r++) {
        if (r < p.m) {
            (*acc)[r] = fma(wv, x_at(r, kk, g, b), (*acc)[r]);
        }
    }
}
#endif

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) t: u32) {
    let c = t / LANES;
    let lane = t % LANES;
    let col = wid.x * COLS + c;
#if NORM
    {
        let r = t / LANES;
        var s = 0.0;
        if (r < p.m) {
            for (var kk = lane; kk < p.k; kk += LANES) {
                s += x[r * p.k + kk];
            }
        }
        let mean = row_sum(t, s) / f32(p.k);
        var q = 0.0;
        if (r < p.m) {
            for (var kk = lane; kk < p.k; kk += LANES) {
                let d = x[r * p.k + kk] - mean;
                q += d * d;
            }
        }
        let var_ = row_sum(t, q) / f32(p.k);
        if (lane == 0u) {
            stats[r] = vec2<f32>(mean, 1.0 / sqrt(var_ + p.eps));
        }
        workgroupBarrier();
    }
#endif
    // Constant-bound loops over the rows, so the sums stay in registers.
    var acc = array<f32, 8>(0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0);
    if (col < p.n) {
        let w_row = col * p.w_stride;
        // Four of a lane's weights are loaded before the first is used (four
        // loads in flight, not one); the sums take them in the same order.
        var i = lane;
        while (i + 3u * LANES < p.w_stride) {
            let w0 = w[w_row + i];
            let w1 = w[w_row + i + LANES];
            let w2 = w[w_row + i + 2u * LANES];
            let w3 = w[w_row + i + 3u * LANES];
            add_weight(&acc, i, w0);
            add_weight(&acc, i + LANES, w1);
            add_weight(&acc, i + 2u * LANES, w2);
            add_weight(&acc, i + 3u * LANES, w3);
            i += 4u * LANES;
        }
        while (i < p.w_stride) {
            add_weight(&acc, i, w[w_row + i]);
            i += LANES;
        }
    }
    for (var r = 0u; r < ROWS; r++) {
        part[(r * COLS + c) * LANES + lane] = acc[r];
    }
    workgroupBarrier();
    // Thread t < 64 finishes (row t / 8, column t % 8).
    if (t < ROWS * COLS) {
        let row = t / COLS;
        let out_col = wid.x * COLS + t % COLS;
        if (row < p.m && out_col < p.n) {
            let base = t * LANES;
            var v = 0.0;
            for (var l = 0u; l < LANES; l++) {
                v += part[base + l];
            }
            store(row, out_col, v);
        }
    }
}
