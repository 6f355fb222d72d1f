// conv_transpose2d: y[o, oy, ox] = b[o] + sum over the group's input channels ic and the
//         kernel taps (ky, kx) with iy * stride_y + ky = oy + pad_y (likewise x) of
//         x[ic, iy, ix] * w[ic, o % cout_g, ky, kx]   (see cpu::conv_transpose2d)
// bindings: 0 params, 1 x: array<f32> (c_in*h_in*w_in), 2 w: array<f32> (c_in*cout_g*kh*kw),
//           3 b: array<f32> (c_out), 4 y: array<f32> (c_out*h_out*w_out)
// one thread per output element, WG threads along a row;
// dispatch (ceil(w_out / WG), h_out, c_out).

struct Params {
    c_in: u32, h_in: u32, w_in: u32, c_out: u32,
    h_out: u32, w_out: u32, kh: u32, kw: u32,
    stride_y: u32, stride_x: u32, pad_y: u32, pad_x: u32,
    groups: u32, _p0: u32, _p1: u32, _p2: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> w: array<f32>;
@group(0) @binding(3) var<storage, read> b: array<f32>;
@group(0) @binding(4) var<storage, read_write> y: array<f32>;

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
    let cout_g = p.c_out / p.groups;
    let group = o / cout_g;
    let oc = o % cout_g;
    var acc = 0.0;
    for (var ic = group * cin_g; ic < (group + 1u) * cin_g; ic++) {
        for (var ky = 0u; ky < p.kh; ky++) {
            let ty = oy + p.pad_y;
            if (ty < ky || (ty - ky) % p.stride_y != 0u) {
                continue;
            }
            let iy = (ty - ky) / p.stride_y;
            if (iy >= p.h_in) {
                continue;
            }
            for (var kx = 0u; kx < p.kw; kx++) {
                let tx = ox + p.pad_x;
                if (tx < kx || (tx - kx) % p.stride_x != 0u) {
                    continue;
                }
                let ix = (tx - kx) / p.stride_x;
                if (ix >= p.w_in) {
                    continue;
                }
                acc += x[(ic * p.h_in + iy) * p.w_in + ix]
                    * w[((ic * cout_g + oc) * p.kh + ky) * p.kw + kx];
            }
        }
    }
    y[(o * p.h_out + oy) * p.w_out + ox] = acc + b[o];
}
