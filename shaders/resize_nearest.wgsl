// resize_nearest: y[c, oy, ox] = x[c, floor(oy / scale_h), floor(ox / scale_w)], clamped
//                 (ONNX Resize: nearest, asymmetric coordinates, floor rounding).
// bindings: 0 params, 1 x: array<f32> (c*h_in*w_in), 2 y: array<f32> (c*h_out*w_out)
// dispatch: ceil(c*h_out*w_out / WG) workgroups spread over x and y (gpu::ops::groups_1d)

struct Params {
    c: u32, h_in: u32, w_in: u32, h_out: u32,
    w_out: u32, scale_h: f32, scale_w: f32, _p0: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;

override WG: u32 = 256u;

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let i = (wid.y * nwg.x + wid.x) * WG + lid;
    let plane = p.h_out * p.w_out;
    if (i >= p.c * plane) {
        return;
    }
    let c = i / plane;
    let oy = (i % plane) / p.w_out;
    let ox = i % p.w_out;
    let iy = min(u32(floor(f32(oy) / p.scale_h)), p.h_in - 1u);
    let ix = min(u32(floor(f32(ox) / p.scale_w)), p.w_in - 1u);
    y[i] = x[(c * p.h_in + iy) * p.w_in + ix];
}
