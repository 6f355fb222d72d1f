// matmul: y[m, n] = act(x[m, k] . w[n, k]^T + bias[n]) + residual[m, n]
// (a linear layer with its bias, activation and residual add fused into the
// epilogue; each part is switched on by the params).
// bindings: 0 params {m, n, k, has_bias, act, has_residual, w_stride},
//           1 x: array<f32> (m*k, row-major),
//           2 w: the weights, rows of w_stride elements (f32) or words (W_F16),
//           3 bias: array<f32> (n; read only when has_bias),
//           4 residual: array<f32> (m*n; read only when has_residual),
//           5 y: array<f32> (m*n)
// act: 0 none, 1 GELU (erf), 2 GELU (tanh), 3 ReLU, 4 SiLU.
// dispatch: (ceil(n / 64), ceil(m / 64), 1) workgroups of 16x16 threads. A
// workgroup computes a 64x64 tile of y, stepping through k in slices of 32
// staged in workgroup memory as vec4s of 4 rows; thread (tx, ty) owns rows
// 4 ty .. 4 ty + 3 and columns 4 tx .. 4 tx + 3, reading one vec4 of x rows
// and one of w rows per k for 16 multiply-adds.
// variants: W_F16 reads f16 weights packed two to a u32 (low half first,
// each row padded to a whole word), unpacked with unpack2x16float so no
// shader-f16 support is needed. Only load_w differs between weight formats.

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

const TM: u32 = 64u;
const TN: u32 = 64u;
const TK: u32 = 32u;

// xs[c * 16 + i] = x[row0 + 4 i .. row0 + 4 i + 3, k0 + c], ws likewise.
var<workgroup> xs: array<vec4<f32>, 512>;
var<workgroup> ws: array<vec4<f32>, 512>;

// w[row, col] as f32; the caller checks the bounds.
fn load_w(row: u32, col: u32) -> f32 {
#if W_F16
    let pair = unpack2x16float(w[row * p.w_stride + col / 2u]);
    return select(pair.x, pair.y, (col & 1u) == 1u);
#else
    return w[row * p.w_stride + col];
#endif
}

fn activate(v: f32) -> f32 {
    switch p.act {
        case 1u: { return gelu_f32(v); }
        case 2u: { return gelu_tanh_f32(v); }
        case 3u: { return max(v, 0.0); }
        case 4u: { return v / (1.0 + exp(-v)); }
        default: { return v; }
    }
}

@compute @workgroup_size(16, 16)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) l: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let row0 = wid.y * TM;
    let col0 = wid.x * TN;
    var acc0 = vec4<f32>(0.0);
    var acc1 = vec4<f32>(0.0);
    var acc2 = vec4<f32>(0.0);
    var acc3 = vec4<f32>(0.0);
    for (var k0 = 0u; k0 < p.k; k0 += TK) {
        // Thread lid stages column c = lid % 32 of row quads lid / 32 and
        // lid / 32 + 8: 32 neighbouring threads read 32 consecutive k.
        let c = lid % TK;
        let kk = k0 + c;
        for (var i = 0u; i < 2u; i++) {
            let quad = lid / TK + 8u * i;
            var xv = vec4<f32>(0.0);
            var wv = vec4<f32>(0.0);
            if (kk < p.k) {
                for (var e = 0u; e < 4u; e++) {
                    let r = row0 + 4u * quad + e;
                    if (r < p.m) {
                        xv[e] = x[r * p.k + kk];
                    }
                    let n = col0 + 4u * quad + e;
                    if (n < p.n) {
                        wv[e] = load_w(n, kk);
                    }
                }
            }
            xs[c * 16u + quad] = xv;
            ws[c * 16u + quad] = wv;
        }
        workgroupBarrier();
        // Threads whose rows are all past m (a short batch) skip the maths.
        if (row0 + 4u * l.y < p.m) {
            for (var cc = 0u; cc < TK; cc++) {
                let a = xs[cc * 16u + l.y];
                let b = ws[cc * 16u + l.x];
                acc0 = fma(vec4<f32>(a.x), b, acc0);
                acc1 = fma(vec4<f32>(a.y), b, acc1);
                acc2 = fma(vec4<f32>(a.z), b, acc2);
                acc3 = fma(vec4<f32>(a.w), b, acc3);
            }
        }
        workgroupBarrier();
    }
    var accs = array<vec4<f32>, 4>(acc0, acc1, acc2, acc3);
    for (var i = 0u; i < 4u; i++) {
        let row = row0 + 4u * l.y + i;
        if (row >= p.m) {
            break;
        }
        for (var j = 0u; j < 4u; j++) {
            let col = col0 + 4u * l.x + j;
            if (col < p.n) {
                var v = accs[i][j];
                if (p.has_bias != 0u) {
                    v += bias[col];
                }
                v = activate(v);
                if (p.has_residual != 0u) {
                    v += residual[row * p.n + col];
                }
                y[row * p.n + col] = v;
            }
        }
    }
}
