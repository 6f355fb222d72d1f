// im2col_1d: the columns of a 1-D convolution, so it becomes one matmul.
// cols[t, c * kernel + k] = x[(t * stride + k - pad) * t_stride + c * c_stride],
// zero where t * stride + k - pad falls outside 0 .. t_in.
// bindings: 0 params {t_in, channels, t_stride, c_stride, kernel, stride, pad, t_out},
//           1 x: array<f32> (t_in steps of channels, laid out by the strides),
//           2 cols: array<f32> (t_out * channels * kernel)
// dispatch: ceil(t_out * channels * kernel / 256) workgroups, spread over x
// and y (see gpu::ops::groups_1d); one thread per element of cols.

struct Params {
    t_in: u32, channels: u32, t_stride: u32, c_stride: u32,
    kernel: u32, stride: u32, pad: u32, t_out: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> cols: array<f32>;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let i = (wid.y * nwg.x + wid.x) * 256u + lid;
    let width = p.channels * p.kernel;
    if (i >= p.t_out * width) {
        return;
    }
    let t = i / width;
    let c = (i % width) / p.kernel;
    let k = i % p.kernel;
    let s = i32(t * p.stride + k) - i32(p.pad);
    var v = 0.0;
    if (s >= 0 && u32(s) < p.t_in) {
        v = x[u32(s) * p.t_stride + c * p.c_stride];
    }
    cols[i] = v;
}
