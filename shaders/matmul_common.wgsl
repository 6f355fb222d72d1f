// matmul_common: what matmul.wgsl (64 x 64 tiles) and matmul_thin.wgsl (a
// few rows as matrix-vector products) share: y[m, n] = act(x[m, k] .
// w[n, k]^T + bias[n]) + residual[m, n], the params, the bindings and the
// epilogue that turns a dot product into its output. Prepended to both
// (after erf.wgsl), not a kernel of its own.
// bindings: 0 params {m, n, k, has_bias, act, has_residual, w_stride},
//           1 x: array<f32> (m*k, row-major),
//           2 w: the weights, rows of w_stride elements (f32) or words (W_F16:
//             f16 packed two to a u32, low half first, each row padded to a
//             whole word),
//           3 bias: array<f32> (n; read only when has_bias),
//           4 residual: array<f32> (m*n; read only when has_residual),
//           5 y: array<f32> (m*n)
// act: 0 none, 1 GELU (erf), 2 GELU (tanh), 3 ReLU, 4 SiLU.

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

fn activate(v: f32) -> f32 {
    switch p.act {
        case 1u: { return gelu_f32(v); }
        case 2u: { return gelu_tanh_f32(v); }
        case 3u: { return max(v, 0.0); }
        case 4u: { return v / (1.0 + exp(-v)); }
        default: { return v; }
    }
}

// Writes y[row, col] from its dot product: bias, activation, residual.
fn store(row: u32, col: u32, dot: f32) {
    var v = dot;
    if (p.has_bias != 0u) {
        v += bias[col];
    }
    v = activate(v);
    if (p.has_residual != 0u) {
        v += residual[row * p.n + col];
    }
    y[row * p.n + col] = v;
}
