// matmul_thin: matmul.wgsl's y[m, n] = act(x[m, k] . w[n, k]^T + bias[n])
// + residual[m, n] for a few rows (m <= 8: a decode step's sequences), as
// matrix-vector products. matmul's 64 x 64 tiles leave all but m of their
// rows idle and give a 384-column layer 6 workgroups; here every weight row
// is read once, by 32 neighbouring threads, for all m rows of x.
// bindings: as matmul.wgsl (0 params {m, n, k, has_bias, act, has_residual,
//           w_stride}, 1 x, 2 w, 3 bias, 4 residual, 5 y).
// dispatch: (ceil(n / 8), 1, 1) workgroups of 256 threads; workgroup g
// computes columns 8 g .. 8 g + 7 of every row: thread t takes column
// 8 g + t / 32 and k (f32) or k-pair words (W_F16) t % 32, t % 32 + 32, ...,
// one partial sum a row; the 32 partials of a (row, column) are then added
// in a fixed order, so a result does not depend on the scheduling.
// variants: W_F16 as matmul.wgsl.

struct Params {
    m: u32, n: u32, k: u32, has_bias: u32,
    act: u32, has_residual: u32, w_stride: u32, _p0: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
#if W_F16
@group(0) @binding(2) var<storage, read> w: array<u32>;
#else
@group(0) @binding(2) var<storage, read> w: array<f32>;
#endif
@group(0) @binding(3) var<storage, read> bias: array<f32>;
@group(0) @binding(4) var<storage, read> residual: array<f32>;
@group(0) @binding(5) var<storage, read_write> y: array<f32>;

const ROWS: u32 = 8u;
const COLS: u32 = 8u;
const LANES: u32 = 32u;

// part[(row * COLS + column) * LANES + lane]
var<workgroup> part: array<f32, 2048>;

fn activate(v: f32) -> f32 {
    switch p.act {
        case 1u: { return gelu_f32(v); }
        case 2u: { return gelu_tanh_f32(v); }
        case 3u: { return max(v, 0.0); }
        case 4u: { return v / (1.0 + exp(-v)); }
        default: { return v; }
    }
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) t: u32) {
    let c = t / LANES;
    let lane = t % LANES;
    let col = wid.x * COLS + c;
    // Constant-bound loops over the rows, so the sums stay in registers.
    var acc = array<f32, 8>(0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0);
    if (col < p.n) {
        let w_row = col * p.w_stride;
#if W_F16
        for (var i = lane; i < p.w_stride; i += LANES) {
            let pair = unpack2x16float(w[w_row + i]);
            let kk = 2u * i;
            // A row of odd length ends with a padding half (0): no x there.
            let second = kk + 1u < p.k;
            for (var r = 0u; r < ROWS; r++) {
                if (r < p.m) {
                    let at = r * p.k + kk;
                    var s = pair.x * x[at];
                    if (second) {
                        s = fma(pair.y, x[at + 1u], s);
                    }
                    acc[r] += s;
                }
            }
        }
#else
        for (var kk = lane; kk < p.k; kk += LANES) {
            let wv = w[w_row + kk];
            for (var r = 0u; r < ROWS; r++) {
                if (r < p.m) {
                    acc[r] = fma(wv, x[r * p.k + kk], acc[r]);
                }
            }
        }
#endif
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
            if (p.has_bias != 0u) {
                v += bias[out_col];
            }
            v = activate(v);
            if (p.has_residual != 0u) {
                v += residual[row * p.n + out_col];
            }
            y[row * p.n + out_col] = v;
        }
    }
}
