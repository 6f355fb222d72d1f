// conv2d: y[o, oy, ox] = act(b[o] + sum over the group's input channels ci
//         and the kernel window (ky, kx) of w[o, ci, ky, kx] * x[g*cin_g + ci, iy, ix])
//         with iy = oy*stride_y + ky*dil_y - pad_y (likewise x), zero padding.
// bindings: 0 params, 1 x: array<f32> (c_in*h_in*w_in), 2 w: array<f32> (c_out*cin_g*kh*kw),
//           3 b: array<f32> (c_out), 4 y: array<f32> (c_out*h_out*w_out)
// activations (act): 0 none, 1 relu, 2 hard-swish, 3 hard-sigmoid (alpha, beta), 4 sigmoid.
// variants:
//   default: any geometry (groups, depthwise, stride, pads, dilation); one thread per
//            output element, WG threads along a row; dispatch (ceil(w_out / WG), h_out, c_out).
//   POINTWISE: 1x1, stride 1, no pads, one group (a matrix product over n = h*w pixels);
//            workgroup (16, 4); each thread computes 4 output channels x 4 pixels
//            (pixels strided by 16 so loads coalesce); dispatch (ceil(n / 64), ceil(c_out / 16), 1).

struct Params {
    c_in: u32, h_in: u32, w_in: u32, c_out: u32,
    h_out: u32, w_out: u32, kh: u32, kw: u32,
    stride_y: u32, stride_x: u32, pad_y: u32, pad_x: u32,
    dil_y: u32, dil_x: u32, groups: u32, act: u32,
    alpha: f32, beta: f32, _p0: u32, _p1: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> w: array<f32>;
@group(0) @binding(3) var<storage, read> b: array<f32>;
@group(0) @binding(4) var<storage, read_write> y: array<f32>;

fn activate(v: f32) -> f32 {
    switch p.act {
        case 1u: { return max(v, 0.0); }
        // Same order as the ONNX spelling: x * clip(x + 3, 0, 6) / 6.
        case 2u: { return v * clamp(v + 3.0, 0.0, 6.0) / 6.0; }
        case 3u: { return clamp(p.alpha * v + p.beta, 0.0, 1.0); }
        case 4u: { return 1.0 / (1.0 + exp(-v)); }
        default: { return v; }
    }
}

#if POINTWISE
@compute @workgroup_size(16, 4)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let n = p.h_in * p.w_in;
    let p0 = wid.x * 64u + lid.x;
    let o0 = (wid.y * 4u + lid.y) * 4u;
    // Loads past the end are clamped to valid addresses; their results are
    // never stored.
    let last_p = n - 1u;
    let last_o = p.c_out - 1u;
    var acc: array<vec4<f32>, 4>;
    for (var k = 0u; k < 4u; k++) {
        acc[k] = vec4<f32>(0.0);
    }
    for (var ci = 0u; ci < p.c_in; ci++) {
        let xb = ci * n;
        let xv = vec4<f32>(x[xb + min(p0, last_p)], x[xb + min(p0 + 16u, last_p)],
                           x[xb + min(p0 + 32u, last_p)], x[xb + min(p0 + 48u, last_p)]);
        for (var k = 0u; k < 4u; k++) {
            acc[k] += w[min(o0 + k, last_o) * p.c_in + ci] * xv;
        }
    }
    for (var k = 0u; k < 4u; k++) {
        let o = o0 + k;
        if (o >= p.c_out) {
            break;
        }
        for (var j = 0u; j < 4u; j++) {
            let px = p0 + 16u * j;
            if (px < n) {
                y[o * n + px] = activate(acc[k][j] + b[o]);
            }
        }
    }
}
#else
override WG: u32 = 64u;

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let ox = wid.x * WG + lid;
    let oy = wid.y;
    let o = wid.z;
    if (ox >= p.w_out) {
        return;
    }
    let cin_g = p.c_in / p.groups;
    let g = o / (p.c_out / p.groups);
    let ix0 = i32(ox * p.stride_x) - i32(p.pad_x);
    let iy0 = i32(oy * p.stride_y) - i32(p.pad_y);
    var acc = 0.0;
    for (var ci = 0u; ci < cin_g; ci++) {
        let xc = (g * cin_g + ci) * p.h_in * p.w_in;
        let wc = (o * cin_g + ci) * p.kh * p.kw;
        for (var ky = 0u; ky < p.kh; ky++) {
            let iy = iy0 + i32(ky * p.dil_y);
            if (iy < 0 || iy >= i32(p.h_in)) {
                continue;
            }
            let xr = xc + u32(iy) * p.w_in;
            for (var kx = 0u; kx < p.kw; kx++) {
                let ix = ix0 + i32(kx * p.dil_x);
                if (ix < 0 || ix >= i32(p.w_in)) {
                    continue;
                }
                acc += w[wc + ky * p.kw + kx] * x[xr + u32(ix)];
            }
        }
    }
    y[(o * p.h_out + oy) * p.w_out + ox] = activate(acc + b[o]);
}
#endif
