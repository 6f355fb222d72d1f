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
//           NORM (matmul_thin_norm): 6 ln: array<f32> (the norm's gamma, k,
//             then its beta, k), 7 cache: array<f32> (read_write),
//             8 seqs: array<u32> (spans of 4: q_start, q_len, kv_start,
//             kv_len)
// act: 0 none, 1 GELU (erf), 2 GELU (tanh), 3 ReLU, 4 SiLU.
// NORM: x is the input of a LayerNorm (eps), folded into the product; with
// n_seqs > 0, columns from cache_col on are also written to row
// kv_start + kv_len - q_len + (row - q_start) of `cache` (rows of
// n - cache_col), of the span that holds the row: a decoder step's new keys
// and values into its sequence's cache.

struct Params {
    m: u32, n: u32, k: u32, has_bias: u32,
    act: u32, has_residual: u32, w_stride: u32, _p0: u32,
#if NORM
    eps: f32, cache_col: u32, n_seqs: u32, _p1: u32,
#endif
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
#if NORM
@group(0) @binding(6) var<storage, read> ln: array<f32>;
@group(0) @binding(7) var<storage, read_write> cache: array<f32>;
@group(0) @binding(8) var<storage, read> seqs: array<u32>;
#endif

fn activate(v: f32) -> f32 {
    switch p.act {
        case 1u: { return gelu_f32(v); }
        case 2u: { return gelu_tanh_f32(v); }
        case 3u: { return max(v, 0.0); }
        case 4u: { return v / (1.0 + exp(-v)); }
        default: { return v; }
    }
}

// Writes y[row, col] from its dot product: bias, activation, residual
// (NORM: and its cache copy).
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
#if NORM
    if (p.n_seqs != 0u && col >= p.cache_col) {
        for (var s = 0u; s < p.n_seqs; s++) {
            let q_start = seqs[4u * s];
            let q_len = seqs[4u * s + 1u];
            if (row >= q_start && row < q_start + q_len) {
                let at = seqs[4u * s + 2u] + seqs[4u * s + 3u] - q_len + row - q_start;
                cache[at * (p.n - p.cache_col) + col - p.cache_col] = v;
            }
        }
    }
#endif
}
