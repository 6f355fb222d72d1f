// gemm: one weight chunk (any format of quant_formats.wgsl) times n
// activation rows, for prefill: y[t, col(o)] (+)= W[o] . x[t] for o < rows,
// t < n. Tiles of BN weight rows x BM tokens; each k-step dequantises a
// BN x BK weight tile into workgroup memory once for all BM tokens.
//   gemm      y = ...
//   gemm_add  ADD: y += ...  (residual add)
// A chunk may hold several parts (gate and up; LFM2's B, C, x) of part_rows
// rows each: chunk row o lands in column
//   col(o) = (o / part_rows) * part_stride + out_off + o % part_rows,
// so the parts come out side by side in y's rows ([n, parts * part_stride]).
// bindings: 0 params, 1 w: array<u32> (chunk), 2 x: [n, x_stride] (first k
//           used), 3 y: [n, y_stride] (read_write)
// dispatch: (ceil(rows / BN), ceil(n / BM), 1) workgroups of 256 threads

struct Params {
    k: u32,
    rows: u32,        // rows in this chunk (all parts)
    n: u32,
    x_stride: u32,
    y_stride: u32,
    part_rows: u32,
    part_stride: u32,
    out_off: u32,
    d_off: u32,
    _p0: u32,
    _p1: u32,
    _p2: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> w: array<u32>;
@group(0) @binding(2) var<storage, read> x: array<f32>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;

const BN: u32 = 64u;
const BM: u32 = 32u;
const BK: u32 = 32u;

var<workgroup> ws: array<f32, 2048>; // [BK][BN]
var<workgroup> xs: array<f32, 1024>; // [BM][BK]

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let row_base = wid.x * BN;
    let tok_base = wid.y * BM;
    let tx = lid & 15u;
    let ty = lid >> 4u;
    // This thread's share of the weight tile: 8 elements of one row.
    let wr = lid >> 2u;
    let wu = lid & 3u;
    let wrow = min(row_base + wr, p.rows - 1u);
    // ... and of the activation tile: 4 elements of one token.
    let xt = lid >> 3u;
    let xc = (lid & 7u) * 4u;
    let xtok = min(tok_base + xt, p.n - 1u);
    var acc: array<f32, 8>; // [4 rows][2 tokens]
    for (var k0 = 0u; k0 < p.k; k0 += BK) {
        let e0 = k0 + wu * 8u;
        var wv = W8(vec4<f32>(0.0), vec4<f32>(0.0));
        if (e0 < p.k) {
            wv = w8(wrow, e0, p.k, p.d_off);
        }
        let wb = wu * 8u * BN + wr;
        ws[wb] = wv.a.x;
        ws[wb + BN] = wv.a.y;
        ws[wb + 2u * BN] = wv.a.z;
        ws[wb + 3u * BN] = wv.a.w;
        ws[wb + 4u * BN] = wv.b.x;
        ws[wb + 5u * BN] = wv.b.y;
        ws[wb + 6u * BN] = wv.b.z;
        ws[wb + 7u * BN] = wv.b.w;
        for (var i = 0u; i < 4u; i++) {
            let e = k0 + xc + i;
            var v = 0.0;
            if (e < p.k) {
                v = x[xtok * p.x_stride + e];
            }
            xs[xt * BK + xc + i] = v;
        }
        workgroupBarrier();
        for (var kk = 0u; kk < BK; kk++) {
            let a0 = ws[kk * BN + tx];
            let a1 = ws[kk * BN + tx + 16u];
            let a2 = ws[kk * BN + tx + 32u];
            let a3 = ws[kk * BN + tx + 48u];
            let b0 = xs[ty * BK + kk];
            let b1 = xs[(ty + 16u) * BK + kk];
            acc[0] += a0 * b0;
            acc[1] += a0 * b1;
            acc[2] += a1 * b0;
            acc[3] += a1 * b1;
            acc[4] += a2 * b0;
            acc[5] += a2 * b1;
            acc[6] += a3 * b0;
            acc[7] += a3 * b1;
        }
        workgroupBarrier();
    }
    for (var i = 0u; i < 4u; i++) {
        let row = row_base + tx + 16u * i;
        if (row >= p.rows) {
            continue;
        }
        let col = (row / p.part_rows) * p.part_stride + p.out_off + row % p.part_rows;
        for (var j = 0u; j < 2u; j++) {
            let tok = tok_base + ty + 16u * j;
            if (tok < p.n) {
                let at = tok * p.y_stride + col;
#if ADD
                y[at] = y[at] + acc[i * 2u + j];
#else
                y[at] = acc[i * 2u + j];
#endif
            }
        }
    }
}
