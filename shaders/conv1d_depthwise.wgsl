// conv1d_depthwise: y[c, t] = b[c] + sum_k w[c, k] * x[c, t + k*dilation - pad_left]
// (groups = channels, stride 1; VITS's DDSConv), out-of-range inputs are zero padding.
// bindings: 0 params, 1 x: [c, t_in], 2 w: [c, kernel] (PyTorch's [c, 1, k]),
// The input's length is t_in = frames * t_mul + t_add with frames = lens[2 s] (t_mul = 0: t_in fixed when
// recorded); workgroup z runs sentence s = first + z of a batch, each buffer's at s times its
// stride (what lies past a sentence's t_in or t_out is never read or written; a sentence of 0 frames runs
// nothing).
// t_out = t_in + pad_left + pad_right - dilation (kernel - 1).
// bindings: 0 params, 1 x: [c, t_in], 2 w: [c, kernel] (PyTorch's [c, 1, k]),
//           3 b: [c], 4 lens: [frames, total] u32 a sentence, 5 y: [c, t_out]
// dispatch: ceil(c * t_out / WG) workgroups, up to 65535 along x, then rows of 65535
// (gpu::speech::groups_wide), the sentences along z, direct or indirect; one invocation
// an output.

struct Params {
    c: u32, t_mul: u32, t_add: i32, kernel: u32,
    dilation: u32, pad_left: u32, pad_right: u32, first: u32,
    x_stride: u32, y_stride: u32, _p0: u32, _p1: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> w: array<f32>;
@group(0) @binding(3) var<storage, read> b: array<f32>;
@group(0) @binding(4) var<storage, read> lens: array<u32>;
@group(0) @binding(5) var<storage, read_write> y: array<f32>;

override WG: u32 = 256u;

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let s = p.first + wid.z;
    let frames = lens[2u * s];
    if (p.t_mul != 0u && frames == 0u) {
        return;
    }
    let t_in = u32(i32(frames * p.t_mul) + p.t_add);
    let t_out = u32(i32(t_in + p.pad_left + p.pad_right) - i32(p.dilation * (p.kernel - 1u)));
    let i = (wid.y * 65535u + wid.x) * WG + lid;
    if (i >= p.c * t_out) {
        return;
    }
    let ch = i / t_out;
    let t = i % t_out;
    var acc = 0.0;
    for (var k = 0u; k < p.kernel; k++) {
        let src = i32(t + k * p.dilation) - i32(p.pad_left);
        if (src >= 0 && src < i32(t_in)) {
            acc += w[ch * p.kernel + k] * x[s * p.x_stride + ch * t_in + u32(src)];
        }
    }
    y[s * p.y_stride + i] = b[ch] + acc;
}
