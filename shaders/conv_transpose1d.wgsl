// conv_transpose1d: y[o, q] = b[o] + sum over (i, k, t) with t*stride + k - pad = q of
// w[i, o, k] * act_in(x[i, t]), act_in(v) = leaky_relu(v * in_scale, in_slope).
// Groups 1, dilation 1 (HiFi-GAN's upsampling layers); written as a gather so every
// output is computed by one invocation. The input length is t_in = frames * t_mul + t_add
// with frames = lens[2 s] (as conv1d's), t_out = (t_in - 1) * stride - 2 pad + kernel.
// Workgroup z runs sentence s = first + z of a batch: x at s * x_stride, y at s * y_stride;
// a sentence of 0 frames runs nothing.
// bindings: 0 params, 1 x: [c_in, t_in], 2 w: packed [c_in, kernel, c_out_pad / 4] vec4
//           (gpu::speech::pack_conv_transpose1d_weights), 3 b: [c_out], 4 lens: [frames,
//           total] u32 a sentence, 5 y: [c_out, t_out]
// dispatch: (ceil(t_out / WG), ceil(c_out / 8), sentences), direct or indirect; one output step,
// 8 channels each.

struct Params {
    c_in: u32, c_out: u32, t_mul: u32, t_add: i32,
    kernel: u32, stride: u32, pad: u32, c_out_pad: u32,
    in_scale: f32, in_slope: f32, x_stride: u32, y_stride: u32,
    first: u32, _p0: u32, _p1: u32, _p2: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> w: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read> b: array<f32>;
@group(0) @binding(4) var<storage, read> lens: array<u32>;
@group(0) @binding(5) var<storage, read_write> y: array<f32>;

override WG: u32 = 64u;

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let s = p.first + wid.z;
    let frames = lens[2u * s];
    if (p.t_mul != 0u && frames == 0u) {
        return;
    }
    let t_in = u32(i32(frames * p.t_mul) + p.t_add);
    let t_out = i32((t_in - 1u) * p.stride + p.kernel) - i32(2u * p.pad);
    let q = wid.x * WG + lid;
    let o0 = wid.y * 8u;
    if (i32(q) >= t_out) {
        return;
    }
    var acc0 = vec4<f32>(0.0);
    var acc1 = vec4<f32>(0.0);
    let row = p.c_out_pad / 4u;
    // Only taps k = (q + pad) mod stride, k + stride, ... reach output q.
    for (var k = (q + p.pad) % p.stride; k < p.kernel; k += p.stride) {
        if (k > q + p.pad) {
            break;
        }
        let t = (q + p.pad - k) / p.stride;
        if (t >= t_in) {
            continue;
        }
        var xi = s * p.x_stride + t;
        var wi = k * row + o0 / 4u;
        let wstep = p.kernel * row;
        for (var i = 0u; i < p.c_in; i++) {
            var v = x[xi] * p.in_scale;
            if (v < 0.0) {
                v = v * p.in_slope;
            }
            acc0 += v * w[wi];
            acc1 += v * w[wi + 1u];
            xi += t_in;
            wi += wstep;
        }
    }
    for (var j = 0u; j < 8u; j++) {
        let o = o0 + j;
        if (o >= p.c_out) {
            break;
        }
        var v = b[o];
        if (j < 4u) {
            v += acc0[j];
        } else {
            v += acc1[j - 4u];
        }
        y[s * p.y_stride + o * u32(t_out) + q] = v;
    }
}
