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

const ROWS: u32 = 8u;
const COLS: u32 = 8u;
const LANES: u32 = 32u;

// part[(row * COLS + column) * LANES + lane]
var<workgroup> part: array<f32, 2048>;

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
            store(row, out_col, v);
        }
    }
}
