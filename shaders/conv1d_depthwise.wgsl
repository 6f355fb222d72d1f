// conv1d_depthwise: y[c, t] = b[c] + sum_k w[c, k] * x[c, t + k*dilation - pad_left]
// (groups = channels, stride 1; VITS's DDSConv), out-of-range inputs are zero padding.
// bindings: 0 params, 1 x: [c, t_in], 2 w: [c, kernel] (PyTorch's [c, 1, k]),
//           3 b: [c], 4 y: [c, t_out]
// dispatch: ceil(c * t_out / WG) workgroups spread over x and y (gpu::ops::groups_1d),
// one invocation an output.

struct Params {
    c: u32, t_in: u32, t_out: u32, kernel: u32,
    dilation: u32, pad_left: u32, _p0: u32, _p1: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> w: array<f32>;
@group(0) @binding(3) var<storage, read> b: array<f32>;
@group(0) @binding(4) var<storage, read_write> y: array<f32>;

override WG: u32 = 256u;

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let i = (wid.y * nwg.x + wid.x) * WG + lid;
    if (i >= p.c * p.t_out) {
        return;
    }
    let ch = i / p.t_out;
    let t = i % p.t_out;
    var acc = 0.0;
    for (var k = 0u; k < p.kernel; k++) {
        let src = i32(t + k * p.dilation) - i32(p.pad_left);
        if (src >= 0 && src < i32(p.t_in)) {
            acc += w[ch * p.kernel + k] * x[ch * p.t_in + u32(src)];
        }
    }
    y[i] = b[ch] + acc;
}
