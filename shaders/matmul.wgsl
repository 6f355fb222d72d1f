// matmul: matmul_common.wgsl's y = act(x . w^T + bias) + residual, by tiles
// (a linear layer with its bias, activation and residual add fused into the
// epilogue; each part is switched on by the params). Bindings and params:
// matmul_common.wgsl.
// dispatch: (ceil(n / 64), ceil(m / 64), 1) workgroups of 16x16 threads. A
// workgroup computes a 64x64 tile of y, stepping through k in slices of 32
// staged in workgroup memory as vec4s of 4 rows; thread (tx, ty) owns rows
// 4 ty .. 4 ty + 3 and columns 4 tx .. 4 tx + 3, reading one vec4 of x rows
// and one of w rows per k for 16 multiply-adds.
// variants: W_F16 reads f16 weights, unpacked with unpack2x16float so no
// shader-f16 support is needed. Only load_w differs between weight formats.

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
                store(row, col, accs[i][j]);
            }
        }
    }
}
